"""The GPU allocator: which GPUs each stage gets. Pure: inventory and holdings in, a placement out.

Rules (issue 4):
- candidates are all GPUs (MIG devices as their own units where MIG is on), narrowed by
  CUDA_VISIBLE_DEVICES and by an explicit list;
- a unit held by a live pp-launch run, or running a foreign compute process, is passed over unless
  sharing is allowed; so is one with less free memory than asked;
- consecutive stages, and the last with the first (the ring's feedback edge), sit on the closest units;
- ties go to the lower PCI bus id, so one inventory always gives one plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pp_launch.core import errors
from pp_launch.core.gpu.inventory import GpuInventory, GpuProcess

SAME = 0
UNKNOWN = 0  # no topology: every pair is as close as any other, bus id decides
BRUTE_FORCE_MAX = 8  # exact ring search up to this many units (7! orders); greedy above


@dataclass(frozen=True)
class Unit:
    """One allocatable device: a whole GPU, or one MIG device of a GPU with MIG on."""

    uuid: str
    gpu_pos: int  # position of its GPU in the inventory (topology index)
    label: str  # how a person names it: "GPU 3" or "GPU 3 MIG 1"
    pci_bus_id: str
    free_mib: int | None
    processes: tuple[GpuProcess, ...] | None


@dataclass(frozen=True)
class Holding:
    """A unit held by a pp-launch run (from container labels or a live reservation)."""

    run_id: str
    stage: int | None


@dataclass(frozen=True)
class AllocationRequest:
    stages: int
    per_stage: int = 1
    explicit: tuple[str, ...] = ()  # --gpus LIST: indices or UUIDs, used in stage order
    visible: tuple[str, ...] | None = None  # CUDA_VISIBLE_DEVICES, parsed
    allow_shared: bool = False
    min_free_mib: int | None = None
    own_pids: frozenset[int] = frozenset()  # processes that are not "foreign"


@dataclass(frozen=True)
class Placement:
    stage_gpus: tuple[tuple[str, ...], ...]
    hop_levels: tuple[int | None, ...]  # level between stage k and k+1, and last -> first


def units(inventory: GpuInventory) -> list[Unit]:
    out = []
    for pos, gpu in enumerate(inventory.gpus):
        if gpu.mig_enabled and gpu.mig_devices:
            for m_index, mig in enumerate(gpu.mig_devices):
                free = None
                if mig.memory_total_mib is not None and mig.memory_used_mib is not None:
                    free = mig.memory_total_mib - mig.memory_used_mib
                out.append(Unit(mig.uuid, pos, f"GPU {gpu.index} MIG {m_index}", gpu.pci_bus_id, free, mig.processes))
        else:
            out.append(Unit(gpu.uuid, pos, f"GPU {gpu.index}", gpu.pci_bus_id, gpu.memory_free_mib, gpu.processes))
    return out


def distance(inventory: GpuInventory, a: Unit, b: Unit) -> int:
    """Lower is closer. NVLink beats any PCIe path (more links, closer); then NVML's common-ancestor level."""
    if a.gpu_pos == b.gpu_pos:
        return SAME
    if inventory.nvlink is not None and (links := inventory.nvlink[a.gpu_pos][b.gpu_pos]) > 0:
        return max(1, 9 - links)
    if inventory.topology is not None:
        return inventory.topology[a.gpu_pos][b.gpu_pos]
    return UNKNOWN


PCIE_LEVELS = {
    10: ("PIX", "one PCIe switch"),
    20: ("PXB", "several PCIe switches"),
    30: ("PHB", "one host bridge"),
    40: ("NODE", "one NUMA node"),
    50: ("SYS", "across sockets"),
}


def describe_level(level: int | None) -> str:
    """A distance() value in words: what a hop between two GPUs crosses (never a bare "level 7")."""
    if level is None:
        return "no GPUs (CPU stages)"
    if level == SAME:
        return "the same GPU, or no topology known"
    if 1 <= level <= 8:
        links = 9 - level
        return f"NVLink, {links} link{'s' if links > 1 else ''}" + (" or more" if links == 8 else "")
    short, words = PCIE_LEVELS.get(level, ("?", f"PCIe level {level}"))
    return f"PCIe, {words} ({short})"


def parse_visible(value: str | None) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES: unset means all; empty means none."""
    if value is None:
        return None
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _matches(token: str, unit: Unit, inventory: GpuInventory) -> bool:
    if token.isdigit():
        return inventory.gpus[unit.gpu_pos].index == int(token)
    return unit.uuid == token or (token.startswith("GPU-") and inventory.gpus[unit.gpu_pos].uuid == token)


def allocate(inventory: GpuInventory, request: AllocationRequest, holdings: Mapping[str, Holding]) -> Placement:
    """Raise NotEnoughGpus naming how many were needed, how many were free, and why each other one was
    passed over."""
    need = request.stages * request.per_stage
    all_units = units(inventory)
    passed_over: list[str] = []
    free: list[Unit] = []
    for unit in all_units:
        why = _why_not(unit, inventory, request, holdings)
        if why is None:
            free.append(unit)
        else:
            passed_over.append(f"{unit.label} ({unit.uuid}) {why}")

    if request.explicit:
        chosen = _explicit(inventory, all_units, free, request, holdings, need)
    else:
        if len(free) < need:
            raise _not_enough(need, request, free, passed_over, inventory)
        chosen = _closest_ring(inventory, free, need, request.per_stage)
    k = request.per_stage
    stage_gpus = tuple(tuple(u.uuid for u in chosen[i * k : (i + 1) * k]) for i in range(request.stages))
    hops = []
    for s in range(request.stages):
        t = (s + 1) % request.stages
        a, b = chosen[s * k : (s + 1) * k], chosen[t * k : (t + 1) * k]
        hops.append(_hop(inventory, a, b) if inventory.topology or inventory.nvlink else None)
    return Placement(stage_gpus, tuple(hops) if request.stages > 1 else ())


def _why_not(
    unit: Unit, inventory: GpuInventory, request: AllocationRequest, holdings: Mapping[str, Holding]
) -> str | None:
    """Why a unit is passed over, or None. Sharing lifts only "held" and "busy", never the filters."""
    if request.visible is not None and not any(_matches(t, unit, inventory) for t in request.visible):
        return "filtered out by CUDA_VISIBLE_DEVICES"
    if request.min_free_mib is not None and (unit.free_mib is None or unit.free_mib < request.min_free_mib):
        have = "unknown" if unit.free_mib is None else f"{unit.free_mib} MiB"
        return f"filtered out by --min-free-mem: {have} free, {request.min_free_mib} MiB asked"
    if request.allow_shared:
        return None
    held = holdings.get(unit.uuid) or holdings.get(inventory.gpus[unit.gpu_pos].uuid)
    if held is not None:
        stage = "" if held.stage is None else f" stage {held.stage}"
        return f"held by pp-launch run {held.run_id}{stage}"
    foreign = [p for p in unit.processes or () if p.pid not in request.own_pids]
    if foreign:
        procs = ", ".join(
            f"pid {p.pid}" + ("" if p.used_memory_mib is None else f" using {p.used_memory_mib} MiB") for p in foreign
        )
        return f"busy: {procs}"
    return None


def _explicit(
    inventory: GpuInventory,
    all_units: list[Unit],
    free: list[Unit],
    request: AllocationRequest,
    holdings: Mapping[str, Holding],
    need: int,
) -> list[Unit]:
    if len(request.explicit) != need:
        raise errors.ConfigError(
            f"--gpus lists {len(request.explicit)} GPUs but {request.stages} stages x {request.per_stage} need {need}"
        )
    chosen: list[Unit] = []
    for token in request.explicit:
        matches = [u for u in all_units if _matches(token, u, inventory)]
        if not matches:
            raise errors.ConfigError(f"--gpus names {token!r}, which is no GPU on this host")
        unit = next((u for u in matches if u in free and u not in chosen), None)
        if unit is None:
            first = matches[0]
            why = "listed twice" if first in chosen else _why_not(first, inventory, request, holdings)
            raise errors.NotEnoughGpus(f"--gpus names {token!r} ({first.label}, {first.uuid}), which is {why}")
        chosen.append(unit)
    return chosen


def _not_enough(
    need: int, request: AllocationRequest, free: list[Unit], passed_over: list[str], inventory: GpuInventory
) -> errors.NotEnoughGpus:
    lines = [
        f"not enough GPUs: {request.stages} stages x {request.per_stage} need {need}, "
        f"{len(free)} free of {len(units(inventory))}"
    ]
    lines += [f"  {why}" for why in passed_over]
    # advice that can help, by why the GPUs were passed over (sharing never lifts a filter)
    advice = ["Ask for fewer (--stages, --gpus-per-stage)"]
    if any(" held by pp-launch run " in why or ") busy: " in why for why in passed_over):
        advice.append("free the GPUs held or busy, or share them (--allow-shared)")
    if any("--min-free-mem" in why for why in passed_over):
        advice.append("lower --min-free-mem")
    if any("CUDA_VISIBLE_DEVICES" in why for why in passed_over):
        advice.append("widen CUDA_VISIBLE_DEVICES")
    advice.append("or run with --gpus none for CPU stages")
    lines.append("; ".join(advice) + ".")
    return errors.NotEnoughGpus("\n".join(lines))


def _hop(inventory: GpuInventory, a: Sequence[Unit], b: Sequence[Unit]) -> int:
    """Between two stages, the closest pair of their units: the link their traffic can take."""
    return min(distance(inventory, x, y) for x in a for y in b)


def _ring_cost(inventory: GpuInventory, order: Sequence[Unit], per_stage: int) -> tuple[int, int]:
    """(sum of distances within each stage, sum of hop distances round the ring). Within a stage first:
    a stage's own GPUs exchange the most (tensor parallelism), the ring hops carry one activation."""
    groups = [order[i : i + per_stage] for i in range(0, len(order), per_stage)]
    hops = (
        sum(_hop(inventory, groups[i], groups[(i + 1) % len(groups)]) for i in range(len(groups)))
        if len(groups) > 1
        else 0
    )
    within = sum(distance(inventory, a, b) for g in groups for a, b in itertools.combinations(g, 2))
    return within, hops


def _closest_ring(inventory: GpuInventory, free: list[Unit], need: int, per_stage: int) -> list[Unit]:
    pool = sorted(free, key=lambda u: (u.pci_bus_id, u.uuid))
    subset = _closest_subset(inventory, pool, need)
    if len(subset) <= BRUTE_FORCE_MAX:
        best: tuple[tuple[int, int], list[Unit]] | None = None
        # Fix the first unit (a ring has no start). Permutations come in bus-id order: first best wins.
        for rest in itertools.permutations(subset[1:]):
            order = [subset[0], *rest]
            cost = _ring_cost(inventory, order, per_stage)
            if best is None or cost < best[0]:
                best = (cost, order)
        assert best is not None
        return best[1]
    order = [subset[0]]
    left = subset[1:]
    while left:
        nxt = min(left, key=lambda u: distance(inventory, order[-1], u))  # min keeps the first (lowest bus id)
        order.append(nxt)
        left.remove(nxt)
    return order


def _closest_subset(inventory: GpuInventory, pool: list[Unit], need: int) -> list[Unit]:
    """Grow a set from each seed by the nearest unit; keep the tightest set (first seed on ties)."""
    best: tuple[int, list[Unit]] | None = None
    for seed in pool:
        chosen = [seed]
        left = [u for u in pool if u is not seed]
        while len(chosen) < need:
            nxt = min(left, key=lambda u: sum(distance(inventory, u, c) for c in chosen))
            chosen.append(nxt)
            left.remove(nxt)
        cost = sum(distance(inventory, a, b) for a, b in itertools.combinations(chosen, 2))
        if best is None or cost < best[0]:
            best = (cost, chosen)
    assert best is not None
    return sorted(best[1], key=lambda u: (u.pci_bus_id, u.uuid))
