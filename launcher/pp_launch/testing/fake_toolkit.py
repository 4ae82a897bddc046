"""The fake NVIDIA Container Toolkit: what `nvidia-container-runtime-hook`, `nvidia-container-runtime` and a CDI
spec do on a GPU host, done on the fake NVML library (fake_nvml) and an inventory (docs/formats.md).

- `install(bin_dir, inventory, library)` writes two executables into `bin_dir`:
  `nvidia-container-runtime-hook`: dockerd registers its `nvidia` device driver when an executable of that name
  is on its PATH; a `--gpus` request then adds it to the container as an OCI prestart hook (args
  `nvidia-container-runtime-hook prestart`, the OCI state on stdin). Like the real one it reads
  NVIDIA_VISIBLE_DEVICES from the bundle's config.json, resolves it (indices, GPU and MIG UUIDs, `all`, `none`,
  `void`) against the host's GPUs, refuses an unknown device (the container does not start) and makes the
  devices visible inside: here, by putting the fake libnvidia-ml.so.1 and a config restricted to them into the
  container's root filesystem.
  `nvidia-container-runtime`: a runc wrapper for engines whose default runtime is NVIDIA's (`--gpu-attach
  env`): on `create` it adds the same prestart hook when the container's environment has NVIDIA_VISIBLE_DEVICES
  (once), then runs runc with the same arguments.
- `write_cdi_spec(path, inventory, library, config_dir)`: an `nvidia.com/gpu` CDI spec with one device per GPU
  by index and by UUID; each device's edits mount its own part of the fake's config, the common edits mount
  the library, so `--device nvidia.com/gpu=1` (Docker 25+ with CDI on) works as on a real host.

Every hook run appends one JSON line to `<bin_dir>/hook.log` (container id, NVIDIA_VISIBLE_DEVICES, what it
gave), so a test can check the hook ran and what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pp_launch.app import gpus as gpu_select
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.testing import fake_nvml

HOOK = "nvidia-container-runtime-hook"
RUNTIME = "nvidia-container-runtime"
SETTINGS = "fake-toolkit.json"  # next to the executables: inventory, library, delay


CONTAINER_EVENTS = "xid-events"  # in the config folder inside a container the hook gave GPUs


class UnknownDevice(ValueError):
    pass


def resolve(inv: GpuInventory, value: str | None) -> tuple[list[int], dict[int, set[str]]] | None:
    """NVIDIA_VISIBLE_DEVICES -> (GPU positions, MIG UUIDs to show per position), as the toolkit reads it.
    None: nothing to do (unset, empty, `void`). `none`: driver only, no GPU. Raises UnknownDevice."""
    if value is None or value.strip() in ("", "void"):
        return None
    value = value.strip()
    if value == "none":
        return [], {}
    if value == "all":
        return list(range(len(inv.gpus))), {}
    positions: list[int] = []
    migs: dict[int, set[str]] = {}
    for token in (t.strip() for t in value.split(",")):
        pos = _find(inv, token, migs)
        if pos is None:
            raise UnknownDevice(token)
        if pos not in positions:
            positions.append(pos)
    return sorted(positions), migs  # NVML inside lists them in the host's (bus) order


def _find(inv: GpuInventory, token: str, migs: dict[int, set[str]]) -> int | None:
    for pos, gpu in enumerate(inv.gpus):
        if token == gpu.uuid or (token.isdigit() and int(token) == gpu.index):
            return pos
        for mig in gpu.mig_devices:
            if token == mig.uuid:
                migs.setdefault(pos, set()).add(mig.uuid)
                return pos
    return None


def visible_config(inv: GpuInventory, positions: Sequence[int], migs: dict[int, set[str]]) -> str:
    """The fake's config for a container given these GPUs (a GPU given by a MIG UUID shows that MIG only)."""
    text = fake_nvml.system_text(inv)
    for pos in positions:
        shown = inv
        if pos in migs:
            gpu = inv.gpus[pos]
            keep = tuple(m for m in gpu.mig_devices if m.uuid in migs[pos])
            gpus = list(inv.gpus)
            gpus[pos] = dataclasses.replace(gpu, mig_devices=keep)
            shown = dataclasses.replace(inv, gpus=tuple(gpus))
        text += fake_nvml.gpu_text(shown, pos)
    return text


# ---------------------------------------------------------------------------------------------- the hook
def _settings(bin_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((bin_dir / SETTINGS).read_text())
    return doc


def hook_main(bin_dir: str, argv: Sequence[str]) -> int:
    """`nvidia-container-runtime-hook prestart`, OCI state on stdin."""
    where = Path(bin_dir)
    settings = _settings(where)
    if not argv or argv[0] != "prestart":
        return 0  # poststart/poststop: nothing to undo (the files live in the container's own layer)
    state = json.loads(sys.stdin.read() or "{}")
    bundle = Path(state.get("bundle") or ".")
    config = json.loads((bundle / "config.json").read_text())
    env = dict(e.split("=", 1) for e in config.get("process", {}).get("env", []) if "=" in e)
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    inv = gpu_select.read_inventory_file(settings["inventory"])
    entry: dict[str, Any] = {"id": state.get("id"), "NVIDIA_VISIBLE_DEVICES": value}
    if delay := float(settings.get("delay", 0) or 0):
        time.sleep(delay)  # a stand-in for the real toolkit's per-container work
    try:
        found = resolve(inv, value)
    except UnknownDevice as exc:
        entry["error"] = f"unknown device {exc}"
        _log(where, entry)
        print(f"nvidia-container-cli: device error: {exc}: unknown device", file=sys.stderr)
        return 1
    if found is None:
        entry["gave"] = None
        _log(where, entry)
        return 0
    positions, migs = found
    root = Path(config.get("root", {}).get("path", "rootfs"))
    root = root if root.is_absolute() else bundle / root
    target = root / fake_nvml.CONTAINER_CONFIG.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    # the container's Xid events (a driver reports an Xid to every process with the GPU): inject_xid appends there
    events = f"events {fake_nvml.CONTAINER_CONFIG}/{CONTAINER_EVENTS}\n"
    (target / "config").write_text(visible_config(inv, positions, migs) + events)
    (target / CONTAINER_EVENTS).touch()
    lib = root / fake_nvml.CONTAINER_LIBRARY.lstrip("/")
    lib.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(settings["library"], lib)
    entry["gave"] = [inv.gpus[p].uuid for p in positions]
    _log(where, entry)
    return 0


def _log(where: Path, entry: dict[str, Any]) -> None:
    with open(where / "hook.log", "a") as f:
        f.write(json.dumps(entry) + "\n")


# ------------------------------------------------------------------------------------------- the runtime
def runtime_main(bin_dir: str, argv: Sequence[str]) -> int:
    """`nvidia-container-runtime [runc args]`: on create, add the prestart hook if NVIDIA_VISIBLE_DEVICES is
    set and no such hook is there yet; then exec runc with the same arguments."""
    args = list(argv)
    if "create" in args:
        bundle = None
        for flag in ("--bundle", "-b"):
            if flag in args and args.index(flag) + 1 < len(args):
                bundle = args[args.index(flag) + 1]
        bundle = bundle or "."
        path = Path(bundle) / "config.json"
        with contextlib.suppress(OSError, ValueError):
            config = json.loads(path.read_text())
            env = config.get("process", {}).get("env", [])
            hooks = config.setdefault("hooks", {}).setdefault("prestart", [])
            if any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env) and not any(
                Path(h.get("path", "")).name == HOOK for h in hooks
            ):
                hooks.append({"path": str(Path(bin_dir) / HOOK), "args": [HOOK, "prestart"]})
                path.write_text(json.dumps(config))
    runc = shutil.which("runc") or "/usr/sbin/runc"
    os.execv(runc, [runc, *args])
    return 127  # not reached


# ------------------------------------------------------------------------------------------------ install
def install(bin_dir: str | Path, inventory: str | Path, library: str | Path, delay: float = 0.0) -> Path:
    """Write the two executables (and their settings) into bin_dir; returns bin_dir."""
    where = Path(bin_dir)
    where.mkdir(parents=True, exist_ok=True)
    (where / SETTINGS).write_text(
        json.dumps(
            {"inventory": str(Path(inventory).resolve()), "library": str(Path(library).resolve()), "delay": delay}
        )
    )
    # The engine runs these with an environment of its own: the interpreter and the package path are fixed here.
    pkg = str(Path(__file__).resolve().parents[2])
    for name, fn in ((HOOK, "hook_main"), (RUNTIME, "runtime_main")):
        exe = where / name
        exe.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {pkg!r})\n"
            f"from pp_launch.testing.fake_toolkit import {fn}\nsys.exit({fn}({str(where)!r}, sys.argv[1:]))\n"
        )
        exe.chmod(0o755)
    return where


def set_delay(bin_dir: str | Path, delay: float) -> None:
    path = Path(bin_dir) / SETTINGS
    doc = json.loads(path.read_text())
    doc["delay"] = delay
    path.write_text(json.dumps(doc))


def given(bin_dir: str | Path, uuid: str) -> list[str]:
    """The containers the hook gave GPU `uuid` (their ids, from its log), to deliver an Xid into."""
    return [str(e["id"]) for e in hook_log(bin_dir) if uuid in (e.get("gave") or ())]


def hook_log(bin_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(bin_dir) / "hook.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------- CDI
def write_cdi_spec(spec_dir: str | Path, inventory: GpuInventory, library: str | Path, config_dir: str | Path) -> Path:
    """`nvidia.com/gpu` devices by index and by UUID (as `nvidia-ctk cdi generate` names them): each mounts its
    GPU's own part of the fake's config into /etc/pp-fake-nvml; all mount the library and the system part."""
    parts = fake_nvml.write_config_dir(inventory, config_dir)
    system = Path(config_dir) / "00-system"

    def mount(host: Path, inside: str) -> dict[str, Any]:
        options = ["ro", "nosuid", "nodev", "bind"]
        return {"hostPath": str(Path(host).resolve()), "containerPath": inside, "options": options}

    devices = []
    for pos, gpu in enumerate(inventory.gpus):
        edits = {"mounts": [mount(parts[pos], f"{fake_nvml.CONTAINER_CONFIG}/{parts[pos].name}")]}
        devices.append({"name": str(gpu.index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    every = [mount(parts[pos], f"{fake_nvml.CONTAINER_CONFIG}/{parts[pos].name}") for pos in range(len(inventory.gpus))]
    devices.append({"name": "all", "containerEdits": {"mounts": every}})  # as nvidia-ctk cdi generate names it
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "mounts": [
                mount(Path(library), fake_nvml.CONTAINER_LIBRARY),
                mount(system, f"{fake_nvml.CONTAINER_CONFIG}/00-system"),
            ],
        },
    }
    out = Path(spec_dir) / "pp-fake-nvidia.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(spec, indent=1))
    return out
