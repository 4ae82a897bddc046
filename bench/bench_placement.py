"""Placement time with 16 candidate GPUs: the exact search (branch and bound) against greedy growth.

Random 16-GPU machines (tests' generator: one or two sockets, NVLink pairs, a mesh or none; nothing busy, so all
16 are candidates), 30 machines per shape, each planned once. Reports median, 95th percentile and worst time of
the exact search, and on how many machines the greedy plan cost more (in the allocator's own cost).
A second table (`--arbitrary`, on by default) plans on 16 GPUs whose distances are drawn at random for each pair
from a few levels: no machine is built like that (a PCIe tree and NVLink give structure the search exploits),
so it shows the search with that structure taken away.

Usage: python bench/bench_placement.py [--machines 30] [--no-arbitrary] [--out bench/results/placement.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from pp_launch.core.gpu import allocator
from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess
from pp_launch.testing.inventories import random_inventory

SHAPES = [(2, 1), (4, 1), (8, 1), (12, 1), (16, 1), (2, 2), (4, 2), (8, 2), (2, 4), (4, 4), (2, 8), (3, 3), (5, 3)]
BUSY_SHAPES = [(2, 1), (4, 1), (8, 1), (12, 1), (2, 2), (4, 2), (6, 2), (2, 4), (3, 4), (2, 6), (3, 3), (4, 3)]
ARBITRARY = [(16, 1), (8, 2), (4, 4), (2, 8), (5, 3)]
LEVELS = ([10, 50], [10, 20, 30, 40, 50], [7, 10, 40])


def machine(seed: int, busy: bool) -> tuple[GpuInventory, list[allocator.Unit]]:
    """A machine-shaped 16-GPU inventory and its candidates: all 16, or (busy) all but 1-3 busy GPUs."""
    rng = random.Random(seed)
    inv = random_inventory(rng, 16, unknowns=False, mig=False)
    taken = set(rng.sample(range(16), rng.randrange(1, 4))) if busy else set()
    busy_proc = (GpuProcess(4242, 100),)
    gpus = tuple(dataclasses.replace(g, processes=busy_proc if g.index in taken else ()) for g in inv.gpus)
    inv = dataclasses.replace(inv, gpus=gpus)
    return inv, [u for u in allocator.units(inv) if not u.processes]


def arbitrary(seed: int) -> tuple[GpuInventory, list[allocator.Unit]]:
    """16 GPUs, each pair's distance drawn at random from a few levels: no structure at all."""
    rng = random.Random(seed)
    levels = rng.choice(LEVELS)
    topo = [[0] * 16 for _ in range(16)]
    for i, j in itertools.combinations(range(16), 2):
        topo[i][j] = topo[j][i] = rng.choice(levels)
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(16))
    inv = GpuInventory(gpus=gpus, topology=tuple(tuple(r) for r in topo))
    return inv, allocator.units(inv)


def table(
    title: str,
    shapes: list[tuple[int, int]],
    machines: int,
    make: Callable[[int], tuple[GpuInventory, list[allocator.Unit]]],
) -> list[str]:
    rows = [
        f"**{title}**",
        "",
        "| stages x GPUs | candidates | exact median ms | p95 ms | worst ms | greedy ms (median) | greedy worse |",
        "|---|---|---|---|---|---|---|",
    ]
    for stages, per in shapes:
        exact_t, greedy_t, worse, sizes = [], [], 0, set()
        for seed in range(machines):
            inv, free = make(seed)
            sizes.add(len(free))
            pool = sorted(free, key=lambda u: (u.pci_bus_id, u.uuid))
            t0 = time.perf_counter()
            exact = allocator._closest_ring(inv, pool, stages * per, per)
            t1 = time.perf_counter()
            greedy = allocator._greedy_ring(inv, pool, stages * per)
            t2 = time.perf_counter()
            exact_t.append((t1 - t0) * 1e3)
            greedy_t.append((t2 - t1) * 1e3)
            e, g = allocator.plan_cost(inv, exact, per), allocator.plan_cost(inv, greedy, per)
            assert e <= g
            worse += e < g
        exact_t.sort()
        p95 = exact_t[min(len(exact_t) - 1, int(0.95 * len(exact_t)))]
        cands = "-".join(str(s) for s in sorted({min(sizes), max(sizes)}))
        rows.append(
            f"| {stages} x {per} | {cands} | {statistics.median(exact_t):.1f} | {p95:.1f} | "
            f"{exact_t[-1]:.1f} | {statistics.median(greedy_t):.1f} | {worse} of {machines} |"
        )
    return [*rows, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=30)
    ap.add_argument("--no-arbitrary", dest="arbitrary", action="store_false", help="skip the unstructured table")
    ap.add_argument("--out", default="bench/results/placement.md")
    opts = ap.parse_args()
    rows = table("16 GPUs, all free", SHAPES, opts.machines, lambda s: machine(s, busy=False))
    rows += table("16 GPUs, 1-3 of them busy", BUSY_SHAPES, opts.machines, lambda s: machine(s, busy=True))
    if opts.arbitrary:
        rows += table("16 GPUs, arbitrary distances (no machine is built so)", ARBITRARY, opts.machines, arbitrary)
    text = "\n".join(rows)
    print(text)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
