"""`pp-launch worker check`."""

from __future__ import annotations

import sys

import click

from pp_launch.adapters.docker_engine import connect
from pp_launch.app import chain as launch
from pp_launch.cli.main import main
from pp_launch.cli.options import parse_env
from pp_launch.core import errors


@main.group("worker")
def worker_group() -> None:
    """Drive GPU workers over the worker-control wire (JSON lines on stdin/stdout)."""


@worker_group.command("check")
@click.argument("image")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Set a variable in the worker container.")
@click.pass_context
def worker_check(ctx: click.Context, image: str, env: tuple[str, ...]) -> None:
    """Run the worker-control conformance sequence against IMAGE; exit 0 only if every step passes.

    Initialize, configure, install rings, readable -> loaded, execute -> produced + completed, release,
    uninstall -> quiesced, stale generation after a restart, invalid JSON -> fatal, graceful shutdown,
    end of stdin. One line per step, with what was expected when it fails. STUB_MODE=worker is set for
    the built-in image's sake; other images ignore it.

    \b
    Examples:
      pp-launch worker check pp-launch/stub-worker:latest
      pp-launch worker check pp-launch/stub-worker:latest --env STUB_WORKER_MISBEHAVE=sequence
    """
    from pp_launch.app.worker_check import check

    verbose = ctx.obj["verbosity"] > 0
    launch.check_image_name(image, "IMAGE")
    engine = connect()
    launch.ensure_image(engine, image, lambda text: click.echo(f"pp-launch: {text}", err=True))
    ok = check(
        engine,
        image,
        dict(parse_env(env)),
        click.echo,
        (lambda text: click.echo(text, err=True)) if verbose else (lambda text: None),
    )
    sys.exit(errors.EXIT_OK if ok else errors.EXIT_FAILURE)
