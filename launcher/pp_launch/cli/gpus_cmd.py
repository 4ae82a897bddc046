"""`pp-launch gpus`: parses where to look and renders the GPU table (or JSON) that app/gpus.py and app/hosts.py
read; it reads no GPU itself."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.cli.main import main
from pp_launch.core import errors, hosts
from pp_launch.core.chain.plan import BUILTIN_IMAGE
from pp_launch.core.gpu.inventory import GpuInventory


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The inventory as one JSON line on stdout (docs/formats.md).")
@click.option(
    "--gpu-inventory",
    type=click.Path(dir_okay=False),
    envvar=gpu_select.INVENTORY_ENV,
    help="Read this inventory file instead of NVML; example:NAME is one the package carries (example:nvlink-8gpu, "
    "example:pcie-2socket-4gpu, example:plain-4gpu, example:mig-2gpu).",
)
@click.option("--record", type=click.Path(dir_okay=False), metavar="FILE", help="Write the inventory to FILE.")
@click.option("--topo", is_flag=True, help="Also the topology matrix, as nvidia-smi topo -m shows it.")
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="A live view, refreshed every --interval: memory and use as bars, and who holds each GPU (Ctrl-C ends it).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="S",
    help="With --watch: seconds between frames.",
)
@click.option("--frames", type=click.IntRange(min=0), default=0, hidden=True, help="With --watch: stop after N.")
@click.option(
    "--host",
    "host",
    metavar="CONTEXT|URL",
    help="The GPUs of that host's engine instead, read by a probe container (python3 in --image) given every GPU.",
)
@click.option(
    "--image",
    default=BUILTIN_IMAGE,
    show_default=True,
    help="With --host: the probe's image (it must be on that host; it needs python3).",
)
@click.option(
    "--gpu-attach",
    type=click.Choice(gpu_select.ATTACH_MODES),
    default="request",
    show_default=True,
    help="With --host: how the probe is given the GPUs (as the chain's stages would be).",
)
def gpus(
    as_json: bool,
    gpu_inventory: str | None,
    record: str | None,
    topo: bool,
    watch: bool,
    interval: float,
    frames: int,
    host: str | None,
    image: str,
    gpu_attach: str,
) -> None:
    """Show the GPUs NVML sees, MIG slices as rows of their own: memory, utilization, processes, and which
    pp-launch run holds each; --topo adds how they are connected.

    \b
    Examples:
      pp-launch gpus
      pp-launch gpus --topo
      pp-launch gpus --watch
      pp-launch gpus --record inventory.json
      pp-launch gpus --host gpu2
    """
    from pp_launch.cli.tables import holders_by_uuid, render_table, render_topology

    if watch:
        if host is not None or as_json or record:
            raise click.UsageError("--watch shows this machine's GPUs on a terminal: not with --host, --json, --record")
        _watch(gpu_inventory, interval, frames)
        return
    host_name = hosts.parse_hosts([host])[0] if host is not None else None
    from pp_launch.app import chain as steps

    probe = (steps.owner_label(False), steps.new_run_id()) if host_name else ("", "")  # --host's probe
    seen = across.gpus_seen(host_name, gpu_inventory, image, gpu_attach, *probe)
    inventory = seen.inventory
    held = holders_by_uuid(seen.holders or [])
    if seen.holders is None:
        click.echo(f"pp-launch: warning: which run holds each GPU is not shown: {seen.why_not}", err=True)
    if record:
        if not inventory.gpus and inventory.note:
            raise errors.ConfigError(f"nothing recorded to {record}: {inventory.note}")
        gpu_select.save_inventory(inventory, record)
    if inventory.note:
        click.echo(inventory.note, err=True)
    if as_json:  # JSON lines, as every --json; an inventory file as it is, with who holds what beside it
        doc = {**_with_health(inventory), "held_by": None if seen.holders is None else _held_by(seen.holders)}
        click.echo(json.dumps(doc, separators=(",", ":")))
    elif inventory.gpus:
        click.echo(render_table(inventory, held))
        if topo:
            click.echo("")
            click.echo(render_topology(inventory))
    if record:
        click.echo(f"recorded {len(inventory.gpus)} GPUs to {record}", err=True)


def _with_health(inventory: GpuInventory) -> dict[str, Any]:
    """The inventory document, each GPU with its `health`: "ok", "unknown" (NVML told nothing of it), or why it is
    not placed on (docs/recovery.md)."""
    doc: dict[str, Any] = inventory.to_json()
    for entry, gpu in zip(doc["gpus"], inventory.gpus, strict=True):
        entry["health"] = gpu.health or ("ok" if gpu.health_known else "unknown")
    return doc


def _held_by(rows: list[Mapping[str, str]]) -> dict[str, dict[str, Any]]:
    """UUID -> {"run", "stage"} of the pp-launch stage holding it."""
    return {uuid: {"run": h.run_id, "stage": h.stage} for uuid, h in gpu_select.holdings_from_labels(rows).items()}


def _watch(gpu_inventory: str | None, interval: float, frames: int) -> None:
    """Read NVML (or the inventory file) and the engine's holders again for every frame."""
    import time

    from rich.console import Console
    from rich.live import Live

    from pp_launch.cli.tables import holders_by_uuid, render_watch

    def frame() -> Any:
        seen = across.gpus_seen(None, gpu_inventory, "", "", "", "")  # this machine's, read again
        return render_watch(seen.inventory, holders_by_uuid(seen.holders or []))

    shown = 0
    try:
        with Live(frame(), console=Console(highlight=False), auto_refresh=False) as live:
            while frames == 0 or shown < frames:
                shown += 1
                live.update(frame(), refresh=True)
                if frames == 0 or shown < frames:
                    time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the view: exit 0
