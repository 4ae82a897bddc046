"""The engine's GPU device requests, as `docker run --gpus` sends them: one place for that JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
