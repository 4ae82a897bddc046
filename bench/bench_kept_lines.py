"""What keeping a detached run's lines costs: the engine's and the guard's CPU while a detached run prints.

From the hand-over on, a detached run's guard follows each stage's log into the run's record (docs/chain.md, "The
record"): the engine serves one more log stream per stage, and the guard writes the lines. Baseline: the same
number of plain `docker run -d --rm` containers printing at the same rate, which no one reads (what any container
that prints that much costs the engine: its json-file log). Both sides in interleaved pairs; each side's CPU is the
engine's (dockerd, from /proc) over the same window, ours adds the guard's process. Medians.

Usage: python bench/bench_kept_lines.py [--stages 3] [--rate 20 --rate 200] [--window 10] [--repeats 3] [--out FILE]
Only loopback traffic (none, in fact: the stages print); stops by itself and leaves nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
STUB = "pp-launch/stub-worker:latest"
PRINTER = (
    "import sys, time\n"
    "i, rate = 0, float(sys.argv[1])\n"
    "while True:\n"
    "    i += 1\n"
    "    sys.stdout.write(f'plain log line {i}\\n')\n"
    "    time.sleep(1 / rate)\n"
)


def cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / HZ


def dockerd() -> int:
    return int(subprocess.run(["pgrep", "-o", "-x", "dockerd"], capture_output=True, text=True, check=True).stdout)


def guard_pid(run: str) -> int:
    """The guard's own process (serve) of this run, by its environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        serve = argv[:3] == [b"python3", b"-u", b"/usr/local/lib/pp-guard/pp_guard.py"] and argv[3:] in ([], [b""])
        if serve and f"PP_GUARD_RUN={run}".encode() in env:
            return int(entry.name)
    raise RuntimeError(f"no guard process of run {run}")


def window(pids: list[int], seconds: float) -> float:
    before = sum(cpu(p) for p in pids)
    time.sleep(seconds)
    return sum(cpu(p) for p in pids) - before


def plain(stages: int, rate: float, seconds: float) -> float:
    refs = []
    try:
        for _ in range(stages):
            argv = ["docker", "run", "-d", "--rm", "--network", "none", "--entrypoint", "python3", STUB]
            refs.append(subprocess.run([*argv, "-u", "-c", PRINTER, str(rate)], capture_output=True, text=True,
                                       check=True).stdout.strip())  # fmt: skip
        time.sleep(2)  # started and printing, as ours is after its hand-over
        return window([dockerd()], seconds)
    finally:
        subprocess.run(["docker", "rm", "-f", *refs], capture_output=True, check=False)


def ours(stages: int, rate: float, seconds: float) -> tuple[float, float]:
    """(the engine's CPU, the guard's) over the window."""
    pp = [sys.executable, "-m", "pp_launch"]
    up = subprocess.run([*pp, "chain", "--stages", str(stages), "--gpus", "none", "--detach", "-q",
                         "--env", "STUB_MODE=hold", "--env", f"STUB_LOG_RATE={rate:g}"],
                        capture_output=True, text=True, check=True)  # fmt: skip
    run = up.stdout.strip()
    try:
        time.sleep(2)
        engine, guard = dockerd(), guard_pid(run)
        e0, g0 = cpu(engine), cpu(guard)
        time.sleep(seconds)
        return cpu(engine) - e0, cpu(guard) - g0
    finally:
        subprocess.run([*pp, "down", run, "--grace", "1"], capture_output=True, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--rate", type=float, action="append", help="lines a second per stage (repeatable)")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [
        f"{args.stages} stages, a {args.window:g} s window, {args.repeats} interleaved pairs (medians)",
        "",
        "| lines/s per stage | plain containers: engine CPU-s | detached run: engine CPU-s | its guard CPU-s "
        "| engine + guard, ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for rate in args.rate or [20.0, 200.0]:
        base, engine, guard = [], [], []
        for _ in range(args.repeats):
            base.append(plain(args.stages, rate, args.window))
            e, g = ours(args.stages, rate, args.window)
            engine.append(e)
            guard.append(g)
        b, e, g = (statistics.median(v) for v in (base, engine, guard))
        rows.append(f"| {rate:g} | {b:.2f} | {e:.2f} | {g:.2f} | {(e + g) / b:.2f}x |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
