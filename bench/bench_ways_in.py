"""The other ways in, timed whole: `pp-gpu-node` (one stage, in the foreground) and `pp-launch worker check` (12
steps, several worker generations), each from spawning the process to its exit, on this engine.

`--before TREE` runs the same commands from another checkout of pp-launch too (its `launcher/` put first on
PYTHONPATH), interleaved with this one, so that a change is measured against what it replaced in one sitting.
pp-gpu-node runs the stub image until it exits on its own (`STUB_EXIT_AFTER=0`); medians; nothing is left.

Usage: python bench/bench_ways_in.py [--repeats 7] [--before /path/to/older/checkout] [--out FILE]
Only loopback traffic; stops by itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import docker

HERE = str(Path(__file__).resolve().parents[1])
STUB = "pp-launch/stub-worker:latest"


def node(tree: str, n: int) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}/launcher",
        "STAGE": "0",
        "PP_IMAGE": STUB,
        "PP_CONTAINER_PREFIX": f"bench-ways-{os.getpid()}-{n}",
        "STUB_MODE": "hold",
        "STUB_EXIT_AFTER": "0",
        "PP_FORWARD_ENV": "STUB_MODE,STUB_EXIT_AFTER",
    }
    main = "from pp_launch.cli.node_cmd import gpu_node_main; gpu_node_main()"
    return _timed([sys.executable, "-c", main], env)


def worker_check(tree: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{tree}/launcher"}
    return _timed([sys.executable, "-m", "pp_launch", "worker", "check", STUB], env)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, cwd="/")
    took = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[-2:]} exited {done.returncode}: {done.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--before", help="another checkout of pp-launch, measured beside this one")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    trees = {"this checkout": HERE, **({"--before": args.before} if args.before else {})}
    times: dict[tuple[str, str], list[float]] = {}
    for n in range(args.repeats):
        for what, run in (("pp-gpu-node, one stage to its exit", node), ("pp-launch worker check", worker_check)):
            for label, tree in trees.items():
                times.setdefault((what, label), []).append(run(tree, n))
    client = docker.from_env()
    left = [c.name for c in client.containers.list(all=True) if c.name.startswith("bench-ways-")]
    client.close()
    lines = ["| what | code | median s | runs |", "|---|---|---:|---|"]
    for (what, label), took in times.items():
        runs = ", ".join(f"{t:.2f}" for t in took)
        lines.append(f"| {what} | {label} | {statistics.median(took):.2f} | {runs} |")
    lines += [
        "",
        f"Medians of {args.repeats}, interleaved; containers left: {len(left)}; `python bench/bench_ways_in.py`.",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
