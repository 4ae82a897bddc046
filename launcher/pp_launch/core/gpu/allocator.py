"""The GPU allocator: which GPUs each stage gets. Pure: inventory and holdings in, a placement out.

Rules:
- candidates are all GPUs (MIG devices as their own units where MIG is on), narrowed by
  CUDA_VISIBLE_DEVICES and by an explicit list;
- a unit held by a live pp-launch run, or running a foreign compute process, is passed over unless
  sharing is allowed; so is one with less free memory than asked;
- consecutive stages, and the last with the first (the ring's feedback edge), sit on the closest units;
- ties go to the lower PCI bus id, so one inventory always gives one plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pp_launch.core import errors
from pp_launch.core.gpu.inventory import GpuInventory, GpuProcess
from pp_launch.core.hosts import HOST_LEVEL as HOST_LEVEL  # a hop between two hosts: farther than any link inside one

SAME = 0
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
    """A unit held by a pp-launch run (from its containers' labels)."""

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
    allow_unhealthy: bool = False  # place on GPUs NVML says are unhealthy (never on one that faulted in this run)
    avoid: tuple[tuple[str, str], ...] = ()  # (UUID, why): GPUs that faulted under this run: never placed on


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
    """Lower is closer. NVLink beats any PCIe path (more links, closer); then NVML's common-ancestor level.
    The same both ways (the search's bounds count on it) even where an inventory's matrices are not: links seen
    from either end count, and the farther of two levels read is taken."""
    i, j = a.gpu_pos, b.gpu_pos
    if i == j:
        return SAME
    if inventory.nvlink is not None and (links := max(inventory.nvlink[i][j], inventory.nvlink[j][i])) > 0:
        return max(1, 9 - links)
    if inventory.topology is not None:
        return max(inventory.topology[i][j], inventory.topology[j][i])
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


def passed_over_now(inventory: GpuInventory, request: AllocationRequest, holdings: Mapping[str, Holding]) -> list[str]:
    """Each unit `request` could not be given now, and why, as the "not enough GPUs" message says it."""
    out = []
    for unit in units(inventory):
        why = _why_not(unit, inventory, request, holdings)
        if why is not None:
            out.append(f"{unit.label} ({unit.uuid}) {why}")
    return out


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
    filtered = _filtered(unit, inventory, request)
    if filtered is not None or request.allow_shared:
        return filtered
    return _taken(unit, inventory, request, holdings)


def _filtered(unit: Unit, inventory: GpuInventory, request: AllocationRequest) -> str | None:
    """What no flag about sharing lifts: CUDA_VISIBLE_DEVICES, a fault in this run, ill health, --min-free-mem."""
    if request.visible is not None and not any(_matches(t, unit, inventory) for t in request.visible):
        return "filtered out by CUDA_VISIBLE_DEVICES"
    gpu = inventory.gpus[unit.gpu_pos]
    faulted = dict(request.avoid)
    if (why := faulted.get(unit.uuid) or faulted.get(gpu.uuid)) is not None:
        return f"faulted in this run: {why}"
    if gpu.health and not request.allow_unhealthy:
        return f"unhealthy: {gpu.health}"
    if request.min_free_mib is not None and (unit.free_mib is None or unit.free_mib < request.min_free_mib):
        have = "unknown" if unit.free_mib is None else f"{unit.free_mib} MiB"
        return f"filtered out by --min-free-mem: {have} free, {request.min_free_mib} MiB asked"
    return None


def _taken(
    unit: Unit, inventory: GpuInventory, request: AllocationRequest, holdings: Mapping[str, Holding]
) -> str | None:
    """Held by a pp-launch run, or running someone's compute process."""
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
        n, k = len(request.explicit), request.stages
        hint = (
            f": list {need}, or ask --gpus-per-stage {n // k} to give each stage {n // k} of them"
            if n % k == 0 and n // k != request.per_stage
            else f": list {need} ({k} stage{'s' if k != 1 else ''} x {request.per_stage} GPU"
            f"{'s' if request.per_stage != 1 else ''} each)"
        )
        raise errors.ConfigError(
            f"--gpus lists {n} GPU{'s' if n != 1 else ''} but {k} stage{'s' if k != 1 else ''} x "
            f"{request.per_stage} need{'s' if k == 1 and request.per_stage == 1 else ''} {need}{hint}"
        )
    chosen: list[Unit] = []
    for token in request.explicit:
        matches = _named(token, all_units, inventory)
        unit = next((u for u in matches if u in free and u not in chosen), None)
        if unit is None:
            first = matches[0]
            why = "listed twice" if first in chosen else _why_not(first, inventory, request, holdings)
            hint = "; --allow-unhealthy places on it anyway" if str(why).startswith("unhealthy:") else ""
            raise errors.NotEnoughGpus(f"--gpus names {token!r} ({first.label}, {first.uuid}), which is {why}{hint}")
        chosen.append(unit)
    return chosen


def _named(token: str, all_units: list[Unit], inventory: GpuInventory) -> list[Unit]:
    """The units a --gpus token names; a lost GPU or no GPU at all is exit 2, said."""
    matches = [u for u in all_units if _matches(token, u, inventory)]
    if matches:
        return matches
    lost = next((g for g in inventory.lost if token in (str(g.index), g.uuid)), None)
    if lost is not None:
        raise errors.NotEnoughGpus(f"--gpus names {token!r} (GPU {lost.index}), which is lost: {lost.why}")
    raise errors.ConfigError(f"--gpus names {token!r}, which is no GPU on this host")


def _not_enough(
    need: int, request: AllocationRequest, free: list[Unit], passed_over: list[str], inventory: GpuInventory
) -> errors.NotEnoughGpus:
    lines = [
        f"not enough GPUs: {request.stages} stage{'s' if request.stages != 1 else ''} x {request.per_stage} "
        f"need{'s' if request.stages == 1 and request.per_stage == 1 else ''} {need}, "
        f"{len(free)} free of {len(units(inventory))}"
    ]
    lines += [f"  {why}" for why in passed_over]
    lines += [f"  GPU {g.index} lost: {g.why}" for g in inventory.lost]
    # advice that can help, by why the GPUs were passed over (sharing never lifts a filter)
    advice = ["Ask for fewer (--stages, --gpus-per-stage)"]
    if any(" held by pp-launch run " in why or ") busy: " in why for why in passed_over):
        advice.append("free the GPUs held or busy, or share them (--allow-shared)")
    if any("--min-free-mem" in why for why in passed_over):
        advice.append("lower --min-free-mem")
    if any("CUDA_VISIBLE_DEVICES" in why for why in passed_over):
        advice.append("widen CUDA_VISIBLE_DEVICES")
    if any(") unhealthy: " in why for why in passed_over):
        advice.append("use unhealthy GPUs anyway (--allow-unhealthy; docs/recovery.md)")
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


def order_groups(inventory: GpuInventory, groups: Sequence[Sequence[str]]) -> tuple[list[int], list[int]]:
    """GPUs granted by someone else (a Ray cluster), one group per stage, on one machine: the order of the groups
    round the cheapest ring (from group 0; every order up to five groups, Held-Karp above), and the hop level
    from each group in that order to the next (the last to the first). UUIDs the inventory lacks are as close
    as any (no topology known)."""
    by_uuid = {u.uuid: u for u in units(inventory)}
    known = [[by_uuid[g] for g in group if g in by_uuid] for group in groups]
    n = len(known)
    h = [
        [_hop(inventory, a, b) if a and b and i != j else UNKNOWN for j, b in enumerate(known)]
        for i, a in enumerate(known)
    ]
    order = _ring_order(h)[1] if n > 1 else list(range(n))
    return order, [h[order[i]][order[(i + 1) % n]] for i in range(n)] if n > 1 else []


def split_granted(
    inventory: GpuInventory, granted: Sequence[str], stages: int, per_stage: int
) -> list[tuple[str, ...]]:
    """GPUs granted to a block of stages by someone else (a Ray cluster), shared out: `stages` groups of `per_stage`,
    the closest ring over them on this machine's topology (of more granted than needed, the closest ring of as many
    as needed). UUIDs the inventory lacks are taken in the order given."""
    by_uuid = {u.uuid: u for u in units(inventory)}
    known = [by_uuid[g] for g in granted if g in by_uuid]
    order = list(granted)
    need = min(len(known), stages * per_stage)
    if per_stage and known and len(known) == len(granted):
        order = [u.uuid for u in _closest_ring(inventory, known, need, per_stage)]
    return [tuple(order[i * per_stage : (i + 1) * per_stage]) for i in range(stages)]


def passed_over(
    inventory: GpuInventory, uuids: Sequence[str], avoid: Sequence[tuple[str, str]], allow_unhealthy: bool
) -> dict[str, str]:
    """Of GPUs someone else chose (a Ray grant), those this run must not use, UUID -> why, as the allocator says it
    of its own choice: faulted in this run (always), unhealthy (unless allowed)."""
    gpus = {g.uuid: g for g in inventory.gpus}
    faulted = dict(avoid)
    out = {}
    for uuid in uuids:
        if (why := faulted.get(uuid)) is not None:
            out[uuid] = f"faulted in this run: {why}"
        elif (g := gpus.get(uuid)) is not None and g.health and not allow_unhealthy:
            out[uuid] = f"unhealthy: {g.health}"
    return out


EXACT_MAX = 16  # exact search (branch and bound) up to this many candidate units; greedy above


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
    d = [[distance(inventory, a, b) for b in pool] for a in pool]
    index = {id(u): i for i, u in enumerate(pool)}
    start = [index[id(u)] for u in greedy]
    found = _exact_ring(d, need, start) if per_stage == 1 else _exact_stages(d, need, per_stage, start)
    return greedy if found is None else [pool[i] for i in found]


def _twins_below(d: list[list[int]]) -> list[list[int]]:
    """For each unit, the lower units interchangeable with it (twins: one distance apart each way, and alike
    to every other unit). Twins are all alike to each other too, so they form classes."""
    n = len(d)
    return [
        [t for t in range(i) if d[i][t] == d[t][i] and all(d[i][x] == d[t][x] for x in range(n) if x not in (i, t))]
        for i in range(n)
    ]


def _opens_after(d: list[list[int]], twins_below: list[list[int]]) -> list[list[int]]:
    """Interchangeable classes of twins: two classes of one size, one distance inside and one distance to every
    other unit (two NVLink pairs on one socket, two pairs behind PCIe switches of one host bridge) can be swapped
    whole without changing any cost. For each class's lowest unit: the lowest units of the lower classes alike
    to it (a search opens those first; for any other unit, nothing)."""
    n = len(d)
    klass = list(range(n))  # each unit's class of twins, named by its lowest unit
    for i in range(n):
        if twins_below[i]:
            klass[i] = klass[twins_below[i][0]]
    size = {c: klass.count(c) for c in set(klass)}
    heads = sorted(size)

    def alike(a: int, b: int) -> bool:
        inner_a = next((d[a][x] for x in range(n) if x != a and klass[x] == a), None)
        inner_b = next((d[b][x] for x in range(n) if x != b and klass[x] == b), None)
        return (
            size[a] == size[b]
            and inner_a == inner_b
            and d[a][b] == d[b][a]
            and all(d[a][x] == d[b][x] for x in heads if x not in (a, b))
        )

    opens_after: list[list[int]] = [[] for _ in range(n)]
    for j in heads:
        opens_after[j] = [i for i in heads if i < j and alike(i, j)]
    return opens_after


def _nearest(d: list[list[int]]) -> list[list[tuple[int, int]]]:
    """Each unit's others, closest first: (distance, unit)."""
    return [sorted((row[j], j) for j in range(len(d)) if j != i) for i, row in enumerate(d)]


def _exact_ring(d: list[list[int]], need: int, start: list[int]) -> list[int] | None:
    """One unit per stage: choose `need` units of the pool and their order round the ring, minimising the sum of
    hop distances (last -> first included). Branch and bound; None when nothing beats `start` (the greedy plan).
    Symmetries cut: the first unit is the lowest chosen (a ring has no start), of twins the lower is used first
    and of interchangeable classes the lower is opened first (the lexicographically least of a plan's equals,
    all rotations and swaps, obeys all three; each rule depends only on the units used, so the state memo below
    stays sound). The bound: each unit still to come has an edge in and an edge out, each at least its nearest
    distances to the units that can still be joined; every edge is seen from both ends, so the sum is halved.
    A state (units used, first and last unit) reached again at no lower cost is not searched again. Ties keep
    the first found in pool order (bus ids), so one inventory gives one plan."""
    return _RingSearch(d, need, start).run()


class _RingSearch:
    """_exact_ring's branch and bound: its state, and one method per step."""

    def __init__(self, d: list[list[int]], need: int, start: list[int]) -> None:
        self.d, self.need, self.n = d, need, len(d)
        self.twins_below = _twins_below(d)
        self.opens_after = _opens_after(d, self.twins_below)
        self.near = _nearest(d)
        self.best_cost = self._ring(start)
        self.best: list[int] | None = None
        self.seq: list[int] = []
        self.used = [False] * self.n
        self.seen: dict[tuple[int, int, int], int] = {}

    def run(self) -> list[int] | None:
        self._dfs(0, 0, 0)
        return self.best

    def _ring(self, seq: list[int]) -> int:
        d = self.d
        return sum(d[seq[i]][seq[(i + 1) % len(seq)]] for i in range(len(seq))) if len(seq) > 1 else 0

    def _smallest(self, v: int, q: int, among: list[bool]) -> int:
        """The sum of v's q smallest distances to units in `among`."""
        total = 0
        for dist, j in self.near[v]:
            if q == 0:
                break
            if among[j]:
                total += dist
                q -= 1
        return total

    def _steps(self, pos: int) -> list[tuple[int, int]]:
        """The units that may come next (symmetries cut), nearest to the last placed first."""
        d, seq, used, twins_below, opens_after = self.d, self.seq, self.used, self.twins_below, self.opens_after
        return sorted(
            (d[seq[-1]][u] if pos else 0, u)
            for u in range(self.n)
            if not used[u]
            and not (pos and u < seq[0])
            and all(used[t] for t in twins_below[u])
            and all(used[t] for t in opens_after[u])
        )

    def _seen_cheaper(self, pos: int, cost: int, mask: int) -> bool:
        """A state (units used, first and last unit) reached before at no higher cost: what is left depends only
        on these."""
        if not 0 < pos < self.need:
            return False
        key = (mask, self.seq[0], self.seq[-1])
        if self.seen.get(key, cost + 1) <= cost:
            return True
        self.seen[key] = cost
        return False

    def _dfs(self, pos: int, cost: int, mask: int) -> None:
        if self._seen_cheaper(pos, cost, mask):
            return
        need, seq, used, smallest = self.need, self.seq, self.used, self._smallest
        if pos == need:
            total = cost + (self.d[seq[-1]][seq[0]] if need > 1 else 0)
            if total < self.best_cost or (self.best is None and total == self.best_cost):
                self.best_cost, self.best = total, list(seq)
            return
        steps = self._steps(pos)
        # what every child shares: the units still free (the child's own unit among them, which only loosens
        # the bound) and, for each, its two nearest among the free units and the ends (the first unit, and the
        # last placed, which is the child's own unit, free here)
        free = [not x for x in used]
        ends = list(free)
        if seq:
            ends[seq[0]] = True
        two = sorted(smallest(v, 2, ends) for v in range(self.n) if free[v])
        for add, u in steps:
            used[u] = True
            seq.append(u)
            floor = cost + add
            if need > 1 and pos + 1 < need:
                floor += -(-(sum(two[: need - pos - 1]) + smallest(u, 1, free) + smallest(seq[0], 1, free)) // 2)
            if floor < self.best_cost or (self.best is None and floor == self.best_cost):
                self._dfs(pos + 1, cost + add, mask | 1 << u)
            seq.pop()
            used[u] = False


def _exact_stages(d: list[list[int]], need: int, k: int, start: list[int]) -> list[int] | None:
    """Stages of k > 1 units: the least (within, hops) over every way to choose `need` units of the pool, split
    them into stages and order the stages round the ring; None when nothing beats `start` (the greedy plan).
    Since `within` comes first, the search runs over the split alone (stages as sets, in order of their lowest
    unit, each stage's units ascending) and orders the stages of each split it completes exactly (_ring_order).
    Symmetries cut: of twins the lower is used first, and of interchangeable classes of twins (same size,
    same distance inside, alike to every other unit: two NVLink pairs on one switch level, say) the lower is
    opened first. Bounds: each unit still to come is at least its nearest distances to the units it can still
    share a stage with; each stage of the ring has two hops, at least its two nearest units outside it. Ties
    keep the first found, so one inventory gives one plan."""
    return _StageSearch(d, need, k, start).run()


class _StageSearch:
    """_exact_stages' branch and bound: its state, and one method per step."""

    def __init__(self, d: list[list[int]], need: int, k: int, start: list[int]) -> None:
        self.d, self.need, self.k, self.n = d, need, k, len(d)
        self.stages = need // k
        n = self.n
        self.twins_below = _twins_below(d)
        self.near = _nearest(d)
        self.opens_after = _opens_after(d, self.twins_below)
        self.dmin = min((d[i][j] for i in range(n) for j in range(n) if i != j), default=0)
        self.best_w, self.best_h = self._cost_of(start)
        self.best: list[int] | None = None
        self.seq: list[int] = []
        self.used = [False] * n
        self.hrows: list[list[int]] = []  # hrows[j][i]: the hop between complete stages j and i < j
        self.outs: list[int] = []  # each complete stage's two hops at least (its two nearest units outside it)

    def run(self) -> list[int] | None:
        self._dfs(0, 0)
        return self.best

    def _cost_of(self, seq: list[int]) -> tuple[int, int]:
        d, k, need, stages = self.d, self.k, self.need, self.stages
        groups = [seq[i : i + k] for i in range(0, need, k)]
        within = sum(d[a][b] for g in groups for a, b in itertools.combinations(g, 2))
        if stages == 1:
            return within, 0
        return within, sum(min(d[a][b] for a in groups[i] for b in groups[(i + 1) % stages]) for i in range(stages))

    def _smallest(self, v: int, q: int, above: int) -> int:
        """The sum of v's q smallest distances to unused units above `above`."""
        used = self.used
        total = 0
        for dist, j in self.near[v]:
            if q == 0:
                break
            if j > above and not used[j]:
                total += dist
                q -= 1
        return total

    def _within_floors(self, pos: int, lo: int) -> Callable[[int], int]:
        """For the children of a node (seq holds pos units, a child puts a unit u > lo at pos): at least what the
        units after u add to `within`. The rest of u's stage takes units above u; stages not begun take units
        above their lowest, so above the lowest of u's stage. Each pair is seen from both its ends, so the sum is
        halved. What the children share is worked out once here: there u itself still counts as free and the
        nearest are sought above lo (slot 0) or above its stage's lowest, which can only lower the floor."""
        d, k, n, need, seq, used, smallest = self.d, self.k, self.n, self.need, self.seq, self.used, self._smallest
        slot = pos % k
        q = k - slot - 1  # units after u in its stage
        rest = need - pos - 1 - q  # units in stages not begun
        base = seq[pos - slot] if slot else lo
        full = sorted((smallest(v, k - 1, base), v) for v in range(base + 1, n) if not used[v]) if rest else []
        mates = seq[pos - slot :]
        part = (
            {v: 2 * sum(d[v][m] for m in mates) + smallest(v, q - 1, lo) for v in range(lo + 1, n) if not used[v]}
            if q
            else {}
        )

        def floor(u: int) -> int:
            twice = 0
            if q:
                twice += sum(sorted(part[v] + 2 * d[v][u] for v in range(u + 1, n) if not used[v])[:q])
            if rest:
                twice += sum(itertools.islice((t for t, v in full if v != u and (slot or v > u)), rest))
            return -(-twice // 2)

        return floor

    def _leaf(self, within: int) -> None:
        stages, k, seq, hrows = self.stages, self.k, self.seq, self.hrows
        hops, order = 0, [0]
        if stages > 1:
            h = [[0] * stages for _ in range(stages)]
            for j in range(stages):
                for i in range(j):
                    h[i][j] = h[j][i] = hrows[j][i]
            # a ring enters and leaves each stage: at least its two nearest stages (one, twice, for two stages)
            ends = (sorted(h[g][x] for x in range(stages) if x != g) for g in range(stages))
            floor = 2 * h[0][1] if stages == 2 else -(-sum(e[0] + e[1] for e in ends) // 2)
            if within == self.best_w and (floor > self.best_h or (floor == self.best_h and self.best is not None)):
                return
            hops, order = _ring_order(h)
        best_w, best_h = self.best_w, self.best_h
        if (within, hops) < (best_w, best_h) or (self.best is None and (within, hops) == (best_w, best_h)):
            self.best_w, self.best_h = within, hops
            self.best = [u for s in order for u in seq[s * k : (s + 1) * k]]

    def _children(self, pos: int, within: int) -> list[tuple[int, int, int, int, int]]:
        """The units that may come next (symmetries cut), each with the floors of what a plan through it costs,
        the most promising first: a good plan found early prunes the rest."""
        d, k, n, need, stages = self.d, self.k, self.n, self.need, self.stages
        seq, used = self.seq, self.used
        slot = pos % k
        lo = (seq[pos - k] if pos else -1) if slot == 0 else seq[-1]
        twice_hops = sum(self.outs) + (stages - len(self.outs)) * 2 * self.dmin if stages > 1 else 0
        within_floor = self._within_floors(pos, lo) if pos + 1 < need else lambda u: 0
        children = []
        for u in range(lo + 1, n):
            if not self._may_come_next(u):
                continue
            if slot == 0 and sum(1 for v in range(u + 1, n) if not used[v]) < need - pos - 1:
                break  # too few units above u left to fill the stages: the same for every higher u
            add = sum(d[u][m] for m in seq[pos - slot :])
            out = self._out_if_completed(pos, u) if stages > 1 and slot == k - 1 else 0
            twice = twice_hops + (out - 2 * self.dmin if out else 0)
            floor = within + add + within_floor(u)
            children.append((floor, -(-twice // 2), u, add, out))
        children.sort()
        return children

    def _may_come_next(self, u: int) -> bool:
        """Unused, and the symmetries allow it: its lower twins and the classes it opens after are used."""
        used = self.used
        return not used[u] and all(used[t] for t in self.twins_below[u]) and all(used[t] for t in self.opens_after[u])

    def _out_if_completed(self, pos: int, u: int) -> int:
        """u completes a stage: its units' two hops out at least (their nearest units in another stage, or still
        to be placed: above the stage's lowest)."""
        d, k, n, seq, used = self.d, self.k, self.n, self.seq, self.used
        g = [*seq[pos + 1 - k :], u]
        reach = sorted(min(d[v][x] for v in g) for x in range(n) if x not in g and (used[x] or x > g[0]))
        return reach[0] + reach[1] if self.stages > 2 else 2 * reach[0]

    def _dfs(self, pos: int, within: int) -> None:
        if pos == self.need:
            self._leaf(within)
            return
        d, k, stages, seq, used, hrows, outs = self.d, self.k, self.stages, self.seq, self.used, self.hrows, self.outs
        slot = pos % k
        for floor, hop_floor, u, add, out in self._children(pos, within):
            best = (self.best_w, self.best_h)
            if (floor, hop_floor) > best or ((floor, hop_floor) == best and self.best is not None):
                continue  # (best may have improved since the children were listed)
            used[u] = True
            seq.append(u)
            completes = stages > 1 and slot == k - 1
            if completes:
                g = seq[pos + 1 - k :]
                hrows.append([min(d[a][b] for a in g for b in seq[i * k : (i + 1) * k]) for i in range(len(outs))])
                outs.append(out)
            self._dfs(pos + 1, within + add)
            if completes:
                hrows.pop()
                outs.pop()
            seq.pop()
            used[u] = False


def _ring_order(h: list[list[int]]) -> tuple[int, list[int]]:
    """The cheapest ring through the stages (h: the hop between each two), from stage 0; of equal rings the
    first in lexicographic order. Every order up to five stages, Held-Karp above."""
    s = len(h)
    if s <= 5:
        return min(
            (sum(h[o[i]][o[(i + 1) % s]] for i in range(s)), list(o))
            for o in ((0, *rest) for rest in itertools.permutations(range(1, s)))
        )
    full = (1 << s) - 1
    memo: dict[tuple[int, int], int] = {}

    def rest(mask: int, v: int) -> int:
        """The least cost from stage v through the stages not in mask and back to stage 0."""
        if mask == full:
            return h[v][0]
        if (mask, v) not in memo:
            memo[mask, v] = min(h[v][w] + rest(mask | 1 << w, w) for w in range(1, s) if not mask >> w & 1)
        return memo[mask, v]

    order, mask, v = [0], 1, 0
    while mask != full:
        here = rest(mask, v)
        v = next(w for w in range(1, s) if not mask >> w & 1 and h[v][w] + rest(mask | 1 << w, w) == here)
        order.append(v)
        mask |= 1 << v
    return rest(1, 0), order


def _greedy_ring(inventory: GpuInventory, pool: list[Unit], need: int) -> list[Unit]:
    subset = _closest_subset(inventory, pool, need)
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
