"""The fake NVML library through the real, unreplaced pynvml: inventories round-trip, failures read cleanly.

Every read here goes through `CDLL("libnvidia-ml.so.1")` in a child process whose library path holds the fake
(pynvml keeps the library it loaded for the life of a process, so each read runs in its own child).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pp_launch.adapters import inventory_file
from pp_launch.core.gpu.inventory import GpuInventory, GpuProcess
from pp_launch.testing import fake_nvml
from pp_launch.testing.inventories import random_inventory

DATA = Path(__file__).resolve().parents[1] / "data"
INVENTORIES = sorted(DATA.glob("*.json"))
PP_LAUNCH = str(Path(sys.executable).with_name("pp-launch"))

# Reads one inventory per config path given, in one process (the fake re-reads its config at each first init).
READ_MANY = """
import json, os, sys
from pp_launch.adapters.nvml import read_inventory, NvmlUnavailable
for path in sys.argv[1:]:
    os.environ["PP_FAKE_NVML_CONFIG"] = path
    try:
        inv = read_inventory()
        print(json.dumps({"inventory": inv.to_json(), "note": inv.note}))
    except NvmlUnavailable as exc:
        print(json.dumps({"error": str(exc)}))
"""


def read_many(lib: Path, configs: list[Path], fail: str = "") -> list[dict[str, object]]:
    env = fake_nvml.environ(lib, configs[0], fail)
    done = subprocess.run(
        [sys.executable, "-c", READ_MANY, *map(str, configs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return [nvml_only(json.loads(line)) for line in done.stdout.splitlines()]


def nvml_only(doc: object) -> object:
    """What NVML said, without what this host's /proc adds to a process (its user and command: a made-up pid
    may be a real process here)."""
    if isinstance(doc, dict):
        return {k: nvml_only(v) for k, v in doc.items() if k not in ("user", "command")}
    if isinstance(doc, list):
        return [nvml_only(v) for v in doc]
    return doc


@pytest.mark.parametrize("path", INVENTORIES, ids=[p.stem for p in INVENTORIES])
def test_gpus_record_through_the_fake_library_gives_back_the_inventory(
    fake_nvml_lib: Path, path: Path, tmp_path: Path
) -> None:
    config = fake_nvml.write_config(inventory_file.load(path), tmp_path / "config")
    out = tmp_path / "recorded.json"
    done = subprocess.run(
        [PP_LAUNCH, "gpus", "--record", str(out)],
        env=fake_nvml.environ(fake_nvml_lib, config),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert nvml_only(json.loads(out.read_text())) == json.loads(path.read_text())


def test_random_inventories_round_trip(fake_nvml_lib: Path, tmp_path: Path) -> None:
    rng = random.Random(1103)
    made = [random_inventory(rng) for _ in range(200)]
    configs = [fake_nvml.write_config(inv, tmp_path / f"config-{i}") for i, inv in enumerate(made)]
    for i, (inv, got) in enumerate(zip(made, read_many(fake_nvml_lib, configs), strict=True)):
        assert got.get("inventory") == inv.to_json(), f"inventory {i} (seed 1103) did not round-trip: {configs[i]}"


def test_the_per_gpu_directory_form_reads_as_the_whole_and_a_subset_keeps_host_order(
    fake_nvml_lib: Path, tmp_path: Path
) -> None:
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    files = fake_nvml.write_config_dir(inv, tmp_path / "all")
    (whole,) = read_many(fake_nvml_lib, [tmp_path / "all"])
    assert whole["inventory"] == inv.to_json()
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "00-system").write_text((tmp_path / "all" / "00-system").read_text())
    for i in (5, 2):
        (sub / files[i].name).write_text(files[i].read_text())
    (got,) = read_many(fake_nvml_lib, [sub])
    doc = got["inventory"]
    assert isinstance(doc, dict)
    assert [g["uuid"] for g in doc["gpus"]] == [inv.gpus[2].uuid, inv.gpus[5].uuid]
    assert doc["topology"] == [[0, inv.topology[2][5]], [inv.topology[5][2], 0]]  # type: ignore[index]


# ---------------------------------------------------------------------------------------- failures
def run_gpus(lib: Path, config: Path, fail: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PP_LAUNCH, "gpus", *args],
        env=fake_nvml.environ(lib, config, fail),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def eight(tmp_path: Path) -> tuple[GpuInventory, Path]:
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    return inv, fake_nvml.write_config(inv, tmp_path / "config")


def test_driver_not_loaded_is_a_clear_message(fake_nvml_lib: Path, eight: tuple[GpuInventory, Path]) -> None:
    done = run_gpus(fake_nvml_lib, eight[1], "driver_not_loaded")
    assert "Traceback" not in done.stderr
    assert "NVIDIA kernel driver is not loaded" in done.stdout + done.stderr


def test_a_lost_gpu_is_left_out_and_said(fake_nvml_lib: Path, eight: tuple[GpuInventory, Path]) -> None:
    inv, config = eight
    done = run_gpus(fake_nvml_lib, config, f"lost:{inv.gpus[3].uuid}", "--json")
    assert done.returncode == 0, done.stderr
    assert "GPU 3 is left out: NVML says GPU is lost" in done.stderr
    doc = json.loads(done.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 4, 5, 6, 7]
    assert len(doc["topology"]) == 7


@pytest.mark.parametrize(
    ("field", "key"),
    [
        ("utilization", "utilization_gpu_pct"),
        ("processes", "processes"),
        ("memory", "memory_total_mib"),
        ("name", "name"),
        ("mig", "mig_enabled"),
    ],
)
def test_a_field_nvml_cannot_read_is_unknown(
    fake_nvml_lib: Path, eight: tuple[GpuInventory, Path], field: str, key: str
) -> None:
    done = run_gpus(fake_nvml_lib, eight[1], f"unsupported:{field}", "--json")
    assert done.returncode == 0, done.stderr
    for gpu in json.loads(done.stdout)["gpus"]:
        assert gpu.get(key) in (None, ""), gpu


@pytest.mark.parametrize(
    ("field", "key"),
    [("topology", "topology"), ("nvlink", "nvlink"), ("driver", "driver_version"), ("cuda", "cuda_version")],
)
def test_a_machine_field_nvml_cannot_read_is_unknown(
    fake_nvml_lib: Path, eight: tuple[GpuInventory, Path], field: str, key: str
) -> None:
    done = run_gpus(fake_nvml_lib, eight[1], f"unsupported:{field}", "--json")
    assert done.returncode == 0, done.stderr
    assert key not in json.loads(done.stdout)


def test_a_process_list_that_grows_between_size_query_and_read(fake_nvml_lib: Path, tmp_path: Path) -> None:
    plain = inventory_file.load(DATA / "plain-4gpu.json")
    running = (GpuProcess(4242, 1000), GpuProcess(4343, None))
    inv = dataclasses.replace(
        plain, gpus=(plain.gpus[0], dataclasses.replace(plain.gpus[1], processes=running), *plain.gpus[2:])
    )
    busy = [1]
    config = fake_nvml.write_config(inv, tmp_path / "config")
    (few,) = read_many(fake_nvml_lib, [config], "grow:2")  # within pynvml's headroom: the list as read
    gpu = few["inventory"]["gpus"][busy[0]]  # type: ignore[index]
    assert len(gpu["processes"]) == len(inv.gpus[busy[0]].processes or ()) + 2
    (many,) = read_many(fake_nvml_lib, [config], "grow:500")  # beyond it: unknown, not a traceback
    assert "processes" not in many["inventory"]["gpus"][busy[0]]  # type: ignore[index]


def test_no_config_reads_as_no_driver(fake_nvml_lib: Path, tmp_path: Path) -> None:
    (got,) = read_many(fake_nvml_lib, [tmp_path / "absent"])
    assert "driver is not loaded" in str(got["error"])


def test_temperature_power_and_who_runs_a_process_come_through_the_c_abi(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """nvmlDeviceGetTemperature/PowerUsage/EnforcedPowerLimit as a driver answers them (milliwatts), `unsupported`
    as unknown; a process's user and command from this host's /proc (here: the reading process itself)."""
    inv = inventory_file.load(DATA / "plain-4gpu.json")
    gpus = list(inv.gpus)
    gpus[0] = dataclasses.replace(
        gpus[0], temperature_c=41, power_w=123.456, power_limit_w=700.0, processes=(GpuProcess(0, 300),)
    )
    config = fake_nvml.write_config(dataclasses.replace(inv, gpus=tuple(gpus)), tmp_path / "config")
    text = config.read_text().replace("proc 0 300", "proc SELF 300")
    code = (
        "import json, os, pathlib, sys\n"
        f"cfg = pathlib.Path({str(config)!r}); cfg.write_text(cfg.read_text().replace('SELF', str(os.getpid())))\n"
        "from pp_launch.adapters.nvml import read_inventory\n"
        "print(json.dumps(read_inventory().to_json()))\n"
    )
    config.write_text(text)
    for fail, expect in (("", (41, 123.456, 700.0)), ("unsupported:temperature,unsupported:power", None)):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=fake_nvml.environ(fake_nvml_lib, config, fail),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        g0 = json.loads(done.stdout)["gpus"][0]
        got = (g0.get("temperature_c"), g0.get("power_w"), g0.get("power_limit_w"))
        assert got == (expect or (None, None, None)), g0
        config.write_text(text)
    (proc,) = g0["processes"]
    assert proc["user"] == __import__("pwd").getpwuid(os.getuid()).pw_name
    assert sys.executable in proc["command"] and "read_inventory" in proc["command"]
