"""What swactor's node has, for a user's worker tests (docs/worker-wire.md): MO01 records, ring layouts, the driver.

Write an ingress record the way swactor's node does, send `RingReadable`, run a step, read the egress record
back. Imports no test framework: usable from any suite, or a script.
"""

from __future__ import annotations

from pp_launch.app.worker_driver import WorkerDriver
from pp_launch.core.worker.codec import (
    ConfigureRole,
    DeviceHandle,
    ExecuteStep,
    InputBinding,
    InstallRing,
    OutputBinding,
    ReleaseDeviceObject,
    RingReadable,
    ShutdownWorker,
)
from pp_launch.core.worker.record import (
    ARENA_BYTES,
    HEADER_LEN,
    ObjectRecord,
    RecordError,
    RingLayout,
    decode_record,
    object_spec,
    ring_layouts,
)

__all__ = [
    "ARENA_BYTES",
    "HEADER_LEN",
    "ConfigureRole",
    "DeviceHandle",
    "ExecuteStep",
    "InputBinding",
    "InstallRing",
    "ObjectRecord",
    "OutputBinding",
    "RecordError",
    "ReleaseDeviceObject",
    "RingLayout",
    "RingReadable",
    "ShutdownWorker",
    "WorkerDriver",
    "decode_record",
    "object_spec",
    "ring_layouts",
]
