"""NVML on this machine, and the fake NVML library against it. Needs a driver, not Docker.

On a host with an NVIDIA driver: records the inventory with real NVML, checks that the fake library
(pp_launch/testing/fake_nvml.c, built here with gcc) serving that record reads back the same inventory
(record -> fake -> record, through the real pynvml in a child process), prints the GPU table, the plan for 1, 2
and 4 stages with the placement cost and each hop in words, and times one inventory query (median of 20).
Finishes in well under 3 minutes.

`--fake FILE` plays a host with the GPUs of an inventory file through the fake library (how the README's
"one query through the fake library for 8 GPUs" is measured): the same steps, in a child whose library path
holds the fake.

Usage: python bench/nvml_probe.py [--record inventory.json] [--fake tests/data/nvlink-8gpu.json]
Without a driver (and without --fake) it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pp_launch.adapters import inventory_file
from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory
from pp_launch.app.launch import GpuOptions, LaunchRequest, plan_launch
from pp_launch.cli.tables import render_table
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainRequest
from pp_launch.core.gpu.allocator import describe_level
from pp_launch.testing import fake_nvml

READ = "import json; from pp_launch.adapters import nvml; print(json.dumps(nvml.read_inventory().to_json()))"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", metavar="FILE", help="write the inventory read here to FILE")
    ap.add_argument("--fake", metavar="FILE", help="play a host with these GPUs through the fake library")
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pp-nvml-probe-"))
    atexit.register(shutil.rmtree, work, True)
    lib = fake_nvml.build(work / "lib")
    if opts.fake and os.environ.get(fake_nvml.CONFIG_ENV) is None:
        config = fake_nvml.write_config(inventory_file.load(opts.fake), work / "host.conf")
        print(f"playing a host with the GPUs of {opts.fake} through the fake libnvidia-ml.so.1")
        child = subprocess.run([sys.executable, *sys.argv], env=fake_nvml.environ(lib.parent, config), check=False)
        return child.returncode
    try:
        inventory = read_inventory()
    except NvmlUnavailable as exc:
        print(exc)
        return 0
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        read_inventory()
        times.append((time.perf_counter() - t0) * 1000)
    if opts.record:
        inventory_file.save(inventory, opts.record)
    print(render_table(inventory, {}))
    print(
        f"\none inventory query (nvmlInit .. nvmlShutdown), {len(inventory.gpus)} GPUs: "
        f"median {statistics.median(times):.2f} ms of 20"
    )

    # record -> fake -> record
    config = fake_nvml.write_config(inventory, work / "recorded.conf")
    env = fake_nvml.environ(lib.parent, config)
    done = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"\nthe fake library could not be read: {done.stderr.strip()}")
        return 1
    again = json.loads(done.stdout)
    same = again == inventory.to_json()
    print(f"\nrecord -> fake library -> record: {'the same inventory' if same else 'DIFFERENT'}")
    if not same:
        for key in sorted(set(again) | set(inventory.to_json())):
            if again.get(key) != inventory.to_json().get(key):
                print(f"  {key}: real {inventory.to_json().get(key)!r}\n  {' ' * len(key)}  fake {again.get(key)!r}")

    for stages in (1, 2, 4):
        try:
            inventory_file.save(inventory, work / "inventory.json")
            gpu = GpuOptions(inventory_path=str(work / "inventory.json"))
            plan = plan_launch(LaunchRequest(ChainRequest(stages=stages), gpu)).plan
        except errors.PpLaunchError as exc:
            print(f"\n{stages} stages: {exc}")
            continue
        print(f"\n{stages} stages: " + "; ".join(f"stage {s.index} -> {','.join(s.gpus)}" for s in plan.stages))
        for k, level in enumerate(plan.hop_levels):
            print(f"  hop {k} -> {(k + 1) % stages}: {describe_level(level)}")
        if plan.cost is not None:
            print(
                f"  placement cost: {plan.cost.within} within stages, {plan.cost.hops} round the ring "
                f"({'exact' if plan.cost.exact else 'greedy'}, {plan.cost.candidates} candidates)"
            )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
