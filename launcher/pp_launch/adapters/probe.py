"""The GPU probe's payload: our NVML reader and nvidia-ml-py's pynvml.py, read from this installation and copied
into a short-lived container on a host (app/hosts.py), where PROBE_BOOT prints that host's inventory."""

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


def probe_files() -> dict[str, bytes]:
    """What the probe needs inside the container: our NVML reader, its imports, and nvidia-ml-py's pynvml."""
    package = Path(__file__).resolve().parents[2]  # the folder that holds pp_launch/
    files = {f"{PROBE_DIR}/{rel}": (package / rel).read_bytes() for rel in PROBE_MODULES}
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise errors.ConfigError("the nvidia-ml-py package is not installed: the GPU probe needs its pynvml.py")
    files[f"{PROBE_DIR}/pynvml.py"] = Path(spec.origin).read_bytes()
    return files
