"""Parallel bring-up on the fake NVIDIA host: 8 stages with a GPU each, the fake toolkit's runtime hook
given a start-up delay (default 0.5 s, a stand-in for the real toolkit's per-container work), `--bring-up
parallel` (`--handoff env`) against `--bring-up in-turn` (the sequential start that came before).

The GPU engine is the test suite's (tests/gpu_host.py: Docker 20.10 with the fake nvidia-container-runtime-hook);
it is started here and removed at the end. Timed from launcher spawn to the roster event; medians.

Usage: python bench/bench_gpu_bringup.py [--delay 0.5] [--repeats 3] [--out bench/results/gpu-bringup.md]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gpu_host import FakeGpuHost  # noqa: E402

from pp_launch.testing import fake_toolkit  # noqa: E402


def once(host: FakeGpuHost, bring_up: str) -> float:
    args = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        "8",
        "--json",
        "--gpus",
        "auto",
        "--grace",
        "2",
        "--env",
        "STUB_MODE=hold",
        "--bring-up",
        bring_up,
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **host.env("request")},
    )
    assert proc.stdout is not None
    took = float("nan")
    for line in proc.stdout:
        if json.loads(line)["event"] == "pp_stage_roster":
            took = time.monotonic() - t0
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/gpu-bringup.md")
    opts = ap.parse_args()
    host = FakeGpuHost()
    host.images = ("pp-launch/stub-worker:latest",)
    try:
        host.engine("request")
        fake_toolkit.set_delay(host.bin, opts.delay)
        times = {mode: [once(host, mode) for _ in range(opts.repeats)] for mode in ("in-turn", "parallel")}
        hooks = len(host.hook_log())
    finally:
        left = host.close()
    seq, par = statistics.median(times["in-turn"]), statistics.median(times["parallel"])
    text = (
        "| 8 stages, 1 GPU each, hook delay | --bring-up in-turn s | --bring-up parallel (--handoff env) s | ratio |\n"
        "|---|---:|---:|---:|\n"
        f"| {opts.delay:g} s | {seq:.2f} | {par:.2f} | {par / seq:.2f} |\n\n"
        f"Medians of {opts.repeats}; {hooks} hook runs; {os.cpu_count()} CPUs; `python bench/bench_gpu_bringup.py`.\n"
    )
    print(text)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
