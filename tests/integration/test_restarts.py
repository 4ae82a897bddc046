"""Chains that recover (`--max-restarts`, `--restart-backoff`; docs/recovery.md), on the real engine: a stage that
fails once, then the run succeeds; no restart left; the launcher SIGKILLed during the backoff and during the next
attempt's bring-up (nothing left); `down` and SIGTERM during the backoff (no further attempt)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from pp_launch.adapters.docker_engine import Engine
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.testing import fake_nvml

from ..helpers import BUSY_SLACK, Launcher, docker, forged, guard_of, run_containers, running, unique, wait_until

pytestmark = pytest.mark.docker
JSON = ["--json", "--gpus", "none", "--grace", "1"]
FAIL_ONCE = [
    "--stage-env",
    "1:STUB_EXIT_AFTER=0",
    "--stage-env",
    "1:STUB_EXIT_CODE=3",
    "--stage-env",
    "1:STUB_EXIT_ATTEMPTS=1",
]
INVENTORY = str(Path(__file__).parent.parent / "data" / "plain-4gpu.json")
FAIL_ALWAYS = ["--stage-env", "1:STUB_EXIT_AFTER=0", "--stage-env", "1:STUB_EXIT_CODE=3"]


def attempts_of(engine: Engine, run: str) -> set[str]:
    return {
        c.labels.get("pp-launch.attempt", "")
        for c in engine.containers([f"pp-launch.run={run}"])
        if c.labels.get("pp-launch.stage") != "guard"
    }


def nothing_left(engine: Engine, run: str) -> bool:
    return not run_containers(engine, run) and not guard_of(engine, run)


def test_a_stage_that_fails_once_is_restarted_and_the_run_completes(engine: Engine, stub_image: str) -> None:
    chain = Launcher("chain", "--stages", "3", "--max-restarts", "2", "--restart-backoff", "0.2", *JSON, *FAIL_ONCE)
    assert chain.wait(120) == 0, chain.stderr_text()
    restarting = chain.events_named("chain_restarting")
    assert len(restarting) == 1
    assert {k: restarting[0][k] for k in ("attempt", "max", "stage", "backoff_s")} == {
        "attempt": 2,
        "max": 3,
        "stage": 1,
        "backoff_s": 0.2,
    }
    assert "stage 1" in restarting[0]["reason"] and "code 3" in restarting[0]["reason"]
    stopped = chain.events_named("chain_stopped")
    assert [(e["reason"], e["exit_code"]) for e in stopped] == [("stage_failed", 1), ("completed", 0)]
    assert chain.events[-1]["event"] == "chain_stopped"
    # the same run id throughout; every stage of the second attempt started after the restart was said
    assert len({e["run"] for e in chain.events}) == 1
    order = [e["event"] for e in chain.events]
    assert order.index("chain_restarting") < len(order) - order[::-1].index("stage_started") - 1
    assert "completed on attempt 2 of at most 3" in chain.stderr_text()
    assert nothing_left(engine, chain.events[0]["run"])


def test_no_restart_left_is_exit_1_naming_every_attempt(engine: Engine, stub_image: str) -> None:
    chain = Launcher("chain", "--stages", "2", "--max-restarts", "2", "--restart-backoff", "0", *JSON, *FAIL_ALWAYS)
    assert chain.wait(120) == 1
    assert [e["attempt"] for e in chain.events_named("chain_restarting")] == [2, 3]
    last = chain.stderr_text().splitlines()[-1]
    assert "no restart left (--max-restarts 2)" in last
    for n in (1, 2, 3):
        assert f"attempt {n}: stage 1 (" in last and "exited with code 3" in last
    assert "its last lines" not in last  # one line per attempt; each attempt's own report had them
    assert nothing_left(engine, chain.events[0]["run"])


@pytest.mark.engine_gpus
@pytest.mark.parametrize("when", ["backoff", "bring-up"])
def test_the_launcher_killed_between_or_during_attempts_leaves_nothing(
    engine: Engine, stub_image: str, when: str, tmp_path: Path
) -> None:
    """SIGKILL in the backoff (only the run's guard exists) or while attempt 2 comes up (its stages exist, not yet
    announced): the guard's lifeline ends, the guard tears down what it recorded, nothing is left, and every GPU
    the run held is free again (a 4-stage plan over the same 4 GPUs fits)."""
    gpus = {"PP_LAUNCH_GPU_INVENTORY": INVENTORY, "PP_LAUNCH_STATE_DIR": str(tmp_path / "state")}
    extra = (
        ["--restart-backoff", "30"]
        if when == "backoff"
        else ["--restart-backoff", "0", "--stage-env", "0:STUB_ANNOUNCE_DELAY=30"]
    )
    fail = [
        "--stage-env",
        "1:STUB_EXIT_AFTER=0.5",
        "--stage-env",
        "1:STUB_EXIT_CODE=3",
        "--stage-env",
        "1:STUB_EXIT_ATTEMPTS=1",
        "--env",
        "STUB_MODE=hold",
    ]
    if when == "bring-up":  # stage 0 announces late in every attempt; stage 1 fails before it in the first
        fail = ["--stage-env", "1:STUB_EXIT_AFTER=0", *fail[2:]]
    on_gpus = ["--json", "--gpus", "auto", "--gpu-attach", "env", "--grace", "1"]
    chain = Launcher("chain", "--stages", "3", "--max-restarts", "3", *on_gpus, *fail, *extra, env=gpus)
    restart = chain.wait_event("chain_restarting", timeout=90)
    run = restart["run"]
    if when == "bring-up":
        started = [e for e in chain.events_named("stage_started")]
        assert wait_until(
            lambda: len(chain.events_named("stage_started")) >= len(started) + 3 or attempts_of(engine, run) == {"2"},
            60,
        )
        assert wait_until(lambda: attempts_of(engine, run) == {"2"} and len(run_containers(engine, run)) == 3, 60)
    else:
        assert run_containers(engine, run) == [] and len(guard_of(engine, run)) == 1  # only the guard, holding
    every = {
        c.labels.get("pp-launch.stage"): c.labels.get("pp-launch.attempt")
        for c in engine.containers([f"pp-launch.run={run}"])
    }
    assert every.get("guard") == "1" and all(every.values()), every  # every container says its attempt
    chain.signal(signal.SIGKILL)
    assert chain.wait(30) == -signal.SIGKILL
    assert wait_until(lambda: nothing_left(engine, run), 15 + BUSY_SLACK), run_containers(engine, run)
    plan = Launcher("chain", "--stages", "4", "--dry-run", "--json", env=gpus)
    assert plan.wait(30) == 0, plan.stderr_text()  # no GPU is held any more


def test_down_during_the_backoff_ends_the_run_without_another_attempt(engine: Engine, stub_image: str) -> None:
    chain = Launcher("chain", "--stages", "2", "--max-restarts", "3", "--restart-backoff", "30", *JSON, *FAIL_ALWAYS)
    run = chain.wait_event("chain_restarting", timeout=90)["run"]
    began = time.monotonic()
    down = Launcher("down", run, "--grace", "1")
    assert down.wait(30) == 0, down.stderr_text()
    assert chain.wait(20) == 143
    assert time.monotonic() - began < 20  # not the 30 s backoff
    assert len(chain.events_named("chain_restarting")) == 1
    assert chain.events[-1]["event"] == "chain_stopped" and chain.events[-1]["exit_code"] == 143
    assert "'pp-launch down'" in chain.events[-1]["message"] and "before attempt 2" in chain.events[-1]["message"]
    started = [e["stage"] for e in chain.events_named("stage_started")]
    assert started.count(0) == 1  # attempt 2 never began
    assert wait_until(lambda: nothing_left(engine, run), 15)


def test_sigterm_during_the_backoff_is_143_at_once(engine: Engine, stub_image: str) -> None:
    chain = Launcher("chain", "--stages", "2", "--max-restarts", "1", "--restart-backoff", "30", *JSON, *FAIL_ALWAYS)
    run = chain.wait_event("chain_restarting", timeout=90)["run"]
    began = time.monotonic()
    chain.signal(signal.SIGTERM)
    assert chain.wait(20) == 143
    assert time.monotonic() - began < 10
    assert "stopped by SIGTERM before attempt 2" in chain.stderr_text()
    assert wait_until(lambda: nothing_left(engine, run), 15)


@pytest.mark.engine_gpus
def test_an_xid_on_a_stages_gpu_fails_it_and_the_next_attempt_never_uses_that_gpu(
    engine: Engine, stub_image: str, fake_nvml_lib: Path, tmp_path: Path
) -> None:
    """The launcher's NVML is the fake library serving the same 4 GPUs it places on; Xid 79 is delivered through
    nvmlEventSetWait while the stages run, as the driver delivers it."""
    inventory = GpuInventory.parse(Path(INVENTORY).read_text())
    config, events = tmp_path / "nvml.conf", tmp_path / "xid-events"
    config.write_text(fake_nvml.config_text(inventory))
    events.touch()
    env = {
        **fake_nvml.environ(fake_nvml_lib, config, events=events),
        "PP_LAUNCH_GPU_INVENTORY": INVENTORY,
        "PP_LAUNCH_STATE_DIR": str(tmp_path / "state"),
    }
    chain = Launcher(
        "chain",
        "--stages",
        "2",
        "--json",
        "--gpu-attach",
        "env",
        "--grace",
        "1",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
        "--env",
        "STUB_MODE=hold",
        "--env",
        "STUB_EXIT_AFTER=6",
        env=env,
    )
    chain.wait_event("pp_stage_roster", timeout=60)
    first = {e["stage"]: e["gpus"] for e in chain.events_named("stage_started")}
    bad = first[1][0]
    fake_nvml.inject_xid(events, bad, 79)
    assert chain.wait(90) == 0, chain.stderr_text()
    failed = chain.events_named("chain_stopped")[0]
    index = [g.uuid for g in inventory.gpus].index(bad)
    assert failed["reason"] == "stage_failed" and failed["message"].startswith(
        f"stage 1 (pp-{failed['run']}-1) failed: its GPU {index} ({bad}) reported Xid 79 (GPU has fallen off the bus)"
    )
    restart = chain.events_named("chain_restarting")[0]
    assert restart["stage"] == 1 and "Xid 79" in restart["reason"]
    second = [e for e in chain.events_named("stage_started")][2:]
    assert len(second) == 2 and all(bad not in e["gpus"] for e in second)
    assert chain.events[-1]["event"] == "chain_stopped" and chain.events[-1]["exit_code"] == 0


def test_a_neighbour_pruning_and_forging_labels_during_the_backoff_changes_nothing(
    engine: Engine, stub_image: str
) -> None:
    """Another client of the engine acts while nothing of the run's stages exists: `docker container prune -f` of
    all the run's (the guard runs, so it stays) and a container of its own carrying the run's labels. The next
    attempt comes up and completes; the neighbour's container is never touched."""
    chain = Launcher("chain", "--stages", "2", "--max-restarts", "1", "--restart-backoff", "3", *JSON, *FAIL_ONCE)
    run = chain.wait_event("chain_restarting", timeout=90)["run"]
    scoped = ["--filter", f"label=pp-launch.run={run}"]  # all of the run; nothing of the suite's other workers
    pruned = subprocess.run(
        ["docker", "container", "prune", "-f", *scoped], capture_output=True, text=True, check=False
    )
    assert pruned.returncode == 0, pruned.stderr
    theirs = forged(run, unique("neighbour"), stage=1)
    try:
        assert chain.wait(120) == 0, chain.stderr_text()
        assert [e["reason"] for e in chain.events_named("chain_stopped")] == ["stage_failed", "completed"]
        assert running(theirs)  # never ours: neither attempt's teardown nor the guard touched it
        assert theirs[:12] not in " ".join(chain.events_named("chain_stopped")[-1]["removed"])
    finally:
        docker("rm", "-f", theirs)
