"""docs/architecture.md's Layout names every module the package has, on its own floor's row."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "launcher" / "pp_launch"


def layout_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].split("`")[1].rstrip("/")] = cells[1]
    return rows


def test_every_module_is_named_on_its_floors_row() -> None:
    rows = layout_rows()
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.name in ("__init__.py", "__main__.py") or len(rel.parts) < 2:
            continue
        if f"`{rel.name}`" not in rows.get(rel.parts[0], ""):
            missing.append(str(rel))
    assert missing == []
