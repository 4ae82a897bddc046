"""The engine's GPU device requests, as `docker run --gpus` sends them: one place for that JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ATTACH_MODES = ("request", "cdi", "env")  # how a stage gets its GPUs (docs/gpus.md)
INVENTORY_ENV = "PP_LAUNCH_GPU_INVENTORY"  # an inventory file instead of this host's NVML (adapters/inventory_file.py)

GPU_CAPABILITIES = [["gpu"]]


def gpu_request(count: int = 0, device_ids: list[str] | None = None) -> dict[str, Any]:
    """One DeviceRequest as the docker CLI's `--gpus` makes it: a count (-1 for all) or a list of devices."""
    return {"Driver": "", "Count": count, "DeviceIDs": device_ids, "Capabilities": GPU_CAPABILITIES, "Options": {}}


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
    return (gpu_request(device_ids=list(gpus)),)


@dataclass(frozen=True)
class GpusAsked:
    """A `--gpus` value read as `docker run --gpus` reads it (the one reader; `pp-launch chain` and pp-gpu-node's
    PP_GPUS each decide what it means for them): auto, none, all, a count of GPUs for one container, or a list
    of indices/UUIDs."""

    kind: str  # auto | none | all | count | list
    count: int = 0
    ids: tuple[str, ...] = ()


def read_gpus(value: str, bare_lists: bool = True) -> GpusAsked | None:
    """None when it is not understood (the caller names its flag in the error). A count is ASCII digits; a list
    is `device=LIST` (quoted or not), or with `bare_lists` a LIST with a comma (`3,` or `0,3`) or of UUIDs."""
    value = value.strip()
    if value in ("auto", "none", "all"):
        return GpusAsked(value)
    if value.isascii() and value.isdigit():
        return GpusAsked("count", int(value))
    listed = value.removeprefix("device=").strip("\"'")
    ids = tuple(t.strip() for t in listed.split(",") if t.strip())
    uuids = all(t.startswith(("GPU-", "MIG-")) for t in ids)
    if ids and (value.startswith("device=") or (bare_lists and ("," in value or uuids))):
        return GpusAsked("list", ids=ids)
    return None
