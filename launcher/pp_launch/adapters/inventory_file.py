"""GPU inventory files (docs/formats.md): read and written here; their grammar is core/gpu/inventory.py."""

from __future__ import annotations

from pathlib import Path

from pp_launch.core import errors
from pp_launch.core.gpu import requests as gpu_requests
from pp_launch.core.gpu.inventory import GpuInventory

INVENTORY_ENV = gpu_requests.INVENTORY_ENV


def this_host(path: str | None = None) -> GpuInventory:
    """This host's GPUs: from the file when one is named (a flag, or PP_LAUNCH_GPU_INVENTORY), else from NVML. No
    driver: empty, with the reason in `note`."""
    import os

    from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory

    path = path or os.environ.get(INVENTORY_ENV) or None
    if path:
        return load(path)
    try:
        return read_inventory()
    except NvmlUnavailable as exc:
        return GpuInventory(note=str(exc))


EXAMPLE = "example:"  # `--gpu-inventory example:NAME`: an inventory the package carries (pp_launch/examples)


def examples() -> dict[str, Path]:
    """The example inventories the package carries (a wheel too), by name: what the docs' commands use."""
    folder = Path(__file__).resolve().parents[1] / "examples"
    return {p.stem: p for p in sorted(folder.glob("*.json"))}


def load(path: str | Path) -> GpuInventory:
    if str(path).startswith(EXAMPLE):
        name = str(path).removeprefix(EXAMPLE)
        known = examples()
        if name not in known:
            names = ", ".join(f"{EXAMPLE}{n}" for n in known)
            raise errors.ConfigError(f"no example GPU inventory {name!r}: the package carries {names}")
        path = known[name]
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise errors.ConfigError(f"cannot read GPU inventory {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise errors.ConfigError(f"GPU inventory {path} is not JSON: not UTF-8 text") from None
    return GpuInventory.parse(text, f"GPU inventory {path}")


def save(inventory: GpuInventory, path: str | Path) -> None:
    Path(path).write_text(inventory.dumps())
