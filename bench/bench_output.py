"""The launcher's memory under a flood of stage output: peak resident size of `pp-launch chain`
while one stage prints 4 million empty lines, or 1 million short lines, against the same chain printing nothing,
in one run. The goal: growth under 64 MiB. Results in bench/results/output.md.

    python bench/bench_output.py [--lines-empty 4000000] [--lines-short 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
PP = str(Path(sys.executable).parent / "pp-launch")


def peak_rss_mib(*knobs: str) -> tuple[float, float, int, str]:
    """(peak RSS MiB, seconds, exit code, last stage-1 line) of one 2-stage chain; stage 0 holds 2 s then exits 0."""
    argv = [
        PP,
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "0:STUB_EXIT_AFTER=2",
        *knobs,
    ]
    t0 = time.monotonic()
    with open(os.devnull, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sink)
        last = b""
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"[stage 1] PP_FLOOD_DONE"):
                last = line
        _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, time.monotonic() - t0, os.waitstatus_to_exitcode(status), last.decode().strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines-empty", type=int, default=4_000_000)
    ap.add_argument("--lines-short", type=int, default=1_000_000)
    args = ap.parse_args()
    flood = ("--stage-env", "1:STUB_FLOOD=lines", "--stage-env", "1:STUB_FLOOD_EXIT=1")
    cases = [
        ("no output (baseline)", ("--stage-env", "1:STUB_EXIT_AFTER=2")),
        (f"{args.lines_empty:,} empty lines", (*flood, "--stage-env", f"1:STUB_FLOOD_LINES={args.lines_empty}")),
        (
            f"{args.lines_short:,} lines of 40 characters",
            (*flood, "--stage-env", f"1:STUB_FLOOD_LINES={args.lines_short}", "--stage-env", "1:STUB_FLOOD_WIDTH=40"),
        ),
    ]
    rows, base, ok = [], 0.0, True
    for i, (name, knobs) in enumerate(cases):
        rss, secs, code, last = peak_rss_mib(*knobs)
        base = base or rss
        growth = rss - base
        kept = "-" if i == 0 else ("yes" if last.startswith("[stage 1] PP_FLOOD_DONE") else "NO")
        ok &= code == 0 and growth < 64 and kept != "NO"
        rows.append(f"| {name} | {rss:.1f} | {growth:+.1f} | {secs:.1f} | {code} | {kept} |")
        print(rows[-1], flush=True)
    table = "\n".join(
        [
            "| stage 1 prints | launcher peak RSS (MiB) | growth (MiB) | seconds | exit | last line shown |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    title = "# Launcher memory under a flood of output\n\n`python bench/bench_output.py`"
    text = f"{title}\n\n{table}\n\ngoal: growth under 64 MiB\n"
    (HERE / "results" / "output.md").write_text(text)
    print("goal met" if ok else "GOAL MISSED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
