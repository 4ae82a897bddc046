"""The GPU probe's payload: our NVML reader and nvidia-ml-py's pynvml.py, read from this installation and copied
into a short-lived container on a host (app/hosts.py), where PROBE_BOOT prints that host's inventory; with the GPU
watch (adapters/gpu_watch.py), into the watcher a chain keeps on each host while its stages run, where WATCH_BOOT
prints `xid UUID INDEX CODE` for each Xid on the GPUs it is given, until its stdin (the launcher's) ends."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pp_launch.core import errors

PROBE_DIR = "pp-probe"
PROBE_MODULES = (
    "pp_launch/__init__.py",
    "pp_launch/core/__init__.py",
    "pp_launch/core/errors.py",
    "pp_launch/core/gpu/__init__.py",
    "pp_launch/core/gpu/inventory.py",
    "pp_launch/adapters/__init__.py",
    "pp_launch/adapters/nvml.py",
)
WATCH_MODULES = (*PROBE_MODULES, "pp_launch/adapters/gpu_watch.py", "pp_launch/adapters/runtime.py")
WATCH_BOOT = f"""
import sys
sys.path.insert(0, "/tmp/{PROBE_DIR}")
from pp_launch.adapters.gpu_watch import GpuWatch
watch = GpuWatch(sys.argv[1:], lambda uuid, index, code: print("xid", uuid, index, code, flush=True)).start()
print("note " + watch.note if watch.note else "watching", flush=True)
sys.stdin.buffer.read()
watch.stop()
"""
PROBE_BOOT = f"""
import json, sys
sys.path.insert(0, "/tmp/{PROBE_DIR}")
from pp_launch.adapters import nvml
try:
    doc = {{"inventory": nvml.read_inventory().to_json()}}
except nvml.NvmlUnavailable as exc:
    doc = {{"note": str(exc)}}
print(json.dumps(doc))
"""


def probe_files(modules: tuple[str, ...] = PROBE_MODULES) -> dict[str, bytes]:
    """What the probe (or the watcher: WATCH_MODULES) needs inside the container: our NVML reader, its imports,
    and nvidia-ml-py's pynvml."""
    package = Path(__file__).resolve().parents[2]  # the folder that holds pp_launch/
    files = {f"{PROBE_DIR}/{rel}": (package / rel).read_bytes() for rel in modules}
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise errors.ConfigError("the nvidia-ml-py package is not installed: the GPU probe needs its pynvml.py")
    files[f"{PROBE_DIR}/pynvml.py"] = Path(spec.origin).read_bytes()
    return files
