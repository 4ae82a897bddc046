"""Chains across hosts: bring-up of 8 stages over 2 engines against 8 stages on 1, and the teardown of
a 2-host chain whose stages ignore SIGTERM.

The hosts are the test suite's (tests/multi_host.py): gpu-a (a Docker context to a second dockerd) and gpu-b
(a third dockerd, reached over ssh://root@127.0.0.1:PORT through an sshd of the bench's own, or over its unix
socket). Every case is `--gpus none` (the same work on each side; the 4-GPU host could not hold 8 GPU stages),
`STUB_MODE=hold`. Bring-up: launcher spawn to the roster event. Teardown: SIGTERM to the launcher to its exit,
with `STUB_IGNORE_SIGTERM=1` and `--grace 2` (the floor is the grace: every stage needs its SIGKILL). Medians.

Usage: python bench/bench_hosts.py [--repeats 3] [--out bench/results/hosts.md]
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

from tests.multi_host import ThreeHosts  # noqa: E402

from pp_launch.core.chain.plan import GUARD_IMAGE  # noqa: E402

GRACE = 2.0


def once(bed: ThreeHosts, hosts: list[str], ignore_sigterm: bool) -> tuple[float, float]:
    """(seconds to the roster, seconds from SIGTERM to the launcher's exit)."""
    args = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        "8",
        "--json",
        "--gpus",
        "none",
        "--grace",
        str(GRACE),
        "--env",
        "STUB_MODE=hold",
    ]
    for h in hosts:
        args += ["--host", h]
    if len(hosts) > 1:
        args += ["--stages-per-host", "4"]
    if ignore_sigterm:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **bed.env()},
    )
    assert proc.stdout is not None
    up = float("nan")
    for line in proc.stdout:
        if json.loads(line)["event"] == "pp_stage_roster":
            up = time.monotonic() - t0
            break
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    down = time.monotonic() - t1
    if up != up:  # no roster: the launch failed; a table of nan would hide it
        raise SystemExit(f"the chain on {hosts} did not come up:\n{err[-2000:]}")
    left = {k: v for k, v in bed.ours().items() if v}
    if left:
        raise SystemExit(f"left behind: {left}")
    return up, down


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/hosts.md")
    opts = ap.parse_args()
    bed = ThreeHosts(("pp-launch/stub-worker:latest", GUARD_IMAGE))  # each host runs the run's guard
    cases = {
        "1 engine (gpu-a)": [bed.a],
        "2 engines, unix sockets (gpu-a, gpu-b)": [bed.a, bed.b_host],
        "2 engines, one over ssh (gpu-a, ssh://gpu-b)": [bed.a, bed.b],
    }
    rows = []
    try:
        for name, hosts in cases.items():
            ups, downs = [], []
            for _ in range(opts.repeats):
                up, _ = once(bed, hosts, ignore_sigterm=False)
                ups.append(up)
                _, down = once(bed, hosts, ignore_sigterm=True)
                downs.append(down)
            rows.append((name, statistics.median(ups), statistics.median(downs)))
    finally:
        left = bed.close()
    base = rows[0][1]
    text = (
        "| 8 stages on | bring-up s | ratio to 1 engine | teardown, SIGTERM ignored, grace 2 s |\n"
        "|---|---:|---:|---:|\n"
        + "".join(f"| {name} | {up:.2f} | {up / base:.2f} | {down:.2f} |\n" for name, up, down in rows)
        + f"\nMedians of {opts.repeats}; `--gpus none`, `STUB_MODE=hold`; {os.cpu_count()} CPUs; "
        "`python bench/bench_hosts.py`.\n"
    )
    print(text)
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(text)
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
