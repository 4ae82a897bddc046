"""The GPU path against a real driver (the device machine: NVML, no Docker engine): what `pp-launch gpus` reads
through nvidia-ml-py's versioned calls, temperature, power and who runs each GPU process included, and the table
it renders; the health fields placement reads (ECC, retired pages, row remapping); and the Xid watch
(nvmlDeviceRegisterEvents for critical Xids, nvmlEventSetWait) registered, waited on and stopped on the real driver.
Run there as: PYTHONPATH=launcher python3 bench/device/nvml_check.py [OUT_DIR]"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pp_launch.adapters.gpu_watch import GpuWatch
from pp_launch.adapters.nvml import read_inventory
from pp_launch.cli.tables import render_table

HOLD = "import torch, time; x = torch.ones(1 << 28, device='cuda'); print('ready', flush=True); time.sleep(60)"


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        inv = read_inventory()
        took = time.monotonic() - t0
        doc = inv.to_json()
        (out / "inventory.json").write_text(json.dumps(doc, indent=2))
        table = render_table(inv, {})
        (out / "table.txt").write_text(table + "\n")
        print(table)
        print(f"read_inventory: {took * 1000:.0f} ms for {len(inv.gpus)} GPU(s); holder pid {holder.pid}")
        for g in inv.gpus:
            procs = [(p.pid, p.used_memory_mib, p.user, p.command) for p in g.processes or ()]
            print(f"GPU {g.index}: {g.temperature_c} C, {g.power_w} W of {g.power_limit_w} W; processes {procs}")
        ok = all(g.temperature_c is not None and g.power_w is not None and g.power_limit_w for g in inv.gpus)
        print("temperature and power read:", ok)
        for g in inv.gpus:
            print(
                f"GPU {g.index} health: ecc_uncorrected={g.ecc_uncorrected} retired_pages_pending="
                f"{g.retired_pages_pending} row_remap_failure={g.row_remap_failure} -> {g.health or 'ok'} "
                f"(known: {g.health_known})"
            )
        seen: list[tuple[str, int, int]] = []
        t0 = time.monotonic()
        watch = GpuWatch([g.uuid for g in inv.gpus], lambda u, i, x: seen.append((u, i, x))).start()
        started = time.monotonic() - t0
        time.sleep(1.0)  # a second of waits on the real event set (200 ms each)
        t0 = time.monotonic()
        watch.stop()
        stopped = time.monotonic() - t0
        alive = watch._thread is not None and watch._thread.is_alive()
        print(
            f"xid watch: registered in {started * 1000:.0f} ms, note {watch.note!r}, events {seen}, "
            f"stopped in {stopped * 1000:.0f} ms, thread alive after stop: {alive}"
        )
        watched = not watch.note and not alive
        return 0 if ok and watched and inv.gpus else 1
    finally:
        holder.kill()
        holder.wait()


if __name__ == "__main__":
    sys.exit(main())
