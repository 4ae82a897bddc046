"""Chains across hosts: which Docker engines a chain runs on, and which stages go to each. Pure.

A host is named as the user named it: a Docker context (as `docker context ls` shows it) or an engine URL
(`unix://`, `tcp://`, `ssh://`). The adapter resolves the name to an engine; here it is only a name.

Stages go to hosts in blocks of consecutive stages, in the order of the user's `--host` list, so the ring
0 -> 1 -> ... -> N-1 -> 0 crosses each host boundary once (and the closing hop once more): a host boundary is
farther than any link inside a host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pp_launch.core import errors
from pp_launch.core.lines import count as counted

__all__ = ["HOSTS_ENV", "HOST_LEVEL", "PLACEMENTS", "assign", "blocks", "parse_hosts"]

HOST_LEVEL = 1000  # the topology level of a hop between two hosts: farther than any link inside one
HOSTS_ENV = "PP_LAUNCH_HOSTS"
PLACEMENTS = ("pack", "spread")

_CONTEXT = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.+-]*")  # docker's context name grammar
_URL = re.compile(r"(unix|tcp|ssh|npipe)://\S+")


def parse_hosts(values: Iterable[str]) -> tuple[str, ...]:
    """`--host` values (repeatable, each may be a comma list) in order; the same host twice is an error."""
    hosts: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if not (_CONTEXT.fullmatch(name) or _URL.fullmatch(name)):
                raise errors.ConfigError(
                    f"--host {name!r} is neither a Docker context name nor an engine URL (unix://PATH, "
                    "tcp://HOST:PORT, ssh://USER@HOST:PORT)"
                )
            if name in hosts:
                raise errors.ConfigError(f"--host {name} is named twice; name each host once, in ring order")
            hosts.append(name)
    return tuple(hosts)


def assign(
    stages: int,
    hosts: Sequence[str],
    capacity: Sequence[int | None],
    placement: str = "pack",
    per_host: int | None = None,
) -> list[int]:
    """The host (its position in `hosts`) of every stage, in blocks of consecutive stages.

    capacity[h]: how many stages host h can take (its free GPUs // GPUs per stage); None for no limit (CPU
    stages, or `--gpus all`). `per_host` (--stages-per-host): N consecutive stages on each host in turn.
    pack (default): fill each host as far as it goes before the next (fewest hosts, fewest boundary hops).
    spread: as even as it goes (the first hosts take one more when it does not divide).
    NotEnoughGpus (exit 2) names every host and what it can take when the stages do not fit."""
    if not hosts:
        raise ValueError("no hosts")
    if placement not in PLACEMENTS:
        raise errors.ConfigError(f"--placement {placement!r}: use pack or spread")
    if per_host is not None:
        counts = _per_host(stages, len(hosts), per_host)
    elif placement == "spread":
        counts = [stages // len(hosts) + (1 if h < stages % len(hosts) else 0) for h in range(len(hosts))]
    else:
        counts = _pack(stages, hosts, capacity)
    for h, (count, cap) in enumerate(zip(counts, capacity, strict=True)):
        if cap is not None and count > cap:
            share = " its share of" if placement == "spread" and per_host is None else ""
            _not_enough(stages, hosts, capacity, f"host {hosts[h]} cannot take{share} {count}")
    return [h for h, count in enumerate(counts) for _ in range(count)]


def _per_host(stages: int, n: int, per_host: int) -> list[int]:
    """--stages-per-host N: N consecutive stages on each host in turn."""
    if per_host < 1:
        raise errors.ConfigError("--stages-per-host must be at least 1")
    if per_host * n < stages:
        raise errors.ConfigError(
            f"--stages-per-host {per_host} over {n} host{'s' if n > 1 else ''} holds {counted(per_host * n, 'stage')}, "
            f"not {stages}: add hosts or raise --stages-per-host"
        )
    return [min(per_host, max(stages - h * per_host, 0)) for h in range(n)]


def _pack(stages: int, hosts: Sequence[str], capacity: Sequence[int | None]) -> list[int]:
    """Each host filled as far as it goes, in order."""
    counts, left = [], stages
    for cap in capacity:
        take = left if cap is None else min(cap, left)
        counts.append(take)
        left -= take
    if left:
        _not_enough(stages, hosts, capacity)
    return counts


def _not_enough(stages: int, hosts: Sequence[str], capacity: Sequence[int | None], first: str = "") -> None:
    room = "; ".join(f"{h}: {'any number' if c is None else c}" for h, c in zip(hosts, capacity, strict=True))
    lead = f"{first}; " if first else ""
    raise errors.NotEnoughGpus(
        f"{lead}{counted(stages, 'stage')} do{'es' if stages == 1 else ''} not fit on the hosts: stages each host "
        f"can take now: {room}. Add hosts "
        "(--host), use fewer GPUs per stage, or --placement pack"
    )


def blocks(assignment: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(host, its stages) for each block of consecutive stages, in ring order."""
    out: list[tuple[int, list[int]]] = []
    for stage, host in enumerate(assignment):
        if out and out[-1][0] == host:
            out[-1][1].append(stage)
        else:
            out.append((host, [stage]))
    return out
