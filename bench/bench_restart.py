"""Recovery (docs/recovery.md): how long a restart takes, against starting over.

In one run, on this engine, the same chain shape (N stages of the stub in hold mode, --gpus none):

- restart: `--max-restarts 1 --restart-backoff 0`, stage 1 exits 3 two seconds into the first attempt
  (STUB_EXIT_ATTEMPTS=1); timed from that stage's failure (its `stage_exited` event) to the second attempt's
  roster (every stage announced), which includes the first attempt's whole teardown;
- fresh: `pp-launch chain` of the same shape, timed from process launch to its roster (what a supervisor that
  relaunches the launcher pays, minus noticing the failure).

The goal: restart at most 1.0x the fresh chain (plus the backoff, 0 here). Medians of --repeats.
Usage: python bench/bench_restart.py [--stages 8] [--repeats 5] [--out bench/results/restart.md]. Only loopback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOLD = ["--json", "--gpus", "none", "--grace", "1", "--env", "STUB_MODE=hold"]


def _ts(event: dict[str, Any]) -> float:
    return datetime.datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC).timestamp()


def _events_until(proc: subprocess.Popen[str], last: str, count: int) -> list[dict[str, Any]]:
    """Events read from the launcher until the `count`-th `last` event."""
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        seen.append(json.loads(line))
        if sum(e["event"] == last for e in seen) >= count:
            return seen
    raise RuntimeError(f"the launcher ended before {count} {last} events: {seen[-3:]}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)


def fresh(stages: int) -> float:
    began = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pp_launch", "chain", "--stages", str(stages), *HOLD],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        roster = _events_until(proc, "pp_stage_roster", 1)[-1]
        return _ts(roster) - began
    finally:
        _stop(proc)


def restart(stages: int) -> float:
    fail = [
        "--stage-env",
        "1:STUB_EXIT_AFTER=2",
        "--stage-env",
        "1:STUB_EXIT_CODE=3",
        "--stage-env",
        "1:STUB_EXIT_ATTEMPTS=1",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pp_launch", "chain", "--stages", str(stages), *HOLD, *fail],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        seen = _events_until(proc, "pp_stage_roster", 2)
        failed = next(e for e in seen if e["event"] == "stage_exited" and e.get("exit_code") == 3)
        return _ts(seen[-1]) - _ts(failed)
    finally:
        _stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results/restart.md")
    args = ap.parse_args()
    fresh(2)  # warm: images, the interpreter's caches
    pairs = [(restart(args.stages), fresh(args.stages)) for _ in range(args.repeats)]  # interleaved: same conditions
    r, f = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    lines = [
        "| stages | restart: failure to every stage of attempt 2 announced s | fresh chain: launch to roster s "
        "| ratio |",
        "|---:|---:|---:|---:|",
        f"| {args.stages} | {r:.2f} | {f:.2f} | {r / f:.2f} |",
        "",
        f"Medians of {args.repeats}, interleaved; --restart-backoff 0; the restart includes the failed attempt's "
        f"whole teardown (--grace 1); `python bench/bench_restart.py --stages {args.stages} --repeats {args.repeats}`.",
    ]
    text = "\n".join(lines)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
