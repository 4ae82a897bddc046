"""GPU selection for a launch: inventory + holdings -> allocator -> device requests.

Concurrent launches must never get the same GPU. The engine's labels say which GPUs its containers hold; the
gap between the pick and the creation of the last stage is closed by the engine's GPU lock (app/locks.py), which
the caller holds from before the labels are read here until its stages exist. Nothing is kept in files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters import inventory_file
from pp_launch.core import errors, hosts, labels
from pp_launch.core.gpu import requests as gpu_requests
from pp_launch.core.gpu.allocator import (
    HOST_LEVEL,
    AllocationRequest,
    Holding,
    Placement,
    PlacementCost,
    allocate,
    free_units,
    parse_visible,
    passed_over_now,
)
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.gpu.requests import device_requests, read_gpus

ATTACH_MODES = gpu_requests.ATTACH_MODES


INVENTORY_ENV = inventory_file.INVENTORY_ENV


def read_inventory_file(path: str) -> GpuInventory:
    """An inventory file (docs/formats.md), or an example the package carries (`example:NAME`)."""
    return inventory_file.load(path)


def save_inventory(inventory: GpuInventory, path: str) -> None:
    """`gpus --record FILE`: the inventory written in the file's format."""
    inventory_file.save(inventory, path)


def load_inventory(path: str | None) -> GpuInventory:
    """From the file when one is named (flag or PP_LAUNCH_GPU_INVENTORY), else from NVML. No driver: empty,
    with the reason in `note`."""
    return inventory_file.this_host(path)


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
    asked = read_gpus(value)
    if asked is None:
        raise errors.ConfigError(
            f"--gpus {value.strip()!r} is not understood: use auto, none, all, a count (2), or device=0,2 / "
            "device=GPU-<uuid> (a bare list with a comma works too: 3, or 0,3)"
        )
    if asked.kind == "count":
        if asked.count < 1:
            raise errors.ConfigError("--gpus 0 asks for no GPU: use --gpus none")
        if per_stage not in (1, asked.count):
            raise errors.ConfigError(
                f"--gpus {asked.count} (a count per stage) and --gpus-per-stage {per_stage} disagree"
            )
        return "auto", asked.count
    if asked.kind == "list":
        return ",".join(asked.ids), per_stage
    return asked.kind, per_stage


@dataclass(frozen=True)
class HostGpus:
    """One engine's GPUs (its inventory) and the labels of its live containers. `host` "" is the one engine of a
    chain without --host: the one-host case of a chain across hosts."""

    host: str
    inventory: GpuInventory
    engine_labels: Callable[[], list[Mapping[str, str]]]


@dataclass(frozen=True)
class _Ask:
    """--gpus as asked and as read, with what the allocator is asked for each block."""

    asked: str
    mode: str  # auto | none | all | a list
    request: AllocationRequest

    @property
    def explicit(self) -> bool:
        return self.mode not in ("auto", "none", "all")


def select(
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
    allow_unhealthy: bool = False,
    avoid: tuple[tuple[str, str], ...] = (),
) -> tuple[list[str], GpuSelection]:
    """Each stage's host and GPUs. mode (--gpus), read as `docker run --gpus` reads it: auto | none | all | N (a
    count: N GPUs for each stage, placed as auto places them) | device=LIST or a LIST with a comma (indices or
    UUIDs, in stage order; one host only). Stages go in blocks of consecutive stages per host in --host order
    (core hosts.assign), then the allocator places each block on its host. Exclusivity per host: that engine's
    labels, read under its GPU lock (held by the caller)."""
    asked = mode.strip()
    mode, per_stage = parse_gpus_flag(mode, per_stage)
    per_stage = _per_stage_of_list(mode, stages, per_stage)
    listed = mode if mode not in ("auto", "none", "all") else "auto"
    request = _request(listed, 1, per_stage, environ, allow_shared, min_free_mib)
    request = dataclasses.replace(request, allow_unhealthy=allow_unhealthy, avoid=avoid)  # docs/recovery.md
    ask = _Ask(asked, mode, request)
    one_engine = _one_engine(hosts_gpus)
    if ask.explicit and len(hosts_gpus) > 1:
        raise errors.ConfigError(
            f"--gpus {ask.asked} lists GPUs of one host; over several --host use auto, a count, all or none"
        )
    cpu = _cpu_only(ask, hosts_gpus)
    holdings = [
        holdings_from_labels(h.engine_labels()) if not cpu and h.inventory.gpus and mode != "all" else {}
        for h in hosts_gpus
    ]
    if one_engine:
        assignment = [0] * stages  # every stage on it (the allocator says what does not fit)
    else:
        any_number = cpu or mode == "all"
        pairs = zip(hosts_gpus, holdings, strict=True)
        capacity = [_capacity(h.inventory, ask.request, got, any_number) for h, got in pairs]
        try:
            assignment = hosts.assign(stages, [h.host for h in hosts_gpus], capacity, placement, stages_per_host)
        except errors.NotEnoughGpus as exc:
            raise _with_passed_over(exc, ask.request, hosts_gpus, holdings, any_number) from None
    blocks = [
        (block, _place(hosts_gpus[h].inventory, len(block), ask, holdings[h], cpu))
        for h, block in hosts.blocks(assignment)
    ]
    selection = _combine(blocks, stages, attach, whole=one_engine and (cpu or mode == "all"))
    return [hosts_gpus[h].host for h in assignment], dataclasses.replace(selection, note=_note(ask, hosts_gpus, cpu))


def _cpu_only(ask: _Ask, hosts_gpus: Sequence[HostGpus]) -> bool:
    """CPU stages: --gpus none, or auto where no host has a GPU. A count or a list with no GPU anywhere: exit 2."""
    if ask.mode == "none":
        return True
    if any(h.inventory.gpus for h in hosts_gpus):
        return False
    if ask.asked == "auto":
        return True
    if _one_engine(hosts_gpus):
        why = hosts_gpus[0].inventory.note or "the GPU inventory lists no GPU"
        raise errors.NotEnoughGpus(f"--gpus {ask.asked} asks for GPUs, but {why}; use --gpus none for CPU stages")
    notes = "; ".join(_notes(hosts_gpus))
    raise errors.NotEnoughGpus(f"--gpus {ask.asked} asks for GPUs, but no host has any ({notes})")


def _per_stage_of_list(mode: str, stages: int, per_stage: int) -> int:
    """A list of k x stages GPUs with --gpus-per-stage left at 1 gives each stage k of them, as `docker run --gpus
    device=0,2` gives its one container both."""
    ids = mode.split(",") if mode not in ("auto", "none", "all") else []
    if ids and per_stage == 1 and len(ids) > stages and len(ids) % stages == 0:
        return len(ids) // stages
    return per_stage


def _one_engine(hosts_gpus: Sequence[HostGpus]) -> bool:
    return len(hosts_gpus) == 1 and not hosts_gpus[0].host


def _notes(hosts_gpus: Sequence[HostGpus]) -> list[str]:
    return [h.inventory.note for h in hosts_gpus if h.inventory.note and not h.inventory.gpus]


def _note(ask: _Ask, hosts_gpus: Sequence[HostGpus], cpu: bool) -> str:
    """What the user is told plainly (e.g. why stages run on CPU)."""
    if cpu and ask.asked == "auto":
        if _one_engine(hosts_gpus):
            why = hosts_gpus[0].inventory.note or "the GPU inventory lists no GPU"
            return f"no GPU found ({why}): stages run on CPU"
        return f"no GPU found on any host ({'; '.join(_notes(hosts_gpus))}): stages run on CPU"
    if notes := _notes(hosts_gpus):
        return "hosts without GPUs take no GPU stage: " + "; ".join(notes)
    return ""


def _place(inventory: GpuInventory, n: int, ask: _Ask, held: Mapping[str, Holding], cpu: bool) -> Placement:
    """One host's block of n consecutive stages."""
    if cpu:
        return Placement(((),) * n, (None,) * n if n > 1 else ())
    if ask.mode == "all":
        return Placement((tuple(g.uuid for g in inventory.gpus),) * n, ())
    return allocate(inventory, dataclasses.replace(ask.request, stages=n), held)


def _combine(blocks: list[tuple[list[int], Placement]], stages: int, attach: str, whole: bool) -> GpuSelection:
    """The blocks' placements as one chain: each stage's GPUs and device requests, each hop's level (a hop out of
    a host is HOST_LEVEL), the summed cost. `whole`: CPU stages or --gpus all on one engine (no hops to show)."""
    stage_gpus: list[tuple[str, ...]] = [()] * stages
    requests: list[tuple[Mapping[str, Any], ...]] = [()] * stages
    hops: list[int | None] = [None] * stages
    costs = [placed.cost for _, placed in blocks if placed.cost is not None]
    for block, placed in blocks:
        for i, k in enumerate(block):
            stage_gpus[k] = placed.stage_gpus[i]
            requests[k] = device_requests(placed.stage_gpus[i], attach)
            if i + 1 < len(block) or len(blocks) == 1:
                hops[k] = placed.hop_levels[i] if i < len(placed.hop_levels) else None
        if len(blocks) > 1:
            hops[block[-1]] = HOST_LEVEL  # out of this host, to the next one (or back to stage 0's)
    cost = None
    if costs:
        cost = PlacementCost(
            sum(c.within for c in costs),
            sum(c.hops for c in costs),
            all(c.exact for c in costs),
            sum(c.candidates for c in costs),
        )
    shown = tuple(hops) if stages > 1 and not whole else ()
    return GpuSelection(stage_gpus, requests, shown, cost=cost)


def _with_passed_over(
    exc: errors.NotEnoughGpus,
    request: AllocationRequest,
    hosts_gpus: Sequence[HostGpus],
    holdings: Sequence[Mapping[str, Holding]],
    any_number: bool,
) -> errors.NotEnoughGpus:
    """Stages that do not fit across hosts, with each GPU passed over on each host and why (held, busy, unhealthy,
    faulted in this run), as one engine's "not enough GPUs" says them."""
    lines = [str(exc)]
    for h, held in zip(hosts_gpus, holdings, strict=True):
        if h.inventory.gpus and not any_number:
            lines += [f"  host {h.host}: {why}" for why in passed_over_now(h.inventory, request, held)]
    if any(") unhealthy: " in line for line in lines[1:]):
        lines.append("Use unhealthy GPUs anyway with --allow-unhealthy (docs/recovery.md).")
    return errors.NotEnoughGpus("\n".join(lines))


def _capacity(
    inventory: GpuInventory, request: AllocationRequest, held: Mapping[str, Holding], any_number: bool
) -> int | None:
    """How many stages a host can take now (None: no limit, for CPU stages or --gpus all)."""
    if any_number:
        return None
    return free_units(inventory, request, held) // request.per_stage if inventory.gpus else 0
