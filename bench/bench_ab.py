"""One change against the code before it: `pp-launch chain` bring-up, two checkouts, interleaved pairs in one run.

Each pair launches the same chain from both checkouts (the order alternates pair by pair), timed as
bench_bringup.py times ours: from spawning the launcher to its roster event (a first launch, not counted, warms
the engine's caches). `--before` and `--after` are checkouts' `launcher`
folders (the second defaults to this checkout's), put first on PYTHONPATH for their launches. Prints the medians,
their ratio and how many pairs the change won, per hand-off mode; every chain is torn down and counted for
leftovers (none may be left).

Usage: python bench/bench_ab.py --before /tmp/pp-before/launcher [--after DIR] [--stages 8] [--pairs 10]
  (make the "before" checkout with: git worktree add /tmp/pp-before REV)
Only loopback traffic; stops by itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import docker

from bench_bringup import ours  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parents[1] / "launcher"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the launcher folder of the code before the change")
    parser.add_argument("--after", default=str(HERE), help="the launcher folder of the change (this checkout's)")
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--handoff", nargs="+", default=["env", "stdin"], choices=["env", "stdin"])
    args = parser.parse_args()
    for folder in (args.before, args.after):
        if not (Path(folder) / "pp_launch" / "__init__.py").is_file():
            print(f"bench_ab: {folder} is not a checkout's launcher folder (no pp_launch/__init__.py)", file=sys.stderr)
            return 2
    client = docker.from_env()
    paths = {"before": args.before, "after": args.after}
    times: dict[tuple[str, str], list[float]] = {(v, h): [] for v in paths for h in args.handoff}
    ours(client, args.stages, 0.0, args.handoff[0])  # warms the engine's caches, not counted
    for pair in range(args.pairs):
        for handoff in args.handoff:
            for version in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                os.environ["PYTHONPATH"] = paths[version]
                took, left = ours(client, args.stages, 0.0, handoff)
                if left:
                    print(f"bench_ab: {left} containers left by a {version} launch", file=sys.stderr)
                    return 1
                times[(version, handoff)].append(took)
    print(f"{args.stages} stages, {args.pairs} interleaved pairs (before: {args.before}; after: {args.after})")
    for handoff in args.handoff:
        before, after = times[("before", handoff)], times[("after", handoff)]
        won = sum(a < b for a, b in zip(after, before, strict=True))
        ratio = statistics.median(after) / statistics.median(before)
        print(
            f"--handoff {handoff}: before {statistics.median(before):.3f} s, after {statistics.median(after):.3f} s, "
            f"ratio {ratio:.3f}; the change won {won} of {len(after)} pairs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
