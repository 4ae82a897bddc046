"""The README a newcomer reads in five minutes, and the documentation site beside it: the site
builds with `mkdocs build --strict`, and every command block marked "runs here" in the README and the docs runs
as written from the repository's root."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- runs here -->"


def runnable() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in page.read_text().split(MARK)[1:]:
            body = block.split("```", 2)[1]
            found += [(page.name, line[2:]) for line in body.splitlines() if line.startswith("$ ")]
    return found


def test_the_readme_is_a_five_minute_read() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def paragraphs(text: str) -> list[str]:
    """The prose of a page: its paragraphs, each list item on its own; code, tables, headings and comments left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found = []
    for block in re.split(r"\n\s*\n", prose):
        if not block.lstrip().startswith(("|", "#", "<!--")):
            found += re.split(r"\n(?=\s*(?:[-*]|\d+\.)\s)", block)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paragraph_is_over_120_words(page: Path) -> None:
    """A page is read, not waded through: a paragraph (or list item) of more than 120 words is split or made a list."""
    long = [" ".join(p.split()[:12]) + " ..." for p in paragraphs(page.read_text()) if len(p.split()) > 120]
    assert long == [], f"{page.name}: paragraphs over 120 words: {long}"


def test_the_word_count_sees_a_long_paragraph() -> None:
    text = "word " * 121 + "\n\n| a | table |\n\n- one\n- two three"
    assert [len(p.split()) for p in paragraphs(text)] == [121, 2, 3]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "troubleshooting.html").exists()  # page.html: the site opens from disk
    site = tmp_path / "site"
    # the command reference is generated from the commands: every option of every command is on it
    reference = html.unescape((site / "cli.html").read_text())
    from pp_launch.cli.main import load_all

    group = load_all()
    missing = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--") and not getattr(param, "hidden", False) and opt not in reference:
                    missing.append(f"{name} {opt}")
        if f"pp-launch {name}" not in reference:
            missing.append(f"pp-launch {name}")
    assert missing == [], f"not in the built command reference: {missing}"
    page = (site / "cli.html").read_text()
    body = page[page.index("<article") :]
    assert "Sentinel" not in body and "UNSET" not in body  # a default --help does not show is not shown
    assert "<em>" not in body and "<strong>" not in body  # PEER_*, FIRST_PEER_*: no name read as emphasis
    run_together = re.findall(r"<p>[^<]*Examples?:[^<]*pp-launch [^<]*</p>", body)
    assert run_together == [], run_together  # every command's examples are a code block, a line each
    assert "[default: 2; 1&lt;=x&lt;=64]" in body  # --stages as --help says it
    # no page renders a literal backslash escape (a `\|` meant as a pipe) where people read or copy it
    escaped = [str(page.relative_to(site)) for page in site.rglob("*.html") if "\\|" in html.unescape(page.read_text())]
    assert escaped == [], escaped


def test_every_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in PAGES[1:] if p.name not in nav] == []


@pytest.mark.parametrize(("page", "command"), runnable(), ids=[f"{p}: {c}" for p, c in runnable()])
def test_a_command_marked_runs_here_runs_as_written(page: str, command: str) -> None:
    argv = shlex.split(command)
    assert argv[0] in ("pp-launch", "pp-gpu-node"), command
    argv[0] = str(Path(sys.executable).parent / argv[0])
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock", "PP_LAUNCH_GPU_INVENTORY": ""}
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, f"{page}: {command}\n{done.stderr}"
    assert not re.search(r"Traceback|error:", done.stdout + done.stderr)


def test_there_are_commands_to_run() -> None:
    assert len(runnable()) >= 4


OUTPUT_MARK = re.compile(r"<!-- output of: (.+?) -->\n```\n(.*?)```", re.S)


def shown_outputs() -> list[tuple[str, str, str]]:
    return [(p.name, m[1], m[2]) for p in PAGES for m in OUTPUT_MARK.finditer(p.read_text())]


@pytest.mark.parametrize(
    ("page", "command", "shown"), shown_outputs(), ids=[f"{p}: {c}" for p, c, _ in shown_outputs()]
)
def test_a_sample_output_is_what_the_command_prints_now(page: str, command: str, shown: str) -> None:
    argv = shlex.split(command)
    argv[0] = str(Path(sys.executable).parent / argv[0])
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock", "COLUMNS": "200"}
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    strip = lambda text: [line.rstrip() for line in text.strip("\n").splitlines()]  # noqa: E731
    assert strip(shown) == strip(done.stdout), f"{page}: the sample of '{command}' no longer matches its output"


def test_the_samples_are_checked() -> None:
    assert [c for _, c, _ in shown_outputs() if "--topo" in c] != []
