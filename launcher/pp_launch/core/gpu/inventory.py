"""GpuInventory: what NVML says about the machine, and the inventory file of docs/formats.md.

Missing optional fields mean "unknown", not zero: they are None here and left out of the file.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from pp_launch.core import errors


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None = None
    user: str | None = None  # who runs it, and its command line: from the host's /proc (NVML gives the pid alone)
    command: str | None = None


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    processes: tuple[GpuProcess, ...] | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str = ""
    pci_bus_id: str = ""
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_gpu_pct: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    temperature_c: int | None = None
    power_w: float | None = None  # drawn now
    power_limit_w: float | None = None  # enforced
    # health, as NVML reads it (docs/recovery.md); None: not supported or not read
    ecc_uncorrected: int | None = None  # uncorrected ECC errors since the driver loaded (volatile)
    retired_pages_pending: bool | None = None  # pages retired, waiting for a GPU reset
    row_remap_failure: bool | None = None  # the row remapper failed (no spare row left)

    @property
    def health(self) -> str:
        """Why this GPU must not be placed on ("" when NVML says nothing against it)."""
        why = []
        if self.ecc_uncorrected:
            why.append(
                f"{self.ecc_uncorrected} uncorrected ECC error{'s' if self.ecc_uncorrected != 1 else ''} "
                "since the driver loaded"
            )
        if self.retired_pages_pending:
            why.append("retired pages pending a GPU reset")
        if self.row_remap_failure:
            why.append("row remapping failed")
        return "; ".join(why)

    @property
    def health_known(self) -> bool:
        """NVML told at least one of the health fields (else a GPU without a word against it is "unknown")."""
        return any(v is not None for v in (self.ecc_uncorrected, self.retired_pages_pending, self.row_remap_failure))

    @property
    def memory_free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib


@dataclass(frozen=True)
class LostGpu:
    """A GPU NVML counts but cannot read: NVML_ERROR_GPU_IS_LOST (Xid 79, fallen off the bus) or any other error."""

    index: int
    why: str
    uuid: str | None = None  # when NVML still told it


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    topology: tuple[tuple[int, ...], ...] | None = None
    nvlink: tuple[tuple[int, ...], ...] | None = None
    note: str = field(default="", compare=False)  # e.g. why it is empty
    lost: tuple[LostGpu, ...] = ()  # GPUs NVML counts but cannot read (fallen off the bus): never placed on

    def position(self, uuid: str) -> int:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return i
        raise KeyError(uuid)

    # ------------------------------------------------------------------ file format (docs/formats.md)
    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"driver_version": self.driver_version, "cuda_version": self.cuda_version}
        doc["gpus"] = [_gpu_json(g) for g in self.gpus]
        if self.topology is not None:
            doc["topology"] = [list(r) for r in self.topology]
        if self.nvlink is not None:
            doc["nvlink"] = [list(r) for r in self.nvlink]
        if self.lost:
            doc["lost"] = [{k: v for k, v in dataclasses.asdict(g).items() if v is not None} for g in self.lost]
        return {k: v for k, v in doc.items() if v is not None}

    @classmethod
    def from_json(cls, doc: Any, source: str = "inventory") -> GpuInventory:
        if not isinstance(doc, dict) or not isinstance(doc.get("gpus", []), list):
            raise errors.ConfigError(
                f"{source} is not a GPU inventory: expected an object with a list 'gpus' (docs/formats.md)"
            )
        gpus = []
        for i, g in enumerate(doc.get("gpus", [])):
            try:
                gpus.append(_gpu_from(g))
            except KeyError as exc:
                raise errors.ConfigError(f"{source}: gpus[{i}] lacks the field {exc} (docs/formats.md)") from None
            except (AttributeError, TypeError, ValueError) as exc:
                raise errors.ConfigError(f"{source}: gpus[{i}] is not a GPU entry: {exc} (docs/formats.md)") from None
        try:
            topology = _matrix(doc.get("topology"), len(gpus), "topology")
            nvlink = _matrix(doc.get("nvlink"), len(gpus), "nvlink")
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise errors.ConfigError(f"{source} is not a GPU inventory: {exc} (docs/formats.md)") from None
        versions = _opt_str(doc.get("driver_version")), _opt_str(doc.get("cuda_version"))
        try:
            lost = tuple(
                LostGpu(int(g["index"]), str(g.get("why", "lost")), _opt_str(g.get("uuid")))
                for g in doc.get("lost") or []
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise errors.ConfigError(f"{source}: 'lost' is not a list of {{index, why}}: {exc}") from None
        return cls(tuple(gpus), *versions, topology, nvlink, lost=lost)

    @classmethod
    def parse(cls, text: str, source: str = "inventory") -> GpuInventory:
        """From the JSON text of an inventory (docs/formats.md); ConfigError names `source` for anything wrong."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise errors.ConfigError(f"{source} is not JSON: {exc}") from None
        return cls.from_json(doc, source)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_bool(v: Any) -> bool | None:
    if v is None:
        return None
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not true or false")
    return v


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _procs(v: Any) -> tuple[GpuProcess, ...] | None:
    if v is None:
        return None
    out = []
    for p in v:
        used, user, command = _opt_int(p.get("used_memory_mib")), _opt_str(p.get("user")), _opt_str(p.get("command"))
        out.append(GpuProcess(int(p["pid"]), used, user, command))
    return tuple(out)


def _gpu_from(g: Any) -> Gpu:
    return Gpu(
        index=int(g["index"]),
        uuid=str(g["uuid"]),
        name=str(g.get("name", "")),
        pci_bus_id=str(g.get("pci_bus_id", "")),
        memory_total_mib=_opt_int(g.get("memory_total_mib")),
        memory_used_mib=_opt_int(g.get("memory_used_mib")),
        utilization_gpu_pct=_opt_int(g.get("utilization_gpu_pct")),
        processes=_procs(g.get("processes")),
        mig_enabled=None if g.get("mig_enabled") is None else bool(g["mig_enabled"]),
        temperature_c=_opt_int(g.get("temperature_c")),
        power_w=_opt_float(g.get("power_w")),
        power_limit_w=_opt_float(g.get("power_limit_w")),
        ecc_uncorrected=_opt_int(g.get("ecc_uncorrected")),
        retired_pages_pending=_opt_bool(g.get("retired_pages_pending")),
        row_remap_failure=_opt_bool(g.get("row_remap_failure")),
        mig_devices=tuple(
            MigDevice(
                str(m["uuid"]),
                _opt_int(m.get("memory_total_mib")),
                _opt_int(m.get("memory_used_mib")),
                _procs(m.get("processes")),
            )
            for m in g.get("mig_devices") or []
        ),
    )


def _gpu_json(g: Gpu) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "pci_bus_id": g.pci_bus_id,
        "memory_total_mib": g.memory_total_mib,
        "memory_used_mib": g.memory_used_mib,
        "utilization_gpu_pct": g.utilization_gpu_pct,
        "processes": None if g.processes is None else [_proc_json(p) for p in g.processes],
        "mig_enabled": g.mig_enabled,
        "temperature_c": g.temperature_c,
        "power_w": g.power_w,
        "power_limit_w": g.power_limit_w,
        "ecc_uncorrected": g.ecc_uncorrected,
        "retired_pages_pending": g.retired_pages_pending,
        "row_remap_failure": g.row_remap_failure,
    }
    if g.mig_devices:
        doc["mig_devices"] = [
            {
                k: v
                for k, v in {
                    "uuid": m.uuid,
                    "memory_total_mib": m.memory_total_mib,
                    "memory_used_mib": m.memory_used_mib,
                    "processes": None if m.processes is None else [_proc_json(p) for p in m.processes],
                }.items()
                if v is not None
            }
            for m in g.mig_devices
        ]
    return {k: v for k, v in doc.items() if v is not None}


def _proc_json(p: GpuProcess) -> dict[str, Any]:
    doc = {"pid": p.pid, "used_memory_mib": p.used_memory_mib, "user": p.user, "command": p.command}
    return {k: v for k, v in doc.items() if v is not None}


def _matrix(v: Any, n: int, what: str) -> tuple[tuple[int, ...], ...] | None:
    if v is None:
        return None
    rows = tuple(tuple(int(x) for x in row) for row in v)
    if len(rows) != n or any(len(r) != n for r in rows):
        raise ValueError(f"{what} must be {n}x{n}, one row and column per GPU")
    return rows
