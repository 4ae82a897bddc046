"""`pp-launch gpus`."""

from __future__ import annotations

import json

import click

from pp_launch.adapters import identity, inventory_file
from pp_launch.adapters.docker_engine import connect
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app.hosts import live_gpu_labels
from pp_launch.cli.main import main
from pp_launch.core import errors, hosts
from pp_launch.core.chain.plan import BUILTIN_IMAGE


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
    as_json: bool, gpu_inventory: str | None, record: str | None, topo: bool, host: str | None, image: str,
    gpu_attach: str,
) -> None:  # fmt: skip
    """Show the GPUs NVML sees, MIG slices as rows of their own: memory, utilization, processes, and which
    pp-launch run holds each; --topo adds how they are connected.

    \b
    Examples:
      pp-launch gpus
      pp-launch gpus --topo
      pp-launch gpus --record inventory.json
      pp-launch gpus --host gpu2
    """
    from pp_launch.cli.tables import holders_by_uuid, render_table, render_topology

    if host is not None:
        reached = across.connect_all(hosts.parse_hosts([host]))
        try:
            across.check_image(reached, image)
            owner = identity.current_owner().label()
            if gpu_inventory:
                inventory = gpu_select.load_inventory(gpu_inventory)
            else:
                inventory = across.probe_inventory(reached[0], image, gpu_attach, identity.new_run_id(), owner)
            held = holders_by_uuid(live_gpu_labels(reached[0].engine))
        finally:
            across.close_all(reached)
    else:
        inventory = gpu_select.load_inventory(gpu_inventory)
        try:
            held = holders_by_uuid(live_gpu_labels(connect(timeout=5)))
        except errors.EngineUnavailable:
            held = {}
    if record:
        inventory_file.save(inventory, record)
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
