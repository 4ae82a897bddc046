"""The fixtures and leak guard of pp-launch's pytest plugin, loaded only when a project enables it (`-p pp_launch`
or `pp_launch = true` in its ini file): see pp_launch/testing/plugin.py. Needs `pip install 'pp-launch[testing]'`.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pytest

from pp_launch.app import gpus as gpu_select
from pp_launch.testing import kit

TESTCONTAINERS_SESSION = "org.testcontainers.session-id"


# ------------------------------------------------------------------------------------------------ leak guard
LAUNCHER_PROGRAMS = {"pp-launch", "pp-gpu-node", "docker-gpu-node.sh"}


def is_launcher(argv: list[str]) -> bool:
    """pp-launch, pp-gpu-node or the old shim as a program or a script, or `python -m pp_launch[.…]` (the
    launcher, its watchdog); not anything that merely has "pp-launch" in a path."""
    if any(os.path.basename(a) in LAUNCHER_PROGRAMS for a in argv[:2]):
        return True
    if "pp_launch.adapters.watchdog" in argv[:6]:  # the watchdog, started isolated (python -I -c BOOT ...)
        return True
    return any(a == "-m" and b.split(".")[0] == "pp_launch" for a, b in itertools.pairwise(argv))


def _session_id() -> str | None:
    try:
        from testcontainers.core.labels import SESSION_ID
    except ImportError:  # an older testcontainers
        return None
    return str(SESSION_ID)


def _containers(engine: Any) -> dict[str, dict[str, Any]]:
    """Containers this session made: pp-launch's (owner: this process or a process it started) and
    testcontainers' (this session's id). Per process, so per pytest-xdist worker."""
    from pp_launch.app import chain as steps
    from pp_launch.core import labels

    me, host = os.getpid(), steps.this_host()
    found: dict[str, dict[str, Any]] = {}
    for c in engine.containers([labels.RUN]):
        owner = labels.Owner.parse(c.labels.get(labels.OWNER, ""))
        if owner is not None and owner.host == host and (owner.pid == me or _descends_from(owner.pid, me)):
            found[c.id] = {"name": c.name, "image": c.image, "labels": dict(c.labels), "state": c.state}
    session = _session_id()
    if session is not None:
        for c in engine.containers([f"{TESTCONTAINERS_SESSION}={session}"]):
            found[c.id] = {"name": c.name, "image": c.image, "labels": dict(c.labels), "state": c.state}
    return found


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


WATCHDOG = "pp_launch.adapters.watchdog"


def _launchers(keep_runs: set[str] | frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """Launcher processes started by this process (or its children) that still run; a watchdog of a run in
    `keep_runs` (its containers are still rightly there: a wider-scope fixture's) is not one."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            argv = [a.decode(errors="replace") for a in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        run = argv[argv.index(WATCHDOG) + 1 :][:1] if WATCHDOG in argv[:6] else []
        if run and run[0] in keep_runs:
            continue
        if is_launcher(argv) and _descends_from(int(entry), me):
            out.append((int(entry), " ".join(argv)))
    return out


ENGINE_FIXTURES = frozenset({"pp_engine", "pp_stage", "pp_chain"})
SETTLE = 5.0  # auto-remove takes a moment after a stage exits; a chain's watchdog ends a moment after the chain


class LeakGuard:
    """Checks the tests that use the engine fixtures (directly or through fixtures of their own), over one
    connection. A container is counted as a test's only when it appeared during that test and is not held by a
    fixture of a wider scope still in use; a fixture of module, class, package or session scope is checked when
    its scope ends. When the list of containers before a test cannot be had, the test errors and nothing is
    removed: the guard never removes what it cannot prove the test made."""

    def __init__(self) -> None:
        self._engine: Any = None
        self.before: dict[str, dict[str, Any]] | None = None
        self.baseline_error = ""
        self.held: dict[int, set[str]] = {}  # id(fixturedef) of a wider-scope fixture -> the containers it made

    def _list(self) -> dict[str, dict[str, Any]]:
        if self._engine is None:
            from pp_launch.app.hosts import engine_here

            self._engine = engine_here(timeout=10)
        return _containers(self._engine)

    @staticmethod
    def watched(item: pytest.Item) -> bool:
        return bool(ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self.before, self.baseline_error = None, ""
        if self.watched(item):
            try:
                self.before = self._list()
            except Exception as exc:  # whatever it was: reported at teardown, and nothing is removed
                self.baseline_error = f"{type(exc).__name__}: {exc}"
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
        if fixturedef.scope == "function" or self.before is None:
            return (yield)
        before = set(self._list())
        result = yield
        self.held.setdefault(id(fixturedef), set()).update(set(self._list()) - before)
        return result

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
        made = self.held.pop(id(fixturedef), set())
        if not made:
            return
        left = self._settle(lambda: {k: v for k, v in self._list().items() if k in made})
        if left:
            self._remove(left)
            raise pytest.fail.Exception(
                f"pp-launch leak guard: fixture {fixturedef.argname} ({fixturedef.scope} scope) left "
                + "; ".join(self._describe(cid, c) for cid, c in left.items()),
                pytrace=False,
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        result = yield
        if not self.watched(item):
            return result
        if self.before is None:
            try:
                self._list()
            except Exception:
                return result  # no engine before nor after: the test could make nothing (it was skipped or failed)
            raise pytest.fail.Exception(
                f"pp-launch leak guard: could not list the engine's containers before {item.nodeid} "
                f"({self.baseline_error}): nothing was checked and nothing removed",
                pytrace=False,
            )
        problems = self._check(item, self.before)
        if problems:
            raise pytest.fail.Exception("pp-launch leak guard:\n  " + "\n  ".join(problems), pytrace=False)
        return result

    @staticmethod
    def _settle(find: Callable[[], dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + SETTLE
        left = find()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = find()
        return left

    @staticmethod
    def _describe(cid: str, c: dict[str, Any]) -> str:
        return f"container {c['name']} ({cid[:12]}, {c['state']}, image {c['image']}, labels {c['labels']})"

    def _remove(self, left: dict[str, dict[str, Any]]) -> list[str]:
        problems = []
        for cid in left:
            try:
                self._engine.remove(cid)
            except Exception as exc:
                problems.append(f"and {cid[:12]} could not be removed: {exc}")
        return problems

    def _check(self, item: pytest.Item, before: dict[str, dict[str, Any]]) -> list[str]:
        held = set().union(*self.held.values()) if self.held else set()
        left = self._settle(lambda: {k: v for k, v in self._list().items() if k not in before and k not in held})
        problems = [f"{item.nodeid} left {self._describe(cid, c)}" for cid, c in left.items()]
        problems += self._remove(left)
        kept = {c["labels"].get("pp-launch.run", "") for k, c in self._list().items() if k in before or k in held}
        deadline = time.monotonic() + SETTLE
        while _launchers(kept) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid, cmd in _launchers(kept):
            problems.append(f"{item.nodeid} left launcher process {pid}: {cmd}")
            with suppress(OSError):
                os.kill(pid, 9)
        return problems


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def pp_engine() -> Any:
    """The Docker engine (DOCKER_HOST or the default), one connection for the session; fails under CI=true when
    none answers, skips elsewhere."""
    from pp_launch.app.hosts import engine_here
    from pp_launch.core import errors

    try:
        return engine_here(timeout=10)
    except errors.PpLaunchError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Docker engine answers (CI=true: Docker tests fail, never skip): {exc}", pytrace=False)
        pytest.skip(f"no Docker engine answers: {exc}")


@pytest.fixture
def pp_stage(pp_engine: Any) -> Iterator[Callable[..., kit.StageContainer]]:
    """Factory: pp_stage(image, stage=0, num_stages=1, env=..., gpus=...) -> a started StageContainer (a pp-launch
    stage: our labels, tini, auto-remove, the stdin lifeline), stopped with our teardown when the test ends."""
    made: list[kit.StageContainer] = []

    def make(image: str, **kwargs: Any) -> kit.StageContainer:
        stage = kit.StageContainer(image, **kwargs)
        made.append(stage)
        return stage.start()

    yield make
    for stage in made:
        stage.stop()


@pytest.fixture
def pp_chain(pp_engine: Any) -> Iterator[Callable[..., kit.RunningChain]]:
    """Factory: pp_chain(image, stages=2, env=..., gpus=..., ...) -> a RunningChain once every stage announced
    (roster, events, each stage's lines), torn down when the test ends, however it ends."""
    with ExitStack() as stack:
        yield lambda image=kit.BUILTIN_IMAGE, **kw: stack.enter_context(kit.Chain(image, **kw))


@pytest.fixture(scope="session")
def pp_gpu_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPU inventory file (docs/formats.md): PP_LAUNCH_GPU_INVENTORY, else an 8-GPU machine written for the session;
    pair it with `--gpu-inventory` or `Chain(gpu_inventory=...)` to test GPU placement without a GPU."""
    given = os.environ.get("PP_LAUNCH_GPU_INVENTORY")
    if given:
        return Path(given)
    import dataclasses

    from pp_launch.testing.inventories import random_inventory

    inv = random_inventory(random.Random(8), 8, unknowns=False, mig=False)
    inv = dataclasses.replace(
        inv, gpus=tuple(dataclasses.replace(g, processes=(), memory_used_mib=512) for g in inv.gpus)
    )
    path = tmp_path_factory.mktemp("pp-gpus") / "inventory.json"
    gpu_select.save_inventory(inv, str(path))
    return path
