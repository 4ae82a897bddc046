"""GPU selection for a launch: inventory + holdings -> allocator -> device requests.

Concurrent launches must never get the same GPU. The engine's labels say which GPUs its containers hold; the
gap between the pick and the creation of the last stage is closed by the engine's GPU lock (app/locks.py), which
the caller holds from before the labels are read here until its stages exist. Nothing is kept in files."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory
from pp_launch.core import errors, hosts, labels
from pp_launch.core.gpu.allocator import (
    HOST_LEVEL,
    AllocationRequest,
    Holding,
    Placement,
    PlacementCost,
    allocate,
    free_units,
    parse_visible,
)
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.gpu.requests import device_requests

ATTACH_MODES = ("request", "cdi", "env")


INVENTORY_ENV = "PP_LAUNCH_GPU_INVENTORY"


def load_inventory(path: str | None) -> GpuInventory:
    """From the file when one is named (flag or PP_LAUNCH_GPU_INVENTORY), else from NVML. No driver: empty,
    with the reason in `note`."""
    path = path or os.environ.get(INVENTORY_ENV) or None
    if path:
        return GpuInventory.load(path)
    try:
        return read_inventory()
    except NvmlUnavailable as exc:
        return GpuInventory(note=str(exc))


@dataclass(frozen=True)
class GpuSelection:
    stage_gpus: list[tuple[str, ...]]
    device_requests: list[tuple[Mapping[str, Any], ...]]
    hop_levels: tuple[int | None, ...]
    note: str = ""  # said plainly to the user, e.g. "no GPU found: CPU stages"
    cost: PlacementCost | None = None


def holdings_from_labels(rows: list[Mapping[str, str]]) -> dict[str, Holding]:
    out: dict[str, Holding] = {}
    for row in rows:
        for uuid in filter(None, row.get(labels.GPUS, "").split(",")):
            stage = row.get(labels.STAGE, "")
            out[uuid] = Holding(row.get(labels.RUN, "?"), labels.ascii_int(stage))
    return out


def _request(
    mode: str, stages: int, per_stage: int, environ: Mapping[str, str], allow_shared: bool, min_free_mib: int | None
) -> AllocationRequest:
    """The allocator's request for a parsed --gpus mode (auto, or a list of indices/UUIDs)."""
    return AllocationRequest(
        stages=stages,
        per_stage=per_stage,
        explicit=() if mode == "auto" else tuple(t.strip() for t in mode.split(",") if t.strip()),
        visible=parse_visible(environ.get("CUDA_VISIBLE_DEVICES")),
        allow_shared=allow_shared,
        min_free_mib=min_free_mib,
    )


def parse_gpus_flag(value: str, per_stage: int) -> tuple[str, int]:
    """(mode, GPUs per stage) from --gpus: a bare number is a count, as in `docker run --gpus 2`; indices are
    `device=3` or a list with a comma (`3,` or `0,3`). ConfigError (exit 2) for anything else."""
    value = value.strip()
    if value in ("auto", "none", "all"):
        return value, per_stage
    if value.isascii() and value.isdigit():
        count = int(value)
        if count < 1:
            raise errors.ConfigError("--gpus 0 asks for no GPU: use --gpus none")
        if per_stage not in (1, count):
            raise errors.ConfigError(f"--gpus {count} (a count per stage) and --gpus-per-stage {per_stage} disagree")
        return "auto", count
    listed = value.removeprefix("device=").strip("\"'")
    tokens = [t.strip() for t in listed.split(",") if t.strip()]
    if tokens and (value.startswith("device=") or "," in value or all(t.startswith(("GPU-", "MIG-")) for t in tokens)):
        return ",".join(tokens), per_stage
    raise errors.ConfigError(
        f"--gpus {value!r} is not understood: use auto, none, all, a count (2), or device=0,2 / device=GPU-<uuid> "
        "(a bare list with a comma works too: 3, or 0,3)"
    )


def select(
    *,
    mode: str,
    stages: int,
    per_stage: int,
    attach: str,
    inventory: GpuInventory,
    engine_labels: Callable[[], list[Mapping[str, str]]],
    environ: Mapping[str, str],
    allow_shared: bool = False,
    min_free_mib: int | None = None,
) -> GpuSelection:
    """mode (--gpus), read as `docker run --gpus` reads it: auto | none | all | N (a count: N GPUs for each
    stage, placed as auto places them) | device=LIST or a LIST with a comma (indices or UUIDs, in stage order)."""
    asked = mode.strip()
    mode, per_stage = parse_gpus_flag(mode, per_stage)
    cpu = GpuSelection([()] * stages, [()] * stages, ())
    if mode == "none":
        return cpu
    if not inventory.gpus:
        why = inventory.note or "the GPU inventory lists no GPU"
        if asked == "auto":  # only auto falls back to CPU stages; a count or a list asked for GPUs
            return GpuSelection(cpu.stage_gpus, cpu.device_requests, (), f"no GPU found ({why}): stages run on CPU")
        raise errors.NotEnoughGpus(f"--gpus {asked} asks for GPUs, but {why}; use --gpus none for CPU stages")
    if mode == "all":
        every = tuple(g.uuid for g in inventory.gpus)
        return GpuSelection([every] * stages, [device_requests(every, attach)] * stages, ())
    request = _request(mode, stages, per_stage, environ, allow_shared, min_free_mib)
    placement: Placement = allocate(inventory, request, holdings_from_labels(engine_labels()))
    gpus = list(placement.stage_gpus)
    return GpuSelection(gpus, [device_requests(g, attach) for g in gpus], placement.hop_levels, cost=placement.cost)


@dataclass(frozen=True)
class HostGpus:
    """One host of a chain across hosts: its GPUs, and the labels of its engine's live containers."""

    host: str
    inventory: GpuInventory
    engine_labels: Callable[[], list[Mapping[str, str]]]


def select_across(
    *,
    mode: str,
    stages: int,
    per_stage: int,
    attach: str,
    hosts_gpus: Sequence[HostGpus],
    environ: Mapping[str, str],
    placement: str = "pack",
    stages_per_host: int | None = None,
    allow_shared: bool = False,
    min_free_mib: int | None = None,
) -> tuple[list[str], GpuSelection]:
    """Each stage's host and GPUs for a chain across hosts: consecutive stages per host in --host order (core
    hosts.assign), then the allocator on each host for its block. Exclusivity per host: that engine's labels,
    read under its GPU lock (held by the caller)."""
    asked = mode.strip()
    mode, per_stage = parse_gpus_flag(mode, per_stage)
    names = [h.host for h in hosts_gpus]
    notes = [h.inventory.note for h in hosts_gpus if h.inventory.note and not h.inventory.gpus]
    explicit = mode not in ("auto", "none", "all")
    if explicit and len(hosts_gpus) > 1:
        raise errors.ConfigError(
            f"--gpus {asked} lists GPUs of one host; over several --host use auto, a count, all or none"
        )
    with_gpus = [h for h in hosts_gpus if h.inventory.gpus]
    cpu = mode == "none" or (asked == "auto" and not with_gpus)
    if not cpu and not with_gpus:
        raise errors.NotEnoughGpus(f"--gpus {asked} asks for GPUs, but no host has any ({'; '.join(notes)})")
    request = _request(mode if explicit else "auto", 1, per_stage, environ, allow_shared, min_free_mib)
    holdings = [
        holdings_from_labels(each.engine_labels()) if not cpu and each.inventory.gpus else {}
        for each in hosts_gpus
    ]
    capacity: list[int | None] = [
        _capacity(h.inventory, request, got, cpu or mode == "all")
        for h, got in zip(hosts_gpus, holdings, strict=True)
    ]
    assignment = hosts.assign(stages, names, capacity, placement, stages_per_host)
    stage_gpus: list[tuple[str, ...]] = [()] * stages
    requests: list[tuple[Mapping[str, Any], ...]] = [()] * stages
    hops: list[int | None] = [None] * stages
    within = ring = 0
    exact, candidates, costed = True, 0, False
    blocks = hosts.blocks(assignment)
    for h, block in blocks:
        host = hosts_gpus[h]
        if cpu:
            placed = Placement(((),) * len(block), (None,) * len(block) if len(block) > 1 else ())
        elif mode == "all":
            every = tuple(g.uuid for g in host.inventory.gpus)
            placed = Placement((every,) * len(block), ())
        else:
            sub = dataclasses.replace(request, stages=len(block))
            placed = allocate(host.inventory, sub, holdings[h])
        for i, k in enumerate(block):
            stage_gpus[k] = placed.stage_gpus[i]
            requests[k] = device_requests(placed.stage_gpus[i], attach)
            if i + 1 < len(block):
                hops[k] = placed.hop_levels[i] if placed.hop_levels else None
        last = block[-1]
        if len(blocks) > 1:
            hops[last] = HOST_LEVEL  # out of this host, to the next one (or back to stage 0's)
        elif len(block) > 1:
            hops[last] = placed.hop_levels[-1] if placed.hop_levels else None
        if placed.cost is not None:
            costed = True
            within, ring = within + placed.cost.within, ring + placed.cost.hops
            exact, candidates = exact and placed.cost.exact, candidates + placed.cost.candidates
    hosts_of = [names[h] for h in assignment]
    cost = PlacementCost(within, ring, exact, candidates) if costed else None
    note = ""
    if cpu and asked == "auto":
        note = f"no GPU found on any host ({'; '.join(notes)}): stages run on CPU"
    elif notes:
        note = "hosts without GPUs take no GPU stage: " + "; ".join(notes)
    return hosts_of, GpuSelection(stage_gpus, requests, tuple(hops) if stages > 1 else (), note, cost)


def _capacity(
    inventory: GpuInventory, request: AllocationRequest, held: Mapping[str, Holding], any_number: bool
) -> int | None:
    """How many stages a host can take now (None: no limit, for CPU stages or --gpus all)."""
    if any_number:
        return None
    return free_units(inventory, request, held) // request.per_stage if inventory.gpus else 0
