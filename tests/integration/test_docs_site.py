"""The documentation site as people see it: built with `mkdocs build --strict`, served on 127.0.0.1 and opened page by
page in a real headless Chromium, driven over the DevTools protocol. Every page loads without a console error, an
uncaught exception or a failed request; every picture has a size; and the site asks nothing of any address but
127.0.0.1 (its fonts and pictures are local: the diagrams are drawn by Graphviz while the site builds)."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

pytestmark = pytest.mark.full


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The built site, served over HTTP on 127.0.0.1 by a server this fixture starts, stops and joins."""
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-q", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", out
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        assert not thread.is_alive()


class Browser:
    """One headless Chromium, one page, spoken to over the DevTools protocol (a websocket on 127.0.0.1)."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None, "chromium is not installed: 'make setup' installs Debian's chromium"
        argv = [
            CHROMIUM,
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-gpu",
            "--mute-audio",
            "--window-size=1280,900",
            # anything but 127.0.0.1 resolves nowhere and goes to a proxy that is not there: nothing leaves the host
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=127.0.0.1",
            "about:blank",
        ]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium's sandbox refuses root
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._drain = threading.Thread(target=self._read_stderr, name="chromium-stderr", daemon=True)
        self._drain.start()
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert self.proc.poll() is None, f"chromium ended at start: {self.stderr[-2000:]}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        import websocket  # websocket-client, a test dependency

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Network.setCacheDisabled", cacheDisabled=True)  # every page fetches all it shows

    stderr = ""

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr = (self.stderr + raw.decode(errors="replace"))[-20000:]

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                assert "error" not in message, f"{method}: {message['error']}"
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        """Until the event `method` arrives (events already seen count)."""
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            assert self._next(deadline), f"no {method} in {timeout} s"

    def settle(self, timeout: float = 30) -> None:
        """Until every request the page started has finished or failed (the search index, the pictures...). Not the
        browser's own fetch of the page's icon for its tab: sent after the load, its end is not always reported (CI
        under load saw it open for 30 s); the tests check that the icon is there (`icon`)."""
        deadline = time.monotonic() + timeout
        while True:
            started = {
                e["params"]["requestId"]
                for e in self.events
                if e.get("method") == "Network.requestWillBeSent" and not is_icon_fetch(e["params"])
            }
            ended = {
                e["params"]["requestId"]
                for e in self.events
                # a worker's script is fetched for the page but finishes in the worker: its answer's headers count
                if e.get("method")
                in ("Network.loadingFinished", "Network.loadingFailed", "Network.responseReceivedExtraInfo")
            }
            if started <= ended:
                return
            open_ = [
                e["params"]["request"]["url"]
                for e in self.events
                if e.get("method") == "Network.requestWillBeSent" and e["params"]["requestId"] in started - ended
            ]
            assert self._next(deadline), f"requests still open after {timeout} s: {open_}"

    def _next(self, deadline: float) -> bool:
        """One more message from the browser into `events`; False once the deadline has passed."""
        import websocket

        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.ws.settimeout(left)
        try:
            self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            return False
        return True

    def open(self, url: str) -> dict[str, Any]:
        self.events = []
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.settle()
        pictures = self.call(
            "Runtime.evaluate",
            expression="JSON.stringify(Array.from(document.images).map(i => ({src: i.currentSrc, "
            "complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, shown: i.getBoundingClientRect().width})))",
            returnByValue=True,
        )
        clipped = self.call(  # code wider than its block (at the window's 1280 px): a reader would have to scroll
            "Runtime.evaluate",
            expression="JSON.stringify(Array.from(document.querySelectorAll('pre > code'))"
            ".filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 60)))",
            returnByValue=True,
        )
        icon = self.call(
            "Runtime.evaluate", expression="document.querySelector('link[rel~=icon]')?.href ?? ''", returnByValue=True
        )
        return {
            "icon": icon["result"]["value"],
            "pictures": json.loads(pictures["result"]["value"]),
            "clipped": json.loads(clipped["result"]["value"]),
            "events": list(self.events),
        }

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
            self._drain.join(15)


def is_icon_fetch(request: dict[str, Any]) -> bool:
    """The browser's fetch of a page's icon for its tab (not a request of the page's own)."""
    return request.get("type") == "Other" and re.search(r"/favicon\.[a-z]+$", request["request"]["url"]) is not None


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def problems(events: list[dict[str, Any]], origin: str) -> list[str]:
    """What a reader would see go wrong, or the site asking for anything away from its own origin."""
    found = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(f"uncaught: {details.get('text')} {details.get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append(f"console.{params['type']}: {[a.get('value', a.get('description')) for a in params['args']]}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"failed request: {params.get('errorText')} ({params['requestId']})")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith((origin + "/", "data:", "blob:", "about:")):
                found.append(f"asked another address: {url}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"HTTP {params['response']['status']}: {params['response']['url']}")
        elif method == "Network.responseReceivedExtraInfo" and params.get("statusCode", 200) >= 400:
            found.append(f"HTTP {params['statusCode']} ({params['requestId']})")
    return found


LEGIBLE_PX = 11  # the smallest text of a diagram, as drawn at page width (the page's own text is 16 px)


def smallest_text_px(svg: str, shown: float) -> float:
    """The smallest font size in a Graphviz drawing, in CSS pixels once the page draws it `shown` pixels wide (its
    viewBox is in points: the picture is scaled as a whole)."""
    view_width = float(re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ', svg).group(1))  # type: ignore[union-attr]
    sizes = [float(size) for size in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes, "a drawing without text"
    return min(sizes) * shown / view_width


def test_the_text_size_check_sees_a_drawing_shrunk_to_fit() -> None:
    """A 1,000 pt drawing with 9 pt labels, drawn 690 px wide: 6.2 px, refused; the same at its own size is not."""
    svg = (
        '<svg width="1000pt" viewBox="0.00 0.00 1000.00 300.00"><text font-size="12.00">a</text>'
        '<text font-size="9.00">b</text></svg>'
    )
    assert round(smallest_text_px(svg, 690), 1) == 6.2 < LEGIBLE_PX
    assert smallest_text_px(svg, 1000 * 4 / 3) == 12 >= LEGIBLE_PX


def pages_of(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*.html") if p.name != "404.html")


def test_every_page_loads_cleanly_and_every_picture_has_a_size(site: tuple[str, Path], browser: Browser) -> None:
    origin, root = site
    pages = pages_of(root)
    assert len(pages) >= 18, pages  # the home page and every page in the nav
    bad: dict[str, list[str]] = {}
    pictures_seen = 0
    for page in pages:
        url = f"{origin}/{page}"
        seen = browser.open(url)
        found = problems(seen["events"], origin)
        for picture in seen["pictures"]:
            pictures_seen += 1
            if not (picture["complete"] and picture["w"] > 0 and picture["h"] > 0 and picture["shown"] > 0):
                found.append(f"picture without a size: {picture}")
            else:
                svg = (root / picture["src"].removeprefix(f"{origin}/")).read_text()
                px = smallest_text_px(svg, picture["shown"])
                if px < LEGIBLE_PX:  # shrunk to fit the page: its text is no longer read
                    found.append(f"text drawn at {px:.1f} px (< {LEGIBLE_PX}) in {picture['src']}")
        found += [f"code clipped at 1280 px: {text!r}" for text in seen["clipped"]]
        if not (root / seen["icon"].removeprefix(f"{origin}/")).is_file():
            found.append(f"no icon at {seen['icon']!r}")
        if found:
            bad[url] = found
    assert bad == {}, "\n".join(f"{url}: {what}" for url, found in bad.items() for what in found)
    assert pictures_seen >= 7, f"only {pictures_seen} pictures on the whole site"


def test_the_site_opens_from_disk_and_every_link_of_its_home_page_is_a_page(
    site: tuple[str, Path], browser: Browser
) -> None:
    """build/site/index.html opened as a file (no server): every link of its navigation leads to a page that loads
    cleanly from disk (search is there when the site is served: `make docs`)."""
    _, root = site
    origin = root.as_uri()
    home = browser.open(f"{origin}/index.html")
    assert problems(home["events"], origin) == []
    links = browser.call(
        "Runtime.evaluate",
        expression="JSON.stringify(Array.from(document.querySelectorAll('nav a[href]')).map(a => a.href))",
        returnByValue=True,
    )
    pages = sorted({u.split("#")[0] for u in json.loads(links["result"]["value"]) if u.startswith(origin)})
    assert len(pages) >= 18, pages
    bad = {}
    for url in pages:
        assert url.endswith(".html"), url  # never a folder: a folder on disk is a listing, not the page
        seen = browser.open(url)
        found = problems(seen["events"], origin)
        title = browser.call("Runtime.evaluate", expression="document.querySelector('article h1') !== null",
                             returnByValue=True)  # fmt: skip
        if not Path(urllib.request.url2pathname(seen["icon"].removeprefix("file://"))).is_file():
            found.append(f"no icon at {seen['icon']!r}")
        if found or not title["result"]["value"]:
            bad[url] = found or ["no page there"]
    assert bad == {}


def test_the_checker_sees_a_broken_picture_and_a_console_error(site: tuple[str, Path], browser: Browser) -> None:
    """The check above can fail: a page with a missing picture, a script error and a request for another address
    is reported on each count."""
    origin, root = site
    (root / "broken").mkdir(exist_ok=True)
    (root / "broken" / "index.html").write_text(
        "<html><body><img src='../diagrams/missing.svg'><img src='../diagrams/ring.svg'>"
        "<script>console.error('boom'); undefinedFunction();</script>"
        "<img src='http://192.0.2.1/x.png'></body></html>"
    )
    try:
        seen = browser.open(f"{origin}/broken/")
    finally:
        shutil.rmtree(root / "broken")
    found = problems(seen["events"], origin)
    sized = [p for p in seen["pictures"] if p["w"] > 0]
    assert any("console.error" in f and "boom" in f for f in found), found
    assert any(f.startswith("uncaught") and "undefinedFunction" in f for f in found), found
    assert any("HTTP 404" in f and "missing.svg" in f for f in found), found
    assert any("asked another address: http://192.0.2.1/" in f for f in found), found
    assert [p["src"].rsplit("/", 1)[1] for p in sized] == ["ring.svg"]
