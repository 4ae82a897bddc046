"""The tree is the architecture: four floors, no arrow back up (issue #17). Walks every import with ast.

core      pure: chain plan/ports/scope, GPU allocator/inventory/requests, worker codec/controller, grammar,
          labels, errors, events. Imports only the standard library and itself.
adapters  the only I/O: the Docker engine, child processes, NVML, host state, the worker driver, the watchdog.
app       the use cases, over core and adapters.
testing   the fake NVIDIA host and test helpers for suites (ours and users'), beside app.
cli       Click and rich, over everything; nothing imports it but itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch"
FLOORS = {"core": 0, "adapters": 1, "app": 2, "testing": 2, "cli": 3}
FOREIGN = {"docker", "requests", "pynvml", "click", "rich"}
ONLY = {"docker": {"adapters.docker_engine"}, "requests": {"adapters.docker_engine"}, "pynvml": {"adapters.nvml"}}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        out.append((".".join(p for p in rel.parts if p != "__init__") or "pp_launch", path))
    return out


def imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (use pp_launch.<floor>...)"
            mod = node.module or ""
            if mod == "pp_launch" or mod.startswith("pp_launch."):
                found += [f"{mod}.{a.name}" for a in node.names]
            else:
                found.append(mod)
    return found


def floor(module: str) -> int | None:
    return FLOORS.get(module.split(".")[0])


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_no_import_reaches_up_or_out_of_its_floor(module: str, path: Path) -> None:
    mine = floor(module)
    for target in imports(path):
        top = target.split(".")[0]
        if top in FOREIGN:
            assert mine is not None and mine >= 1, f"{module} imports {target}: only adapters and above do I/O"
            allowed = ONLY.get(top)
            assert allowed is None or module in allowed, f"{module} imports {top}: only {sorted(allowed or [])} may"
            if top in ("click", "rich"):
                assert mine == 3, f"{module} imports {top}: only the CLI may"
        if target.startswith("pp_launch."):
            theirs = floor(target.removeprefix("pp_launch."))
            if mine is not None and theirs is not None:
                assert theirs <= mine, f"{module} imports {target}: a lower floor must not reach a higher one"


def test_every_module_lives_on_a_floor() -> None:
    loose = [m for m, _ in modules() if floor(m) is None and m not in ("pp_launch", "__main__")]
    assert loose == []
