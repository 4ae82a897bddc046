"""The tables the CLI prints: `pp-launch gpus` and `pp-launch ps`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pp_launch.app.gpus import holdings_from_labels
from pp_launch.app.housekeeping import OWNER_STATUS_SAID
from pp_launch.app.rows import StageRow
from pp_launch.core.gpu.allocator import PCIE_LEVELS
from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess
from pp_launch.core.lines import display


def holders_by_uuid(rows: list[Mapping[str, str]]) -> dict[str, str]:
    return {
        uuid: f"run {h.run_id}" + ("" if h.stage is None else f" stage {h.stage}")
        for uuid, h in holdings_from_labels(rows).items()
    }


def _mib(v: int | None) -> str:
    return "?" if v is None else f"{v}"


def gpu_names(inventory: GpuInventory) -> dict[str, str]:
    """UUID -> "GPU 3" or "GPU 0 MIG 1": how a person names a GPU or a slice."""
    out: dict[str, str] = {}
    for g in inventory.gpus:
        out[g.uuid] = f"GPU {g.index}"
        for k, m in enumerate(g.mig_devices):
            out[m.uuid] = f"GPU {g.index} MIG {k}"
    return out


def _procs(processes: tuple[GpuProcess, ...] | None) -> str:
    """Each process: pid(memory), and who runs what when this host's /proc says (`1234(400 MiB) alice:python s.py`)."""
    if processes is None:
        return "?"
    return ", ".join(f"{p.pid}({_mib(p.used_memory_mib)} MiB){_who(p)}" for p in processes) or "-"


def _who(p: GpuProcess, width: int = 40) -> str:
    if p.user is None and p.command is None:
        return ""
    command = p.command or "?"
    command = command if len(command) <= width else command[: width - 1] + "…"
    return f" {p.user or '?'}:{command}"


def _heat(g: Gpu) -> str:
    """Temperature and power, as nvidia-smi shows them: `45C 120/700W`; `?` for what NVML did not say."""
    temp = "?" if g.temperature_c is None else f"{g.temperature_c}C"
    if g.power_w is None and g.power_limit_w is None:
        return f"{temp} ?W"
    now = "?" if g.power_w is None else f"{g.power_w:.0f}"
    cap = "" if g.power_limit_w is None else f"/{g.power_limit_w:.0f}"
    return f"{temp} {now}{cap}W"


def render_topology(inventory: GpuInventory) -> str:
    """`nvidia-smi topo -m` style: NV# for NVLink links, else the PCIe path, with a legend."""
    n = len(inventory.gpus)
    if inventory.topology is None and inventory.nvlink is None:
        return "no topology known for these GPUs"
    head = ["", *(f"GPU{g.index}" for g in inventory.gpus)]
    rows = [head]
    for i, g in enumerate(inventory.gpus):
        cells = [f"GPU{g.index}"]
        for j in range(n):
            links = inventory.nvlink[i][j] if inventory.nvlink is not None else 0
            if i == j:
                cells.append("X")
            elif links:
                cells.append(f"NV{links}")
            elif inventory.topology is not None:
                cells.append(PCIE_LEVELS.get(inventory.topology[i][j], ("?", ""))[0])
            else:
                cells.append("?")
        rows.append(cells)
    width = max(len(c) for r in rows for c in r)
    lines = ["  ".join(c.ljust(width) for c in r).rstrip() for r in rows]
    legend = ["", "  X    = self", "  NV#  = NVLink, # links"]
    legend += [f"  {short:<4} = {words}" for short, words in PCIE_LEVELS.values()]
    legend.append("From closest (NV#) to farthest (SYS); pp-launch places consecutive stages on the closest GPUs.")
    return "\n".join(lines + legend)


def health_cell(g: Gpu) -> str:
    """ok, the reason it is not placed on, or ? when NVML told nothing about its health."""
    if g.health:
        return f"UNHEALTHY: {g.health}"
    return "ok" if g.health_known else "?"


def render_table(inventory: GpuInventory, held: Mapping[str, str]) -> str:
    header = ("idx", "uuid", "name", "memory used/total MiB", "util %", "temp power", "processes", "held by", "health")
    rows = []
    for g in inventory.gpus:
        name = g.name + (" [MIG]" if g.mig_enabled else "")
        memory = f"{_mib(g.memory_used_mib)}/{_mib(g.memory_total_mib)}"
        procs = _procs(g.processes)
        rows.append(
            (
                str(g.index),
                g.uuid,
                name,
                memory,
                _mib(g.utilization_gpu_pct),
                _heat(g),
                procs,
                held.get(g.uuid, "-"),
                health_cell(g),
            )
        )
        for k, m in enumerate(g.mig_devices):  # each slice its own row: its memory, its processes, its holder
            memory = f"{_mib(m.memory_used_mib)}/{_mib(m.memory_total_mib)}"
            slice_row = (f"{g.index}/{k}", m.uuid, "  MIG slice", memory, "-", "-", _procs(m.processes))
            rows.append((*slice_row, held.get(m.uuid, "-"), "-"))
    for lost in inventory.lost:  # NVML counts it but cannot read it: never placed on
        rows.append((str(lost.index), lost.uuid or "?", "?", "?", "?", "?", "?", "-", f"LOST: {lost.why}"))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]
    footer = []
    if inventory.driver_version:
        footer.append(f"driver {inventory.driver_version}, CUDA {inventory.cuda_version or '?'}")
    return "\n".join(lines + footer)


def _link(level: int | None) -> str:
    """A hop as a line: ══ NVLink, ~~ between hosts, ── anything else (PCIe, or CPU stages)."""
    from pp_launch.core.gpu.allocator import HOST_LEVEL

    if level is not None and 1 <= level <= 8:
        return "══"
    if level is not None and level >= HOST_LEVEL:
        return "~~"
    return "──"


def render_ring(doc: dict[str, Any], names: dict[str, str]) -> str:
    """The chain's ring over the topology, left to right, the hop back to stage 0 drawn underneath: which GPUs
    each stage has (and its host), and each hop's link."""
    stages = doc["stages"]
    levels = [h.get("topology_level") for h in doc.get("hops", [])]
    levels = [(10**6 if lvl == "host" else lvl) for lvl in levels] or [None] * len(stages)

    def box(s: dict[str, Any]) -> str:
        gpus = ",".join(names.get(u, u[:12]) for u in s["gpus"]) or "CPU"
        on = f"@{s['host']}" if s.get("host") else ""
        return f"[{s['stage']}: {gpus}{on}]"

    boxes = [box(s) for s in stages]
    top = "┌> " + "".join(b + (f" {_link(levels[k])} " if k + 1 < len(boxes) else "") for k, b in enumerate(boxes))
    back = _link(levels[-1])
    inner = len(top)  # the top line ends with " ┐": the bottom spans it between its corners
    left = max(0, (inner - 4) // 2)
    bottom = "└" + "─" * left + f" {back} " + "─" * max(0, inner - 4 - left) + "┘"
    legend = "══ NVLink  ── PCIe or none  ~~ between hosts"
    return "\n".join([top + " ┐", bottom, legend])


def _bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return "?".center(width, "·")
    full = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * full + "░" * (width - full)


def render_watch(inventory: GpuInventory, held: Mapping[str, str]) -> Any:
    """One frame of `pp-launch gpus --watch`, in the spirit of nvitop: per GPU (and MIG slice) its memory and
    utilisation as bars, its processes, and the pp-launch run and stage holding it."""
    import time

    from rich.table import Table
    from rich.text import Text

    clock = time.strftime("%Y-%m-%d %H:%M:%S")
    table = Table(title=f"pp-launch gpus --watch  {clock}  (Ctrl-C ends it)", title_justify="left", expand=False)
    for col in ("idx", "name", "memory MiB", "util", "temp power", "processes", "held by"):
        table.add_column(col, no_wrap=col in ("memory MiB", "util", "temp power"))

    def memory(used: int | None, total: int | None) -> Text:
        fraction = None if used is None or not total else used / total
        return Text(f"{_bar(fraction, 10)} {_mib(used)}/{_mib(total)}")

    for g in inventory.gpus:
        util = None if g.utilization_gpu_pct is None else g.utilization_gpu_pct / 100
        pct = "?" if g.utilization_gpu_pct is None else f"{g.utilization_gpu_pct}%"
        table.add_row(
            Text(str(g.index)),
            Text(g.name),
            memory(g.memory_used_mib, g.memory_total_mib),
            Text(f"{_bar(util, 10)} {pct}"),
            Text(_heat(g)),
            Text(_procs(g.processes)),
            Text(held.get(g.uuid, "-"), style="bold" if g.uuid in held else ""),
        )
        for k, m in enumerate(g.mig_devices):
            table.add_row(
                Text(f"{g.index}/{k}"),
                Text("  MIG slice"),
                memory(m.memory_used_mib, m.memory_total_mib),
                Text("-"),
                Text("-"),
                Text(_procs(m.processes)),
                Text(held.get(m.uuid, "-")),
            )
    return table


def _gpus_cell(r: StageRow) -> str:
    """GPU indices with memory and utilisation where NVML told them, else short UUIDs."""
    if r.gpu_index:
        cells = []
        for i, mem, util in zip(r.gpu_index, r.gpu_memory_used_mib, r.gpu_utilization_pct, strict=True):
            parts = (None if mem is None else f"{mem}MiB", None if util is None else f"{util}%")
            extra = "/".join(x for x in parts if x)
            cells.append(f"{i}" + (f"({extra})" if extra else ""))
        return ",".join(cells)
    return ",".join(g[:12] for g in r.gpus) or "-"


def _up(r: StageRow) -> str:
    if r.uptime_s is not None:
        return f"{r.uptime_s}s"
    return "-" if r.age_s is None else f"{r.age_s}s old"


def _owner_is(r: StageRow) -> str:
    """Whether the owner lives, in words; a detached run's owner is its guard (the owner column says `detached`)."""
    if r.owner_status == "detached" and r.owner == "detached":
        return "its guard"
    return OWNER_STATUS_SAID.get(r.owner_status, r.owner_status)


def _ps_cells(r: StageRow, restarted: bool, hosts: bool) -> tuple[str, ...]:
    """One row of `ps`'s table, as it is shown (not escaped yet)."""
    return (
        r.run,
        str(r.stage) if r.stage is not None else (r.role if r.role != "stage" else "?"),
        *((str(r.attempt or "-"),) if restarted else ()),
        *((r.host or "-",) if hosts else ()),
        r.container,
        r.image,
        _gpus_cell(r),
        r.address or "-",
        r.owner,
        _owner_is(r),
        r.status or r.state,
        _up(r),
    )


def render_ps(rows: Sequence[StageRow]) -> str:
    """`pp-launch ps`'s table: the attempt column once a run was restarted, the host column where several places
    were asked; every cell escaped for the terminal (labels are anyone's to write)."""
    if not rows:
        return "no pp-launch containers"
    hosts = any(r.host for r in rows)
    restarted = any((r.attempt or 1) > 1 for r in rows)
    header = (
        "run",
        "stage",
        *(("attempt",) if restarted else ()),
        *(("host",) if hosts else ()),
        "container",
        "image",
        "gpus",
        "address",
        "owner",
        "owner is",
        "state",
        "up",
    )
    table = [header] + [_ps_cells(r, restarted, hosts) for r in rows]
    table = [tuple(display(cell.encode("utf-8", "surrogateescape")) for cell in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
