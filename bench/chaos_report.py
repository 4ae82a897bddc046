"""The chaos matrix as a table for the README: every stop signal at every phase (with stages that honour
SIGTERM and with stages that ignore it), plus chains killed at random moments with random signals.

Usage: python bench/chaos_report.py [--runs 2] [--random 30] [--out bench/results/chaos.md]
Uses the same scenarios as tests/integration/test_chaos.py. Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from pp_launch.adapters.docker_engine import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos import PHASES, Result, matrix, random_kill, run_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="runs of each matrix case")
    ap.add_argument("--random", type=int, default=30, help="chains killed at random")
    ap.add_argument("--out", default="bench/results/chaos.md")
    opts = ap.parse_args()
    engine = connect()
    groups: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    started = time.monotonic()
    for case in matrix():
        for _ in range(opts.runs):
            r = run_case(engine, case)
            key = (case.phase, signal.Signals(case.signum).name, "ignored" if case.ignore_sigterm else "honoured")
            groups[key].append(r)
            print(f"{case.name}: exit {r.exit_code} left {len(r.left)} in {r.teardown_s:.2f}s", flush=True)
    seed = time.time_ns() % 100000
    rng = random.Random(seed)
    for _ in range(opts.random):
        r = random_kill(engine, rng)
        groups[
            ("random", signal.Signals(r.case.signum).name, "ignored" if r.case.ignore_sigterm else "honoured")
        ].append(r)
    lines = [
        "| phase | signal | SIGTERM | runs | right exit code | containers left | teardown median s | max s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    order = {p: i for i, p in enumerate((*PHASES, "random"))}
    for (phase, sig, ignore), results in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][2], kv[0][1])):
        times = [r.teardown_s for r in results]
        lines.append(
            f"| {phase} | {sig} | {ignore} | {len(results)} | {sum(r.exit_code == r.expected_exit for r in results)} "
            f"| {sum(len(r.left) for r in results)} | {statistics.median(times):.2f} | {max(times):.2f} |"
        )
    total = sum(len(v) for v in groups.values())
    left = sum(len(r.left) for v in groups.values() for r in v)
    note = (
        f"\n{total} runs, {left} containers left; 4 stages, grace 1 s; random seed {seed}; "
        f"{time.monotonic() - started:.0f} s; `python bench/chaos_report.py`. Teardown is timed from the signal "
        "to the launcher's exit (SIGKILL: to the engine holding no container of the run).\n"
    )
    table = "\n".join(lines) + "\n" + note
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(table)
    print(table)
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
