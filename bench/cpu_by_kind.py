"""Where a machine's CPU goes while a command runs, by kind of process: the launchers (pp-launch), the engines
(dockerd, containerd, their shims), what runs in containers, sshd and its `docker system dial-stdio` channels, Ray,
the test workers.

Under pytest-xdist a test's own CPU cannot be told apart from its neighbours' (PP_TESTS_CPU_LOG gives the whole
machine's CPU while it ran); this counts by process instead. Each second it reads every process's own CPU (utime
+ stime) and what its reaped children used (cutime + cstime), so a process too short to be seen still counts, in
its parent's "children of" row (a parent's row includes its whole reaped tree: read the kinds' own rows first).

Usage: python bench/cpu_by_kind.py [--out FILE] -- COMMAND [ARGS...]
(e.g. `python bench/cpu_by_kind.py --out /tmp/cpu.json -- make test-all`). Prints the table at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def kind(pid: str, comm: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    except OSError:
        argv = []
    line = " ".join(argv[:6])
    if "exec(eval(sys.stdin.readline()))" in line or "pytest" in line:
        return "pytest (controller and workers)"
    if "pp-launch" in line or "pp_launch" in line or "pp-gpu-node" in line:
        return "pp-launch (launchers, watchdogs, commands)"
    if "pp_guard" in line:
        return "guards (in containers)"
    if "pp_stub" in line or "pp-worker" in line:
        return "stub stages (in containers)"
    if "dial-stdio" in line:
        return "docker system dial-stdio (ssh channels)"
    if "ray" in line.lower():
        return f"ray: {comm}"
    return comm


class Counts:
    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        self.seen: dict[str, tuple[str, str, int, int]] = {}  # pid -> (start time, kind, own, children)

    def tick(self, first: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            f = stat.rsplit(")", 1)[1].split()
            start, own, kids = f[19], int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
            before = self.seen.get(pid)
            if before is None or before[0] != start:  # new since the last look (or a reused pid)
                what = kind(pid, comm)
                base = (own, kids) if first else (0, 0)  # what ran before the command is not counted
            else:
                what, base = before[1], (before[2], before[3])
            self.total[what] += own - base[0]
            self.total[f"children of {what}"] += kids - base[1]
            self.seen[pid] = (start, what, own, kids)

    def table(self) -> dict[str, float]:
        return {k: round(v / HZ, 1) for k, v in self.total.most_common() if v > 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="also write the table as JSON here")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    opts = ap.parse_args()
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        ap.error("give the command to run after --")
    counts = Counts()
    counts.tick(first=True)
    began = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(1.0)
        counts.tick()
    counts.tick()
    wall = time.monotonic() - began
    table = counts.table()
    print(f"{' '.join(command)}: exit {proc.returncode}, {wall:.0f} s; CPU seconds by kind of process:")
    for what, seconds in table.items():
        if seconds >= 0.1:
            print(f"{seconds:9.1f}  {what}")
    if opts.out:
        with open(opts.out, "w") as out:
            json.dump({"command": command, "wall_s": round(wall, 1), "cpu_s": table}, out, indent=1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
