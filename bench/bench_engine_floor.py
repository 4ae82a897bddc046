"""The engine's own floor for a bring-up: N stage containers (the stub image, as a chain's: --init, auto-remove,
host network, stdin open, the stage's two mounts) created, then started one after another and all at once, through
docker-py with nothing of pp-launch in between; against the docker-CLI chain of bench_bringup.py.

What it shows: how far below the CLI chain any launcher on this engine can bring N stages up (the starts alone,
before a stage announces), so that a bring-up goal can be read against what the engine allows here.

Usage: python bench/bench_engine_floor.py [--stages 32] [--repeats 3] [--out FILE]
Only loopback traffic; leaves nothing (every container removed, the volume too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from docker.types import Mount

from bench_chain import baseline  # type: ignore[import-not-found]

IMAGE = "pp-launch/stub-worker:latest"


def stage_config(api: docker.APIClient, k: int, n: int, volume: str, scratch: str) -> dict[str, object]:
    cache = Path(scratch, f"stage-{k}")
    cache.mkdir(exist_ok=True)
    mounts = [
        Mount("/root/.cache/tinygrad", str(cache), type="bind"),
        Mount("/run/pp-launch-record", volume, type="volume", read_only=True),
    ]
    host = api.create_host_config(auto_remove=True, init=True, network_mode="host", mounts=mounts)
    env = ["STUB_MODE=hold", f"STAGE={k}", f"NUM_STAGES={n}"]
    return {"image": IMAGE, "host_config": host, "environment": env, "stdin_open": True, "labels": {"pp-bench": "1"}}


def starts(api: docker.APIClient, n: int, workers: int, volume: str, scratch: str) -> float:
    """Seconds from the first start to the last, `workers` at a time (the creates come before, untimed)."""
    ids = [api.create_container(**stage_config(api, k, n, volume, scratch))["Id"] for k in range(n)]
    try:
        with ThreadPoolExecutor(workers) as pool:
            t0 = time.monotonic()
            list(pool.map(api.start, ids))
            return time.monotonic() - t0
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda ref: api.remove_container(ref, force=True), ids))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/engine-floor.md")
    opts = ap.parse_args()
    client = docker.from_env()
    api, n = client.api, opts.stages
    volume = api.create_volume("pp-bench-floor")["Name"]
    serial, parallel, chain = [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="pp-bench-floor-") as scratch:
            for _ in range(opts.repeats):
                serial.append(starts(api, n, 1, volume, scratch))
                parallel.append(starts(api, n, 16, volume, scratch))
                chain.append(baseline(client, n, 2.0, False).bring_up_s)
    finally:
        api.remove_volume(volume, force=True)
    s, p, c = statistics.median(serial), statistics.median(parallel), statistics.median(chain)
    text = (
        "| stages | CLI chain bring-up s | starts one at a time s | starts 16 at a time s | all at once / CLI chain |\n"
        "|---:|---:|---:|---:|---:|\n"
        f"| {n} | {c:.2f} | {s:.2f} | {p:.2f} | {p / c:.2f} |\n\n"
        f"Medians of {opts.repeats}, interleaved; `python bench/bench_engine_floor.py --stages {n}`.\n"
    )
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
