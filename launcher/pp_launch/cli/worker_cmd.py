"""`pp-launch worker check`: parses the options, runs the worker protocol check (app/worker_check.py) and prints
each step's line and the verdict."""

from __future__ import annotations

import sys

import click

from pp_launch.app import chain as steps
from pp_launch.cli.main import main
from pp_launch.cli.options import parse_env
from pp_launch.core import errors


@main.group("worker")
def worker_group() -> None:
    """Drive GPU workers over the worker-control wire (JSON lines on stdin/stdout)."""


@worker_group.command("check")
@click.argument("image")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Set a variable in the worker container.")
@click.option(
    "--init-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="S",
    help="Seconds a worker has to answer InitializeWorker with WorkerReady (swactor's 10 s).",
)
@click.option(
    "--step-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="S",
    help="Seconds a worker has to answer each other command.",
)
@click.option(
    "--trace",
    is_flag=True,
    help="Print every line exchanged, with direction (> sent, < received, "
    "# what the node did) and seconds since the start.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document (trace to stderr).")
@click.pass_context
def worker_check(
    ctx: click.Context,
    image: str,
    env: tuple[str, ...],
    init_timeout: float,
    step_timeout: float,
    trace: bool,
    as_json: bool,
) -> None:
    """Run the worker-control conformance sequence against IMAGE; exit 0 only if every step passes.

    The worker is driven as swactor's own node drives it (docs/worker-wire.md): initialize, configure (integer
    fields), install an ingress and an egress ring, the node writes MO01 records at the ingress ring's
    data_offset -> loaded, execute -> produced + completed, the output record read back (committed_bytes is
    the whole record), release, uninstall -> quiesced, a stale handle as an ExecuteStep input after a
    restart -> fatal, invalid JSON -> fatal, graceful shutdown, end of stdin. One line per step; a worker that
    dies or sends WorkerFatal ends its step at once, with the exit status or reason and its last stderr
    lines. STUB_MODE=worker is set for the built-in image's sake; other images ignore it.

    \b
    Examples:
      pp-launch worker check pp-launch/stub-worker:latest
      pp-launch worker check pp-launch/stub-worker:latest --trace
      pp-launch worker check my-worker:latest --env DEV=CUDA --json
    """
    from pp_launch.app.worker_check import check_here

    verbose = ctx.obj["verbosity"] > 0
    steps.check_image_name(image, "IMAGE")
    ok = check_here(
        image,
        dict(parse_env(env)),
        click.echo,
        building=lambda text: click.echo(f"pp-launch: {text}", err=True),
        log=(lambda text: click.echo(text, err=True)) if verbose else (lambda text: None),
        timeout=step_timeout,
        init_timeout=init_timeout,
        trace=(lambda text: click.echo(text, err=as_json)) if trace else None,
        as_json=as_json,
    )
    sys.exit(errors.EXIT_OK if ok else errors.EXIT_FAILURE)
