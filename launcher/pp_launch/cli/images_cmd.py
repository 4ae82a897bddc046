"""`pp-launch images build`."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from pp_launch.app import chain as steps
from pp_launch.cli.main import main


@main.group("images")
def images_group() -> None:
    """Build the images pp-launch needs, with no registry."""


@images_group.command("build")
@click.option(
    "--base",
    metavar="IMAGE",
    help="Build the stage image on this local image (needs python3 and numpy) instead of importing a "
    "Debian root filesystem made with debootstrap.",
)
@click.pass_context
def images_build(ctx: click.Context, base: str | None) -> None:
    """Build the base image (debootstrap + docker import) and pp-launch/stub-worker:latest on it.

    Each image records a hash of its inputs; a second call with unchanged inputs rebuilds nothing.

    \b
    Example:
      pp-launch images build
    """
    quiet = ctx.obj["verbosity"] < 0
    results = steps.build_images((lambda t: None) if quiet else _progress_printer(), base)
    for r in results:
        click.echo(f"{r.image}: {'built' if r.built else 'up to date'}")


def _progress_printer() -> Callable[[str], None]:
    if sys.stderr.isatty():
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
        return lambda text: console.print(f"[dim]images:[/] {text}", markup=True, soft_wrap=True)
    return lambda text: click.echo(f"images: {text}", err=True)
