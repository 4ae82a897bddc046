"""pp-launch's pytest plugin (entry point `pytest11: pp_launch`).

Fixtures, available wherever the package is installed (a fixture does nothing until a test asks for it):
  pp_engine          the Docker engine (DOCKER_HOST or the default); fails under CI=true when none answers,
                     skips elsewhere
  pp_stage           factory: pp_stage(image, stage=0, num_stages=1, env=..., gpus=...) -> a started
                     StageContainer, stopped with our teardown at the end of the test
  pp_chain           factory: pp_chain(image, stages=2, ...) -> a RunningChain, torn down at the end of the test
  pp_gpu_inventory   an inventory file (contract §7): PP_LAUNCH_GPU_INVENTORY, else an 8-GPU machine written
                     for the session (pair it with `--gpu-inventory` or `Chain(gpu_inventory=...)`)

The leak guard is opt-in per project: `-p pp_launch` on the command line, or `pp_launch = true` in the ini
file. With it, a test that leaves a pp-launch container of this session's processes, a testcontainers container
of this session, or a launcher process it started fails in its teardown, naming the container, its image and
labels; what it left is then removed.
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

from pp_launch.testing import kit

TESTCONTAINERS_SESSION = "org.testcontainers.session-id"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("pp_launch", "turn on pp-launch's leak guard (a test that leaves a container fails)", type="bool",
                  default=False)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    asked = "pp_launch" in (getattr(config.option, "plugins", None) or [])
    if (asked or config.getini("pp_launch")) and not config.pluginmanager.has_plugin("pp_launch_leak_guard"):
        config.pluginmanager.register(LeakGuard(), "pp_launch_leak_guard")


# ------------------------------------------------------------------------------------------------ leak guard
def _session_id() -> str | None:
    try:
        from testcontainers.core.labels import SESSION_ID
    except ImportError:  # an older testcontainers
        return None
    return str(SESSION_ID)


def _containers() -> dict[str, dict[str, Any]]:
    """Containers this session made: pp-launch's (owner: this process or a process it started) and
    testcontainers' (this session's id)."""
    from pp_launch.adapters import docker_engine
    from pp_launch.core import labels

    engine = docker_engine.connect()
    me = os.getpid()
    found: dict[str, dict[str, Any]] = {}
    for c in engine.containers([labels.RUN]):
        owner = labels.Owner.parse(c.labels.get(labels.OWNER, ""))
        if owner is not None and owner.is_local() and (owner.pid == me or _descends_from(owner.pid, me)):
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


LAUNCHER_PROGRAMS = {"pp-launch", "pp-gpu-node", "docker-gpu-node.sh"}


def is_launcher(argv: list[str]) -> bool:
    """pp-launch, pp-gpu-node or the old shim as a program or a script, or `python -m pp_launch[.…]` (the
    launcher, its watchdog); not anything that merely has "pp-launch" in a path."""
    if any(os.path.basename(a) in LAUNCHER_PROGRAMS for a in argv[:2]):
        return True
    if "pp_launch.adapters.watchdog" in argv[:6]:  # the watchdog, started isolated (python -I -c BOOT ...)
        return True
    return any(a == "-m" and b.split(".")[0] == "pp_launch" for a, b in itertools.pairwise(argv))


def _launchers() -> list[tuple[int, str]]:
    """Launcher processes started by this process (or its children) that still run."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            argv = [a.decode(errors="replace") for a in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if is_launcher(argv) and _descends_from(int(entry), me):
            out.append((int(entry), " ".join(argv)))
    return out


class LeakGuard:
    def __init__(self) -> None:
        self.before: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        try:
            self.before = _containers()
        except Exception:
            self.before = {}
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        result = yield
        problems = self._check(item)
        if problems:
            raise pytest.fail.Exception("pp-launch leak guard:\n  " + "\n  ".join(problems), pytrace=False)
        return result

    def _check(self, item: pytest.Item) -> list[str]:
        from pp_launch.testing.kit import remove

        try:
            deadline = time.monotonic() + 5  # auto-remove takes a moment after a stage exits
            left = {k: v for k, v in _containers().items() if k not in self.before}
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = {k: v for k, v in _containers().items() if k not in self.before}
        except Exception:
            left = {}
        problems = [f"{item.nodeid} left container {c['name']} ({cid[:12]}, {c['state']}, image {c['image']}, "
                    f"labels {c['labels']})" for cid, c in left.items()]  # fmt: skip
        for cid in left:
            try:
                remove(cid)
            except Exception as exc:
                problems.append(f"and it could not be removed: {exc}")
        deadline = time.monotonic() + 5  # a chain's watchdog ends a moment after the chain
        while _launchers() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid, cmd in _launchers():
            problems.append(f"{item.nodeid} left launcher process {pid}: {cmd}")
            with suppress(OSError):
                os.kill(pid, 9)
        return problems


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def pp_engine() -> Any:
    from pp_launch.adapters import docker_engine
    from pp_launch.core import errors

    try:
        return docker_engine.connect(timeout=10)
    except errors.PpLaunchError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Docker engine answers (CI=true: Docker tests fail, never skip): {exc}", pytrace=False)
        pytest.skip(f"no Docker engine answers: {exc}")


@pytest.fixture
def pp_stage(pp_engine: Any) -> Iterator[Callable[..., kit.StageContainer]]:
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
    with ExitStack() as stack:
        yield lambda image=kit.BUILTIN_IMAGE, **kw: stack.enter_context(kit.Chain(image, **kw))


@pytest.fixture(scope="session")
def pp_gpu_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("PP_LAUNCH_GPU_INVENTORY")
    if given:
        return Path(given)
    import dataclasses

    from pp_launch.testing.inventories import random_inventory

    inv = random_inventory(random.Random(8), 8, unknowns=False, mig=False)
    inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, processes=(), memory_used_mib=512)
                                              for g in inv.gpus))  # fmt: skip
    path = tmp_path_factory.mktemp("pp-gpus") / "inventory.json"
    inv.save(path)
    return path
