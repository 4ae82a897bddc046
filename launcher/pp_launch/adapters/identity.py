"""Who this process is, and whether another launcher still runs: facts read from /proc, the host name and
the system's randomness (the pure rules are core/labels.py)."""

from __future__ import annotations

import os
import secrets
import socket

from pp_launch.core.labels import Here, Owner
from pp_launch.core.labels import owner_is_gone as _owner_is_gone


def new_run_id() -> str:
    """12 lowercase hex digits: short enough for container names, random enough not to collide."""
    return secrets.token_hex(6)


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


def pid_namespace(pid: int | str = "self") -> str | None:
    """The inode of a process's PID namespace: pids compare only within one namespace."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    inode = link.partition("[")[2].rstrip("]")
    return inode if inode.isascii() and inode.isdigit() else None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip().replace("-", "") or None
    except OSError:
        return None


def here() -> Here:
    return Here(socket.gethostname(), boot_id(), pid_namespace())


def current_owner() -> Owner:
    """This process as a launcher: `<host>:<pid>:<start time>[:pidns-<inode>][:boot-<id>]`."""
    pid = os.getpid()
    return Owner(socket.gethostname(), pid, process_start_time(pid) or "0", pid_namespace(), boot_id())


def judge_here(owner: Owner) -> str | None:
    """Why `owner`'s liveness cannot be judged from this process (None: it can)."""
    return owner.judge(here())


def is_alive(owner: Owner) -> bool:
    """Only meaningful where judge_here() is None: the pid exists and started when the label says."""
    return process_start_time(owner.pid) == owner.start_time


def owner_is_gone(value: str) -> bool:
    """core.labels.owner_is_gone judged from this process."""
    return _owner_is_gone(value, here(), process_start_time)
