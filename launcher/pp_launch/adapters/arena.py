"""A memory file shared with one worker container: the arena of docs/worker-wire.md.

swactor's controller hands its worker an inherited memory file (`SWACTOR_ARENA_FD`, `SWACTOR_ARENA_BYTES`). A
container cannot inherit a descriptor from us, so the worker driver (app/worker_driver.py) makes the memory file on
the host's tmpfs (/dev/shm), maps it here, bind-mounts it into the container, and starts the image's own entrypoint
and command under `/bin/sh`, which opens it as descriptor 3 first (`ENTRY`). Both sides then see the same pages. The
host's name for the file is unlinked as soon as the worker is ready (both sides keep it open), so a controller
killed later leaves no file behind.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from pp_launch.core import errors
from pp_launch.core.worker import record

FD_ENV = "SWACTOR_ARENA_FD"
BYTES_ENV = "SWACTOR_ARENA_BYTES"
INSIDE = "/run/pp-launch-arena"  # where the memory file appears inside the container
FD_NUMBER = 3
ENTRY = ("/bin/sh", "-c", f'exec {FD_NUMBER}<>"{INSIDE}" && exec "$@"', "pp-arena")
HOST_SHM = "/dev/shm"


class Arena:
    """A memory file shared with one worker container."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def write_record(self, layout: record.RingLayout, obj: record.ObjectRecord) -> int:
        """Write `obj` where swactor's node writes an ingress record: at the ring's data_offset. Returns its size."""
        data = obj.encode()
        if len(data) > layout.data_capacity or layout.data_offset + len(data) > self.size:
            raise errors.PpLaunchError(
                f"a {len(data)}-byte record does not fit ring {layout.ring_id} "
                f"({layout.data_capacity} bytes at offset {layout.data_offset} of a {self.size}-byte arena)"
            )
        self.map[layout.data_offset : layout.data_offset + len(data)] = data
        return len(data)

    def read_record(self, layout: record.RingLayout) -> record.ObjectRecord:
        """The record at the ring's data_offset (raises record.RecordError when there is none)."""
        with memoryview(self.map) as view:  # released at once: the map can still be closed
            return record.decode_record(view, layout.data_offset, layout.data_capacity - record.HEADER_LEN)

    def close(self) -> None:
        self.unlink()
        self.map.close()
