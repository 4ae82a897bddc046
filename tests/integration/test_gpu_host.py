"""The GPU path end to end on the fake NVIDIA host (tests/gpu_host.py): the launcher reads the host's NVML (the
fake library, never an inventory file), plans, and the engine's own GPU machinery (the nvidia device driver and
its prestart hook, the NVIDIA runtime, CDI) gives each container its GPUs; each stub stage prints what NVML
inside its container lists (`PP_STAGE_GPUS`), and that is checked against the plan."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ..gpu_host import DOCKER26, docker
from ..helpers import Launcher, unique, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.full]  # three fake-GPU engines (Docker 20.10 and 26): the full tier
IN_CI = os.environ.get("CI") == "true"
MODES = ["request", "env", "cdi"]


def seen_by_stage(launcher: Launcher) -> dict[int, list[str]]:
    """Stage -> the GPU UUIDs its NVML listed, from its `[stage K] PP_STAGE_GPUS ...` line."""
    out = {}
    for line in launcher.stderr_lines + launcher.stdout_lines:
        m = re.match(r"\[stage (\d+)\] PP_STAGE_GPUS (\S+)", line)
        if m:
            out[int(m.group(1))] = [] if m.group(2) == "-" else m.group(2).split(",")
    return out


def need_mode(mode: str) -> None:
    if mode == "cdi" and not (DOCKER26 / "usr" / "sbin" / "dockerd").exists():
        if IN_CI:
            pytest.fail(f"Docker 26 is not unpacked at {DOCKER26} (launcher/scripts/ensure-docker26.sh)")
        pytest.skip(f"Docker 26 is not unpacked at {DOCKER26}: run launcher/scripts/ensure-docker26.sh")


def chain(host, mode: str, *args: str, **env: str) -> Launcher:  # type: ignore[no-untyped-def]
    return Launcher(
        "chain",
        "--json",
        "--gpus",
        "auto",
        "--gpu-attach",
        mode,
        "--env",
        "STUB_MODE=hold",
        *args,
        env=host.env(mode, **env),
    )


def stop(launcher: Launcher) -> int:
    launcher.signal()
    return launcher.wait(60)


@pytest.mark.parametrize("mode", MODES)
def test_four_stages_of_two_gpus_each_see_exactly_their_planned_gpus(gpu_host, mode: str) -> None:
    need_mode(mode)
    launcher = chain(gpu_host, mode, "--stages", "4", "--gpus-per-stage", "2")
    try:
        for k in range(4):
            launcher.wait_event("stage_announced", stage=k, timeout=60)
        planned = {e["stage"]: sorted(e["gpus"]) for e in launcher.events_named("stage_started")}
        assert [len(planned[k]) for k in range(4)] == [2, 2, 2, 2]
        assert len({u for g in planned.values() for u in g}) == 8  # all eight, none twice
        # stage lines come on stderr, events on stdout: wait for the lines, not only the events
        assert wait_until(lambda: len(seen_by_stage(launcher)) == 4, 10), launcher.stderr_text()
        seen = seen_by_stage(launcher)
        assert {k: sorted(v) for k, v in seen.items()} == planned, launcher.stderr_text()
    finally:
        stop(launcher)
    engine = gpu_host.engine(mode)
    assert docker(engine.host, "ps", "-aq").stdout.split() == []


@pytest.mark.parametrize("mode", MODES)
def test_two_chains_at_once_get_disjoint_gpus_and_a_third_is_refused(gpu_host, mode: str) -> None:
    need_mode(mode)
    go = threading.Barrier(2)
    launchers: list[Launcher] = []

    def start() -> None:
        go.wait()
        launchers.append(chain(gpu_host, mode, "--stages", "2", "--gpus-per-stage", "2"))

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        for launcher in launchers:
            for k in range(2):
                launcher.wait_event("stage_announced", stage=k, timeout=60)
        held = [{u for e in launcher.events_named("stage_started") for u in e["gpus"]} for launcher in launchers]
        assert len(held[0]) == len(held[1]) == 4 and not held[0] & held[1]
        for launcher, gpus in zip(launchers, held, strict=True):
            assert wait_until(lambda launcher=launcher: len(seen_by_stage(launcher)) == 2, 10)  # stderr lines
            assert {u for v in seen_by_stage(launcher).values() for u in v} == gpus
        third = subprocess.run(
            [
                sys.executable,
                "-m",
                "pp_launch",
                "chain",
                "--stages",
                "2",
                "--gpus-per-stage",
                "2",
                "--gpus",
                "auto",
                "--gpu-attach",
                mode,
            ],
            env={**os.environ, **gpu_host.env(mode)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert third.returncode == 2, third.stderr
        assert "not enough GPUs: 2 stages x 2 need 4, 0 free of 8" in third.stderr
        assert "held by pp-launch run" in third.stderr
    finally:
        for launcher in launchers:
            stop(launcher)
    assert docker(gpu_host.engine(mode).host, "ps", "-aq").stdout.split() == []


@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_device_stops_the_chain_with_the_toolkit_message(gpu_host, mode: str) -> None:
    """--gpus names a GPU the launcher's NVML knows but the engine's toolkit does not: here, a host whose NVML
    and toolkit disagree is made by giving the launcher a wider inventory file than the engine has."""
    need_mode(mode)
    inv = json.loads(gpu_host.inventory_path.read_text())
    ghost = dict(
        inv["gpus"][0], index=8, uuid="GPU-99999999-0000-4000-8000-000000000000", pci_bus_id="00000000:F0:00.0"
    )
    wider = dict(inv, gpus=[*inv["gpus"], ghost])
    for key in ("topology", "nvlink"):
        wider.pop(key, None)
    path = gpu_host.root / f"wider-{unique('inv')}.json"
    path.write_text(json.dumps(wider))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pp_launch",
            "chain",
            "--stages",
            "1",
            "--gpus",
            ghost["uuid"] + ",",
            "--gpu-attach",
            mode,
            "--gpu-inventory",
            str(path),
        ],
        env={**os.environ, **gpu_host.env(mode)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode != 0
    text = done.stderr
    assert "stage 0" in text and ("unknown device" in text or "unresolvable CDI devices" in text), text
    assert docker(gpu_host.engine(mode).host, "ps", "-aq").stdout.split() == []


def node_run(host, mode: str, value: str) -> list[str]:  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        **host.env(mode),
        "STAGE": "0",
        "PP_GPUS": value,
        "PP_CONTAINER_PREFIX": unique("node"),
        "PP_IMAGE": "pp-launch/stub-worker:latest",
        "STUB_MODE": "hold",
        "STUB_EXIT_AFTER": "0.2",
        "PP_FORWARD_ENV": "STUB_MODE,STUB_EXIT_AFTER",
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    done = subprocess.run(["pp-gpu-node"], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("PP_STAGE_GPUS "))
    return [] if line.split()[1] == "-" else line.split()[1].split(",")


def docker_run(host, mode: str, value: str) -> list[str]:  # type: ignore[no-untyped-def]
    gpus = f'"{value}"' if "," in value else value
    done = docker(
        host.engine(mode).host,
        "run",
        "--rm",
        "--gpus",
        gpus,
        "-e",
        "STUB_MODE=hold",
        "-e",
        "STUB_EXIT_AFTER=0.2",
        "pp-launch/stub-worker:latest",
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("PP_STAGE_GPUS "))
    return [] if line.split()[1] == "-" else line.split()[1].split(",")


@pytest.mark.parametrize("value", ["all", "2", "device=0,2", "device=GPU-00000005-0000-4000-8000-0000001109a3"])
def test_pp_gpu_node_gives_what_docker_run_gpus_gives(gpu_host, value: str) -> None:
    ours = node_run(gpu_host, "request", value)
    assert ours == docker_run(gpu_host, "request", value)
    assert len(ours) == {"all": 8, "2": 2}.get(value, len(value.split(",")))


def test_pp_gpu_node_auto_gets_a_free_gpu_and_sees_it(gpu_host) -> None:
    assert len(node_run(gpu_host, "request", "auto")) == 1


def test_gpus_on_the_host_shows_which_run_and_stage_holds_each_gpu(gpu_host) -> None:
    launcher = chain(gpu_host, "request", "--stages", "2")
    try:
        for k in range(2):
            launcher.wait_event("stage_announced", stage=k, timeout=60)
        run = launcher.run_id
        planned = {e["stage"]: e["gpus"][0] for e in launcher.events_named("stage_started")}
        done = subprocess.run(
            [sys.executable, "-m", "pp_launch", "gpus"],
            capture_output=True,
            text=True,
            env={**os.environ, **gpu_host.env("request")},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        for stage, uuid in planned.items():
            row = next(line for line in done.stdout.splitlines() if uuid in line)
            assert f"{run} stage {stage}" in row, done.stdout
    finally:
        stop(launcher)


@pytest.mark.parametrize("mode", ["request", "cdi"])
def test_compose_services_see_their_gpus(gpu_host, mode: str, tmp_path: Path) -> None:
    need_mode(mode)
    project = unique("gpucompose")
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "pp_launch",
            "compose",
            "--stages",
            "2",
            "--gpus",
            "0,3",
            "--gpu-attach",
            mode,
            "--project",
            project,
            "--env",
            "STUB_MODE=hold",
        ],
        env={**os.environ, **gpu_host.env(mode)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    out = tmp_path / "compose.yaml"
    out.write_text(made.stdout)
    host = gpu_host.engine(mode).host
    base = ["docker", "-H", host, "compose", "-p", project, "-f", str(out)]
    seen: dict[int, list[str]] = {}

    def both_said() -> bool:
        logs = subprocess.run([*base, "logs", "--no-color"], capture_output=True, text=True).stdout
        for m in re.finditer(r"stage-(\d+)\s+\|\s+PP_STAGE_GPUS (\S+)", logs):
            seen[int(m.group(1))] = m.group(2).split(",")
        return len(seen) == 2

    try:
        up = subprocess.run([*base, "up", "-d"], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        assert wait_until(both_said, 60), subprocess.run([*base, "logs"], capture_output=True, text=True).stdout
        inv = gpu_host.inventory
        assert seen == {0: [inv.gpus[0].uuid], 1: [inv.gpus[3].uuid]}
    finally:
        subprocess.run([*base, "down", "-t", "2"], capture_output=True, timeout=120)
    assert docker(host, "ps", "-aq").stdout.split() == []
