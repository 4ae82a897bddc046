"""Parallel bring-up on the real engine: every container starts at once; the hand-off arrives late,
in the environment (`--handoff env`, under the sh entry) or on stdin (`--handoff stdin`); every teardown
path holds for stages still waiting for their hand-off."""

from __future__ import annotations

import signal

import pytest

from ..helpers import Launcher, run_containers, wait_until

pytestmark = pytest.mark.docker


def first_index(launcher: Launcher, name: str) -> int:
    return next(i for i, e in enumerate(launcher.events) if e.get("event") == name)


def last_index(launcher: Launcher, name: str) -> int:
    return max(i for i, e in enumerate(launcher.events) if e.get("event") == name)


@pytest.mark.parametrize("handoff", ["env", "stdin"])
def test_every_container_starts_before_any_stage_announces_and_the_demo_matches(
    engine, stub_image, handoff: str
) -> None:
    launcher = Launcher(
        "chain", "--stages", "4", "--json", "--gpus", "none", "--handoff", handoff, "--env", "STUB_ANNOUNCE_DELAY=0.5"
    )
    assert launcher.wait(120) == 0, launcher.stderr_text()
    assert last_index(launcher, "stage_started") < first_index(launcher, "stage_announced")
    assert any("PP_DEMO_RESULT" in line and "match=true" in line for line in launcher.stderr_lines)
    assert run_containers(engine, launcher.wait_event("chain_stopped")["run"]) == []


def test_env_handoff_runs_the_images_own_command_under_tini_with_peers_in_its_environment(engine, stub_image) -> None:
    launcher = Launcher("chain", "--stages", "2", "--json", "--gpus", "none", "--env", "STUB_MODE=hold")
    try:
        launcher.wait_event("pp_stage_roster", timeout=60)
        name = launcher.wait_event("stage_started", stage=1)["container"]
        top = engine.api.top(name, ps_args="-o pid,args")["Processes"]
        args = [p[1] for p in top]
        assert "docker-init" in args[0] or "tini" in args[0]  # PID 1 is still tini
        assert any("pp_stub.py" in a for a in args[1:]) and not any("pp-handoff" in a for a in args[1:])  # exec
        env = engine.api.exec_start(engine.api.exec_create(name, ["sh", "-c", "cat /proc/[0-9]*/environ"]))
        first = launcher.wait_event("stage_announced", stage=0)
        assert f"PEER_DIRECT={first['direct']}".encode() in env
    finally:
        launcher.signal()
        launcher.wait(60)


def test_stdin_handoff_loads_every_stage_side_by_side(engine, stub_image) -> None:
    """Each stage works 2 s before it announces (the model-load stand-in): all four announce, each 2 s after
    its own start, and the ring connects with peers read late from stdin."""
    launcher = Launcher(
        "chain", "--stages", "4", "--json", "--gpus", "none", "--handoff", "stdin", "--env", "STUB_ANNOUNCE_DELAY=2"
    )
    assert launcher.wait(120) == 0, launcher.stderr_text()
    announced = launcher.events_named("stage_announced")
    assert sorted(e["stage"] for e in announced) == [0, 1, 2, 3]
    assert all(1.5 <= e["elapsed_s"] < 6.0 for e in announced), announced  # its own load, never the others'
    assert last_index(launcher, "stage_started") < first_index(launcher, "stage_announced")
    assert any("peers from stdin" in line for line in launcher.stderr_lines)
    assert any("match=true" in line for line in launcher.stderr_lines)


def test_sigkill_of_the_launcher_while_stages_wait_for_their_handoff_leaves_nothing(engine, stub_image) -> None:
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
        "0:STUB_ANNOUNCE_DELAY=60",
    )
    run = launcher.wait_event("stage_started", stage=3)["run"]
    assert len(run_containers(engine, run)) == 4
    launcher.signal(signal.SIGKILL)
    launcher.wait(30)
    assert wait_until(lambda: run_containers(engine, run) == [], 20), run_containers(engine, run)


def test_a_waiting_stage_killed_from_outside_ends_the_chain_naming_it(engine, stub_image) -> None:
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
        "0:STUB_ANNOUNCE_DELAY=60",
    )
    name = launcher.wait_event("stage_started", stage=2)["container"]
    run = launcher.wait_event("stage_started", stage=2)["run"]
    engine.api.kill(name)
    assert launcher.wait(60) == 1
    assert "stage 2" in launcher.stderr_text()
    assert run_containers(engine, run) == []


def test_sigterm_while_stages_wait_stops_them_within_the_grace(engine, stub_image) -> None:
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
        "0:STUB_ANNOUNCE_DELAY=60",
        "--grace",
        "2",
    )
    run = launcher.wait_event("stage_started", stage=2)["run"]
    launcher.signal(signal.SIGTERM)
    assert launcher.wait(30) == 143
    stopped = launcher.wait_event("chain_stopped")
    assert stopped["orphans"] == [] and len(stopped["removed"]) == 3
    assert run_containers(engine, run) == []


def test_bring_up_in_turn_starts_each_stage_after_the_one_before_announced_with_no_entry(engine, stub_image) -> None:
    launcher = Launcher(
        "chain", "--stages", "3", "--json", "--gpus", "none", "--bring-up", "in-turn", "--env", "STUB_MODE=hold"
    )
    try:
        launcher.wait_event("pp_stage_roster", timeout=60)
        wanted = ("stage_started", "stage_announced")
        kinds = [(e["event"], e.get("stage")) for e in launcher.events if e["event"] in wanted]
        assert kinds == [(kind, k) for k in range(3) for kind in ("stage_started", "stage_announced")]
        name = launcher.wait_event("stage_started", stage=2)["container"]
        assert "pp-handoff" not in (engine.inspect(name)["Config"]["Entrypoint"] or [])
    finally:
        launcher.signal()
        launcher.wait(60)
