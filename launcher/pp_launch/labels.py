"""Container labels (contract §6) and the launcher's owner identity.

The owner value `<hostname>:<pid>:<start time>` identifies a launcher process without being fooled by
pid reuse: a pid that is alive but started at another time is a different process.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

RUN = "pp-launch.run"
STAGE = "pp-launch.stage"
OWNER = "pp-launch.owner"
GPUS = "pp-launch.gpus"

OWNER_DETACHED = "detached"
OWNER_COMPOSE_PREFIX = "compose:"


def process_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start_time: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start_time(pid) or "0")

    @classmethod
    def parse(cls, value: str) -> Owner | None:
        """None for `detached`, `compose:…` and anything that is not a process identity."""
        host, sep, rest = value.rpartition(":")
        host2, sep2, pid = host.rpartition(":")
        if not sep or not sep2 or not pid.isdigit():
            return None
        return cls(host2, int(pid), rest)

    def label(self) -> str:
        return f"{self.host}:{self.pid}:{self.start_time}"

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def is_alive(self) -> bool:
        """Only meaningful for a local owner: the pid exists and started when the label says."""
        return process_start_time(self.pid) == self.start_time


def owner_is_gone(value: str) -> bool:
    """True only for a process owner on this host that no longer runs. Detached, compose and foreign-host
    owners are never 'gone' from here: gc must not touch them."""
    owner = Owner.parse(value)
    return owner is not None and owner.is_local() and not owner.is_alive()


def stage_labels(run_id: str, stage: int, owner: str, gpus: tuple[str, ...]) -> dict[str, str]:
    return {RUN: run_id, STAGE: str(stage), OWNER: owner, GPUS: ",".join(gpus)}
