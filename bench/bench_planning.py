"""Planning time: how long `pp-launch chain` takes to pick GPUs, with 50 labelled containers on the engine.

An 8-GPU NVLink inventory (tests/data/nvlink-8gpu.json); 50 containers created (never started) with pp-launch
labels, 6 of them holding GPUs 0 and 1; then plan_launch (the engine reached, the inventory file read, the
engine's labels, the allocator, the plan) for 2, 4 and 8 stages, many times each. Median and 95th percentile.

Usage: python bench/bench_planning.py [--runs 200] [--out bench/results/planning.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pp_launch.adapters import identity, images, inventory_file
from pp_launch.adapters.docker_engine import connect
from pp_launch.app import launch
from pp_launch.core import labels
from pp_launch.core.chain.plan import ChainRequest

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", default="bench/results/planning.md")
    opts = ap.parse_args()
    os.environ["PP_LAUNCH_STATE_DIR"] = tempfile.mkdtemp(prefix="pp-bench-state-")
    engine = connect()
    images.build_all(engine, lambda text: None)
    path = ROOT / "tests" / "data" / "nvlink-8gpu.json"
    inventory = inventory_file.load(path)
    held = ",".join(g.uuid for g in inventory.gpus[:2])
    run, owner = "benchplan001", identity.current_owner().label()
    made = []
    try:
        for i in range(50):
            made.append(
                engine.api.create_container(
                    images.BUILTIN_IMAGE,
                    labels={
                        labels.RUN: run,
                        labels.STAGE: str(i),
                        labels.OWNER: owner,
                        labels.GPUS: held if i < 6 else "",
                    },
                )["Id"]
            )
        rows = []
        for stages in (2, 4, 8 if len(inventory.gpus) - 2 >= 8 else 6):
            gpu = launch.GpuOptions("auto", inventory_path=str(path))
            request = launch.LaunchRequest(ChainRequest(stages=stages), gpu)
            times = []
            for _ in range(opts.runs):
                t0 = time.perf_counter()
                plan = launch.plan_launch(request).plan
                times.append((time.perf_counter() - t0) * 1000)
            chosen = [inventory.position(s.gpus[0]) for s in plan.stages]
            rows.append((stages, statistics.median(times), sorted(times)[int(0.95 * len(times)) - 1], chosen))
            print(json.dumps({"stages": stages, "median_ms": round(rows[-1][1], 2), "gpus": chosen}), flush=True)
    finally:
        for ref in made:
            engine.remove(ref)
    lines = ["| stages | median ms | p95 ms | GPUs chosen (GPUs 0 and 1 held) |", "|---:|---:|---:|---|"]
    lines += [f"| {s} | {m:.2f} | {p:.2f} | {c} |" for s, m, p, c in rows]
    text = "\n".join(lines) + (
        f"\n\n8-GPU NVLink inventory, 50 labelled containers on the engine, {opts.runs} runs each; "
        "`python bench/bench_planning.py`.\n"
    )
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
