"""The chain path stays readable: no function on it above radon's rank C (cyclomatic complexity
20) or longer than 60 lines, nested functions included. The path: the CLI's chain command, the launch use case,
planning and GPU selection, the reservation, the scope and its teardown, the host assignment, the backends."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from radon.complexity import cc_visit
from radon.visitors import Function

PKG = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch"
CHAIN_PATH = [
    "cli/chain_cmd.py",
    "app/launch.py",
    "app/on_ray.py",
    "app/docker_site.py",
    "app/places.py",
    "app/planning.py",
    "app/docker_runs.py",
    "app/site.py",
    "app/chain.py",
    "app/gpus.py",
    "app/hosts.py",
    "app/locks.py",
    "core/chain/plan.py",
    "core/chain/ports.py",
    "core/chain/handoff.py",
    "core/chain/scope.py",
    "core/chain/teardown.py",
    "core/hosts.py",
    "core/gpu/allocator.py",
    "core/gpu/requests.py",
    "core/events.py",
    "adapters/multi_host.py",
    "adapters/ray_cluster.py",
    "adapters/docker_engine.py",
    "adapters/docker_client.py",
    "adapters/process_backend.py",
    "adapters/inbox.py",
    "adapters/runtime.py",
]
MAX_COMPLEXITY = 20  # the top of rank C
MAX_LINES = 60


def functions(path: Path) -> list[Function]:
    found: list[Function] = []

    def walk(blocks: list) -> None:  # type: ignore[type-arg]
        for block in blocks:
            if isinstance(block, Function):
                found.append(block)
                walk(block.closures)
            else:  # a class: its methods
                walk(block.methods)
                walk(getattr(block, "inner_classes", []))

    walk(cc_visit(path.read_text()))
    return list({(f.lineno, f.name): f for f in found}.values())  # radon lists a method's closures twice


@pytest.mark.parametrize("module", CHAIN_PATH)
def test_no_function_on_the_chain_path_is_above_rank_c_or_60_lines(module: str) -> None:
    too = [
        f"{f.fullname} (line {f.lineno}): complexity {f.complexity}, {f.endline - f.lineno + 1} lines"
        for f in functions(PKG / module)
        if f.complexity > MAX_COMPLEXITY or f.endline - f.lineno + 1 > MAX_LINES
    ]
    assert too == []


def test_the_measure_sees_a_function_that_is_too_long_or_too_branchy(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(35))
    (tmp_path / "m.py").write_text(f"def branchy(x):\n{branches}    return -1\n")
    (f,) = functions(tmp_path / "m.py")
    assert f.complexity > MAX_COMPLEXITY and f.endline - f.lineno + 1 > MAX_LINES


def test_no_function_in_the_package_is_above_rank_c() -> None:
    """Beyond the chain path too (its length aside): every module of the package, the testing kit's included."""
    too = [
        f"{path.relative_to(PKG)}: {f.fullname} (line {f.lineno}): complexity {f.complexity}"
        for path in sorted(PKG.rglob("*.py"))
        for f in functions(path)
        if f.complexity > MAX_COMPLEXITY
    ]
    assert too == []


def test_every_module_opens_with_what_it_owns() -> None:
    """Each module and package of pp_launch opens with a docstring: what it owns (docs/architecture.md)."""
    silent = [
        str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py")) if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert silent == []


def rebound(source: str) -> list[str]:
    """Names a module binds twice at its top level (plain assignments, `def`, `class`): the second silently replaces
    the first for every use above it too (a constant of the same name added further down changed a guard's 1 s
    silence to an hour, and no linter said so)."""
    seen: dict[str, int] = {}
    twice = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        for name in names:
            if name in seen:
                twice.append(f"{name} (lines {seen[name]} and {node.lineno})")
            seen[name] = node.lineno
    return twice


def test_no_module_binds_a_top_level_name_twice() -> None:
    """The package's modules, and the programs of its images (the guard, the stub worker)."""
    root = PKG.parents[1]
    modules = sorted(PKG.rglob("*.py")) + sorted((root / "images").rglob("*.py"))
    twice = [f"{p.relative_to(root)}: {n}" for p in modules for n in rebound(p.read_text())]
    assert twice == []


def test_the_rebinding_check_sees_a_constant_bound_again() -> None:
    assert rebound("LOST_AFTER = 1.0\ndef f():\n    return LOST_AFTER\nLOST_AFTER = 3600.0\n") == [
        "LOST_AFTER (lines 1 and 4)"
    ]
