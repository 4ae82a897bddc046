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
HOST_LEVEL = 1000  # a hop between two hosts (core/hosts.py): farther than any link inside one
UNKNOWN = 0  # no topology: every pair is as close as any other, bus id decides


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
    cost: PlacementCost | None = None  # None: the user listed the GPUs (--gpus LIST)


@dataclass(frozen=True)
class PlacementCost:
    """The allocator's own measure of a plan (lower is better, `within` first): the sum of distance() between
    the units of each stage, then the sum of the hop distances round the ring, last -> first included.
    `exact`: the least possible for the candidates (searched exhaustively); else the greedy plan's."""

    within: int
    hops: int
    exact: bool
    candidates: int


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
    if level >= HOST_LEVEL:
        return "host: across hosts, over the network"
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


def free_units(inventory: GpuInventory, request: AllocationRequest, holdings: Mapping[str, Holding]) -> int:
    """How many units (GPUs, or MIG slices) `request` could be given now: what a host can take."""
    return sum(1 for unit in units(inventory) if _why_not(unit, inventory, request, holdings) is None)


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

    cost = None
    if request.explicit:
        chosen = _explicit(inventory, all_units, free, request, holdings, need)
    else:
        if len(free) < need:
            raise _not_enough(need, request, free, passed_over, inventory)
        chosen = _closest_ring(inventory, free, need, request.per_stage)
        within, ring = plan_cost(inventory, chosen, request.per_stage)
        cost = PlacementCost(within, ring, len(free) <= EXACT_MAX, len(free))
    k = request.per_stage
    stage_gpus = tuple(tuple(u.uuid for u in chosen[i * k : (i + 1) * k]) for i in range(request.stages))
    hops = []
    for s in range(request.stages):
        t = (s + 1) % request.stages
        a, b = chosen[s * k : (s + 1) * k], chosen[t * k : (t + 1) * k]
        hops.append(_hop(inventory, a, b) if inventory.topology or inventory.nvlink else None)
    return Placement(stage_gpus, tuple(hops) if request.stages > 1 else (), cost)


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


EXACT_MAX = 16  # exact search (branch and bound) up to this many candidate units; greedy above
WITHIN = 10**6  # cost = within * WITHIN + hops: a stage's own closeness first, then the ring


def plan_cost(inventory: GpuInventory, order: Sequence[Unit], per_stage: int) -> tuple[int, int]:
    """The allocator's stated cost of a placement (stages are consecutive runs of `per_stage` units):
    (within: sum of distances inside each stage, hops: sum of hop distances round the ring, last -> first too).
    Lower is better, compared within first."""
    return _ring_cost(inventory, order, per_stage)


def _closest_ring(inventory: GpuInventory, free: list[Unit], need: int, per_stage: int) -> list[Unit]:
    pool = sorted(free, key=lambda u: (u.pci_bus_id, u.uuid))
    greedy = _greedy_ring(inventory, pool, need)
    if len(pool) > EXACT_MAX:
        return greedy
    return _exact(inventory, pool, need, per_stage, greedy)


def _greedy_ring(inventory: GpuInventory, pool: list[Unit], need: int) -> list[Unit]:
    subset = _closest_subset(inventory, pool, need)
    order = [subset[0]]
    left = subset[1:]
    while left:
        nxt = min(left, key=lambda u: distance(inventory, order[-1], u))  # min keeps the first (lowest bus id)
        order.append(nxt)
        left.remove(nxt)
    return order


def _exact(inventory: GpuInventory, pool: list[Unit], need: int, k: int, start: list[Unit]) -> list[Unit]:
    """Branch and bound over placements: choose `need` of the pool and order them into stages of k, minimising
    plan_cost. Symmetries cut: the first unit is the lowest of those chosen (a ring has no start), a stage's
    units go in pool order (a stage is a set), and of interchangeable units (twins: the same distance to
    every other unit) the lower is used first. The bound adds to the cost so far what the units still to come
    must at least add: each new unit's nearest distance once per stage-mate, each ring hop still open the
    smallest distance of all. Ties keep the first found in pool order, so one inventory gives one plan."""
    n = len(pool)
    d = [[distance(inventory, a, b) for b in pool] for a in pool]
    twins_below = [
        [t for t in range(i) if d[i][t] == d[t][i] and all(d[i][x] == d[t][x] for x in range(n) if x not in (i, t))]
        for i in range(n)
    ]
    dmin = min((d[i][j] for i in range(n) for j in range(n) if i != j), default=0)
    stages = need // k
    index = {id(u): i for i, u in enumerate(pool)}

    def cost_of(seq: list[int]) -> int:
        within, hops = _ring_cost(inventory, [pool[i] for i in seq], k)
        return within * WITHIN + hops

    best_cost = cost_of([index[id(u)] for u in start])
    best: list[int] | None = None
    seq: list[int] = []
    used = [False] * n
    # dominance: a state (see dfs) reached again at no lower cost is not searched again
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]], int] = {}

    near = [sorted((d[i][j], j) for j in range(n) if j != i) for i in range(n)]  # each unit's others, closest first

    def smallest(v: int, q: int, among: list[bool]) -> int:
        """The sum of v's q smallest distances to units in `among` (future pairs and edges join only those)."""
        total = 0
        for dist, j in near[v]:
            if q == 0:
                break
            if among[j]:
                total += dist
                q -= 1
        return total

    Parts = tuple[list[bool], list[int], list[int], list[int]]

    def node_parts() -> Parts:
        """What every child of this node shares, computed once: the free units (the child's own unit still among
        them, which only loosens the bounds below) and the sorted per-unit terms of the bounds."""
        free = [not x for x in used]
        free_units = [v for v in range(n) if free[v]]
        full_terms = sorted(smallest(v, k - 1, free) for v in free_units) if k > 1 else []
        two_terms: list[int] = []
        if k == 1 and stages > 1:  # edges to come join the free units and the two ends (the first unit is free
            ends = list(free)  # itself at the root, the last placed is the child's unit, free here)
            if seq:
                ends[seq[0]] = True
            two_terms = sorted(smallest(v, 2, ends) for v in free_units)
        return free, free_units, full_terms, two_terms

    def bound_rest(pos: int, parts: Parts) -> int:
        """A lower bound on what positions pos..need-1 and the hops not yet counted add (seq has pos units).
        Halves are kept doubled: each pair inside a stage, each ring edge, is seen from both its ends."""
        free, free_units, full_terms, two_terms = parts
        slot = pos % k
        q = (k - slot) % k  # units still to come in the stage being filled
        full = (need - pos - q) // k  # stages not begun
        mates = seq[pos - slot :] if slot else []
        within2 = 0
        if q:
            terms = (2 * sum(d[v][m] for m in mates) + smallest(v, q - 1, free) for v in free_units if not used[v])
            within2 += sum(sorted(terms)[:q])
        if k > 1 and full:
            within2 += sum(full_terms[: full * k])
        bound = -(-within2 // 2) * WITHIN
        if stages > 1 and pos < need:
            if k == 1:  # each unit to come has an edge in and out (the last one's out closes the ring)
                r = need - pos
                bound += -(-(sum(two_terms[:r]) + smallest(seq[-1], 1, free) + smallest(seq[0], 1, free)) // 2)
            else:
                bound += (stages - max(0, pos // k - 1)) * dmin
        return bound

    def hop(g1: list[int], g2: list[int]) -> int:
        return min(d[a][b] for a in g1 for b in g2)

    def dfs(pos: int, cost: int, mask: int) -> None:
        nonlocal best_cost, best
        if k <= pos < need:
            # What is left depends only on the units used, the first stage (closing hop), the last complete
            # stage (the next hop) and the stage being filled.
            slot = pos % k
            done = pos - slot
            key = (mask, tuple(seq[:k]), tuple(seq[done - k : done]), tuple(seq[done:]))
            if seen.get(key, cost + 1) <= cost:
                return
            seen[key] = cost
        if pos == need:
            total = cost + (hop(seq[-k:], seq[:k]) if stages > 1 else 0)
            if total < best_cost or (best is None and total == best_cost):
                best_cost, best = total, list(seq)
            return
        slot = pos % k
        steps = []
        for u in range(n):
            if used[u] or (pos > 0 and u < seq[0]) or (slot > 0 and u < seq[-1]):
                continue
            if any(not used[t] for t in twins_below[u]):
                continue
            add = sum(d[u][m] for m in seq[pos - slot :]) * WITHIN
            if slot == k - 1 and pos >= k:  # this unit completes a stage: the hop from the one before is known
                add += hop(seq[pos - slot - k : pos - slot], [*seq[pos - slot :], u])
            steps.append((add, u))
        steps.sort()
        parts = node_parts()
        for add, u in steps:
            used[u] = True
            seq.append(u)
            floor = cost + add + bound_rest(pos + 1, parts)
            if floor < best_cost or (best is None and floor == best_cost):
                dfs(pos + 1, cost + add, mask | 1 << u)
            seq.pop()
            used[u] = False

    dfs(0, 0, 0)
    return start if best is None else [pool[i] for i in best]


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
