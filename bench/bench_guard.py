"""The guard (docs/chain.md, "The guard"): what it costs a bring-up, and how fast it ends a run on its own.

1. Its start: `RunGuard.start` (create, attach, start, the ready handshake) and its clean end, on this engine,
   against one stage container's plain `docker run --rm --init` of the stub image that exits at once (the
   baseline: the cheapest container the engine can run), medians.
2. The launcher and its watchdog SIGKILLed, stages deaf to SIGTERM and to end of input (`--grace 1`): seconds
   until nothing of the run is left, the guard alone at work.
3. The launcher frozen (SIGSTOP, as a machine that hangs or a cut link: nothing closes), its watchdog frozen too,
   with the heartbeat a network engine gets by default (8 s): seconds until nothing is left (goal: within 15 s).

Usage: python bench/bench_guard.py [--repeats 5] [--out bench/results/guard.md]. Only loopback; stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pp_launch.adapters import guard
from pp_launch.adapters.docker_engine import connect
from pp_launch.adapters.guard import RunGuard
from pp_launch.adapters.identity import new_run_id

DEAF = ["--env", "STUB_MODE=hold", "--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1"]


def guard_start_end(repeats: int) -> tuple[float, float]:
    engine = connect()
    starts, ends = [], []
    for _ in range(repeats):
        t0 = time.monotonic()
        held = RunGuard.start(engine, new_run_id(), "bench", 1.0)
        starts.append(time.monotonic() - t0)
        t0 = time.monotonic()
        held.close(wait=10.0)
        ends.append(time.monotonic() - t0)
    return statistics.median(starts), statistics.median(ends)


def plain_container(repeats: int) -> float:
    took = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--init",
                "--network",
                "none",
                "--entrypoint",
                "true",
                "pp-launch/stub-worker:latest",
            ],
            check=True,
            capture_output=True,
        )
        took.append(time.monotonic() - t0)
    return statistics.median(took)


def left(run: str) -> int:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=pp-launch.run={run}"], capture_output=True, text=True
    ).stdout
    return len(out.split())


def until_gone(freeze: bool) -> float:
    beat = str(guard.HEARTBEAT)  # forced on this local socket: what an engine over the network gets
    env = dict(os.environ, PP_LAUNCH_GUARD_HEARTBEAT=beat) if freeze else dict(os.environ)
    argv = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        "4",
        "--gpus",
        "none",
        "--json",
        "--grace",
        "1",
        *DEAF,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    run = ""
    for line in proc.stdout:
        event = json.loads(line)
        run = event["run"]
        if event["event"] == "pp_stage_roster":
            break
    dog = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True)
    dogs = [int(p) for p in dog.stdout.split()]
    how = signal.SIGSTOP if freeze else signal.SIGKILL
    for pid in [*dogs, proc.pid]:
        os.kill(pid, how)
    t0 = time.monotonic()
    while left(run) and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    took = time.monotonic() - t0
    for pid in [*dogs, proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert left(run) == 0, f"run {run} left containers"
    return took


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "guard.md"))
    args = parser.parse_args()
    start, end = guard_start_end(args.repeats)
    plain = plain_container(args.repeats)
    killed = statistics.median(until_gone(False) for _ in range(3))
    frozen = statistics.median(until_gone(True) for _ in range(3))
    lines = [
        "# The guard",
        "",
        f"`python bench/bench_guard.py --repeats {args.repeats}` (medians):",
        "",
        "| what | seconds |",
        "|---|---|",
        f"| a run's guard up (create, attach, start, ready) | {start:.3f} |",
        f"| its clean end (nothing left: it exits, the engine removes it) | {end:.3f} |",
        f"| baseline: `docker run --rm --init ... true` (the cheapest container) | {plain:.3f} |",
        f"| launcher and watchdog SIGKILLed, 4 deaf stages, --grace 1: until nothing is left | {killed:.2f} |",
        f"| launcher and watchdog frozen, heartbeat {guard.HEARTBEAT:g} s (the default over a network): until nothing "
        f"is left | {frozen:.2f} |",
        "",
        f"guard up / plain container: {start / plain:.2f}x",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
