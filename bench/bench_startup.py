"""Start-up: `pp-launch --version`, `--help` and `chain --help` against `python3 -c 'import click'`.

Each command is run REPEATS times, interleaved (one of each in turn, so the machine's drift falls on all three
alike); medians and the ratio to the yardstick. The goal: both at most 2x the yardstick. `--chain-import` adds
the time to import what `pp-launch chain` needs (docker, the adapters), for the record.

Usage: python bench/bench_startup.py [--repeats 21] [--out bench/results/startup.md]
Starts nothing but interpreters; needs no engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PP_LAUNCH = [sys.executable, "-c", "from pp_launch.cli.entry import main; main()"]
CASES = {
    "python3 -c 'import click' (yardstick)": [sys.executable, "-c", "import click"],
    "pp-launch --version": [*PP_LAUNCH, "--version"],
    "pp-launch --help": [*PP_LAUNCH, "--help"],
    "pp-launch chain --help": [*PP_LAUNCH, "chain", "--help"],
    "import pp_launch.app.launch (what a chain run loads: docker-py too)": [
        sys.executable,
        "-c",
        "import pp_launch.app.launch",
    ],
}


def once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--out", default="bench/results/startup.md")
    opts = ap.parse_args()
    for argv in CASES.values():  # warm the page cache and the bytecode caches first
        once(argv)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(opts.repeats):
        for name, argv in CASES.items():
            times[name].append(once(argv))
    base = statistics.median(next(iter(times.values())))
    rows = ["| command | median s | ratio to `import click` |", "|---|---:|---:|"]
    worst = 0.0
    for name, got in times.items():
        median = statistics.median(got)
        ratio = median / base
        if name.startswith("pp-launch"):
            worst = max(worst, ratio)
        rows.append(f"| {name} | {median:.3f} | {ratio:.2f} |")
    note = (
        f"\nMedians of {opts.repeats} interleaved runs; {os.cpu_count()} CPUs; "
        "`python bench/bench_startup.py`. Goal: --version and --help at most 2x the yardstick.\n"
    )
    text = "\n".join(rows) + "\n" + note
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    print(text)
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
