"""pp_launch.testing's kit and pytest plugin, tested as a user would use them: inner pytest runs (pytester, in a
subprocess so each has its own process and owner) on the real engine; the outer suite stays green and clean."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from pp_launch.core import labels
from pp_launch.testing.kit import BUILTIN_IMAGE, Chain, StageContainer, WorkerUnderTest

from ..helpers import run_containers

pytestmark = pytest.mark.docker
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "test_my_stage.py"


def test_the_leak_guard_fails_the_test_that_left_a_container_and_removes_it(pytester: pytest.Pytester,
                                                                            engine) -> None:  # fmt: skip
    pytester.makepyfile(
        test_inner=f"""
from pp_launch.testing.kit import StageContainer

def test_leaks():
    StageContainer({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).start().wait_for_announcement(30)

def test_clean(pp_stage):
    pp_stage({BUILTIN_IMAGE!r}, env={{"STUB_MODE": "hold"}}).wait_for_announcement(30)
"""
    )
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*pp-launch leak guard:*", "*test_inner.py::test_leaks left container *"
                                 f"image {BUILTIN_IMAGE}*pp-launch.run*"])  # fmt: skip
    assert "test_clean left" not in result.stdout.str()
    assert [c for c in engine.containers([labels.RUN]) if c.image == BUILTIN_IMAGE and "test_inner" in c.name] == []


def test_without_the_opt_in_there_is_no_guard(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1)
    assert "leak guard" not in result.stdout.str()


def test_the_example_passes_as_a_user_runs_it(pytester: pytest.Pytester) -> None:
    shutil.copy(EXAMPLE, pytester.path / "test_my_stage.py")
    result = pytester.runpytest_subprocess("-p", "pp_launch", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_stage_container_stop_on_a_sigterm_ignoring_stage_takes_about_one_grace(engine) -> None:
    stage = StageContainer(BUILTIN_IMAGE, env={"STUB_MODE": "hold", "STUB_IGNORE_SIGTERM": "1"}, grace=2.0).start()
    try:
        stage.wait_for_announcement(30)
        t0 = time.monotonic()
        stage.stop()
        took = time.monotonic() - t0
    finally:
        stage.stop()
    assert 1.9 <= took <= 5.0, took
    assert stage.exit_code() is not None
    assert engine.inspect(stage.ref or "") is None  # auto-removed


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
