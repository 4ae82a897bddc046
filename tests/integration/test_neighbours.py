"""Beside hostile neighbours: another client of the same engine forges our labels, prunes, removes our guard or
lock, and calls `down` while a run is still placing. What is ours is only what a run's guard recorded at create."""

from __future__ import annotations

import signal
import subprocess

import pytest

from pp_launch.adapters.docker_engine import Engine
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import GUARD_IMAGE

from ..helpers import Launcher, guard_of, remember_run, run_containers, unique, wait_until

pytestmark = pytest.mark.docker
HOLD = ["--json", "--gpus", "none", "--env", "STUB_MODE=hold", "--grace", "1"]


def docker(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=False)


def forged(run: str, name: str) -> str:
    """A neighbour's container carrying run `run`'s labels (run ids are public through `ps`)."""
    out = docker(
        "run", "-d", "--name", name, "--network", "none", "--label", f"{labels.RUN}={run}",
        "--label", f"{labels.STAGE}=0", "--label", f"{labels.OWNER}=detached", "--label", f"{labels.GPUS}=",
        "-e", "STUB_MODE=hold", "-e", "STUB_IGNORE_LIFELINE=1", "pp-launch/stub-worker:latest",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def running(ref: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", ref).stdout.strip() == "true"


def test_a_container_forging_a_live_runs_labels_survives_its_teardown_down_and_gc(engine, stub_image) -> None:
    chain = Launcher("chain", "--stages", "2", *HOLD)
    chain.wait_event("pp_stage_roster")
    run = chain.run_id
    someone = forged(run, unique("someone-elses-db"))
    try:
        assert wait_until(lambda: running(someone), 20)
        chain.signal(signal.SIGINT)
        assert chain.wait(30) == 130
        stopped = chain.events_named("chain_stopped")[-1]
        assert someone not in stopped["removed"] and stopped["orphans"] == []
        assert running(someone)  # the teardown acted on the ids it created, never on a label match
        down = Launcher("down", run, "--grace", "1")
        assert down.wait(30) == 0
        assert "not touched" in down.stderr_text() and running(someone)
        gc = Launcher("gc")
        assert gc.wait(30) == 0 and running(someone)
        assert any(someone[:12] in line or "someone-elses-db" in line for line in gc.stdout_lines)
        assert wait_until(lambda: guard_of(engine, run) == [], 10)
    finally:
        docker("rm", "-f", someone)


def test_prune_at_every_phase_of_a_detached_run_loses_nothing_and_leaves_nothing(engine, stub_image) -> None:
    """`docker container prune`, `system prune -f` and `network prune` while a detached run lives: its guard runs,
    so nothing of it is pruned; `ps` still says whose it is, `down` still ends it, and nothing is left."""
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "STUB_MODE=hold", "-d", "-q")
    assert up.wait(60) == 0, up.stderr_text()
    run = up.stdout_lines[-1].strip()
    remember_run(run)
    for prune in (["container", "prune", "-f"], ["system", "prune", "-f"], ["network", "prune", "-f"]):
        assert docker(*prune).returncode == 0
        assert len(run_containers(engine, run)) == 2 and len(guard_of(engine, run)) == 1
    ps = Launcher("ps", "--json", "--run", run)
    assert ps.wait(30) == 0
    assert [(r["stage"], r["owner_status"]) for r in ps.events if r["role"] == "stage"] == [
        (0, "detached"),
        (1, "detached"),
    ]
    plain = Launcher("chain", "--stages", "2", "--gpus", "none")  # the next plain chain sweeps nothing away
    assert plain.wait(60) == 0
    assert len(run_containers(engine, run)) == 2
    down = Launcher("down", run, "--grace", "1")
    assert down.wait(30) == 0, down.stderr_text()
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)


def test_down_of_a_run_still_placing_stops_it_for_good(engine, stub_image) -> None:
    """`down` while stage 0 has not announced yet (stages come up in turn): the launcher never brings the run
    up afterwards; it ends non-zero, and nothing of the run is left."""
    chain = Launcher(
        "chain", "--stages", "3", *HOLD, "--bring-up", "in-turn", "--stage-env", "0:STUB_ANNOUNCE_DELAY=4",
    )  # fmt: skip
    chain.wait_event("stage_started")
    run = chain.run_id
    down = Launcher("down", run, "--grace", "1")
    assert down.wait(30) == 0, down.stderr_text()
    code = chain.wait(30)
    assert code not in (0, None), chain.stderr_text()
    assert not chain.events_named("pp_stage_roster")  # never up
    assert all(e["stage"] == 0 for e in chain.events_named("stage_started"))
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)


def test_a_held_container_whose_entry_ends_is_not_held(engine, stub_image) -> None:
    """A lock or guard whose entry ends at once (an image without the tool it runs: tini then exits 127) is
    refused when it is seen ended at start, and otherwise seen dead by id at the holder's next look."""
    eng: Engine = engine
    try:
        held = eng.hold(None, GUARD_IMAGE, {labels.RUN: "0" * 12, labels.STAGE: "lock"}, entrypoint=("no-such-tool",))
    except errors.EngineError as exc:
        assert "no-such-tool" in str(exc) or "ended as soon as it started" in str(exc)
    else:
        assert held is not None and wait_until(lambda: not held.alive(), 10)
        held.release()
    assert wait_until(lambda: engine.containers([f"{labels.RUN}={'0' * 12}"]) == [], 10)
