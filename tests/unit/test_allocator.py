"""The allocator on inventory files that model real machines (tests/data), and a property test."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp_launch.adapters import inventory_file
from pp_launch.core import errors
from pp_launch.core.gpu.allocator import (
    AllocationRequest,
    Holding,
    Unit,
    _closest_ring,
    _greedy_ring,
    _ring_order,
    allocate,
    distance,
    parse_visible,
    plan_cost,
    units,
)
from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess
from pp_launch.testing.inventories import random_inventory

DATA = Path(__file__).parent.parent / "data"


def load(name: str) -> GpuInventory:
    return inventory_file.load(DATA / name)


def indices(inv: GpuInventory, stage_gpus: tuple[tuple[str, ...], ...]) -> list[list[int | str]]:
    by_uuid = {g.uuid: g.index for g in inv.gpus}
    return [[by_uuid.get(u, u) for u in s] for s in stage_gpus]


# ---------------------------------------------------------------- 8-GPU NVLink board (hybrid cube mesh)
def test_nvlink_board_four_stages_stay_inside_one_nvlink_quad() -> None:
    inv = load("nvlink-8gpu.json")
    p = allocate(inv, AllocationRequest(stages=4), {})
    assert indices(inv, p.stage_gpus) == [[0], [1], [2], [3]]
    assert p.hop_levels == (7, 7, 7, 7)  # every hop, the feedback edge included, on 2 NVLinks


def test_nvlink_board_eight_stages_cross_quads_only_over_nvlink() -> None:
    inv = load("nvlink-8gpu.json")
    p = allocate(inv, AllocationRequest(stages=8), {})
    assert indices(inv, p.stage_gpus) == [[0], [1], [2], [3], [7], [5], [6], [4]]
    assert 50 not in p.hop_levels  # never across sockets over PCIe
    assert p.hop_levels.count(8) == 2  # the two crossings use the single-link pairs 3-7 and 4-0


def test_nvlink_board_avoids_gpus_held_by_another_run() -> None:
    inv = load("nvlink-8gpu.json")
    held = {inv.gpus[0].uuid: Holding("aaaa00000000", 0), inv.gpus[1].uuid: Holding("aaaa00000000", 1)}
    assert indices(inv, allocate(inv, AllocationRequest(stages=4), held).stage_gpus) == [[4], [5], [6], [7]]
    assert indices(inv, allocate(inv, AllocationRequest(stages=2), held).stage_gpus) == [[2], [3]]


def test_nvlink_board_two_stages_of_four_gpus_are_the_two_quads() -> None:
    inv = load("nvlink-8gpu.json")
    p = allocate(inv, AllocationRequest(stages=2, per_stage=4), {})
    assert indices(inv, p.stage_gpus) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert p.hop_levels == (8, 8)  # the closest pair between the quads: one NVLink


# ---------------------------------------------------------------- two-socket PCIe box, GPU 0 busy
def test_pcie_box_keeps_both_stages_on_one_socket_around_a_busy_gpu() -> None:
    inv = load("pcie-2socket-4gpu.json")
    p = allocate(inv, AllocationRequest(stages=2), {})
    assert indices(inv, p.stage_gpus) == [[2], [3]]  # not [1], [2]: that would cross the sockets
    assert p.hop_levels == (10, 10)


def test_pcie_box_allow_shared_uses_the_busy_gpu() -> None:
    inv = load("pcie-2socket-4gpu.json")
    p = allocate(inv, AllocationRequest(stages=2, allow_shared=True), {})
    assert indices(inv, p.stage_gpus) == [[0], [1]]


def test_pcie_box_too_few_gpus_names_need_free_and_why() -> None:
    inv = load("pcie-2socket-4gpu.json")
    held = {inv.gpus[3].uuid: Holding("bbbb00000000", 1)}
    with pytest.raises(errors.NotEnoughGpus) as exc:
        allocate(inv, AllocationRequest(stages=2, per_stage=2), held)
    assert str(exc.value) == (
        "not enough GPUs: 2 stages x 2 need 4, 2 free of 4\n"
        f"  GPU 0 ({inv.gpus[0].uuid}) busy: pid 4242 using 1024 MiB\n"
        f"  GPU 3 ({inv.gpus[3].uuid}) held by pp-launch run bbbb00000000 stage 1\n"
        "Ask for fewer (--stages, --gpus-per-stage); free the GPUs held or busy, or share them (--allow-shared); "
        "or run with --gpus none for CPU stages."
    )
    assert exc.value.exit_code == 2


def test_min_free_memory_filters_with_its_reason() -> None:
    inv = load("pcie-2socket-4gpu.json")
    with pytest.raises(errors.NotEnoughGpus) as exc:
        allocate(inv, AllocationRequest(stages=4, allow_shared=True, min_free_mib=45000), {})
    assert "GPU 0 (" in str(exc.value)
    assert "filtered out by --min-free-mem: 44532 MiB free, 45000 MiB asked" in str(exc.value)
    assert "lower --min-free-mem" in str(exc.value) and "--allow-shared" not in str(exc.value)  # it would not help


# ---------------------------------------------------------------- MIG
def test_mig_devices_are_units_of_their_own_and_busy_ones_are_skipped() -> None:
    inv = load("mig-2gpu.json")
    assert [u.label for u in units(inv)] == ["GPU 0 MIG 0", "GPU 0 MIG 1", "GPU 0 MIG 2", "GPU 1"]
    p = allocate(inv, AllocationRequest(stages=3), {})
    assert p.stage_gpus == (
        ("MIG-aaaaaaaa-0000-4000-8000-000000000001",),
        ("MIG-aaaaaaaa-0000-4000-8000-000000000003",),
        (inv.gpus[1].uuid,),
    )
    assert p.hop_levels == (0, 30, 30)


def test_mig_explicit_index_picks_a_free_mig_device_of_that_gpu() -> None:
    inv = load("mig-2gpu.json")
    p = allocate(inv, AllocationRequest(stages=2, explicit=("1", "0")), {})
    assert p.stage_gpus == ((inv.gpus[1].uuid,), ("MIG-aaaaaaaa-0000-4000-8000-000000000001",))


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES and explicit lists
def test_cuda_visible_devices_as_indices() -> None:
    inv = load("pcie-2socket-4gpu.json")
    p = allocate(inv, AllocationRequest(stages=2, visible=parse_visible("1,2")), {})
    assert indices(inv, p.stage_gpus) == [[1], [2]]
    assert p.hop_levels == (50, 50)


def test_cuda_visible_devices_as_uuids_and_the_filter_reason() -> None:
    inv = load("pcie-2socket-4gpu.json")
    visible = parse_visible(f"{inv.gpus[1].uuid},{inv.gpus[3].uuid}")
    assert indices(inv, allocate(inv, AllocationRequest(stages=2, visible=visible), {}).stage_gpus) == [
        [1],
        [3],
    ]
    with pytest.raises(errors.NotEnoughGpus) as exc:
        allocate(inv, AllocationRequest(stages=3, visible=visible), {})
    assert f"GPU 2 ({inv.gpus[2].uuid}) filtered out by CUDA_VISIBLE_DEVICES" in str(exc.value)


def test_empty_cuda_visible_devices_means_none() -> None:
    assert parse_visible("") == ()
    assert parse_visible(None) is None
    inv = load("plain-4gpu.json")
    with pytest.raises(errors.NotEnoughGpus):
        allocate(inv, AllocationRequest(stages=1, visible=()), {})


def test_explicit_list_is_used_in_stage_order() -> None:
    inv = load("plain-4gpu.json")
    p = allocate(inv, AllocationRequest(stages=2, per_stage=2, explicit=("3", inv.gpus[0].uuid, "2", "1")), {})
    assert indices(inv, p.stage_gpus) == [[3, 0], [2, 1]]


@pytest.mark.parametrize(
    ("explicit", "message"),
    [
        (("0",), "--gpus lists 1 GPU but 2 stages x 1 need 2: list 2 (2 stages x 1 GPU each)"),
        (("2", "9"), "--gpus names '9', which is no GPU on this host"),
        (("1", "1"), "which is listed twice"),
        (
            ("0", "1"),
            "(GPU 0, GPU-00000000-0000-4000-8000-00000002c779), which is busy: pid 4242 using 1024 MiB",
        ),
    ],
)
def test_explicit_list_errors(explicit: tuple[str, ...], message: str) -> None:
    inv = load("pcie-2socket-4gpu.json")
    with pytest.raises(errors.ConfigError) as exc:
        allocate(inv, AllocationRequest(stages=2, explicit=explicit), {})
    assert message in str(exc.value)


def test_no_topology_means_bus_id_order() -> None:
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x40 - i:02X}:00.0") for i in range(4))
    p = allocate(GpuInventory(gpus=gpus), AllocationRequest(stages=2), {})
    assert p.stage_gpus == (("GPU-3",), ("GPU-2",))  # lowest bus ids
    assert p.hop_levels == (None, None)


# ---------------------------------------------------------------- property test
@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GpuInventory, AllocationRequest, dict[str, Holding]]:
    n = draw(st.integers(1, 8))
    levels = st.sampled_from([10, 20, 30, 40, 50])
    topo = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            topo[i][j] = topo[j][i] = draw(levels)
    gpus = []
    for i in range(n):
        busy = draw(st.booleans())
        gpus.append(
            Gpu(
                index=i,
                uuid=f"GPU-{i:04d}",
                pci_bus_id=f"00000000:{draw(st.integers(0, 255)):02X}:{i:02X}.0",
                memory_total_mib=1000,
                memory_used_mib=draw(st.integers(0, 1000)),
                processes=(GpuProcess(1000 + i, 10),) if busy else (),
            )
        )
    inv = GpuInventory(gpus=tuple(gpus), topology=tuple(tuple(r) for r in topo))
    held = {f"GPU-{i:04d}": Holding("r", i) for i in range(n) if draw(st.booleans()) and draw(st.booleans())}
    visible = draw(st.none() | st.lists(st.integers(0, n - 1), unique=True).map(lambda xs: tuple(map(str, xs))))
    request = AllocationRequest(
        stages=draw(st.integers(1, 4)),
        per_stage=draw(st.integers(1, 2)),
        visible=visible,
        allow_shared=draw(st.booleans()),
        min_free_mib=draw(st.none() | st.integers(0, 1000)),
    )
    return inv, request, held


def _excluded(inv: GpuInventory, req: AllocationRequest, held: dict[str, Holding], gpu: Gpu) -> bool:
    """The rule, stated independently: filters always apply; sharing lifts only "held" and "busy"."""
    if req.visible is not None and str(gpu.index) not in req.visible:
        return True
    free = gpu.memory_free_mib
    if req.min_free_mib is not None and (free is None or free < req.min_free_mib):
        return True
    return not req.allow_shared and (gpu.uuid in held or bool(gpu.processes))


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_gpu_twice_no_excluded_gpu_and_the_same_plan_every_time(
    scenario: tuple[GpuInventory, AllocationRequest, dict[str, Holding]],
) -> None:
    inv, req, held = scenario
    allowed = [g for g in inv.gpus if not _excluded(inv, req, held, g)]
    need = req.stages * req.per_stage
    if len(allowed) < need:
        with pytest.raises(errors.NotEnoughGpus):
            allocate(inv, req, held)
        return
    p = allocate(inv, req, held)
    given_out = [u for s in p.stage_gpus for u in s]
    assert len(given_out) == need == len(set(given_out))
    assert all(len(s) == req.per_stage for s in p.stage_gpus)
    assert set(given_out) <= {g.uuid for g in allowed}
    assert allocate(inv, req, held) == p


# ---------------------------------------------------------------- exact placement
def brute_force_minimum(inv: GpuInventory, pool: list[Unit], need: int, per_stage: int) -> tuple[int, int]:
    """Every subset of the pool, every order of it (the first unit fixed: a ring has no start)."""
    best: tuple[int, int] | None = None
    for subset in itertools.combinations(pool, need):
        for rest in itertools.permutations(subset[1:]):
            cost = plan_cost(inv, [subset[0], *rest], per_stage)
            best = cost if best is None or cost < best else best
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_costs_the_brute_force_minimum_on_random_machines(seed: int) -> None:
    """Two sockets or one, NVLink pairs, a mesh or none, some GPUs busy (processes), some held by another run:
    the plan's own cost equals the least any placement of the free GPUs costs."""
    rng = random.Random(seed)
    for trial in range(50):
        inv = random_inventory(rng, rng.randrange(2, 10), unknowns=False, mig=False)
        held = {g.uuid: Holding("otherrun0001", 0) for g in inv.gpus if rng.random() < 0.15}
        free = [u for u in units(inv) if u.uuid not in held and not u.processes]
        per_stage = rng.choice([1, 1, 2, 3])
        if len(free) < per_stage:
            continue
        stages = rng.randrange(1, min(len(free), 7) // per_stage + 1)
        if stages * per_stage > 7:  # keep the brute force to at most 7! orders
            stages = 7 // per_stage
        p = allocate(inv, AllocationRequest(stages=stages, per_stage=per_stage), held)
        assert p.cost is not None and p.cost.exact
        want = brute_force_minimum(inv, free, stages * per_stage, per_stage)
        assert (p.cost.within, p.cost.hops) == want, f"seed {seed} trial {trial}: {stages}x{per_stage} on {inv}"
        chosen = [u for s in p.stage_gpus for uuid in s for u in free if u.uuid == uuid]
        assert plan_cost(inv, chosen, per_stage) == want  # the cost stated is the cost of the plan given


def test_the_exact_search_is_never_worse_than_greedy_growth_and_often_better() -> None:
    """Greedy subset growth (the plan before the exact search, still used beyond 16 candidates) against the search."""
    rng = random.Random(1)
    better = 0
    for _ in range(200):
        inv = random_inventory(rng, rng.randrange(4, 10), unknowns=False, mig=False)
        pool = sorted((u for u in units(inv) if not u.processes), key=lambda u: (u.pci_bus_id, u.uuid))
        k = rng.choice([1, 2])
        if len(pool) < 2 * k:
            continue
        need = k * rng.randrange(2, len(pool) // k + 1)
        greedy = plan_cost(inv, _greedy_ring(inv, pool, need), k)
        exact = plan_cost(inv, _closest_ring(inv, pool, need, k), k)
        assert exact <= greedy
        better += exact < greedy
    assert better >= 10, f"greedy matched the exact search on all but {better} machines"


def arbitrary_machine(rng: random.Random, n: int) -> GpuInventory:
    """n GPUs whose pairwise distances are drawn at random from a few levels: none of a real machine's structure
    (a PCIe tree, NVLink pairs) for the search to lean on, many ties."""
    levels = rng.choice([[10, 50], [10, 20, 30, 40, 50], [7, 10, 40]])
    topo = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        topo[i][j] = topo[j][i] = rng.choice(levels)
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(n))
    return GpuInventory(gpus=gpus, topology=tuple(tuple(r) for r in topo))


def split_minimum(inv: GpuInventory, pool: list[Unit], need: int, k: int) -> tuple[int, int]:
    """Every choice of `need` units, every split of them into stages of k (each split once: a stage is a set),
    every order of the stages round the ring (the first fixed): the least (within, hops)."""
    dist = {(a.uuid, b.uuid): distance(inv, a, b) for a in pool for b in pool}

    def splits(rest: list[Unit]) -> Iterator[list[list[Unit]]]:
        if not rest:
            yield []
            return
        for mates in itertools.combinations(rest[1:], k - 1):
            left = [u for u in rest[1:] if u not in mates]
            for more in splits(left):
                yield [[rest[0], *mates], *more]

    best: tuple[int, int] | None = None
    for chosen in itertools.combinations(pool, need):
        for groups in splits(list(chosen)):
            within = sum(dist[a.uuid, b.uuid] for g in groups for a, b in itertools.combinations(g, 2))
            if best is not None and within > best[0]:
                continue
            s = len(groups)
            hop = [[min(dist[a.uuid, b.uuid] for a in g1 for b in g2) for g2 in groups] for g1 in groups]
            rings = (
                (
                    hop[0][o[0]] + sum(hop[x][y] for x, y in itertools.pairwise(o)) + hop[o[-1]][0]
                    for o in itertools.permutations(range(1, s))
                )
                if s > 1
                else iter([0])
            )
            cost = (within, min(rings))
            best = cost if best is None or cost < best else best
    assert best is not None
    return best


@pytest.mark.parametrize(
    ("gpus", "stages", "per_stage"), [(16, 2, 8), (12, 3, 4), (12, 4, 3), (12, 2, 6), (10, 5, 2), (9, 3, 3)]
)
def test_stages_of_several_gpus_cost_the_exhaustive_minimum_up_to_sixteen_gpus(
    gpus: int, stages: int, per_stage: int
) -> None:
    """Stages of several GPUs are searched as splits of the candidates with interchangeable GPUs and
    interchangeable pairs of GPUs (two NVLink pairs on one socket) cut; against every split, on machines built
    like real ones (all GPUs free, or some busy) and on arbitrary distances."""
    rng = random.Random(gpus * 100 + stages * 10 + per_stage)
    for trial in range(4):
        if trial < 3:
            inv = random_inventory(rng, gpus, unknowns=False, mig=False)
            busy = (GpuProcess(4242, 10),)
            taken = set(rng.sample(range(gpus), trial)) if gpus - trial >= stages * per_stage else set()
            inv = dataclasses.replace(
                inv, gpus=tuple(dataclasses.replace(g, processes=busy if g.index in taken else ()) for g in inv.gpus)
            )
        else:
            inv = arbitrary_machine(rng, gpus)
        free = [u for u in units(inv) if not u.processes]
        p = allocate(inv, AllocationRequest(stages=stages, per_stage=per_stage), {})
        assert p.cost is not None and p.cost.exact
        want = split_minimum(inv, free, stages * per_stage, per_stage)
        assert (p.cost.within, p.cost.hops) == want, f"trial {trial}: {stages}x{per_stage} on {inv}"


@pytest.mark.parametrize("gpus", [10, 11, 12])
def test_single_gpu_stages_over_every_free_gpu_cost_the_least_ring(gpus: int) -> None:
    """One GPU per stage on every free GPU of a machine (a ring through all of them): the plan's hops equal the
    least ring by Held-Karp (checked against every order itself below), on machines built like real ones (NVLink
    pairs and PCIe pairs make classes of GPUs the search opens in order) and on arbitrary distances."""
    rng = random.Random(gpus)
    for trial in range(6):
        inv = random_inventory(rng, gpus, unknowns=False, mig=False) if trial < 4 else arbitrary_machine(rng, gpus)
        inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, processes=()) for g in inv.gpus))
        pool = units(inv)
        p = allocate(inv, AllocationRequest(stages=gpus), {})
        assert p.cost is not None and p.cost.exact
        least, _ = _ring_order([[distance(inv, a, b) for b in pool] for a in pool])
        assert p.cost.hops == least, f"trial {trial} on {inv}"


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6, 7, 8])
def test_the_ring_of_stages_is_the_cheapest_and_the_first_of_equals(stages: int) -> None:
    """Every order up to five stages, Held-Karp above: both give the least ring and, of equal rings, the first
    order in lexicographic order (one inventory, one plan)."""
    rng = random.Random(stages)
    for _ in range(20):
        h = [[0] * stages for _ in range(stages)]
        for i, j in itertools.combinations(range(stages), 2):
            h[i][j] = h[j][i] = rng.choice([7, 10, 40, 50])
        want = min(
            (sum(h[o[i]][o[(i + 1) % stages]] for i in range(stages)), list(o))
            for o in ((0, *rest) for rest in itertools.permutations(range(1, stages)))
        )
        assert _ring_order(h) == want


def test_a_lopsided_inventory_is_read_the_same_both_ways_and_still_placed_exactly() -> None:
    """Matrices that disagree with themselves (a link counted from one end only, two levels for one pair: a
    hand-written file, a link NVML could not read from one side): distance is the same both ways, so the
    search's bounds hold and the plan still costs the brute-force minimum."""
    rng = random.Random(5)
    for _ in range(30):
        n = rng.randrange(4, 8)
        inv = random_inventory(rng, n, unknowns=False, mig=False)
        inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, processes=()) for g in inv.gpus))
        assert inv.topology is not None
        topo = [list(r) for r in inv.topology]
        links = [[0] * n for _ in range(n)]
        for i, j in itertools.permutations(range(n), 2):
            topo[i][j] = rng.choice([10, 30, 50])
            links[i][j] = rng.choice([0, 0, 2]) if i < j else 0
        inv = dataclasses.replace(inv, topology=tuple(map(tuple, topo)), nvlink=tuple(map(tuple, links)))
        pool = units(inv)
        assert all(distance(inv, a, b) == distance(inv, b, a) for a in pool for b in pool)
        k = rng.choice([1, 2])
        stages = min(n, 6) // k
        p = allocate(inv, AllocationRequest(stages=stages, per_stage=k), {})
        assert p.cost is not None
        assert (p.cost.within, p.cost.hops) == brute_force_minimum(inv, pool, stages * k, k)


def test_more_than_sixteen_candidates_fall_back_to_greedy_and_say_so() -> None:
    inv = random_inventory(random.Random(3), 20, unknowns=False, mig=False)
    inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, processes=()) for g in inv.gpus))
    p = allocate(inv, AllocationRequest(stages=4), {})
    assert p.cost is not None and not p.cost.exact and p.cost.candidates == 20
