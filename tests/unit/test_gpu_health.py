"""GPU health (docs/recovery.md) through the real NVML C ABI: the fake library (pp_launch.testing.fake_nvml) serves
ECC counts, retired pages, row remapping, lost GPUs and Xid events; pp-launch reads them with the unreplaced pynvml
in a child process (pynvml keeps the library it loaded for the life of a process). Placement and `gpus` are then
checked through their own commands."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pp_launch.core import errors
from pp_launch.core.gpu import xid
from pp_launch.core.gpu.allocator import AllocationRequest, allocate
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.testing import fake_nvml

DATA = Path(__file__).resolve().parents[1] / "data"
PP_LAUNCH = str(Path(sys.executable).with_name("pp-launch"))


@pytest.fixture()
def sick(tmp_path: Path) -> tuple[GpuInventory, Path]:
    """The plain 4-GPU machine: GPU 1 with uncorrected ECC errors, GPU 2 with retired pages pending and a failed row
    remap; GPU 0 healthy as NVML reads it, GPU 3 with no health fields at all (an old driver)."""
    inv = GpuInventory.parse((DATA / "plain-4gpu.json").read_text())
    gpus = list(inv.gpus)
    gpus[0] = dataclasses.replace(gpus[0], ecc_uncorrected=0, retired_pages_pending=False, row_remap_failure=False)
    gpus[1] = dataclasses.replace(gpus[1], ecc_uncorrected=2, retired_pages_pending=False, row_remap_failure=False)
    gpus[2] = dataclasses.replace(gpus[2], ecc_uncorrected=0, retired_pages_pending=True, row_remap_failure=True)
    inv = dataclasses.replace(inv, gpus=tuple(gpus))
    config = tmp_path / "nvml.conf"
    config.write_text(fake_nvml.config_text(inv))
    return inv, config


def gpus_cmd(lib: Path, config: Path, *args: str, fail: str = "") -> subprocess.CompletedProcess[str]:
    env = {**fake_nvml.environ(lib, config, fail), "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    env.pop("PP_LAUNCH_GPU_INVENTORY", None)
    return subprocess.run([PP_LAUNCH, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_nvml_health_is_read_and_shown(fake_nvml_lib: Path, sick: tuple[GpuInventory, Path]) -> None:
    _, config = sick
    done = gpus_cmd(fake_nvml_lib, config, "gpus", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [g["health"] for g in doc["gpus"]] == [
        "ok",
        "2 uncorrected ECC errors since the driver loaded",
        "retired pages pending a GPU reset; row remapping failed",
        "unknown",
    ]
    assert doc["gpus"][1]["ecc_uncorrected"] == 2 and doc["gpus"][2]["row_remap_failure"] is True
    table = gpus_cmd(fake_nvml_lib, config, "gpus").stdout.splitlines()
    assert table[0].split()[-1] == "health"
    assert table[1].endswith("ok") and table[2].endswith("UNHEALTHY: 2 uncorrected ECC errors since the driver loaded")
    assert table[4].endswith("?")


def test_a_lost_gpu_is_shown_lost_and_never_placed(fake_nvml_lib: Path, sick: tuple[GpuInventory, Path]) -> None:
    inv, config = sick
    lost = inv.gpus[3].uuid
    done = gpus_cmd(fake_nvml_lib, config, "gpus", "--json", fail=f"lost:{lost}")
    doc = json.loads(done.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2]
    assert doc["lost"] == [{"index": 3, "why": "NVML says GPU is lost"}]
    table = gpus_cmd(fake_nvml_lib, config, "gpus", fail=f"lost:{lost}").stdout
    assert "LOST: NVML says GPU is lost" in table
    named = gpus_cmd(
        fake_nvml_lib, config, "chain", "--stages", "1", "--gpus", "device=3", "--dry-run", fail=f"lost:{lost}"
    )
    assert named.returncode == 2 and "--gpus names '3' (GPU 3), which is lost: NVML says GPU is lost" in named.stderr


def test_placement_passes_over_unhealthy_gpus_unless_allowed(
    fake_nvml_lib: Path, sick: tuple[GpuInventory, Path]
) -> None:
    _, config = sick
    plan = gpus_cmd(fake_nvml_lib, config, "chain", "--stages", "2", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    placed = [s["gpus"] for s in json.loads(plan.stdout)["stages"]]
    assert {g for s in placed for g in s}.isdisjoint(_uuids(config, 1, 2))
    three = gpus_cmd(fake_nvml_lib, config, "chain", "--stages", "3", "--dry-run")
    assert three.returncode == 2
    assert "unhealthy: 2 uncorrected ECC errors since the driver loaded" in three.stderr
    assert "use unhealthy GPUs anyway (--allow-unhealthy" in three.stderr
    named = gpus_cmd(fake_nvml_lib, config, "chain", "--stages", "1", "--gpus", "device=1", "--dry-run")
    assert named.returncode == 2 and "which is unhealthy: 2 uncorrected ECC errors" in named.stderr
    assert "--allow-unhealthy places on it anyway" in named.stderr
    allowed = gpus_cmd(
        fake_nvml_lib,
        config,
        "chain",
        "--stages",
        "1",
        "--gpus",
        "device=1",
        "--dry-run",
        "--allow-unhealthy",
        "--json",
    )
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["stages"][0]["gpus"] == list(_uuids(config, 1))


def _uuids(config: Path, *indices: int) -> set[str]:
    lines = [line.split()[1] for line in config.read_text().splitlines() if line.startswith("gpu ")]
    return {lines[i] for i in indices}


def test_a_gpu_that_faulted_in_the_run_is_never_placed_even_when_unhealthy_ones_are_allowed() -> None:
    inv = GpuInventory.parse((DATA / "plain-4gpu.json").read_text())
    bad = inv.gpus[0].uuid
    ask = AllocationRequest(stages=4, allow_unhealthy=True, avoid=((bad, "Xid 79 (GPU has fallen off the bus)"),))
    with pytest.raises(errors.NotEnoughGpus, match=r"faulted in this run: Xid 79 \(GPU has fallen off the bus\)"):
        allocate(inv, ask, {})
    placed = allocate(inv, dataclasses.replace(ask, stages=3), {})
    assert bad not in {g for s in placed.stage_gpus for g in s}


def test_xid_meanings_and_which_fail_a_stage() -> None:
    assert xid.describe(79) == "Xid 79 (GPU has fallen off the bus)"
    assert all(xid.fails_stage(code) for code in (48, 63, 64, 74, 79, 94, 95))
    assert not xid.fails_stage(13) and not xid.fails_stage(31) and not xid.fails_stage(43)
    assert "catalogue" in xid.meaning(9999)


WATCH = """
import json, sys, threading, time
from pp_launch.adapters.gpu_watch import GpuWatch
seen = []
expected = int(sys.argv[1])  # how many events the test injects: the wait ends when they came, never on a clock
watch = GpuWatch(sys.argv[2:], lambda uuid, index, code: seen.append([uuid, index, code])).start()
print(json.dumps({"ready": True, "note": watch.note}), flush=True)
sys.stdin.readline()  # the test injected its events
deadline = time.monotonic() + 10
while len(seen) < expected and time.monotonic() < deadline:
    time.sleep(0.01)
began = time.monotonic()
watch.stop()
alive = any(t.name == "gpu-watch" for t in threading.enumerate())
print(json.dumps({"seen": seen, "stop_s": time.monotonic() - began, "alive": alive}), flush=True)
"""


def test_the_watch_sees_xids_on_its_gpus_after_it_started_and_nothing_else(
    fake_nvml_lib: Path, sick: tuple[GpuInventory, Path], tmp_path: Path
) -> None:
    inv, config = sick
    events = tmp_path / "xid-events"
    events.write_text(f"xid {inv.gpus[0].uuid} 48\n")  # before the watch: the driver never reports the past
    env = fake_nvml.environ(fake_nvml_lib, config, events=events)
    child = subprocess.Popen(
        [sys.executable, "-c", WATCH, "2", inv.gpus[0].uuid, inv.gpus[2].uuid],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert json.loads(child.stdout.readline()) == {"ready": True, "note": ""}
    fake_nvml.inject_xid(events, inv.gpus[1].uuid, 79)  # a GPU the run does not use
    fake_nvml.inject_xid(events, inv.gpus[2].uuid, 79)
    fake_nvml.inject_xid(events, inv.gpus[0].uuid, 95)
    child.stdin.write("go\n")
    child.stdin.flush()
    result = json.loads(child.stdout.readline())
    assert child.wait(10) == 0
    assert result["seen"] == [[inv.gpus[2].uuid, 2, 79], [inv.gpus[0].uuid, 0, 95]]
    assert result["stop_s"] < 1.0 and result["alive"] is False  # its thread is joined, promptly


def test_a_watch_without_a_driver_says_why_and_starts_nothing(fake_nvml_lib: Path, tmp_path: Path) -> None:
    env = fake_nvml.environ(fake_nvml_lib, tmp_path / "absent", fail="driver_not_loaded")
    done = subprocess.run(
        [sys.executable, "-c", WATCH, "0", "GPU-x"],
        env=env,
        input="go\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    first = json.loads(done.stdout.splitlines()[0])
    assert "not watched for Xid errors" in first["note"]
