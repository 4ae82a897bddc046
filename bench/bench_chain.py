"""Bring-up and teardown of `pp-launch chain` against swactor's way, side by side in one run.

Swactor's way: one `docker run --rm --init` CLI child per stage, spawned in sequence, each waited on for
its announcement; teardown sends SIGTERM to every child, waits up to the grace for each in turn, then
SIGKILLs the child (the docker CLI, not the container).

Bring-up is timed from the first stage request to the last announcement on both sides: for pp-launch from
its chain_starting event to its pp_stage_roster event, for the baseline from spawning the first `docker
run`. pp-launch's time from spawning the launcher process (interpreter start and imports included) is
reported too. Teardown: from SIGTERM to the launcher's exit, which comes only after the engine confirmed
every container gone.

Usage: python bench/bench_chain.py [--stages 1,4,8,16] [--grace 2] [--repeats 3] [--out FILE.md]
Only loopback traffic; stops by itself; removes whatever the baseline leaves behind after counting it.
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
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker

IMAGE = "pp-launch/stub-worker:latest"
PREFIX = "PP_GPU_NODE_ADDR"


@dataclass
class Sample:
    bring_up_s: float
    teardown_s: float
    left: int
    end_to_end_s: float = 0.0  # pp-launch only: from spawning the launcher, interpreter start included


def leftovers(client: docker.DockerClient, run: str) -> list[str]:
    return [c.name for c in client.containers.list(all=True, filters={"label": f"pp-launch.run={run}"})]


def reap(client: docker.DockerClient, run: str) -> None:
    """Whatever the run left, then its record volume (kept by design for `wait` and `ps -a`: a benchmark's runs
    need none; one still mounted stays, and its container was counted as left)."""
    for c in client.containers.list(all=True, filters={"label": f"pp-launch.run={run}"}):
        with contextlib.suppress(docker.errors.NotFound):
            c.remove(force=True)
    for v in client.volumes.list(filters={"label": f"pp-launch.run={run}"}):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            v.remove()


def wait_gone(client: docker.DockerClient, run: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while leftovers(client, run) and time.monotonic() < deadline:
        time.sleep(0.1)


def baseline(
    client: docker.DockerClient,
    n: int,
    grace: float,
    ignore: bool,
    extra_env: tuple[str, ...] = (),
    on_up: Callable[[], None] | None = None,
) -> Sample:
    """Swactor's way; extra_env: NAME=VALUE for every stage; on_up is called once the last stage announced."""
    run = "bench" + uuid.uuid4().hex[:7]
    children: list[subprocess.Popen[str]] = []
    first = prev = None
    t0 = time.monotonic()
    for k in range(n):
        env = ["-e", f"STAGE={k}", "-e", f"NUM_STAGES={n}", "-e", "STUB_MODE=hold"]
        if ignore:
            env += ["-e", "STUB_IGNORE_SIGTERM=1"]
        for item in extra_env:
            env += ["-e", item.format(index=k)]
        if k:
            assert prev is not None and first is not None
            env += ["-e", f"PEER_NODE_ID={prev[0]}", "-e", f"PEER_DIRECT={prev[1]}"]
            env += ["-e", f"FIRST_PEER_NODE_ID={first[0]}", "-e", f"FIRST_PEER_DIRECT={first[1]}"]
        child = subprocess.Popen(
            [
                "docker",
                "run",
                "--rm",
                "--init",
                "--network",
                "host",
                "--label",
                f"pp-launch.run={run}",
                "--label",
                "pp-launch.owner=bench-baseline",
                *env,
                IMAGE,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        children.append(child)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(PREFIX):
                _, node, direct = line.split()
                prev = (node, direct)
                first = first or prev
                break
    bring_up = time.monotonic() - t0
    if on_up is not None:
        on_up()
    t1 = time.monotonic()
    for child in children:
        child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    teardown = time.monotonic() - t1
    time.sleep(1.0)  # give --rm its chance before counting
    left = len(leftovers(client, run))
    reap(client, run)
    return Sample(bring_up, teardown, left)


def ours(client: docker.DockerClient, n: int, grace: float, ignore: bool) -> Sample:
    args = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        str(n),
        "--json",
        "--gpus",
        "none",
        "--grace",
        str(grace),
        "--env",
        "STUB_MODE=hold",
    ]
    if ignore:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    run = None
    first_request = roster = 0.0
    for line in proc.stdout:
        event = json.loads(line)
        run = event["run"]
        if event["event"] == "chain_starting":
            first_request = time.monotonic()
        if event["event"] == "pp_stage_roster":
            roster = time.monotonic()
            break
    end_to_end = roster - t0
    bring_up = roster - first_request
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    teardown = time.monotonic() - t1
    assert run is not None
    left = len(leftovers(client, run))
    reap(client, run)
    return Sample(bring_up, teardown, left, end_to_end)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default="1,4,8,16")
    ap.add_argument("--grace", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/chain.md")
    opts = ap.parse_args()
    client = docker.from_env()
    rows = []
    for n in (int(x) for x in opts.stages.split(",")):
        for ignore in (False, True):
            reps = opts.repeats if not ignore else 1
            b = [baseline(client, n, opts.grace, ignore) for _ in range(reps)]
            o = [ours(client, n, opts.grace, ignore) for _ in range(reps)]
            row = {
                "stages": n,
                "sigterm": "ignored" if ignore else "honoured",
                "base_up": statistics.median(s.bring_up_s for s in b),
                "ours_up": statistics.median(s.bring_up_s for s in o),
                "ours_e2e": statistics.median(s.end_to_end_s for s in o),
                "base_down": statistics.median(s.teardown_s for s in b),
                "ours_down": statistics.median(s.teardown_s for s in o),
                "base_left": max(s.left for s in b),
                "ours_left": max(s.left for s in o),
            }
            rows.append(row)
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
    columns = [
        "stages",
        "SIGTERM",
        "bring-up baseline s",
        "bring-up pp-launch s",
        "ratio",
        "pp-launch incl. start-up s",
        "ratio",
        "teardown baseline s",
        "teardown pp-launch s",
        "ratio",
        "left: baseline",
        "left: pp-launch",
    ]
    header = "| " + " | ".join(columns) + " |\n|---:|---|" + "---:|" * (len(columns) - 2)
    lines = [header]
    for r in rows:
        lines.append(
            f"| {r['stages']} | {r['sigterm']} | {r['base_up']:.2f} | {r['ours_up']:.2f} | "
            f"{r['ours_up'] / r['base_up']:.2f} | {r['ours_e2e']:.2f} | {r['ours_e2e'] / r['base_up']:.2f} | "
            f"{r['base_down']:.2f} | {r['ours_down']:.2f} | "
            f"{r['ours_down'] / r['base_down']:.2f} | {r['base_left']} | {r['ours_left']} |"
        )
    table = "\n".join(lines)
    note = (
        f"\nGrace {opts.grace:g} s; medians of {opts.repeats} runs (1 run for SIGTERM-ignoring stages); "
        f"{os.cpu_count()} CPUs; `python bench/bench_chain.py`.\n"
    )
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(table + "\n" + note)
    print(table + "\n" + note)
    return 0 if all(r["ours_left"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
