"""The engine's GPU device requests, as `docker run --gpus` sends them: one place for that JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
