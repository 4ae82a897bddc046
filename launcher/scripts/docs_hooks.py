"""mkdocs hook: the site's pictures are Graphviz sources (`docs/diagrams/*.dot`) rendered to SVG by the local `dot`
while the site builds, so nothing is fetched and a picture cannot drift from its source. A missing `dot` fails the
build with the package to install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SOURCES = "diagrams"


def render(source: Path) -> bytes:
    dot = shutil.which("dot")
    if dot is None:
        raise PluginError(
            f"cannot draw {source.name}: Graphviz's 'dot' is not installed "
            "(Debian/Ubuntu: apt-get install graphviz; 'make setup' installs it)"
        )
    done = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise PluginError(f"dot could not draw {source}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def on_files(files: Files, config: Any, **_: Any) -> Files:
    for source in sorted((Path(config["docs_dir"]) / SOURCES).glob("*.dot")):
        files.append(File.generated(config, f"{SOURCES}/{source.stem}.svg", content=render(source)))
    return files
