"""GPU exclusivity on the real engine, with a modelled 4-GPU inventory and --gpu-attach env (no GPU needed):
containers labelled as holding GPUs are avoided; concurrent launches never share a GPU."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ..helpers import Launcher, run_containers, unique

pytestmark = pytest.mark.docker
INVENTORY = str(Path(__file__).parent.parent / "data" / "plain-4gpu.json")
UUIDS = [g["uuid"] for g in json.loads(Path(INVENTORY).read_text())["gpus"]]


@pytest.fixture
def state_dir(tmp_path: Path) -> dict[str, str]:
    """Each test gets its own lock and reservations: no chain elsewhere on the host can interfere."""
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
    assert list((Path(state_dir["PP_LAUNCH_STATE_DIR"]) / "reservations").iterdir()) == []
