"""Real NVML on a machine with an NVIDIA GPU: record the inventory, print the table and the plan for 1, 2
and 4 stages, and time one inventory query. Needs NVML (nvidia-ml-py and a driver), not Docker.

Usage: python bench/nvml_probe.py [--record inventory.json]
Without a driver it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory
from pp_launch.app.chain import GpuOptions, plan_chain
from pp_launch.cli.tables import render_table
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainRequest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", metavar="FILE")
    opts = ap.parse_args()
    try:
        inventory = read_inventory()
    except NvmlUnavailable as exc:
        print(exc)
        return 0
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        read_inventory()
        times.append((time.perf_counter() - t0) * 1000)
    if opts.record:
        inventory.save(opts.record)
    print(render_table(inventory, {}))
    print(f"\none inventory query (nvmlInit .. nvmlShutdown): median {statistics.median(times):.1f} ms of 20")
    for stages in (1, 2, 4):
        try:
            plan, _note = plan_chain(
                ChainRequest(stages=stages), GpuOptions(), None, inventory=inventory, reserve=False
            )
        except errors.PpLaunchError as exc:
            print(f"\n{stages} stages: {exc}")
            continue
        hops = ", ".join(str(h) for h in plan.hop_levels) or "-"
        print(
            f"\n{stages} stages: "
            + "; ".join(f"stage {s.index} -> {','.join(s.gpus)}" for s in plan.stages)
            + f"; hop topology levels: {hops}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
