"""The guard of one run on one engine (docs/chain.md, "The guard").

It runs as a container of the run on the engine it guards (tini as init, auto-remove, no network), reaching that
engine through its socket, mounted at PP_GUARD_SOCKET. It holds the ids of the run's containers there, as the
launcher sends them on its stdin right after each create, and the launcher's lifeline: that same stdin, which the
engine closes when the launcher's attach ends, however the launcher ends.

First it checks that its socket reaches the engine the launcher means (PP_GUARD_ENGINE) and says `ready` on stdout
(or why not); the only other line it writes there is `down`, when SIGUSR1 (`pp-launch down`) tells it to stop. stdin lines: `own <id>` (a container the launcher created:
answered `owned <id>` on stderr, so the engine's log of this container is the run's record of what is its own), `detach` (the run is up and detached: the guard is its
owner from now on, answered `detached`). End of stdin, for a run that is not detached, SIGUSR1 (`pp-launch down`)
or SIGTERM (`docker stop`, an engine that stops), tears down every owned container (SIGTERM, PP_GUARD_GRACE seconds, SIGKILL, removal confirmed by the
engine), then the guard exits. A detached run's guard also exits once none of its containers is left. With
PP_GUARD_HEARTBEAT=S (an engine the launcher reaches over the network), S seconds without a line from the launcher
(`beat`) count as the end of stdin too: a link that was cut, or a machine that froze or vanished, closes nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import sys
import threading
import time

SOCKET = os.environ.get("PP_GUARD_SOCKET", "/var/run/docker.sock")
GRACE = float(os.environ.get("PP_GUARD_GRACE", "5"))
# > 0: the launcher writes a line at least this often; silence that long means its machine or link is lost
HEARTBEAT = float(os.environ.get("PP_GUARD_HEARTBEAT", "0"))
PATIENCE = float(os.environ.get("PP_GUARD_PATIENCE", "60"))  # how long a teardown retries a silent engine
POLL = 0.1
ID = re.compile(r"[0-9a-f]{64}")


class _Unix(http.client.HTTPConnection):
    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(SOCKET)


def call(method: str, path: str) -> int:
    """One Engine API request; its HTTP status."""
    conn = _Unix("localhost", timeout=30)
    try:
        conn.request(method, path, headers={"Content-Length": "0"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def identity() -> str:
    """What the launcher calls this engine (its id, name and data root): the socket must reach that one."""
    conn = _Unix("localhost", timeout=30)
    try:
        conn.request("GET", "/info")
        info = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return "|".join(str(info.get(k, "")) for k in ("ID", "Name", "DockerRootDir"))


def exists(ref: str) -> bool:
    return call("GET", f"/containers/{ref}/json") != 404


def say(text: str) -> None:
    """The record, on stderr: stdout carries one line only, `ready` or why not, to the launcher's attach."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def ready() -> bool:
    expected = os.environ.get("PP_GUARD_ENGINE", "")
    try:
        found = identity()
    except (OSError, ValueError) as exc:
        sys.stdout.write(f"cannot reach the engine through {SOCKET}: {exc}\n")
        return False
    if expected and found != expected:
        sys.stdout.write(f"{SOCKET} is another engine ({found}, not {expected}): set PP_LAUNCH_GUARD_SOCKET to the "
                         "engine's own socket on its machine\n")  # fmt: skip
        return False
    sys.stdout.write("ready\n")
    return True


class Guard:
    def __init__(self) -> None:
        self.owned: list[str] = []
        self.detached = False
        self.ended = threading.Event()  # end of stdin, or SIGTERM
        self.lock = threading.Lock()
        self.heard = time.monotonic()

    def read(self) -> None:
        for raw in sys.stdin.buffer:
            self.heard = time.monotonic()
            words = raw.decode("ascii", "replace").split()
            with self.lock:
                if len(words) == 2 and words[0] == "own" and ID.fullmatch(words[1]) and words[1] not in self.owned:
                    self.owned.append(words[1])
                    say(f"owned {words[1]}")
                elif words == ["detach"] and not self.detached:
                    self.detached = True
                    say("detached")
        if not self.detached:
            self.ended.set()

    def left(self) -> list[str]:
        with self.lock:
            owned = list(self.owned)
        return [ref for ref in owned if exists(ref)]

    def teardown(self) -> None:
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                self._stop(self.left())
                if not self.left():
                    return
            except OSError:
                pass  # the engine is restarting or frozen: try again while it may come back
            if time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def _stop(self, refs: list[str]) -> None:
        for ref in refs:
            call("POST", f"/containers/{ref}/kill?signal=SIGTERM")
        end = time.monotonic() + GRACE
        while refs and time.monotonic() < end:
            time.sleep(POLL)
            refs = [r for r in refs if exists(r)]
        for ref in refs:
            call("POST", f"/containers/{ref}/kill?signal=SIGKILL")
            call("DELETE", f"/containers/{ref}?force=1")
        for ref in refs:
            say(f"removed {ref}")


def main() -> int:
    ok = ready()
    sys.stdout.flush()
    if not ok:
        return 3
    guard = Guard()

    def down(*_: object) -> None:  # `pp-launch down`: the launcher, if it is there, hears it on our stdout
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write("down\n")
            sys.stdout.flush()
        guard.ended.set()

    signal.signal(signal.SIGUSR1, down)  # `pp-launch down` asks with its own signal: an engine that stops sends TERM
    signal.signal(signal.SIGTERM, lambda *_: guard.ended.set())
    signal.signal(signal.SIGINT, lambda *_: guard.ended.set())
    threading.Thread(target=guard.read, daemon=True).start()
    while not guard.ended.wait(1.0):
        if HEARTBEAT > 0 and not guard.detached and time.monotonic() - guard.heard > HEARTBEAT:
            say("the launcher is silent: its lifeline is lost")
            break
        if guard.detached:
            try:
                if not guard.left():
                    say("every container of the run is gone")
                    return 0
            except OSError:
                pass
    guard.teardown()
    say("torn down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
