"""The fake NVIDIA Container Toolkit's pure parts: how NVIDIA_VISIBLE_DEVICES resolves, what a container's NVML
then lists (through the fake library and the real pynvml), the runtime wrapper's hook injection, the CDI spec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pp_launch.adapters import inventory_file
from pp_launch.testing import fake_nvml, fake_toolkit

DATA = Path(__file__).resolve().parents[1] / "data"
MIG = inventory_file.load(DATA / "mig-2gpu.json")
EIGHT = inventory_file.load(DATA / "nvlink-8gpu.json")


@pytest.mark.parametrize(
    ("value", "positions"),
    [
        ("all", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("3", [3]),
        ("5,1", [1, 5]),
        (EIGHT.gpus[6].uuid, [6]),
        (f"{EIGHT.gpus[2].uuid},0", [0, 2]),
        ("none", []),
        ("1,1", [1]),
    ],
)
def test_visible_devices_resolve_as_the_toolkit_reads_them(value: str, positions: list[int]) -> None:
    found = fake_toolkit.resolve(EIGHT, value)
    assert found is not None and found[0] == positions


@pytest.mark.parametrize("value", [None, "", "void"])
def test_unset_empty_and_void_leave_the_container_alone(value: str | None) -> None:
    assert fake_toolkit.resolve(EIGHT, value) is None


@pytest.mark.parametrize("value", ["8", "GPU-ffffffff-0000-4000-8000-000000000000", "0,nope"])
def test_an_unknown_device_is_refused(value: str) -> None:
    with pytest.raises(fake_toolkit.UnknownDevice):
        fake_toolkit.resolve(EIGHT, value)


def read(lib: Path, config: Path) -> dict[str, object]:
    code = "import json; from pp_launch.adapters import nvml; print(json.dumps(nvml.read_inventory().to_json()))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=fake_nvml.environ(lib, config),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def test_a_mig_uuid_shows_its_gpu_with_that_mig_device_only(fake_nvml_lib: Path, tmp_path: Path) -> None:
    mig = MIG.gpus[0].mig_devices[1].uuid
    found = fake_toolkit.resolve(MIG, mig)
    assert found is not None
    config = tmp_path / "config"
    config.write_text(fake_toolkit.visible_config(MIG, *found))
    doc = read(fake_nvml_lib, config)
    gpus = doc["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 1
    assert [m["uuid"] for m in gpus[0]["mig_devices"]] == [mig]


def test_the_runtime_adds_the_hook_once_when_nvidia_visible_devices_is_set(tmp_path: Path) -> None:
    bin_dir = fake_toolkit.install(tmp_path / "bin", DATA / "nvlink-8gpu.json", tmp_path / "lib.so")
    runc = tmp_path / "runc-bin"
    runc.mkdir()
    (runc / "runc").write_text('#!/bin/sh\necho "runc $*"\n')
    (runc / "runc").chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]}}
    (bundle / "config.json").write_text(json.dumps(config))
    env = {"PATH": f"{runc}:/usr/bin:/bin"}
    for _ in range(2):
        done = subprocess.run(
            [str(bin_dir / fake_toolkit.RUNTIME), "--root", "/x", "create", "--bundle", str(bundle), "cid"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == f"runc --root /x create --bundle {bundle} cid"
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]["prestart"]
    assert hooks == [{"path": str(bin_dir / fake_toolkit.HOOK), "args": [fake_toolkit.HOOK, "prestart"]}]


def test_the_cdi_spec_names_each_gpu_by_index_and_uuid(tmp_path: Path) -> None:
    spec = json.loads(
        fake_toolkit.write_cdi_spec(tmp_path / "cdi", EIGHT, tmp_path / "lib.so", tmp_path / "parts").read_text()
    )
    assert spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [n for g in EIGHT.gpus for n in (str(g.index), g.uuid)] + ["all"]
    every = spec["devices"][-1]["containerEdits"]["mounts"]
    assert len(every) == len(EIGHT.gpus)  # `all` mounts every GPU's part of the config
    inside = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert inside == {fake_nvml.CONTAINER_LIBRARY, f"{fake_nvml.CONTAINER_CONFIG}/00-system"}


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["/venv/bin/python", "/venv/bin/pp-launch", "chain"], True),
        (["pp-gpu-node"], True),
        (["python", "-m", "pp_launch", "chain"], True),
        (["python", "-m", "pp_launch.adapters.watchdog", "r", "5"], True),
        (["/opt/pp-launch/docker26/usr/sbin/dockerd", "-H", "unix:///tmp/pp-launch.sock"], False),
        (["python", "-m", "pytest", "-p", "pp_launch"], False),
        (["bash", "wrappers/docker-gpu-node.sh"], True),
    ],
)
def test_the_leak_guard_knows_a_launcher_from_a_path_with_pp_launch_in_it(argv: list[str], launcher: bool) -> None:
    from pp_launch.testing.fixtures import is_launcher

    assert is_launcher(argv) is launcher
