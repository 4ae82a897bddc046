"""`pp-launch chain` on the real engine: demo chains, teardown, failures, bad announcements.

Every chain is a real launcher process with real signals; the no-orphan assertions ask the engine by the
run's label (docs/formats.md).
"""

from __future__ import annotations

import signal
import time

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ..helpers import BUSY_SLACK, Launcher, run_containers, unique, wait_until

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_demo_chain_matches_and_leaves_nothing(engine, stub_image, stages: int) -> None:
    launcher = Launcher("chain", "--stages", str(stages), "--json", "--gpus", "none")
    rc = launcher.wait(120)
    assert rc == 0, launcher.stderr_text()
    assert any("PP_DEMO_RESULT" in line and "match=true" in line for line in launcher.stderr_lines)
    roster = launcher.wait_event("pp_stage_roster")
    assert [s["stage_index"] for s in roster["stages"]] == list(range(stages))
    stopped = launcher.wait_event("chain_stopped")
    assert stopped["reason"] == "completed" and stopped["orphans"] == [] and len(stopped["removed"]) == stages
    assert [e["exit_code"] for e in launcher.events_named("stage_exited")] == [0] * stages
    assert run_containers(engine, roster["run"]) == []
    # --json: nothing but JSON objects on stdout
    assert all(line.startswith("{") for line in launcher.stdout_lines)


def test_sigterm_ignoring_stages_are_killed_after_grace(engine, stub_image) -> None:
    launcher = Launcher(
        "chain",
        "--stages",
        "6",
        "--grace",
        "2",
        "--json",
        "--gpus",
        "none",
        "--env",
        "STUB_MODE=hold",
        "--env",
        "STUB_IGNORE_SIGTERM=1",
    )
    launcher.wait_event("pp_stage_roster", timeout=60)
    run = launcher.run_id
    assert len(run_containers(engine, run)) == 6
    t0 = time.monotonic()
    launcher.signal(signal.SIGTERM)
    rc = launcher.wait(30)
    elapsed = time.monotonic() - t0
    assert rc == 143
    assert run_containers(engine, run) == []
    assert elapsed < 2 + BUSY_SLACK, f"teardown took {elapsed:.2f}s"  # one shared grace (2 s), not one per stage
    assert elapsed >= 2.0, "the grace was not honoured"
    stopped = launcher.wait_event("chain_stopped")
    assert stopped["exit_code"] == 143 and stopped["orphans"] == []
    assert sorted(e["exit_code"] for e in launcher.events_named("stage_exited")) == [137] * 6


def test_stage_exiting_3_mid_run_fails_the_chain_within_2s(engine, stub_image) -> None:
    launcher = Launcher(
        "chain",
        "--stages",
        "4",
        "--json",
        "--gpus",
        "none",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "2:STUB_EXIT_AFTER=3",
        "--stage-env",
        "2:STUB_EXIT_CODE=3",
    )
    exited = launcher.wait_event("stage_exited", stage=2, timeout=60)
    t_exit = time.monotonic()
    rc = launcher.wait(30)
    assert rc == 1
    assert time.monotonic() - t_exit < 2.0
    assert exited["exit_code"] == 3 and exited["reason"] == "failed"
    assert "stage 2" in launcher.stderr_text() and "exited with code 3" in launcher.stderr_text()
    assert run_containers(engine, launcher.run_id) == []


def test_docker_kill_of_stage_1_from_outside_fails_the_chain(engine, stub_image) -> None:
    prefix = unique("kill")
    launcher = Launcher(
        "chain", "--stages", "3", "--json", "--gpus", "none", "--name", prefix, "--env", "STUB_MODE=hold"
    )
    launcher.wait_event("pp_stage_roster", timeout=60)
    t0 = time.monotonic()
    engine.signal(f"{prefix}-1", signal.SIGKILL)
    rc = launcher.wait(30)
    assert rc == 1
    took = time.monotonic() - t0
    assert took < 2.0 + BUSY_SLACK, f"{took:.1f} s; {launcher.stderr_text()}"  # noticed within 2 s, then teardown
    assert f"stage 1 ({prefix}-1) exited with code 137" in launcher.stderr_text()
    assert run_containers(engine, launcher.run_id) == []


def test_address_timeout_removes_started_stages(engine, stub_image) -> None:
    launcher = Launcher(
        "chain",
        "--stages",
        "4",
        "--json",
        "--gpus",
        "none",
        "--addr-timeout",
        "3",
        "--stage-env",
        "2:STUB_NO_ANNOUNCE=1",
        "--env",
        "STUB_MODE=hold",
    )
    rc = launcher.wait(60)
    assert rc == 1
    started = [e["stage"] for e in launcher.events_named("stage_started")]
    assert started == [0, 1, 2, 3]  # all at once; stage 3 waited for a hand-off that never came
    assert not any(line.startswith("[stage 3]") for line in launcher.stderr_lines)
    stopped = launcher.wait_event("chain_stopped")
    assert len(stopped["removed"]) == 4 and stopped["orphans"] == []
    assert "stage 2" in launcher.stderr_text() and "did not announce its address within 3 s" in launcher.stderr_text()
    assert run_containers(engine, launcher.run_id) == []


def test_injection_in_announcement_is_rejected_and_never_forwarded(engine, stub_image) -> None:
    evil = "PP_GPU_NODE_ADDR " + "ab" * 32 + " 127.0.0.1:1234;$(touch /tmp/pwned)`id`"
    launcher = Launcher(
        "chain",
        "--stages",
        "3",
        "--json",
        "--gpus",
        "none",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        f"1:STUB_ANNOUNCE_LINE={evil}",
    )
    rc = launcher.wait(60)
    assert rc == 1
    err = launcher.stderr_text()
    assert "stage 1" in err and "malformed announcement" in err
    assert "'PP_GPU_NODE_ADDR " in err  # shown shell-escaped
    assert [e["stage"] for e in launcher.events_named("stage_started")] == [0, 1, 2]  # all at once
    assert not any(line.startswith("[stage 2]") for line in launcher.stderr_lines)  # its worker never ran
    assert launcher.events_named("stage_announced")[-1]["stage"] == 0
    assert run_containers(engine, launcher.run_id) == []


def test_decoy_container_without_our_labels_survives(engine, stub_image) -> None:
    """A container named like a stage but without our labels is never touched by a chain's teardown."""
    decoy_name = unique("pp-stage-decoy")
    decoy = (
        DockerContainer(stub_image, name=decoy_name, network_mode="host")
        .with_env("STUB_MODE", "hold")
        .waiting_for(LogMessageWaitStrategy("holding"))
    )
    with decoy:
        launcher = Launcher("chain", "--stages", "2", "--json", "--gpus", "none")
        assert launcher.wait(60) == 0
        assert engine.inspect(decoy_name) is not None
        assert engine.inspect(decoy_name)["State"]["Running"]


def test_missing_user_image_is_exit_2_before_anything_starts(engine) -> None:
    image = f"pp-launch/{unique('absent')}:latest"
    launcher = Launcher("chain", "--stages", "2", "--image", image, "--gpus", "none")
    assert launcher.wait(30) == 2
    err = launcher.stderr_text()
    assert f"image {image} is not present" in err and "never pulls" in err
    assert "Traceback" not in err
    assert launcher.events == []


def test_unreachable_engine_is_exit_2_with_a_plain_message() -> None:
    launcher = Launcher("chain", "--stages", "2", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert launcher.wait(30) == 2
    err = launcher.stderr_text()
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in err
    assert "Traceback" not in err


def test_plain_output_prefixes_stage_lines_on_stdout(engine, stub_image) -> None:
    launcher = Launcher("chain", "--stages", "2", "--gpus", "none")
    assert launcher.wait(60) == 0
    assert any(line.startswith("[stage 0] PP_DEMO_RESULT") for line in launcher.stdout_lines)
    assert all(line.startswith("[stage ") for line in launcher.stdout_lines)
    assert wait_until(lambda: "nothing left behind" in launcher.stderr_text(), 2)


def test_a_failed_chain_says_the_cause_before_the_teardown_summary_and_once(engine, stub_image) -> None:
    launcher = Launcher("chain", "--gpus", "none", "--network", "nosuchnet")
    assert launcher.wait(60) == 1
    lines = launcher.stderr_lines
    cause = [i for i, line in enumerate(lines) if "network nosuchnet not found" in line]
    summary = [i for i, line in enumerate(lines) if line.startswith("pp-launch: chain stopped")]
    assert len(cause) == 1 and len(summary) == 1 and cause[0] < summary[0], lines
    assert lines[cause[0]].startswith("pp-launch: error: stage ")


def test_the_readmes_python_example_runs_as_written(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("## In Python", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PP_LAUNCH_SWEEP": "0"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 every stage exited 0"), done.stdout
