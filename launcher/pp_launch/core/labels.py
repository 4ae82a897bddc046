"""Container labels (docs/formats.md) and the launcher's owner identity (pure: the process facts come from
adapters/identity.py).

The owner value `<hostname>:<pid>:<start time>` identifies a launcher process without being fooled by
pid reuse: a pid that is alive but started at another time is a different process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

RUN = "pp-launch.run"
STAGE = "pp-launch.stage"
OWNER = "pp-launch.owner"
GPUS = "pp-launch.gpus"
HOST = "pp-launch.host"  # the engine it runs on, as the launcher named it (--host; absent on one engine)
HOSTS = "pp-launch.hosts"  # every host of its run, comma-separated in ring order (absent on one engine)
LAUNCHER = "pp-launch.launcher"  # a detached run's launcher (said by `ps`; its guard owns the run)
ATTEMPT = "pp-launch.attempt"  # which attempt of its run made it: 1, then 2... after restarts (--max-restarts)

STAGE_LOCK = "lock"  # the stage label of an engine's GPU lock container (app/locks.py)
STAGE_GUARD = "guard"  # the stage label of a run's guard on an engine (adapters/guard.py)
STAGE_WATCH = "gpu-watch"  # the stage label of a run's GPU watcher on a --host engine (app/hosts.py)
STAGE_RECORD = "record"  # the stage label of a run's record volume on an engine (adapters/guard.py)
RECORD_MARK = "pp-launch.record"  # on a record volume: the mark its launcher made it with (a taken name has another)

OWNER_DETACHED = "detached"
OWNER_COMPOSE_PREFIX = "compose:"


def ascii_int(text: str) -> int | None:
    """A label's number, read strictly: ASCII digits only (str.isdigit() takes '²', which int() refuses)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


@dataclass(frozen=True)
class Owner:
    """`<host>:<pid>:<start time>[:pidns-<inode>][:boot-<id>]`: the extra fields say where the pid can be
    judged. A launcher in a container shares the host's hostname but not its PID namespace."""

    host: str
    pid: int
    start_time: str
    pidns: str | None = None
    boot: str | None = None

    @classmethod
    def parse(cls, value: str) -> Owner | None:
        """None for `detached`, `compose:…` and anything that is not a process identity (malformed labels
        included: a container whose owner cannot be read is not ours to judge)."""
        parts = value.split(":")
        if len(parts) < 3 or not parts[0] or not value.isascii() or not value.isprintable():
            return None
        pid, start = ascii_int(parts[1]), parts[2]
        if pid is None or ascii_int(start) is None:
            return None
        extra: dict[str, str] = {}
        for field in parts[3:]:
            key, sep, val = field.partition("-")
            if not sep or key not in ("pidns", "boot") or not val.isalnum() or key in extra:
                return None
            extra[key] = val
        return cls(parts[0], pid, start, extra.get("pidns"), extra.get("boot"))

    def label(self) -> str:
        extra = "".join(f":{k}-{v}" for k, v in (("pidns", self.pidns), ("boot", self.boot)) if v)
        return f"{self.host}:{self.pid}:{self.start_time}{extra}"

    def judge(self, here: Here) -> str | None:
        """Why this owner's liveness cannot be judged from `here`: `other-host`, `other-boot` or `other-pidns`
        (None: it can; then the pid and its start time decide, adapters/identity.py)."""
        if self.host != here.host:
            return "other-host"
        if self.boot is not None and self.boot != here.boot:
            return "other-boot"
        if self.pidns is not None and self.pidns != here.pidns:
            return "other-pidns"
        return None


@dataclass(frozen=True)
class Here:
    """Where a judgement is made: this host's name, boot and PID namespace (read by adapters/identity.py)."""

    host: str
    boot: str | None
    pidns: str | None


def owner_is_gone(value: str, here: Here, start_time_of: Callable[[int], str | None]) -> bool:
    """True only for a process owner that can be judged from `here` and no longer runs (its pid is gone or
    started at another time). Detached, compose, malformed, other hosts' and other PID namespaces' owners are
    never 'gone' from here: gc must not touch them."""
    owner = Owner.parse(value)
    return owner is not None and owner.judge(here) is None and start_time_of(owner.pid) != owner.start_time


def run_selector(run_id: str | None = None) -> list[str]:
    """The engine's label filter for one run's containers, or for every pp-launch container (None)."""
    return [RUN] if run_id is None else [f"{RUN}={run_id}"]


def stage_labels(
    run_id: str,
    stage: int,
    owner: str,
    gpus: tuple[str, ...],
    host: str = "",
    hosts: tuple[str, ...] = (),
    launcher: str = "",
    attempt: int = 1,
) -> dict[str, str]:
    out = {RUN: run_id, STAGE: str(stage), OWNER: owner, GPUS: ",".join(gpus), ATTEMPT: str(attempt)}
    if launcher:
        out[LAUNCHER] = launcher
    if hosts:
        out.update({HOST: host, HOSTS: ",".join(hosts)})
    return out
