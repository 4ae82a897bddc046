"""pp_launch.testing's kit and pytest plugin, tested as a user would use them: inner pytest runs (pytester, in a
subprocess so each has its own process and owner) on the real engine; the outer suite stays green and clean."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from pp_launch.core import errors, labels
from pp_launch.testing.kit import BUILTIN_IMAGE, Chain, StageContainer, StageExited, StageTimeout, WorkerUnderTest

from ..helpers import BUSY_SLACK, run_containers

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "test_my_stage.py"


def test_the_leak_guard_fails_the_test_that_left_a_container_and_removes_it(pytester: pytest.Pytester, engine) -> None:
    pytester.makepyfile(
        test_inner=f"""
from pp_launch.testing.kit import StageContainer

def test_leaks(pp_engine):
    StageContainer({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).start().wait_for_announcement(30)

def test_not_watched():  # uses no engine fixture: the guard leaves it alone (and costs it nothing)
    pass

def test_clean(pp_stage):
    pp_stage({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).wait_for_announcement(30)
"""
    )
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        ["*pp-launch leak guard:*", f"*test_inner.py::test_leaks left container *image {BUILTIN_IMAGE}*pp-launch.run*"]
    )
    assert "test_clean left" not in result.stdout.str()
    assert [c for c in engine.containers([labels.RUN]) if c.image == BUILTIN_IMAGE and "test_inner" in c.name] == []


def test_the_leak_guard_works_per_xdist_worker(pytester: pytest.Pytester, engine) -> None:
    """Each worker is a process of its own: it sees its own tests' containers, never another worker's."""
    for name in ("a", "b"):
        pytester.makepyfile(
            **{
                f"test_{name}": f"""
from pp_launch.testing.kit import StageContainer

def test_leaks_{name}(pp_engine):
    StageContainer({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).start().wait_for_announcement(60)

def test_clean_{name}(pp_stage):
    pp_stage({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).wait_for_announcement(60)
"""
            }
        )
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=4, errors=2)
    out = result.stdout.str()
    assert "test_a.py::test_leaks_a left container" in out and "test_b.py::test_leaks_b left container" in out
    assert "test_clean_a left" not in out and "test_clean_b left" not in out
    leaked = re.findall(r"left container (pp-[0-9a-f]{12}-0) ", out)
    assert len(set(leaked)) == 2 and all(engine.inspect(name) is None for name in leaked)  # each removed


def test_without_the_opt_in_there_is_no_guard(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1)
    assert "leak guard" not in result.stdout.str()


def test_the_example_passes_as_a_user_runs_it(pytester: pytest.Pytester) -> None:
    shutil.copy(EXAMPLE, pytester.path / "test_my_stage.py")
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_docs_example_runs_as_written(pytester: pytest.Pytester) -> None:
    readme = (ROOT / "docs" / "testing-kit.md").read_text()
    block = readme.split("# README example, run as written by tests/integration/test_testing_kit.py", 1)[1]
    code = block.split("\n", 1)[1].split("```", 1)[0]
    (pytester.path / "test_readme_example.py").write_text(code)
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_stage_container_stop_on_a_sigterm_ignoring_stage_takes_about_one_grace(engine) -> None:
    before = set(threading.enumerate())
    stage = StageContainer(BUILTIN_IMAGE, env={"STUB_MODE": "hold", "STUB_IGNORE_SIGTERM": "1"}, grace=2.0).start()
    try:
        stage.wait_for_announcement(30)
        t0 = time.monotonic()
        stage.stop()
        took = time.monotonic() - t0
    finally:
        stage.stop()
    assert 1.9 <= took <= 2 + BUSY_SLACK, took  # the grace honoured, then a kill (not testcontainers' bare kill)
    assert stage.exit_code() is not None
    assert engine.inspect(stage.ref or "") is None  # auto-removed
    left = [t.name for t in threading.enumerate() if t not in before]
    assert left == [], f"threads the stage started and stop() did not join: {left}"


def test_a_stage_container_that_exits_by_itself_says_how_and_leaves_no_thread(engine) -> None:
    before = set(threading.enumerate())
    exits = {"STUB_MODE": "hold", "STUB_EXIT_AFTER": "0.5", "STUB_EXIT_CODE": "3"}
    stage = StageContainer(BUILTIN_IMAGE, env=exits).start()
    try:
        assert stage.exit_code(timeout=60) == 3
    finally:
        stage.stop()
    left = [t.name for t in threading.enumerate() if t not in before]
    assert left == [], f"threads the stage started and stop() did not join: {left}"


def test_chain_tears_down_when_the_block_raises(engine) -> None:
    run = ""
    with pytest.raises(ZeroDivisionError), Chain(BUILTIN_IMAGE, stages=2, env={"STUB_MODE": "hold"}) as chain:
        run = chain.run_id
        assert len(run_containers(engine, run)) == 2
        assert [e.stage_index for e in chain.roster] == [0, 1]
        _ = 1 / 0
    assert run and run_containers(engine, run) == []


def test_worker_under_test_runs_steps_in_the_tests_own_order() -> None:
    with WorkerUnderTest(BUILTIN_IMAGE) as worker:
        assert worker.initialize()
        assert worker.configure()
        assert worker.shutdown()


# ---------------------------------------------------------------------------------------------- builders
def test_stage_container_builders_take_effect(engine) -> None:
    """Before: StageContainer inherited testcontainers' builders and ignored them (with_env never reached the
    stage, with_name never named it)."""
    name = f"kit-{uuid.uuid4().hex[:8]}"
    stage = StageContainer(BUILTIN_IMAGE).with_env("STUB_MODE", "hold").with_env("PEER_DIRECT", "127.0.0.1:9")
    with stage.with_name(name) as s:
        s.wait_for_announcement(30)
        env = engine.inspect(s.ref or "")["Config"]["Env"]
        assert "PEER_DIRECT=127.0.0.1:9" in env and "STUB_MODE=hold" in env
        assert engine.inspect(name)["Id"] == s.ref
        with pytest.raises(RuntimeError, match="after start"):
            s.with_env("X", "1")
    assert engine.inspect(name) is None


def test_a_stage_name_someone_else_holds_is_named_and_never_touched(engine) -> None:
    """A StageContainer is a run of one stage through launch(): a name held by another container is the chain's
    error (exit-2 kind, the holder named) before anything of the run exists, and the holder is left running."""
    name = f"kit-held-{uuid.uuid4().hex[:8]}"
    with StageContainer(BUILTIN_IMAGE, env={"STUB_MODE": "hold"}).with_name(name) as holder:
        holder.wait_for_announcement(30)
        second = StageContainer(BUILTIN_IMAGE, env={"STUB_MODE": "hold"}).with_name(name)
        with pytest.raises(errors.NameInUse, match=name):
            second.start()
        second.stop()  # nothing to stop: it never ran
        assert engine.inspect(name)["Id"] == holder.ref and engine.inspect(name)["State"]["Running"]
        assert run_containers(engine, second.run_id or "") == []
    assert engine.inspect(name) is None


def test_exited_before_announcing_and_timed_out_are_different_errors(engine) -> None:
    early = StageContainer(
        BUILTIN_IMAGE, env={"STUB_MODE": "hold", "STUB_NO_ANNOUNCE": "1", "STUB_EXIT_AFTER": "1", "STUB_EXIT_CODE": "3"}
    ).start()
    try:
        with pytest.raises(StageExited) as exited:
            early.wait_for_announcement(60)
        assert exited.value.exit_code == 3 and "exited with code 3 before printing its PP_GPU_NODE_ADDR line" in str(
            exited.value
        )
        assert exited.value.last_lines == early.lines()[-20:]
    finally:
        early.stop()
    slow = StageContainer(BUILTIN_IMAGE, env={"STUB_MODE": "hold", "STUB_NO_ANNOUNCE": "1"}).start()
    try:
        with pytest.raises(StageTimeout, match="still running"):
            slow.wait_for_announcement(2)
    finally:
        slow.stop()


def test_every_fixture_says_what_it_is(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "pp_launch", "--fixtures", "-p", "no:cacheprovider")
    text = result.stdout.str()
    for name in ("pp_engine", "pp_stage", "pp_chain", "pp_gpu_inventory"):
        assert name in text
    assert "no docstring available" not in text.split("fixtures defined from pp_launch", 1)[-1]


def test_a_module_scoped_stage_is_no_leak_until_its_module_ends(pytester: pytest.Pytester, engine) -> None:
    pytester.makepyfile(
        test_inner=f"""
import pytest
from pp_launch.testing.kit import StageContainer

@pytest.fixture(scope="module")
def shared(pp_engine):
    with StageContainer({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}) as s:
        s.wait_for_announcement(30)
        yield s

def test_one(shared):
    assert shared.exit_code() is None

def test_two(shared):
    assert shared.exit_code() is None  # before: killed as a "leak" after test_one (exit 137 here)
"""
    )
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_without_the_opt_in_the_fixtures_are_not_there(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_needs(pp_engine):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'pp_engine' not found*"])


@pytest.mark.full  # a fresh venv from the package index
def test_a_plain_install_never_changes_an_unrelated_pytest(tmp_path: Path) -> None:
    """Before: `pip install pp-launch` (no extras) broke every pytest run in that environment: the pytest11 plugin
    imported testcontainers at load. A fresh venv with the package alone (no dependencies at all) and pytest:
    an unrelated test passes; enabling the plugin says which extra to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "pytest"], check=True, timeout=300)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, timeout=300)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_unrelated.py").write_text("def test_sum():\n    assert sum([1, 2]) == 3\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PP_"))}
    run = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    plain = subprocess.run(run, cwd=project, capture_output=True, text=True, env=clean, timeout=120)
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout + plain.stderr
    assert "pytest11" not in plain.stdout + plain.stderr
    enabled = subprocess.run(
        [*run, "-p", "pp_launch"], cwd=project, capture_output=True, text=True, env=clean, timeout=120
    )
    assert enabled.returncode != 0
    assert "pip install 'pp-launch[testing]'" in enabled.stdout + enabled.stderr


def test_a_chain_waits_for_a_line_and_for_its_end_and_says_why_not(engine) -> None:
    """Chain.wait_for_line: StageTimeout while the chain runs, StageExited once it ended; Chain.wait: the chain's
    own exit code (a stage exiting 4 fails the chain: 1)."""
    env = {"STUB_MODE": "hold", "STUB_EXIT_AFTER": "3", "STUB_EXIT_CODE": "4"}
    with Chain(BUILTIN_IMAGE, stages=2, env=env, grace=1.0) as chain:
        assert "holding" in chain.wait_for_line(0, lambda line: "holding" in line, timeout=30)
        waited = r"printed no a line with 'never printed' within 0.5 s \(\d+ lines; still running\)"
        with pytest.raises(StageTimeout, match=waited):
            chain.wait_for_line(0, "never printed", timeout=0.5)
        assert chain.wait(timeout=60) == 1
        ended = r"(?s)ended \(exit 1: stage \d \(pp-\w+-\d\) exited with code 4.*\) before stage 1 printed a line with"
        with pytest.raises(StageExited, match=ended) as caught:
            chain.wait_for_line(1, "never printed", timeout=5)
        assert "'never printed'" in str(caught.value) and caught.value.exit_code == 1
