"""The `pp-launch gpus` table."""

from __future__ import annotations

from collections.abc import Mapping

from pp_launch.app.gpus import holdings_from_labels
from pp_launch.core.gpu.inventory import GpuInventory


def holders_by_uuid(rows: list[Mapping[str, str]]) -> dict[str, str]:
    return {
        uuid: f"run {h.run_id}" + ("" if h.stage is None else f" stage {h.stage}")
        for uuid, h in holdings_from_labels(rows).items()
    }


def _mib(v: int | None) -> str:
    return "?" if v is None else f"{v}"


def render_table(inventory: GpuInventory, held: Mapping[str, str]) -> str:
    header = ("idx", "uuid", "name", "memory used/total MiB", "util %", "processes", "held by")
    rows = []
    for g in inventory.gpus:
        procs = (
            "?"
            if g.processes is None
            else (", ".join(f"{p.pid}({_mib(p.used_memory_mib)} MiB)" for p in g.processes) or "-")
        )
        holder = held.get(g.uuid) or ", ".join(
            f"{m.uuid[:12]}: {held[m.uuid]}" for m in g.mig_devices if m.uuid in held
        )
        name = g.name + (" [MIG]" if g.mig_enabled else "")
        rows.append(
            (
                str(g.index),
                g.uuid,
                name,
                f"{_mib(g.memory_used_mib)}/{_mib(g.memory_total_mib)}",
                _mib(g.utilization_gpu_pct),
                procs,
                holder or "-",
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]
    footer = []
    if inventory.driver_version:
        footer.append(f"driver {inventory.driver_version}, CUDA {inventory.cuda_version or '?'}")
    return "\n".join(lines + footer)
