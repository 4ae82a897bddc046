"""GPU selection for a launch: inventory + holdings -> allocator -> device requests, under a host lock.

Concurrent launches on one host must never get the same GPU. A chain creates its containers one by one
as earlier stages announce, so the engine's labels alone cannot close the gap between the pick and the
last creation. Under a host-wide lock we read the engine's labels and the live reservations, pick, and
write our own reservation; it lives until the launch ends (or its owner dies, which readers notice).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import errors, labels
from .allocator import AllocationRequest, Holding, Placement, allocate, parse_visible
from .inventory import GpuInventory
from .nvml import NvmlUnavailable, read_inventory

ATTACH_MODES = ("request", "cdi", "env")
INVENTORY_ENV = "PP_LAUNCH_GPU_INVENTORY"


def state_dir() -> Path:
    path = Path(os.environ.get("PP_LAUNCH_STATE_DIR", "/tmp/pp-launch-state"))
    path.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        path.chmod(0o1777)  # several users' launches share the host's GPUs
    return path


def load_inventory(path: str | None) -> GpuInventory:
    """From the file when one is named (flag or PP_LAUNCH_GPU_INVENTORY), else from NVML. No driver: empty,
    with the reason in `note`."""
    path = path or os.environ.get(INVENTORY_ENV) or None
    if path:
        return GpuInventory.load(path)
    try:
        return read_inventory()
    except NvmlUnavailable as exc:
        return GpuInventory(note=str(exc))


def device_requests(gpus: tuple[str, ...], attach: str) -> tuple[Mapping[str, Any], ...]:
    """The engine's DeviceRequest JSON, as `docker run --gpus device=UUID,...` sends it (request), as CDI
    device names (cdi), or none (env: NVIDIA_VISIBLE_DEVICES alone)."""
    if not gpus or attach == "env":
        return ()
    if attach == "cdi":
        return (
            {
                "Driver": "cdi",
                "Count": 0,
                "DeviceIDs": [f"nvidia.com/gpu={u}" for u in gpus],
                "Capabilities": [],
                "Options": {},
            },
        )
    return ({"Driver": "", "Count": 0, "DeviceIDs": list(gpus), "Capabilities": [["gpu"]], "Options": {}},)


@dataclass(frozen=True)
class GpuSelection:
    stage_gpus: list[tuple[str, ...]]
    device_requests: list[tuple[Mapping[str, Any], ...]]
    hop_levels: tuple[int | None, ...]
    note: str = ""  # said plainly to the user, e.g. "no GPU found: CPU stages"


def holdings_from_labels(rows: list[Mapping[str, str]]) -> dict[str, Holding]:
    out: dict[str, Holding] = {}
    for row in rows:
        for uuid in filter(None, row.get(labels.GPUS, "").split(",")):
            stage = row.get(labels.STAGE, "")
            out[uuid] = Holding(row.get(labels.RUN, "?"), labels.ascii_int(stage))
    return out


@contextlib.contextmanager
def host_lock(directory: Path) -> Iterator[None]:
    with open(directory / "gpu.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Reservations:
    """Live reservations under `state_dir()/reservations/<run>.json`, each with its owner."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory / "reservations"
        self.dir.mkdir(exist_ok=True)

    def live(self) -> dict[str, Holding]:
        out: dict[str, Holding] = {}
        for path in self.dir.glob("*.json"):
            try:
                doc = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if labels.owner_is_gone(str(doc.get("owner", ""))):
                path.unlink(missing_ok=True)
                continue
            for k, gpus in enumerate(doc.get("stage_gpus", [])):
                for uuid in gpus:
                    out[uuid] = Holding(str(doc.get("run", path.stem)), k)
        return out

    def write(self, run_id: str, owner: str, stage_gpus: list[tuple[str, ...]]) -> None:
        doc = {"run": run_id, "owner": owner, "stage_gpus": [list(g) for g in stage_gpus]}
        (self.dir / f"{run_id}.json").write_text(json.dumps(doc))

    def release(self, run_id: str) -> None:
        (self.dir / f"{run_id}.json").unlink(missing_ok=True)


def select(
    *,
    mode: str,
    stages: int,
    per_stage: int,
    attach: str,
    inventory: GpuInventory,
    engine_labels: Callable[[], list[Mapping[str, str]]],
    run_id: str,
    owner: str,
    environ: Mapping[str, str],
    allow_shared: bool = False,
    min_free_mib: int | None = None,
    reserve: bool = True,
) -> GpuSelection:
    """mode: auto | none | all | a comma-separated list of indices or UUIDs."""
    cpu = GpuSelection([()] * stages, [()] * stages, ())
    if mode == "none":
        return cpu
    if not inventory.gpus:
        why = inventory.note or "the GPU inventory lists no GPU"
        if mode == "auto":
            return GpuSelection(cpu.stage_gpus, cpu.device_requests, (), f"no GPU found ({why}): stages run on CPU")
        raise errors.NotEnoughGpus(f"--gpus {mode} asks for GPUs, but {why}")
    if mode == "all":
        every = tuple(g.uuid for g in inventory.gpus)
        return GpuSelection([every] * stages, [device_requests(every, attach)] * stages, ())
    explicit = () if mode == "auto" else tuple(t.strip() for t in mode.split(",") if t.strip())
    request = AllocationRequest(
        stages=stages,
        per_stage=per_stage,
        explicit=explicit,
        visible=parse_visible(environ.get("CUDA_VISIBLE_DEVICES")),
        allow_shared=allow_shared,
        min_free_mib=min_free_mib,
    )
    directory = state_dir()
    reservations = Reservations(directory)
    with host_lock(directory):
        holdings = holdings_from_labels(engine_labels())
        holdings.update(reservations.live())
        placement: Placement = allocate(inventory, request, holdings)
        if reserve:
            reservations.write(run_id, owner, list(placement.stage_gpus))
    gpus = list(placement.stage_gpus)
    return GpuSelection(gpus, [device_requests(g, attach) for g in gpus], placement.hop_levels)
