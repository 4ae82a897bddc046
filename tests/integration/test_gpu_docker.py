"""GPU exclusivity on the real engine, with a modelled 4-GPU inventory and --gpu-attach env (no GPU needed):
containers labelled as holding GPUs are avoided; concurrent launches never share a GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ..helpers import Launcher, remember_run, run_containers, unique, wait_until, watchdogs

pytestmark = [pytest.mark.docker, pytest.mark.engine_gpus]
INVENTORY = str(Path(__file__).parent.parent / "data" / "plain-4gpu.json")
UUIDS = [g["uuid"] for g in json.loads(Path(INVENTORY).read_text())["gpus"]]


@pytest.fixture
def state_dir(tmp_path: Path) -> dict[str, str]:
    """Each test gets its own state directory and the fake inventory."""
    return {"PP_LAUNCH_STATE_DIR": str(tmp_path / "state"), "PP_LAUNCH_GPU_INVENTORY": INVENTORY}


def test_gpus_held_by_a_running_labelled_container_are_avoided(engine, stub_image, state_dir) -> None:
    holder = (
        DockerContainer(
            stub_image,
            network_mode="host",
            labels={
                "pp-launch.run": unique("held"),
                "pp-launch.stage": "0",
                "pp-launch.gpus": f"{UUIDS[0]},{UUIDS[1]}",
                "pp-launch.owner": f"{socket.gethostname()}:{os.getpid()}:0",
            },
        )
        .with_env("STUB_MODE", "hold")
        .waiting_for(LogMessageWaitStrategy("holding"))
    )
    with holder:
        plan = Launcher("chain", "--stages", "2", "--dry-run", "--json", env=state_dir)
        assert plan.wait(30) == 0, plan.stderr_text()
        doc = json.loads("\n".join(plan.stdout_lines))
        assert [s["gpus"] for s in doc["stages"]] == [[UUIDS[2]], [UUIDS[3]]]
        too_many = Launcher("chain", "--stages", "3", "--dry-run", env=state_dir)
        assert too_many.wait(30) == 2
        assert f"GPU 0 ({UUIDS[0]}) held by pp-launch run held" in too_many.stderr_text()
        shown = Launcher("gpus", "--json", env=state_dir)  # who holds what, in --json too
        assert shown.wait(30) == 0, shown.stderr_text()
        held_by = json.loads("\n".join(shown.stdout_lines))["held_by"]
        assert set(held_by) == {UUIDS[0], UUIDS[1]} and held_by[UUIDS[0]]["stage"] == 0
        assert held_by[UUIDS[0]]["run"].startswith("held")
    plan = Launcher("chain", "--stages", "2", "--dry-run", "--json", env=state_dir)
    assert plan.wait(30) == 0
    assert [s["gpus"] for s in json.loads("\n".join(plan.stdout_lines))["stages"]] == [[UUIDS[0]], [UUIDS[1]]]


def test_concurrent_chains_get_disjoint_gpus_and_a_third_gets_exit_2(engine, stub_image, state_dir) -> None:
    args = (
        "chain",
        "--stages",
        "2",
        "--json",
        "--gpus",
        "auto",
        "--gpus-per-stage",
        "1",
        "--gpu-attach",
        "env",
        "--env",
        "STUB_MODE=hold",
    )
    first, second = Launcher(*args, env=state_dir), Launcher(*args, env=state_dir)
    try:
        for launcher in (first, second):
            launcher.wait_event("pp_stage_roster", timeout=60)
        held = [g for launcher in (first, second) for e in launcher.events_named("stage_started") for g in e["gpus"]]
        assert sorted(held) == sorted(UUIDS)  # four stages, four different GPUs
        for launcher in (first, second):
            for c in engine.containers([f"pp-launch.run={launcher.run_id}"]):
                if c.labels["pp-launch.stage"] == "guard":
                    continue  # the run's guard holds no GPU
                assert c.labels["pp-launch.gpus"] in UUIDS
                env = engine.inspect(c.id)["Config"]["Env"]
                assert f"NVIDIA_VISIBLE_DEVICES={c.labels['pp-launch.gpus']}" in env
        third = Launcher(*args, env=state_dir)
        assert third.wait(30) == 2
        err = third.stderr_text()
        assert "not enough GPUs: 2 stages x 1 need 2, 0 free of 4" in err
        assert f"held by pp-launch run {first.run_id}" in err and f"held by pp-launch run {second.run_id}" in err
        assert third.events == []
    finally:
        for launcher in (first, second):
            launcher.signal(signal.SIGTERM)
        assert first.wait(30) == 143 and second.wait(30) == 143
    assert run_containers(engine, first.run_id) == run_containers(engine, second.run_id) == []
    assert engine.inspect("pp-launch-gpu-lock") is None  # the engine's GPU lock went with its holders


GPU_ARGS = ("--json", "--gpus", "auto", "--gpus-per-stage", "1", "--gpu-attach", "env", "--env", "STUB_MODE=hold")


def test_a_launch_waits_for_the_engines_gpu_lock_says_on_whom_and_never_gets_a_held_gpu(
    engine, stub_image, state_dir
) -> None:
    """The first chain comes up in turn (its stage 1 is created only once stage 0 announced, 8 s
    later), holding the engine's GPU lock all that time (its run's guard, renamed); the second, started meanwhile
    from another state directory (another machine), waits on the lock, names its holder, then gets the two GPUs the
    first does not hold. Once its stages exist, the first's guard goes back to a guard's name, still running."""
    first = Launcher(
        "chain", "--stages", "2", *GPU_ARGS, "--bring-up", "in-turn", "--env", "STUB_ANNOUNCE_DELAY=8", env=state_dir
    )
    second = None
    try:
        first.wait_event("stage_started", stage=0, timeout=60)
        lock = engine.inspect("pp-launch-gpu-lock")
        assert lock is not None and lock["State"]["Running"], lock
        assert lock["Config"]["Labels"]["pp-launch.stage"] == "guard"
        assert lock["Config"]["Labels"]["pp-launch.run"] == first.run_id
        other = {**state_dir, "PP_LAUNCH_STATE_DIR": state_dir["PP_LAUNCH_STATE_DIR"] + "-machine-2"}
        second = Launcher("chain", "--stages", "2", *GPU_ARGS, env=other)
        assert wait_until(lambda: "waiting for the GPU lock" in second.stderr_text(), 30), second.stderr_text()
        assert f"held by run {first.run_id} of " in second.stderr_text()
        assert not second.events_named("stage_started")  # nothing placed while the first holds the lock
        ps = Launcher("ps", "--run", first.run_id, env=state_dir)
        assert ps.wait(30) == 0 and any(line.startswith(f"{first.run_id}  lock ") for line in ps.stdout_lines)
        third = Launcher("chain", "--stages", "2", *GPU_ARGS, env=other)
        assert wait_until(lambda: "waiting for the GPU lock" in third.stderr_text(), 30), third.stderr_text()
        third.signal(signal.SIGINT)  # Ctrl-C ends a wait for the lock at once: what it started (its guard) goes
        assert third.wait(10) == 130 and not third.events_named("stage_started")
        said = [line for line in third.stderr_text().splitlines() if "stopped by signal" in line]
        third_run = re.fullmatch(
            r"pp-launch: stopped by signal 2 while placing run ([0-9a-f]{12}), before any stage was created: the "
            r"run's guard on \S+ was removed; nothing else was touched",
            said[0] if len(said) == 1 else "",
        )
        assert third_run is not None, third.stderr_text()
        stopped = third.events_named("chain_stopped")
        assert [(e["reason"], e["exit_code"], e["run"]) for e in stopped] == [("signal", 130, third_run[1])], stopped
        assert run_containers(engine, third_run[1]) == []  # its guard is gone by the time it says so
        prefix = unique("node")  # pp-gpu-node (PP_GPUS=auto) waits on the same lock, and a stop ends it there too
        node_env = {"STAGE": "0", "PP_GPUS": "auto", "PP_CONTAINER_PREFIX": prefix, "PP_IMAGE": stub_image}
        node = Launcher("node", env={**other, **node_env})
        assert wait_until(lambda: "waiting for the GPU lock" in node.stderr_text(), 30), node.stderr_text()
        node.signal(signal.SIGTERM)
        assert node.wait(10) == 143, node.stderr_text()
        assert "stopped by signal 15 while placing run " in node.stderr_text(), node.stderr_text()
        assert "before any stage was created: the run's guard on " in node.stderr_text(), node.stderr_text()
        assert engine.inspect(f"{prefix}-0") is None  # nothing of it was started
        assert wait_until(lambda: watchdogs(PP_CONTAINER_PREFIX=prefix) == [], 20)  # its guard's watchdog is done
        first.wait_event("pp_stage_roster", timeout=60)
        second.wait_event("pp_stage_roster", timeout=60)
        guard = engine.inspect(lock["Id"])
        assert guard is not None and guard["State"]["Running"] and guard["Name"].startswith("/pp-guard-"), guard
        mine = [g for e in first.events_named("stage_started") for g in e["gpus"]]
        theirs = [g for e in second.events_named("stage_started") for g in e["gpus"]]
        assert len(mine) == len(theirs) == 2 and not set(mine) & set(theirs)
    finally:
        for launcher in (first, second):
            if launcher is not None:
                launcher.signal(signal.SIGTERM)
                launcher.wait(30)
    assert engine.inspect("pp-launch-gpu-lock") is None


def test_a_detached_launcher_killed_during_bring_up_leaves_no_gpu_held(engine, stub_image, state_dir) -> None:
    """Its containers went, but its reservation stayed forever and refused every later chain.
    Nothing is reserved outside the engine now: the next chain gets all four GPUs."""
    up = Launcher(
        "chain", "--stages", "2", *GPU_ARGS, "--detach", "--stage-env", "1:STUB_ANNOUNCE_DELAY=30", env=state_dir
    )
    up.wait_event("stage_started", stage=1, timeout=60)
    remember_run(up.run_id)
    up.signal(signal.SIGKILL)
    up.wait(10)
    assert wait_until(lambda: run_containers(engine, up.run_id) == [], 20)
    assert wait_until(lambda: engine.inspect("pp-launch-gpu-lock") is None, 10)
    after = Launcher("chain", "--stages", "4", *GPU_ARGS, env=state_dir)
    try:
        roster = after.wait_event("pp_stage_roster", timeout=60)
        assert sorted(g for e in after.events_named("stage_started") for g in e["gpus"]) == sorted(UUIDS)
    finally:
        after.signal(signal.SIGTERM)
        assert after.wait(30) == 143
    assert run_containers(engine, roster["run"]) == []


@pytest.fixture
def shell_less_image(engine, stub_image):  # type: ignore[no-untyped-def]
    """The stub image without /bin/sh, dash or cat: what once made the GPU lock's entry exit 127 at once."""
    import io

    name = f"pp-tests/no-shell-{unique('img')}:latest"
    dockerfile = (
        f"FROM {stub_image}\n"
        'RUN ["/usr/bin/rm", "-f", "/bin/sh", "/usr/bin/sh", "/bin/dash", "/usr/bin/dash", "/usr/bin/cat", '
        '"/bin/cat"]\n'
    )
    for _ in engine.api.build(fileobj=io.BytesIO(dockerfile.encode()), tag=name, rm=True, decode=True):
        pass
    try:
        yield name
    finally:
        engine.remove_image(name)


def test_a_stage_image_without_a_shell_never_gets_a_gpu_given_twice(engine, shell_less_image, state_dir) -> None:
    """Two launches at once, stages from an image with no shell and no `cat`: the engine's GPU lock runs pp-launch's
    own image, so the second waits for the first and the four stages hold four different GPUs."""
    args = (
        "chain",
        "--stages",
        "2",
        "--json",
        "--gpus",
        "auto",
        "--gpus-per-stage",
        "1",
        "--gpu-attach",
        "env",
        "--handoff",
        "stdin",
        "--image",
        shell_less_image,
        "--env",
        "STUB_MODE=hold",
        "--grace",
        "1",
    )
    first, second = Launcher(*args, env=state_dir), Launcher(*args, env=state_dir)
    try:
        for launcher in (first, second):
            launcher.wait_event("pp_stage_roster", timeout=60)
        held = [g for launcher in (first, second) for e in launcher.events_named("stage_started") for g in e["gpus"]]
        assert sorted(held) == sorted(UUIDS)  # four stages, four different GPUs: none given twice
    finally:
        for launcher in (first, second):
            launcher.signal(signal.SIGINT)
            assert launcher.wait(30) == 130
    for launcher in (first, second):
        assert run_containers(engine, launcher.run_id) == []


@pytest.mark.parametrize("how", ["removed", "renamed"])
def test_a_lock_removed_while_its_launch_places_stops_that_launch_and_no_gpu_is_given_twice(
    engine, stub_image, state_dir, how
) -> None:
    """Stages come up in turn, so the first launch holds the engine's GPU lock while stage 0 loads (3 s); another
    client removes the lock (`docker rm -f`, or an old `down --all`), or renames it (the lock is the run's guard,
    renamed: `docker rename`), and a second launch takes it and places. The first sees its lock gone, by id, before
    it lets go: it stops (exit 1, one line saying how), nothing of it is left, and at no moment do two running
    stages hold one GPU."""
    import subprocess

    args = (
        "chain",
        "--stages",
        "2",
        "--json",
        "--gpus",
        "auto",
        "--gpus-per-stage",
        "2",
        "--gpu-attach",
        "env",
        "--env",
        "STUB_MODE=hold",
        "--grace",
        "1",
        "--bring-up",
        "in-turn",
    )
    first = Launcher(*args, "--stage-env", "0:STUB_ANNOUNCE_DELAY=3", env=state_dir)
    second: Launcher | None = None
    try:
        first.wait_event("stage_started", stage=0, timeout=60)
        lock = engine.inspect("pp-launch-gpu-lock")
        assert lock is not None and lock["Config"]["Labels"]["pp-launch.run"] == first.run_id
        elsewhere = unique("pp-tests-renamed")
        change = ["rm", "-f", lock["Id"]] if how == "removed" else ["rename", lock["Id"], elsewhere]
        subprocess.run(["docker", *change], check=True, capture_output=True)
        second = Launcher("chain", "--stages", "2", *GPU_ARGS, "--grace", "1", env=state_dir)  # the two GPUs left
        seen: list[list[str]] = []

        def sample() -> bool:
            rows = engine.containers(["pp-launch.gpus"])
            held = [g for c in rows if c.state == "running" for g in c.labels["pp-launch.gpus"].split(",") if g]
            seen.append(held)
            return first.proc.poll() is not None

        assert wait_until(sample, 60, 0.05)
        assert first.wait(10) == 1, first.stderr_text()
        said = "removed" if how == "removed" else f"renamed to {elsewhere}"
        assert f"was {said} by another client" in first.stderr_text(), first.stderr_text()
        assert all(len(held) == len(set(held)) for held in seen)  # never one GPU in two running stages
        assert run_containers(engine, first.run_id) == []
        second.wait_event("pp_stage_roster", timeout=60)
    finally:
        for launcher in (first, second):
            if launcher is not None and launcher.proc.poll() is None:
                launcher.signal(signal.SIGINT)
                launcher.wait(30)


def test_down_of_a_run_still_placing_is_said_as_down_by_both_sides(engine, stub_image, state_dir) -> None:
    """A launch waiting for the GPU lock another run holds has a guard and no stage. `down RUN2` stops it through
    that guard: the launcher says one line, that `pp-launch down` stopped it while placing (not a lock removed by
    another client), exit 143 and chain_stopped `down`; `down` counts the run it stopped that had no stage yet.
    (`down --all` says the same of such a run; it is not run here: the suite's engine has other owners' runs.)"""
    first = Launcher("chain", "--stages", "2", *GPU_ARGS, "--bring-up", "in-turn",
                     "--env", "STUB_ANNOUNCE_DELAY=8", env=state_dir)  # fmt: skip
    second = None
    try:
        first.wait_event("stage_started", stage=0, timeout=60)
        other = {**state_dir, "PP_LAUNCH_STATE_DIR": state_dir["PP_LAUNCH_STATE_DIR"] + "-machine-2"}
        second = Launcher("chain", "--stages", "2", *GPU_ARGS, env=other)
        assert wait_until(lambda: "waiting for the GPU lock" in second.stderr_text(), 30), second.stderr_text()
        every = engine.containers(["pp-launch.run"])  # beside other runs (CI's real work): the one with no stage
        staged = {c.labels["pp-launch.run"] for c in every if c.labels.get("pp-launch.stage", "").isdigit()}
        placing = {c.labels["pp-launch.run"] for c in every} - staged - {first.run_id}
        assert len(placing) == 1, placing
        run2 = placing.pop()
        down = Launcher("down", run2, "--grace", "1", env=other)
        assert down.wait(60) == 0, down.stderr_text()
        assert second.wait(30) == 143, second.stderr_text()
        said = [line for line in second.stderr_text().splitlines() if line.startswith("pp-launch: ")][1:]
        assert said == [
            f"pp-launch: stopped by 'pp-launch down' (told to the run's guard) while placing run {run2}, before any "
            "stage was created: its guard and GPU lock went with it; nothing else was touched"
        ], second.stderr_text()
        assert [(e["reason"], e["exit_code"]) for e in second.events_named("chain_stopped")] == [("down", 143)]
        summary = down.stderr_text()
        assert f"stopped 1 run still placing ({run2})" in summary, summary
        assert run_containers(engine, run2) == [] and first.proc.poll() is None  # the run coming up: untouched
    finally:
        for launcher in (first, second):
            if launcher is not None and launcher.proc.poll() is None:
                launcher.signal(signal.SIGINT)
                launcher.wait(60)
