"""GPU inventory files (contract §7): read and written here; their grammar is core/gpu/inventory.py."""

from __future__ import annotations

from pathlib import Path

from pp_launch.core import errors
from pp_launch.core.gpu.inventory import GpuInventory


def load(path: str | Path) -> GpuInventory:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise errors.ConfigError(f"cannot read GPU inventory {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise errors.ConfigError(f"GPU inventory {path} is not JSON: not UTF-8 text") from None
    return GpuInventory.parse(text, f"GPU inventory {path}")


def save(inventory: GpuInventory, path: str | Path) -> None:
    Path(path).write_text(inventory.dumps())
