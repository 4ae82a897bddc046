"""Run every benchmark under bench/, one after another, and fail if any of them fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = [
    "bench_chain.py",
    "chaos_report.py",
    "bench_planning.py",
    "bench_placement.py",
    "bench_bringup.py",
    "bench_engine_floor.py",
    "bench_gpu_bringup.py",
    "bench_hosts.py",
    "bench_output.py",
    "bench_guard.py",
    "bench_kept_lines.py",
    "bench_restart.py",
    "bench_ray.py",
    "bench_ways_in.py",
    "bench_torch_pipeline.py",
]


def main() -> int:
    here = Path(__file__).parent
    failed = [b for b in BENCHES if subprocess.call([sys.executable, str(here / b)]) != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
