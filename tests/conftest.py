"""Shared fixtures. Docker tests fail (never skip) under CI=true when no engine answers, and the session
fails if anything of ours is left: a container labelled pp-launch.run, a testcontainers container of this
session, a launcher process a test started, or a watchdog of a launcher of this session."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # Ryuk cannot be pulled here; we reap by label

import atexit
import contextlib
import ctypes
import json
import shutil
import signal
import tempfile
import time

import pytest

from pp_launch.testing import fake_nvml

from .helpers import FAILED, TESTCONTAINERS_LABEL, live_launchers, ours, records_made_under, wait_until, watchdogs
from .quick import quick
from .story import Chapter

# The suite's own host, whatever this machine is: a state directory (lock, reservations) of its own,
# never the one real runs use, and an NVML that says "no GPU" unless a test gives it an inventory. The fake
# libnvidia-ml.so.1 is loaded here before anything imports pynvml (a later dlopen of that name finds it, even on a
# host with a driver) and is first on the library path of every child; with no config it answers as a host
# whose driver is not loaded. Tests that mean GPUs use the fake NVIDIA host (gpu_host) or an inventory file.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="pp-tests-"))
atexit.register(shutil.rmtree, _SESSION_DIR, True)
FAKE_NVML = fake_nvml.build(_SESSION_DIR / "nvml")
ctypes.CDLL(str(FAKE_NVML), mode=ctypes.RTLD_GLOBAL)
os.environ.update(fake_nvml.environ(FAKE_NVML.parent, _SESSION_DIR / "no-gpu"))
os.environ["PP_LAUNCH_STATE_DIR"] = str(_SESSION_DIR / "state")
# The suite runs beside real work: pp-launch acts only on the ids its runs' guards recorded, never on a label match
# (PP_LAUNCH_SWEEP is accepted and does nothing; the test of that sets it both ways).
os.environ["PP_LAUNCH_SWEEP"] = "0"
SESSION_MARK = {"PP_TESTS_SESSION": str(_SESSION_DIR)}  # every child inherits it: how our watchdogs are known
os.environ.update(SESSION_MARK)

IN_CI = os.environ.get("CI") == "true"
pytest_plugins = ["pytester"]  # the testing kit's own tests run inner sessions


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The directory holding the fake libnvidia-ml.so.1, built with gcc for this session."""
    return FAKE_NVML.parent


@pytest.fixture(scope="session")
def engine(pp_engine):  # type: ignore[no-untyped-def]
    """The plugin's pp_engine (pp_launch.testing.plugin), as a user's suite has it: fails under CI=true when no
    engine answers, skips elsewhere."""
    return pp_engine


@pytest.fixture(scope="session")
def stub_image(engine) -> str:  # type: ignore[no-untyped-def]
    from pp_launch.adapters import images

    images.build_all(engine, lambda text: None)
    return images.BUILTIN_IMAGE


@pytest.fixture(scope="session")
def our_images(stub_image) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """What a test engine needs to run chains: the stage image and pp-launch's guard image."""
    from pp_launch.core.chain.plan import GUARD_IMAGE

    return (stub_image, GUARD_IMAGE)


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


# Costly to make (an engine, a cluster, a browser): made once per session, so every test that uses one runs on the
# same pytest-xdist worker (`--dist loadgroup`, docs/tests.md). Tests that use none are spread over every worker.
MADE_ONCE = {
    "side_engine": "side-engine",
    "broken_engine": "side-engine",
    "gpu_host": "gpu-host",
    "bed": "three-hosts",
    "clean": "three-hosts",
    "cluster": "ray",
    "nothing_left": "ray",
    "site": "docs-site",
    "browser": "docs-site",
    "swactor_like_image": "swactor-like-image",  # built for its module, removed at its end
    "installed": "wheel",  # a wheel built in the checkout's own build/ folder: one build at a time
}


def _group(item: pytest.Item) -> str | None:
    """The worker group of a test: its costly fixture's, or the engine's GPUs'; None: any worker."""
    group = next((MADE_ONCE[f] for f in getattr(item, "fixturenames", ()) if f in MADE_ONCE), None)
    if group is None and item.get_closest_marker("engine_gpus"):
        group = "engine-gpus"  # GPUs held on the suite's engine: every such test sees the others' holdings
    return group


GROUPS_ENV = "PP_TESTS_GROUPS"  # where the workers write each test's group for the controller's scheduler


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getvalue("dist") == "loadgroup":  # the pytest-xdist controller
        folder = Path(tempfile.mkdtemp(prefix="pp-tests-groups-"))  # 0700: nothing another user could plant
        atexit.register(shutil.rmtree, folder, True)
        os.environ[GROUPS_ENV] = str(folder / "groups.json")  # the workers it starts inherit it


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A real-engine test outside the quick tier (tests/quick.py) is marked `full`. Under pytest-xdist, each worker
    writes every test's group (they all collect the same tests); the scheduler below reads it (xdist's own
    `xdist_group` marks no longer reach its scheduler under pytest 9.2, which names tests by `_id`)."""
    for item in items:
        module = getattr(item, "module", None)
        name = getattr(module, "__name__", "")
        function = getattr(item, "originalname", item.name)
        if ".integration." in name and not quick(name.rsplit(".", 1)[1], function):
            item.add_marker(pytest.mark.full)
    path = os.environ.get(GROUPS_ENV)
    if path and hasattr(config, "workerinput"):
        groups = {item.nodeid: g for item in items if (g := _group(item)) is not None}
        part = f"{path}.{os.getpid()}"
        Path(part).write_text(json.dumps(groups))
        os.replace(part, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup`: the tests of one group on one worker (groups first, the largest first), every other test
    wherever a worker is free."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once every worker collected (schedule() runs only then)
                self.groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
            return self.groups.get(nodeid, nodeid)

    return ByGroup(config, log)


CPU_LOG = os.environ.get("PP_TESTS_CPU_LOG")  # a file: each test's share of the machine's CPU, one line per test


def _machine_cpu() -> float:
    """CPU-seconds the whole machine has spent busy (every process: the engine, containers, launchers)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    item.stash[_CHAPTER] = Chapter()
    if not CPU_LOG:
        return (yield)
    cpu, wall, began = _machine_cpu(), time.monotonic(), time.time()
    try:
        return (yield)
    finally:  # measured with one test at a time (no xdist): the machine's CPU is then this test's
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")  # and when, on which worker: the parallel run's timeline
        with open(CPU_LOG, "a") as log:
            took = f"{_machine_cpu() - cpu:.2f}\t{time.monotonic() - wall:.2f}"
            log.write(f"{took}\t{item.nodeid}\t{began:.1f}\t{worker}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A failed test that used an engine or started a launcher says what its runs did (tests/story.py)."""
    report: pytest.TestReport = yield
    item.stash[FAILED] = item.stash.get(FAILED, False) or report.failed  # for a fixture's teardown to tell more
    chapter = item.stash.get(_CHAPTER, None)
    if report.failed and chapter is not None and (chapter.launchers() or "engine" in getattr(item, "fixturenames", ())):
        try:
            report.sections.append(("what the test's runs did", chapter.tell()))
        except Exception as exc:  # the story is help, never a second failure
            report.sections.append(("what the test's runs did", f"(could not be told: {exc!r})"))
    return report


_CHAPTER = pytest.StashKey[Chapter]()
_from_workers: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist: what a worker found left at its end (below) fails the whole run, here in the controller."""
    _from_workers.extend(getattr(node, "workeroutput", {}).get("pp_problems", []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set in a pytest-xdist worker
    problems = list(_from_workers)
    if IN_CI and _skipped and workeroutput is None:  # the controller hears every worker's reports
        problems.append(f"CI=true and {len(_skipped)} tests were skipped: " + ", ".join(_skipped[:5]))
    problems += _left_by_this_process(_made_here(session.config))
    if workeroutput is not None:
        workeroutput["pp_problems"] = problems
        return
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "FAILING THE SUITE:\n  " + "\n  ".join(problems)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _made_here(config: pytest.Config) -> list[Path]:
    """Where this process's tests kept state: the session's own directory, and each test's temporary folders (tests
    that act as another machine or user give pp-launch a state directory there)."""
    places = [_SESSION_DIR]
    with contextlib.suppress(Exception):
        places.append(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    return places


def _left_by_this_process(places: list[Path]) -> list[str]:
    """What this process's tests left: launchers, watchdogs, containers (each removed once named)."""
    problems = []
    for proc in live_launchers():
        proc.kill()
        problems.append(f"launcher process {proc.pid} ({' '.join(proc.args[3:6])}...) was still running")
    # A watchdog still at work when its test ended (a sweep under way) is given a moment; one still retrying
    # after that waits for an engine that will not come back (torn down under it): a process left behind.
    if not wait_until(lambda: not watchdogs(**SESSION_MARK), 20, 0.5):
        for pid in watchdogs(**SESSION_MARK):
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
                problems.append(f"watchdog process {pid} ({cmd.strip()}) was still running")
    try:
        from pp_launch.adapters.docker_engine import connect

        engine = connect(timeout=5)
    except Exception:
        engine = None
    if engine is not None:
        leftovers = [c for c in engine.containers(["pp-launch.run"]) if ours(dict(c.labels))]
        leftovers += engine.containers([TESTCONTAINERS_LABEL])
        for c in leftovers:
            problems.append(f"container {c.name} ({c.state}, labels {dict(c.labels)}) was left behind")
            engine.remove(c.id)
        # each run's record volume is kept by design (for `wait` and `ps -a`, until `gc` finds it old): the ones this
        # session's runs made (each state directory its launchers used lists them, as a user's does) go now
        made = records_made_under(*places)
        for volume in made:
            engine.remove_volume(volume)  # not there: on an engine of a test's own, gone with it
        left = {v.name for v in engine.volumes(["pp-launch.stage=record"])}
        problems += [f"the record volume {volume} is still in use" for volume in made if volume in left]
    return problems


@pytest.fixture(scope="session")
def as_nobody_argv(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, str]]:
    """How a test runs pp-launch as a second, unprivileged user (`nobody`): the argv before pp-launch's own arguments,
    and the environment it needs. pp-launch comes from a world-readable copy, since the checkout may be in a folder
    only its owner can read (0700, as anything under /root)."""
    import sys

    from .helpers import NOBODY, readable_install

    place = Path(tempfile.mkdtemp(prefix="pp-tests-readable-", dir="/tmp"))
    atexit.register(shutil.rmtree, place, True)
    readable_install(place / "site")
    place.chmod(0o755)
    python = os.path.realpath(sys.executable)
    return [*NOBODY, python, "-s", "-m", "pp_launch"], {"PYTHONPATH": str(place / "site")}


@pytest.fixture(scope="session")
def side_engine(engine, our_images):  # type: ignore[no-untyped-def]
    """A second engine that tests may kill, freeze, stop or restart; the stub image loaded into it."""
    from pathlib import Path

    from .engines import SideEngine

    bridge = Path("/sys/class/net/docker0")
    had_bridge = bridge.exists()
    side = SideEngine("faults")
    try:
        side.start()
        side.load(*our_images)
        yield side
    finally:
        side.close()
        left = side.leftovers()
        if left:
            pytest.fail(f"the side engine left {left}", pytrace=False)
        if had_bridge and not bridge.exists():
            pytest.fail("the side engine removed the main engine's docker0 bridge", pytrace=False)


@pytest.fixture(scope="session")
def gpu_host(engine, our_images):  # type: ignore[no-untyped-def]
    """The fake NVIDIA host (tests/gpu_host.py): fake NVML for launchers, GPU engines started on first use."""
    from .gpu_host import FakeGpuHost

    host = FakeGpuHost()
    host.images = our_images
    try:
        yield host
    finally:
        left = host.close()
        if left:
            pytest.fail(f"the fake GPU host left {left}", pytrace=False)


@pytest.fixture
def broken_engine(side_engine):  # type: ignore[no-untyped-def]
    """The side engine, running, and running again after the test (which may break it)."""
    side_engine.ensure_running()
    yield side_engine
    side_engine.ensure_running()
    from .helpers import wait_until

    # a test that failed before the engine was back leaves its run to the run's watchdog, which removes it now:
    # only what it has not removed within its patience was left
    wait_until(lambda: not side_engine.ours_listed(), 60)
    ids = side_engine.ours_listed()
    if ids:
        from .helpers import DESCRIBE

        what = side_engine.docker("inspect", "-f", DESCRIBE, *ids, check=False).stdout.strip()
        side_engine.docker("rm", "-f", *ids, check=False)
        pytest.fail(f"containers of ours were left on the side engine: {ids}\n{what}", pytrace=False)
