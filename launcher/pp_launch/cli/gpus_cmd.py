"""`pp-launch gpus`."""

from __future__ import annotations

import json

import click

from pp_launch.adapters.docker_engine import connect
from pp_launch.app import chain as launch
from pp_launch.app import gpus as gpu_select
from pp_launch.cli.main import main
from pp_launch.core import errors


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The inventory as one JSON line on stdout (docs/formats.md).")
@click.option(
    "--gpu-inventory",
    type=click.Path(dir_okay=False),
    envvar=gpu_select.INVENTORY_ENV,
    help="Read this inventory file instead of NVML.",
)
@click.option("--record", type=click.Path(dir_okay=False), metavar="FILE", help="Write the inventory to FILE.")
@click.option("--topo", is_flag=True, help="Also the topology matrix, as nvidia-smi topo -m shows it.")
def gpus(as_json: bool, gpu_inventory: str | None, record: str | None, topo: bool) -> None:
    """Show the GPUs NVML sees, MIG slices as rows of their own: memory, utilization, processes, and which
    pp-launch run holds each; --topo adds how they are connected.

    \b
    Examples:
      pp-launch gpus
      pp-launch gpus --topo
      pp-launch gpus --record inventory.json
    """
    from pp_launch.cli.tables import holders_by_uuid, render_table, render_topology

    inventory = gpu_select.load_inventory(gpu_inventory)
    if record:
        inventory.save(record)
    try:
        held = holders_by_uuid(launch.live_gpu_labels(connect(timeout=5)))
    except errors.EngineUnavailable:
        held = {}
    if inventory.note:
        click.echo(inventory.note, err=True)
    if as_json:
        click.echo(json.dumps(inventory.to_json(), separators=(",", ":")))  # JSON lines, as every --json
    elif inventory.gpus:
        click.echo(render_table(inventory, held))
        if topo:
            click.echo("")
            click.echo(render_topology(inventory))
    if record:
        click.echo(f"recorded {len(inventory.gpus)} GPUs to {record}", err=True)
