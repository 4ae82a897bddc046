"""Parallel bring-up: `pp-launch chain --handoff env|stdin` against the swactor-style docker-CLI chain.

Timed from process launch to the last stage's announcement, on both sides: the baseline spawns one
`docker run --rm --init` per stage in sequence, each waited on for its announcement before the next (the
seed's way); pp-launch is timed from spawning the launcher (interpreter start and imports included) to its
roster event. STUB_ANNOUNCE_DELAY is the stand-in for a model load before the worker announces; it is the same
on both sides. Medians; every chain is torn down and counted for leftovers.

Every launch runs as a user's does, and leaves nothing on the engine (no container is started ahead of a run).
--hog: a busy loop per CPU throughout (as `make test-load`). --fake-gpus: every stage of ours asks for a
GPU (`--gpus auto --gpu-attach env`), so that the engine's GPU lock is taken and let go by every launch, from a
fake NVML library (pp_launch.testing.fake_nvml) of as many GPUs as the longest chain; the CLI chain is given each
stage's GPU the same way (NVIDIA_VISIBLE_DEVICES), picked by hand as its user would.

Usage: python bench/bench_bringup.py [--repeats 3] [--stages N ...] [--delay S ...] [--hog] [--fake-gpus] [--out FILE]
Only loopback traffic; stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

from bench_chain import baseline as chain_baseline  # type: ignore[import-not-found]
from bench_chain import leftovers, reap

CASES = [(8, 0.0, 3), (8, 2.0, 3), (16, 0.0, 1), (32, 0.0, 1)]  # stages, announce delay, repeats (x --repeats/3)


GPU_ENV: dict[str, str] = {}  # --fake-gpus: the launcher's environment with the fake NVML
HZ = os.sysconf("SC_CLK_TCK")
CPU: list[tuple[str, int, float, float, float, float]] = []  # side, stages, delay, wall s, machine CPU-s, ours


def busy_cpu() -> float:
    """CPU-seconds the whole machine has spent busy since boot (every process, the engine's included)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / HZ  # less idle and iowait


def own_cpu(pid: int) -> float:
    """CPU-seconds of a process and of its live children (the launcher and its watchdog), 0 once gone."""
    total = 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(stat[11]) + int(stat[12])) / HZ
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(own_cpu(int(kid)) for kid in kids)


def baseline(client: docker.DockerClient, n: int, delay: float) -> tuple[float, int]:
    env: tuple[str, ...] = (f"STUB_ANNOUNCE_DELAY={delay}",)
    if GPU_ENV:
        env += ("NVIDIA_VISIBLE_DEVICES={index}",)  # each stage its own GPU, by hand (bench_chain formats it)
    before = busy_cpu()
    spent: list[float] = []
    sample = chain_baseline(client, n, 2.0, False, env, on_up=lambda: spent.append(busy_cpu() - before))
    CPU.append(("CLI chain", n, delay, sample.bring_up_s, spent[0], 0.0))
    return sample.bring_up_s, sample.left


def fake_gpus(count: int, where: Path) -> dict[str, str]:
    """The environment of a launcher on a host with `count` fake GPUs (one PCIe switch each, as plain hosts)."""
    from pp_launch.adapters import inventory_file
    from pp_launch.testing import fake_nvml

    gpus = [
        {
            "index": k,
            "uuid": f"GPU-{k:08x}-0000-4000-8000-{k:012x}",
            "name": "NVIDIA A100-SXM4-40GB",
            "pci_bus_id": f"00000000:{k + 1:02x}:00.0",
            "memory_total_mib": 40960,
            "memory_used_mib": 512,
            "utilization_gpu_pct": 0,
            "processes": [],
            "mig_enabled": False,
        }
        for k in range(count)
    ]
    topology = [[0 if i == j else 40 for j in range(count)] for i in range(count)]
    doc = {"driver_version": "550.54.15", "cuda_version": "12.4", "gpus": gpus, "topology": topology}
    (where / "inventory.json").write_text(json.dumps(doc))
    inv = inventory_file.load(where / "inventory.json")
    lib = fake_nvml.build(where / "lib")
    return fake_nvml.environ(lib.parent, fake_nvml.write_config(inv, where / "nvml.conf"))


def ours(client: docker.DockerClient, n: int, delay: float, handoff: str) -> tuple[float, int]:
    gpus = ["--gpus", "auto", "--gpu-attach", "env"] if GPU_ENV else ["--gpus", "none"]
    args = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        str(n),
        "--json",
        *gpus,
        "--grace",
        "2",
        "--env",
        "STUB_MODE=hold",
        "--env",
        f"STUB_ANNOUNCE_DELAY={delay}",
        "--handoff",
        handoff,
    ]
    before = busy_cpu()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=GPU_ENV or None,
    )
    assert proc.stdout is not None
    run, took = None, float("nan")
    for line in proc.stdout:
        event = json.loads(line)
        run = event["run"]
        if event["event"] == "pp_stage_roster":
            took = time.monotonic() - t0
            CPU.append((f"--handoff {handoff}", n, delay, took, busy_cpu() - before, own_cpu(proc.pid)))
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert run is not None
    left = len(leftovers(client, run))
    reap(client, run)
    return took, left


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/bringup.md")
    ap.add_argument("--stages", type=int, action="append", help="only these chain lengths (repeatable)")
    ap.add_argument("--delay", type=float, action="append", help="only these announce delays (repeatable)")
    ap.add_argument("--hog", action="store_true", help="a busy loop on every CPU throughout")
    ap.add_argument("--fake-gpus", action="store_true", help="every stage asks for a GPU: the GPU lock is taken")
    opts = ap.parse_args()
    client = docker.from_env()
    scratch = tempfile.TemporaryDirectory(prefix="pp-bench-gpus-")
    if opts.fake_gpus:
        longest = max(n for n, _, _ in CASES if not opts.stages or n in opts.stages)
        GPU_ENV.update(fake_gpus(longest, Path(scratch.name)))
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range((os.cpu_count() or 1) * opts.hog)
    ]
    try:
        return measure(client, opts)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        scratch.cleanup()


def cpu_table() -> str:
    """Where each side's time could go at best: the machine's busy CPU-seconds during a bring-up, spread over
    every CPU, is a floor no ordering of the same work gets under (medians of the same runs)."""
    cpus = os.cpu_count() or 1
    rows = [
        f"\n| stages | announce delay s | side | wall s | machine CPU-s | CPU-s / {cpus} CPUs | that / CLI chain wall |"
        " launcher and watchdog CPU-s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for n, delay in dict.fromkeys((n, d) for _, n, d, *_ in CPU):
        cli_wall = statistics.median(w for side, k, d, w, *_ in CPU if (k, d) == (n, delay) and side == "CLI chain")
        for name in dict.fromkeys(side for side, *_ in CPU):
            got = [(w, busy, mine) for side, k, d, w, busy, mine in CPU if (side, k, d) == (name, n, delay)]
            wall, busy, mine = (statistics.median(x[i] for x in got) for i in range(3))
            rows.append(
                f"| {n} | {delay:g} | {name} | {wall:.2f} | {busy:.2f} | {busy / cpus:.2f} | "
                f"{busy / cpus / cli_wall:.2f} | {mine:.2f} |"
            )
    return "\n".join(rows) + "\n"


def measure(client: docker.DockerClient, opts: argparse.Namespace) -> int:
    rows = [
        "| stages | announce delay s | CLI chain s | --handoff env s | ratio | --handoff stdin s | ratio | left |"
        " CLI chain left |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    left_total = 0  # ours: must stay 0
    base_left = 0  # the CLI chain's: docker run --rm whose client was killed can leave its container
    for n, delay, reps in CASES:
        if (opts.stages and n not in opts.stages) or (opts.delay and delay not in opts.delay):
            continue
        reps = max(1, reps * opts.repeats // 3)
        base, env, stdin = [], [], []
        for _ in range(reps):
            for sink, handoff in ((base, None), (env, "env"), (stdin, "stdin")):
                if handoff is None:
                    took, left = baseline(client, n, delay)
                    base_left += left
                else:
                    took, left = ours(client, n, delay, handoff)
                    left_total += left
                sink.append(took)
        b, e, s = statistics.median(base), statistics.median(env), statistics.median(stdin)
        row = f"| {n} | {delay:g} | {b:.2f} | {e:.2f} | {e / b:.2f} | {s:.2f} | {s / b:.2f} | "
        row += f"{left_total} | {base_left} |"
        print(row, flush=True)
        rows.append(row)
    note = (
        f"\nMedians ({opts.repeats} runs for 8 stages, {max(1, opts.repeats // 3)} beyond); timed from process launch "
        f"to the last announcement; {os.cpu_count()} CPUs; {'a busy loop per CPU; ' * opts.hog}"
        f"{'every stage a fake GPU (the GPU lock taken); ' * opts.fake_gpus}"
        f"`python bench/bench_bringup.py`.\n"
    )
    text = "\n".join(rows) + "\n" + note + ("" if opts.hog else cpu_table())
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    print(text)
    return 0 if left_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
