"""The NVML reader against a replaced pynvml module: the real call signatures, the real return structures
(pynvml's own ctypes types), pynvml's own error classes and constants."""

from __future__ import annotations

import json
import types
from typing import Any

import pynvml
import pytest

from pp_launch.adapters.nvml import NO_DRIVER, NvmlUnavailable, read_inventory
from pp_launch.core.gpu.inventory import GpuInventory

from ..helpers import NO_DRIVER as SUITE_NO_DRIVER

MIB = 1024 * 1024


class FakeMachine:
    """Two H200s on one host bridge joined by 18 NVLinks; GPU 1 runs a process; GPU 0 has MIG off."""

    def __init__(self, init_error: int | None = None) -> None:
        self.init_error = init_error
        self.calls: list[str] = []
        self.bus = ["00000000:19:00.0", "00000000:3B:00.0"]

    def module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v", "c_nvml", "nvmlPciInfo")):
                setattr(m, name, getattr(pynvml, name))
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(m, name, getattr(self, name))
        return m

    def _log(self, name: str) -> None:
        self.calls.append(name)

    def nvmlInit(self) -> None:
        self._log("init")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._log("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.03"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        _kind, i = handle
        return f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.bus[handle[1]].encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        assert version == pynvml.nvmlMemory_v2, "v2 memory info matches nvidia-smi"
        info = pynvml.c_nvmlMemory_v2_t()
        info.total = 143771 * MIB
        info.used = (512 if handle[1] == 0 else 40960) * MIB
        info.free = info.total - info.used
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = (0, 0) if handle[1] == 0 else (87, 40)
        return u

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        if handle[1] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 34

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 71234 if handle[1] == 0 else 512000  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return 700000

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if handle[1] == 0:
            return []
        p = pynvml.c_nvmlProcessInfo_v3_t()
        p.pid, p.usedGpuMemory = 4242, 40000 * MIB
        return [p]

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        if device[1] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.bus[1 - device[1]].encode()
        return info


def test_reads_every_field_once_inside_init_and_shutdown() -> None:
    machine = FakeMachine()
    inv = read_inventory(machine.module())
    assert machine.calls == ["init", "shutdown"]
    assert inv.driver_version == "580.159.03" and inv.cuda_version == "13.0"
    g0, g1 = inv.gpus
    assert (g0.index, g0.uuid, g0.name, g0.pci_bus_id) == (
        0,
        "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "NVIDIA H200",
        "00000000:19:00.0",
    )
    assert (g0.memory_total_mib, g0.memory_used_mib, g0.utilization_gpu_pct) == (143771, 512, 0)
    assert g0.processes == () and g0.mig_enabled is False
    assert g1.processes is not None and [(p.pid, p.used_memory_mib) for p in g1.processes] == [(4242, 40000)]
    assert g1.mig_enabled is None  # not supported: unknown, not "off"
    assert inv.topology == ((0, 30), (30, 0))
    assert inv.nvlink == ((0, 18), (18, 0))
    assert (g0.temperature_c, g0.power_w, g0.power_limit_w) == (34, 71.234, 700.0)
    assert (g1.temperature_c, g1.power_w) == (None, 512.0)  # not supported: unknown


def test_the_inventory_file_round_trips() -> None:
    inv = read_inventory(FakeMachine().module())
    doc = json.loads(json.dumps(inv.to_json()))
    assert "mig_enabled" not in doc["gpus"][1]  # unknown fields are left out, not written as false
    assert GpuInventory.from_json(doc) == inv


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, NO_DRIVER),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA kernel driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML could not start"),
    ],
)
def test_init_failures_become_one_clear_reason(code: int, message: str) -> None:
    machine = FakeMachine(init_error=code)
    with pytest.raises(NvmlUnavailable) as exc:
        read_inventory(machine.module())
    assert message in str(exc.value)
    assert machine.calls == ["init"]  # no shutdown after a failed init


def test_the_suites_own_host_has_no_driver_whatever_this_machine_has() -> None:
    """The real pynvml in the test process finds the fake library conftest loaded (on a GPU host too), which
    without an inventory answers as a host whose driver is not loaded."""
    with pytest.raises(NvmlUnavailable) as exc:
        read_inventory()
    assert str(exc.value) == SUITE_NO_DRIVER
