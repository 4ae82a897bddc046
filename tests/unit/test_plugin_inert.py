"""The pytest11 entry point is loaded by every pytest in any environment where pp-launch is
installed, so at load it may import only the standard library and pytest, and must register nothing but its ini
option until a project enables it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch" / "testing" / "plugin.py"


def test_the_entry_point_imports_only_the_standard_library_and_pytest_at_load() -> None:
    tree = ast.parse(PLUGIN.read_text())
    top = []
    for node in tree.body:  # module level only: imports inside functions run when the plugin is enabled
        if isinstance(node, ast.Import):
            top += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            top.append((node.module or "").split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"pytest", "__future__"}
    assert top and set(top) <= allowed, sorted(set(top) - allowed)


def test_the_entry_point_defines_no_fixture_and_no_hook_but_options_and_configure() -> None:
    tree = ast.parse(PLUGIN.read_text())
    hooks = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("pytest_")}
    assert hooks == {"pytest_addoption", "pytest_configure"}
    text = PLUGIN.read_text()
    assert "@pytest.fixture" not in text


def test_enabled_only_by_the_opt_in(pytestconfig: pytest.Config) -> None:
    from pp_launch.testing import plugin

    assert plugin.enabled(pytestconfig)  # our own suite opts in (pyproject: pp_launch = true)
    assert pytestconfig.pluginmanager.has_plugin("pp_launch_fixtures")
