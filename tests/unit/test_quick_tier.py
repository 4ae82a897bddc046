"""The quick tier names tests that exist: a renamed test must not leave `make test` silently."""

from __future__ import annotations

import ast
from pathlib import Path

from ..quick import ALL, QUICK

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_test_the_quick_tier_names_exists() -> None:
    for module, chosen in QUICK.items():
        path = INTEGRATION / f"{module}.py"
        assert path.is_file(), f"tests/quick.py names {module}, which does not exist"
        if chosen == ALL:
            continue
        tree = ast.parse(path.read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        assert not set(chosen) - functions, f"tests/quick.py names tests {module} lacks: {set(chosen) - functions}"
