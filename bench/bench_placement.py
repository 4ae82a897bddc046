"""Placement time with 16 candidate GPUs: the exact search (branch and bound) against greedy growth.

Random 16-GPU machines (tests' generator: one or two sockets, NVLink pairs, a mesh or none; nothing busy, so all
16 are candidates), 30 machines per shape, each planned once. Reports median, 95th percentile and worst time of
the exact search, and how much worse (in the allocator's own cost) the greedy plan was where it differed.

Usage: python bench/bench_placement.py [--machines 30] [--out bench/results/placement.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path

from pp_launch.core.gpu import allocator
from pp_launch.testing.inventories import random_inventory

SHAPES = [(2, 1), (4, 1), (8, 1), (16, 1), (2, 2), (4, 2), (8, 2), (2, 4), (4, 4), (2, 8)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=30)
    ap.add_argument("--out", default="bench/results/placement.md")
    opts = ap.parse_args()
    rows = ["| stages x GPUs | exact median ms | p95 ms | worst ms | greedy ms (median) | greedy worse on |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for stages, per in SHAPES:
        exact_t, greedy_t, worse = [], [], 0
        for seed in range(opts.machines):
            inv = random_inventory(random.Random(seed), 16, unknowns=False, mig=False)
            inv = dataclasses.replace(inv, gpus=tuple(dataclasses.replace(g, processes=()) for g in inv.gpus))
            pool = sorted(allocator.units(inv), key=lambda u: (u.pci_bus_id, u.uuid))
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
        rows.append(f"| {stages} x {per} | {statistics.median(exact_t):.1f} | {p95:.1f} | {exact_t[-1]:.1f} | "
                    f"{statistics.median(greedy_t):.1f} | {worse} of {opts.machines} |")  # fmt: skip
    text = "\n".join(rows) + "\n"
    print(text)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
