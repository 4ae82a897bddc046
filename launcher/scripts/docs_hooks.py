"""mkdocs hook: the site's pictures are Graphviz sources (`docs/diagrams/*.dot`) rendered to SVG by the local `dot`
while the site builds, so nothing is fetched and a picture cannot drift from its source; a missing `dot` fails the
build with the package to install. The command reference (docs/cli.md) is made from the commands themselves
(pp_launch/cli/reference.py), where the page says REFERENCE."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SOURCES = "diagrams"
REFERENCE = "<!-- the command reference, made from the commands -->"


def render(source: Path) -> bytes:
    dot = shutil.which("dot")
    if dot is None:
        raise PluginError(
            f"cannot draw {source.name}: Graphviz's 'dot' is not installed "
            "(Debian/Ubuntu: apt-get install graphviz; 'make docs' and 'make test' install it)"
        )
    done = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise PluginError(f"dot could not draw {source}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def on_files(files: Files, config: Any, **_: Any) -> Files:
    for source in sorted((Path(config["docs_dir"]) / SOURCES).glob("*.dot")):
        files.append(File.generated(config, f"{SOURCES}/{source.stem}.svg", content=render(source)))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if REFERENCE not in markdown:
        return markdown
    from pp_launch.cli.main import load_all
    from pp_launch.cli.reference import markdown as reference

    return markdown.replace(REFERENCE, reference(load_all()))
