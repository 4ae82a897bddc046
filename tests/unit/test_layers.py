"""The tree is the architecture: four floors, no arrow back up. Walks every import with ast.

core      pure: chain plan/ports/scope, GPU allocator/inventory/requests, worker codec/controller, grammar,
          labels, errors, events. Imports only the standard library and itself, and none of its I/O:
          clocks, threads, ids, process facts and files reach it through parameters and ports.
adapters  the only I/O: the Docker engine, child processes, NVML, files, descriptors, identity, the clock.
app       the use cases, over core and adapters; no I/O of its own (no subprocess, socket, files, descriptors).
testing   the fake NVIDIA host and test helpers for suites (ours and users'), beside app; test doubles of hosts
          and files, so I/O is theirs by nature.
cli       Click and rich, over everything; nothing imports it but itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch"
FLOORS = {"core": 0, "adapters": 1, "app": 2, "testing": 2, "cli": 3}
FOREIGN = {"docker", "requests", "pynvml", "click", "rich", "ray"}
ONLY = {
    "docker": {"adapters.docker_engine", "adapters.docker_client"},
    "requests": {"adapters.docker_engine", "adapters.docker_client"},
    "pynvml": {"adapters.nvml"},
    "ray": {"adapters.ray_cluster"},
}


# What the core may not import: I/O, clocks, threads, randomness.
CORE_FORBIDDEN = {
    "os", "subprocess", "socket", "threading", "time", "secrets", "random", "pathlib", "concurrent", "queue",
    "shutil", "tempfile", "select", "selectors", "fcntl", "io", "asyncio", "multiprocessing", "uuid", "glob",
}  # fmt: skip
# What the use cases may not import or call: I/O belongs to the adapters.
APP_FORBIDDEN = {"subprocess", "socket", "pathlib", "shutil", "tempfile", "select", "selectors", "fcntl", "io"}
OS_ALLOWED = {"environ", "getenv", "path", "sep", "devnull"}  # reading configuration, joining names
IO_BUILTINS = {"open", "input", "print"}


def violations(module: str, source: str) -> list[str]:
    """Where `module` (dotted, below pp_launch) breaks its floor's rules on I/O."""
    top = module.split(".")[0]
    if top not in ("core", "app"):
        return []
    forbidden = CORE_FORBIDDEN if top == "core" else APP_FORBIDDEN
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found += [f"imports {n}" for n in names if n.split(".")[0] in forbidden]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
            found.append(f"calls {node.func.id}()")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr not in OS_ALLOWED
        ):
            found.append(f"uses os.{node.attr}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/proc/" in node.value:
            found.append("reads /proc")
    return found


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


ENGINE_ADAPTERS = ("pp_launch.adapters.docker_engine", "pp_launch.adapters.docker_client")


@pytest.mark.parametrize(("module", "path"), [m for m in modules() if m[0].startswith(("cli.", "testing."))])
def test_the_cli_and_the_kit_go_through_the_use_cases_alone(module: str, path: Path) -> None:
    """The CLI and the testing kit are users of pp-launch: every piece of I/O they need is a use case's (app/),
    never an adapter reached around it."""
    reached = [t for t in imports(path) if t.startswith("pp_launch.adapters")]
    assert reached == [], f"{module} reaches an adapter itself: {reached}"


@pytest.mark.parametrize(("module", "path"), [m for m in modules() if m[0].startswith("testing.")])
def test_the_testing_kit_reaches_engines_only_through_the_use_cases(module: str, path: Path) -> None:
    """The kit is a user of pp-launch like the CLI: an engine is the app's to reach (app.hosts.engine_here), so
    a user's tests meet the same engines, errors and timeouts as pp-launch itself."""
    reached = [t for t in imports(path) if t.startswith(ENGINE_ADAPTERS)]
    assert reached == [], f"{module} reaches an engine itself: {reached}"


def test_every_module_lives_on_a_floor() -> None:
    loose = [m for m, _ in modules() if floor(m) is None and m not in ("pp_launch", "__main__")]
    assert loose == []


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_the_core_does_no_io_and_the_use_cases_leave_io_to_the_adapters(module: str, path: Path) -> None:
    assert violations(module, path.read_text()) == []


CORE_BREAKS = [f"import {name}\n" for name in sorted(CORE_FORBIDDEN)] + [
    "from pathlib import Path\n",
    "from concurrent.futures import ThreadPoolExecutor\n",
    "import os.path\n",
    "x = open('f').read()\n",
    "print('hello')\n",
    "STAT = '/proc/self/stat'\n",
]
APP_BREAKS = [f"import {name}\n" for name in sorted(APP_FORBIDDEN)] + [
    "import os\nos.write(1, b'x')\n",
    "import os\nos.makedirs('d')\n",
    "data = open('f').read()\n",
]


@pytest.mark.parametrize("added", CORE_BREAKS)
def test_each_forbidden_thing_added_to_a_core_module_on_purpose_fails(added: str) -> None:
    clean = (PKG / "core" / "chain" / "plan.py").read_text()
    assert violations("core.chain.plan", clean) == []
    assert violations("core.chain.plan", clean + added) != [], added


@pytest.mark.parametrize("added", APP_BREAKS)
def test_each_io_added_to_a_use_case_on_purpose_fails(added: str) -> None:
    clean = (PKG / "app" / "chain.py").read_text()
    assert violations("app.chain", clean) == []
    assert violations("app.chain", clean + added) != [], added


def test_os_environ_stays_allowed_in_the_use_cases() -> None:
    assert violations("app.chain", "import os\nx = os.environ.get('A')\ny = os.path.join('a', 'b')\n") == []


CLI_MODULES = [(m, p) for m, p in modules() if m.startswith("cli.")]


@pytest.mark.parametrize(("module", "path"), CLI_MODULES, ids=[m for m, _ in CLI_MODULES])
def test_no_cli_module_connects_to_an_engine(module: str, path: Path) -> None:
    """The CLI parses and renders: reaching an engine is a use case's (app/), never a command's own."""
    for target in imports(path):
        assert target != "pp_launch.adapters.docker_engine.connect", f"{module} imports docker_engine.connect"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "connect" and isinstance(node.value, ast.Name):
            assert node.value.id not in ("docker_engine", "docker"), f"{module} calls {node.value.id}.connect"


def test_the_cli_rule_sees_a_connect() -> None:
    """The rule above, on a command that connects by itself: it fails."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad_cmd.py"
        bad.write_text("from pp_launch.adapters.docker_engine import connect\n")
        with pytest.raises(AssertionError, match=r"imports docker_engine\.connect"):
            test_no_cli_module_connects_to_an_engine("cli.bad_cmd", bad)


HOUSEKEEPING_COMMANDS = ("cli.housekeeping_cmd", "cli.runs_cmd", "cli.engines")


def site_blind(module: str, path: Path) -> list[str]:
    """What a housekeeping command imports that belongs to one kind of site: an adapter, or Ray's use cases."""
    return [t for t in imports(path) if t.startswith("pp_launch.adapters") or t.startswith("pp_launch.app.on_ray")]


@pytest.mark.parametrize("module", HOUSEKEEPING_COMMANDS)
def test_the_housekeeping_commands_ask_a_site_and_never_a_kind_of_site(module: str) -> None:
    """ps, down, gc, logs and wait parse, ask app/runs.py, and render: what a Docker engine or a Ray cluster is
    stays below them."""
    path = PKG / (module.replace(".", "/") + ".py")
    assert site_blind(module, path) == []


def test_the_site_rule_sees_an_adapter(tmp_path: Path) -> None:
    bad = tmp_path / "ps_cmd.py"
    bad.write_text("from pp_launch.adapters.docker_engine import Engine\nfrom pp_launch.app import on_ray\n")
    assert site_blind("cli.ps_cmd", bad) == ["pp_launch.adapters.docker_engine.Engine", "pp_launch.app.on_ray"]


def import_graph() -> dict[str, set[str]]:
    """Each module and the modules of ours it imports, at its top or inside a function."""
    known = dict(modules())
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        found = set()
        for target in imports(path):
            name = target.removeprefix("pp_launch.")
            while name and name not in known:  # pp_launch.app.launch.Hooks -> app.launch
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
        graph[module] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle, as the path that closes it (a depth-first walk)."""
    found, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                walk(nxt, [*path, nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle between modules, even through an import inside a function: each module can be read, and
    tested, from the ones it needs."""
    assert cycles(import_graph()) == []


def test_the_circle_rule_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
