"""The NVML reader: the only module that imports `pynvml` (from the nvidia-ml-py distribution).

One query = one nvmlInit ... nvmlShutdown. Memory uses the v2 memory info (what nvidia-smi shows,
reserved memory counted as used). Any field NVML cannot give stays None ("unknown").
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from pp_launch.core.errors import PpLaunchError
from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess, LostGpu, MigDevice

MIB = 1024 * 1024
NO_DRIVER = "NVML not found: no NVIDIA driver on this host"


class NvmlUnavailable(PpLaunchError):
    """No NVIDIA driver, or NVML could not start: the inventory is empty (a CPU-only host)."""


def load_module() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:  # the package itself is missing: a broken install, not a GPU-less host
        raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({exc})") from None


def read_inventory(nvml: ModuleType | None = None) -> GpuInventory:
    nvml = nvml or load_module()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(_init_error(nvml, exc)) from None
    try:
        return _query(nvml)
    except nvml.NVMLError as exc:  # the device count or a handle: nothing sensible can be said about the GPUs
        raise NvmlUnavailable(f"NVML failed while listing the GPUs: {exc} (check 'nvidia-smi')") from None
    finally:
        _try(nvml, nvml.nvmlShutdown)


def _init_error(nvml: ModuleType, exc: Any) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return NO_DRIVER
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return "NVML found, but the NVIDIA kernel driver is not loaded (check 'nvidia-smi' and 'lsmod | grep nvidia')"
    return f"NVML could not start: {exc}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(nvml: ModuleType, fn: Any, *args: Any) -> Any:
    """A call whose failure (not supported, no permission; or a binding without it: None) means "unknown"."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _processes(nvml: ModuleType, handle: Any) -> tuple[GpuProcess, ...] | None:
    procs = _try(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if procs is None:
        return None
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        user, command = process_owner(int(p.pid))
        out.append(GpuProcess(int(p.pid), None if used is None else int(used) // MIB, user, command))
    return tuple(out)


def process_owner(pid: int, proc: str = "/proc") -> tuple[str | None, str | None]:
    """Who runs `pid` and its command line, from this host's /proc (NVML gives the pid alone); (None, None) for a
    pid this host cannot see (another PID namespace, gone meanwhile)."""
    import pwd

    try:
        status = Path(proc, str(pid), "status").read_text()
        raw = Path(proc, str(pid), "cmdline").read_bytes()
    except OSError:
        return None, None
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), None)
    try:
        user = None if uid is None else pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError):
        user = uid
    command = " ".join(a.decode("utf-8", "backslashreplace") for a in raw.split(b"\0") if a)
    return user, command or None


def _memory(nvml: ModuleType, handle: Any) -> tuple[int | None, int | None]:
    version = getattr(nvml, "nvmlMemory_v2", None)
    info = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, handle, version) if version is not None else None
    if info is None:
        info = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    if info is None:
        return None, None
    return int(info.total) // MIB, int(info.used) // MIB


def _mig(nvml: ModuleType, handle: Any) -> tuple[bool | None, tuple[MigDevice, ...]]:
    mode = _try(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if mode is None:
        return None, ()
    enabled = bool(mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
    if not enabled:
        return False, ()
    devices = []
    for i in range(_try(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _try(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        uuid = None if mig is None else _try(nvml, nvml.nvmlDeviceGetUUID, mig)
        if uuid is None:
            continue
        total, used = _memory(nvml, mig)
        devices.append(MigDevice(_text(uuid), total, used, _processes(nvml, mig)))
    return True, tuple(devices)


def _query(nvml: ModuleType) -> GpuInventory:
    driver = _try(nvml, nvml.nvmlSystemGetDriverVersion)
    cuda = _try(nvml, nvml.nvmlSystemGetCudaDriverVersion_v2)
    handles, uuids, indices, lost = [], [], [], []
    for i in range(nvml.nvmlDeviceGetCount()):
        try:  # a GPU that fell off the bus answers nothing, its UUID included: it is left out and said
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuids.append(_text(nvml.nvmlDeviceGetUUID(h)))
            handles.append(h)
            indices.append(i)
        except nvml.NVMLError as exc:
            lost.append(LostGpu(i, f"NVML says {_text(exc)}"))
    gpus = []
    for i, h, uuid in zip(indices, handles, uuids, strict=True):
        total, used = _memory(nvml, h)
        name = _try(nvml, nvml.nvmlDeviceGetName, h)
        util = _try(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        pci = _try(nvml, nvml.nvmlDeviceGetPciInfo, h)
        mig_enabled, mig_devices = _mig(nvml, h)
        temp = _try(nvml, getattr(nvml, "nvmlDeviceGetTemperature", None), h, 0)  # 0: NVML_TEMPERATURE_GPU
        power = _try(nvml, getattr(nvml, "nvmlDeviceGetPowerUsage", None), h)  # milliwatts
        limit = _try(nvml, getattr(nvml, "nvmlDeviceGetEnforcedPowerLimit", None), h)
        gpus.append(
            Gpu(
                index=i,
                uuid=uuid,
                name="" if name is None else _text(name),
                pci_bus_id=_text(pci.busId) if pci is not None else "",
                memory_total_mib=total,
                memory_used_mib=used,
                utilization_gpu_pct=None if util is None else int(util.gpu),
                processes=_processes(nvml, h),
                mig_enabled=mig_enabled,
                mig_devices=mig_devices,
                temperature_c=None if temp is None else int(temp),
                power_w=None if power is None else int(power) / 1000,
                power_limit_w=None if limit is None else int(limit) / 1000,
                **_health(nvml, h),
            )
        )
    return GpuInventory(
        gpus=tuple(gpus),
        driver_version=None if driver is None else _text(driver),
        cuda_version=None if cuda is None else f"{cuda // 1000}.{(cuda % 1000) // 10}",
        topology=_topology(nvml, handles),
        nvlink=_nvlink(nvml, handles, [g.pci_bus_id for g in gpus]),
        note="; ".join(f"GPU {g.index} is left out: {g.why}" for g in lost),
        lost=tuple(lost),
    )


def _health(nvml: ModuleType, h: Any) -> dict[str, Any]:
    """What NVML says of the GPU's memory health (docs/recovery.md); None where it cannot say (not supported)."""
    ecc = _try(nvml, getattr(nvml, "nvmlDeviceGetTotalEccErrors", None), h, 1, 0)  # uncorrected, volatile
    pending = _try(nvml, getattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", None), h)
    rows = _try(nvml, getattr(nvml, "nvmlDeviceGetRemappedRows", None), h)  # (corrected, uncorrected, pending, failed)
    return {
        "ecc_uncorrected": None if ecc is None else int(ecc),
        "retired_pages_pending": None if pending is None else int(pending) == getattr(nvml, "NVML_FEATURE_ENABLED", 1),
        "row_remap_failure": None if rows is None else bool(rows[3]),
    }


def _topology(nvml: ModuleType, handles: list[Any]) -> tuple[tuple[int, ...], ...] | None:
    rows = []
    for i, a in enumerate(handles):
        row = []
        for j, b in enumerate(handles):
            level = 0 if i == j else _try(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, a, b)
            if level is None:
                return None
            row.append(int(level))
        rows.append(tuple(row))
    return tuple(rows)


def _nvlink(nvml: ModuleType, handles: list[Any], bus_ids: list[str]) -> tuple[tuple[int, ...], ...] | None:
    """Active links between each pair, from each link's remote PCI bus id. None when NVML cannot say."""
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    by_bus = {b.lower(): j for j, b in enumerate(bus_ids)}
    counts = [[0] * len(handles) for _ in handles]
    known = False
    for i, h in enumerate(handles):
        for link in range(max_links):
            state = _try(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break  # no such link (or no NVLink at all)
            known = True
            if state != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            remote = _try(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            j = by_bus.get(_text(remote.busId).lower()) if remote is not None else None
            if j is not None and j != i:
                counts[i][j] += 1
    return tuple(tuple(r) for r in counts) if known else None
