"""Stages shaped like swactor's pp-worker (STUB_MODE=pp-worker, run as /usr/local/bin/pp-worker, the way a real
`swactor-pp-gpu` image is run): the seed node's options reach every stage, a stage without SEED_ADDR fails as the
real binary does, and the same holds through `pp-launch chain`, `pp-gpu-node` and `compose`."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from ..helpers import Launcher, run_containers, unique, wait_until
from .test_compose_docker import dc, leftovers, project, write  # noqa: F401  (project is a fixture)
from .test_node_docker import node_env

pytestmark = pytest.mark.docker
SEED = "5eed" * 16
PP_WORKER = "/usr/local/bin/pp-worker"


def chain(*extra: str, env: dict[str, str] | None = None) -> Launcher:
    return Launcher(
        "chain", "--json", "--gpus", "none", "--entrypoint", PP_WORKER, "--env", "STUB_MODE=pp-worker", *extra, env=env
    )


def test_a_chain_of_pp_worker_stages_joins_the_seed_and_each_stage_gets_its_peers(engine, stub_image) -> None:
    launcher = chain("--stages", "3", "--env", "STUB_LOAD_SECONDS=1", env={"SEED_ADDR": SEED})
    roster = launcher.wait_event("pp_stage_roster", timeout=60)
    ids = [s["node_id_hex"] for s in roster["stages"]]
    assert wait_until(lambda: sum("model loaded" in line for line in launcher.stderr_lines) == 3, 30)
    log = launcher.stderr_text()
    for k in range(3):
        assert f"[stage {k}] pp-worker: joining seed {SEED}" in log
    for k in (1, 2):
        assert f"[stage {k}] pp-worker: also joining peer {ids[k - 1]}" in log
        assert f"[stage {k}] pp-worker: also joining first-stage peer {ids[0]}" in log
    run = launcher.run_id
    inspect = engine.inspect(run_containers(engine, run)[0])
    # under the hand-off entry (parallel bring-up), which execs the --entrypoint once the peers are known
    assert inspect["Config"]["Entrypoint"][-1] == "pp-handoff" and inspect["Config"]["Cmd"] == [PP_WORKER]
    assert f"SEED_ADDR={SEED}" in inspect["Config"]["Env"]
    launcher.signal(signal.SIGINT)
    assert launcher.wait(30) == 130
    assert run_containers(engine, run) == []


def test_without_a_seed_the_first_stage_exits_2_as_pp_worker_does_and_the_chain_names_it(engine, stub_image) -> None:
    launcher = chain("--stages", "2")
    assert launcher.wait(60) == 1
    text = launcher.stderr_text()
    assert "[stage 0] pp-worker: env SEED_ADDR is required" in text
    stopped = launcher.wait_event("chain_stopped")
    assert stopped["exit_code"] == 1 and "stage 0" in stopped.get("message", text)
    assert run_containers(engine, stopped["run"]) == []


def test_a_bad_seed_is_refused_before_anything_starts(engine, stub_image) -> None:
    launcher = chain("--stages", "2", "--seed-addr", "not-hex")
    assert launcher.wait(30) == 2
    assert "SEED_ADDR not-hex is not the seed's node id (64 hex digits)" in launcher.stderr_text()


@pytest.mark.parametrize(
    ("env", "code", "message"),
    [
        ({"NUM_STAGES": "1"}, 2, "pp-worker: invalid STAGE=0 for NUM_STAGES=1 (need NUM_STAGES >= 2"),
        ({"NUM_STAGES": "x2"}, 2, 'pp-worker: env NUM_STAGES="x2" must be a u32'),
        ({"NUM_STAGES": "2"}, 2, "pp-worker: env SEED_ADDR is required"),
        ({"NUM_STAGES": "2", "SEED_ADDR": "abc"}, 101, "SEED_ADDR must be 64 hex characters (32 bytes)"),
    ],
)
def test_pp_gpu_node_runs_the_pp_worker_boundary(
    engine, stub_image, env: dict[str, str], code: int, message: str
) -> None:
    node = Launcher(
        "node",
        env=node_env(
            unique("ppw"), stub_image, PP_ENTRYPOINT=PP_WORKER, STUB_MODE="pp-worker", PP_FORWARD_ENV="STUB_MODE", **env
        ),
    )
    assert node.wait(60) == code
    assert message in node.stderr_text()


def test_pp_gpu_node_pp_worker_announces_first_then_loads(engine, stub_image) -> None:
    env = node_env(
        unique("ppw"),
        stub_image,
        PP_ENTRYPOINT=PP_WORKER,
        STUB_MODE="pp-worker",
        STUB_LOAD_SECONDS="30",
        PP_FORWARD_ENV="STUB_MODE,STUB_LOAD_SECONDS",
        NUM_STAGES="2",
        SEED_ADDR=SEED,
    )
    node = Launcher("node", env=env)
    assert wait_until(lambda: any(line.startswith("PP_GPU_NODE_ADDR") for line in node.stdout_lines), 30)
    assert wait_until(lambda: "loading the model slice (30 s)" in "\n".join(node.stdout_lines), 10)
    node.signal(signal.SIGTERM)
    assert node.wait(30) in (0, 143)


def test_compose_runs_pp_worker_stages_with_the_seed(engine, stub_image, tmp_path: Path, project: str) -> None:  # noqa: F811
    path, text = write(
        tmp_path,
        "--stages",
        "2",
        "--project",
        project,
        "--gpus",
        "none",
        "--entrypoint",
        PP_WORKER,
        "--seed-addr",
        SEED,
        "--env",
        "STUB_MODE=pp-worker",
    )
    assert re.search(rf"SEED_ADDR: ['\"]?{SEED}", text)
    try:
        up = dc(path, "up", "-d")
        assert up.returncode == 0, up.stderr
        assert wait_until(lambda: "also joining peer" in dc(path, "logs", "stage-1").stdout, 60)
        assert f"joining seed {SEED}" in dc(path, "logs", "stage-0").stdout
    finally:
        down = dc(path, "down", check=False)
    assert down.returncode == 0, down.stderr
    assert leftovers(engine, project) == {"containers": 0, "networks": 0, "volumes": 0}
