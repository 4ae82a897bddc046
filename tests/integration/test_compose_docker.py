"""Chains as Compose projects, on the real engine with Compose v2."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pp_launch.app import compose
from pp_launch.cli.main import main
from pp_launch.core import labels

from ..helpers import Launcher, remember_run, unique, wait_until
from ..unit.test_compose import CLEAN_ENV, DATA

pytestmark = pytest.mark.docker


def write(tmp_path: Path, *args: str) -> tuple[Path, str]:
    result = CliRunner().invoke(main, ["compose", *args], env=CLEAN_ENV, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    path = tmp_path / "chain.yaml"
    path.write_text(result.stdout)
    return path, result.stdout


def dc(path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-f", str(path), *args], capture_output=True, text=True, check=check, timeout=180
    )


@pytest.fixture
def project(engine) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = unique("ppc")
    remember_run(compose.run_id_for(name))
    yield name
    for c in engine.containers([f"com.docker.compose.project={name}"]):
        engine.remove(c.id)


def leftovers(engine, name: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    label = f"label=com.docker.compose.project={name}"
    counts = {"containers": len(engine.containers([f"com.docker.compose.project={name}"]))}
    for kind in ("network", "volume"):
        out = subprocess.run(["docker", kind, "ls", "-q", "--filter", label], capture_output=True, text=True).stdout
        counts[kind + "s"] = len(out.split())
    return counts


@pytest.mark.full  # every shape; the quick tier runs the demo
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("gpus", ["none", "auto"])
def test_rendered_files_pass_compose_config(engine, tmp_path: Path, project: str, stages: int, gpus: str) -> None:
    args = ["--stages", str(stages), "--project", project, "--gpus", gpus]
    if gpus == "auto":
        args += ["--gpu-inventory", str(DATA / "plain-4gpu.json")]
    path, _ = write(tmp_path, *args)
    resolved = dc(path, "config").stdout
    assert f"container_name: {project}-stage-{stages - 1}" in resolved
    assert ("device_ids:" in resolved) == (gpus == "auto")


def test_a_four_stage_demo_starts_every_service_at_once_and_down_leaves_nothing(
    engine, stub_image, tmp_path: Path, project: str
) -> None:
    path, _ = write(tmp_path, "--stages", "4", "--project", project, "--gpus", "none", "--addr-timeout", "30")
    try:
        up = dc(path, "up", "-d")
        assert up.returncode == 0, up.stderr
        for k in range(4):
            assert f"Container {project}-stage-{k}  Started" in up.stderr
        assert "Healthy" not in up.stderr  # no service waits on another: all start together
        assert wait_until(lambda: "match=true" in dc(path, "logs", "stage-0").stdout, 60)
        ps = Launcher("ps", "--json")
        assert ps.wait(30) == 0
        mine = [r for r in ps.events if r["run"] == compose.run_id_for(project)]
        assert [(r["stage"], r["owner_status"]) for r in mine] == [(k, "compose") for k in range(4)]
        waited = Launcher("wait", compose.run_id_for(project), "--timeout", "60")  # compose keeps its stages
        assert waited.wait(90) == 0, waited.stderr_text()
        assert sorted(line.split()[1] for line in waited.stdout_lines) == ["0", "1", "2", "3"]
    finally:
        down = dc(path, "down", check=False)
    assert down.returncode == 0, down.stderr
    assert leftovers(engine, project) == {"containers": 0, "networks": 0, "volumes": 0}
    assert not Path(f"/tmp/pp-launch-compose/{project}").exists()  # the hand-off lived in stage 0's /dev/shm


@pytest.mark.full  # compose faults
def test_a_stage_that_never_announces_stops_the_rest_and_down_still_cleans(
    engine, stub_image, tmp_path: Path, project: str
) -> None:
    path, _ = write(
        tmp_path,
        "--stages",
        "4",
        "--project",
        project,
        "--gpus",
        "none",
        "--addr-timeout",
        "4",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "1:STUB_NO_ANNOUNCE=1",
    )
    try:
        up = dc(path, "up", "-d", "--wait", check=False)
        assert up.returncode != 0
        info = {k: engine.inspect(f"{project}-stage-{k}")["State"] for k in range(4)}
        assert info[1]["Health"]["Status"] == "unhealthy"
        # stage 2 waited --addr-timeout for stage 1's address, then gave up without starting its worker
        assert info[2]["Status"] == "exited" and info[2]["ExitCode"] == 1
        assert "stage-1.addr after 4 s: the earlier stage is not up" in dc(path, "logs", "stage-2").stdout
        run = compose.run_id_for(project)
        down = Launcher("down", run, "--grace", "1")  # pp-launch can stop a compose run too
        assert down.wait(60) == 0, down.stderr_text()
        assert engine.containers([f"{labels.RUN}={run}"]) == []
    finally:
        dc(path, "down", check=False)
    assert leftovers(engine, project) == {"containers": 0, "networks": 0, "volumes": 0}


@pytest.mark.full  # compose faults
def test_a_malformed_announcement_keeps_the_stage_unhealthy(engine, stub_image, tmp_path: Path, project: str) -> None:
    evil = "PP_GPU_NODE_ADDR " + "ab" * 32 + " 127.0.0.1:1;touch /tmp/x"
    path, _ = write(
        tmp_path,
        "--stages",
        "2",
        "--project",
        project,
        "--gpus",
        "none",
        "--addr-timeout",
        "3",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        f"0:STUB_ANNOUNCE_LINE={evil}",
    )
    try:
        up = dc(path, "up", "-d", "--wait", check=False)
        assert up.returncode != 0
        logs = dc(path, "logs", "stage-0").stdout
        assert "malformed announcement, not passed on" in logs
        later = dc(path, "logs", "stage-1").stdout
        assert "stage-0.addr after 3 s" in later and "touch" not in later  # never handed on
    finally:
        dc(path, "down", check=False)
