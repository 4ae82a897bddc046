"""`--rendezvous torch` (docs/chain.md, "torch.distributed, as torchrun runs it"): every stage gets the variables
torchrun gives a worker (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so a program that
calls `init_process_group(init_method="env://")` runs unmodified. No stage announces: all start at once, and the
roster is the running stages, each "announced" by pp-launch as it starts, with the master's address (`announced`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pp_launch.core.announce import StageAnnouncement

MODES = ("torch",)
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
LOCAL = "127.0.0.1"  # stage 0 on the launcher's own engine, host network: every stage there reaches it on loopback


def master_host(stage_hosts: tuple[str, ...]) -> str:
    """Where every stage reaches stage 0: loopback on one engine; across --host engines, stage 0's host as its engine
    is named (an URL's host, else the context's name, which must resolve there: MASTER_ADDR in --env overrides)."""
    if not stage_hosts or not stage_hosts[0]:
        return LOCAL
    host = stage_hosts[0]
    if "://" in host:
        host = host.split("://", 1)[1].rsplit("@", 1)[-1].split("/", 1)[0]
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return host


def torch_env(k: int, stages: int, stage_hosts: tuple[str, ...], given: Mapping[str, str]) -> dict[str, str]:
    """Stage k's torch variables; MASTER_ADDR and MASTER_PORT given in --env win (the launcher picks a free port
    for MASTER_PORT on one engine: app/launch.py)."""
    hosts = stage_hosts or ("",) * stages
    here = [j for j in range(stages) if hosts[j] == hosts[k]]
    env = {
        "RANK": str(k),
        "WORLD_SIZE": str(stages),
        "LOCAL_RANK": str(here.index(k)),
        "LOCAL_WORLD_SIZE": str(len(here)),
        "GROUP_RANK": str(sorted(set(hosts), key=hosts.index).index(hosts[k])),
        MASTER_ADDR: given.get(MASTER_ADDR) or master_host(stage_hosts),
    }
    if given.get(MASTER_PORT):
        env[MASTER_PORT] = given[MASTER_PORT]
    return env


def announced(ref: str, env: Mapping[str, str]) -> StageAnnouncement:
    """What a stage of a rendezvous run is taken to have announced as it starts: a node id from its container's
    id, and the master's address (the one address every rank meets at)."""
    return StageAnnouncement(node_id_hex=hashlib.sha256(ref.encode()).hexdigest(), direct=master(env))


def master(env: Mapping[str, str]) -> str:
    """host:port where every rank meets the master (torch's default port when none is set)."""
    return f"{env.get(MASTER_ADDR) or LOCAL}:{env.get(MASTER_PORT) or '29500'}"
