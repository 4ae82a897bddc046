"""`pp-launch images build|save|load`: parses the options and prints each image's line; building, saving and
loading pp-launch's images are adapters/images.py's."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from pp_launch.app import chain as steps
from pp_launch.cli.main import main
from pp_launch.cli.options import host_option


@main.group("images")
def images_group() -> None:
    """Build the images pp-launch needs with no registry, and carry them to other engines.

    \b
    Examples:
      pp-launch images build                           # here, on DOCKER_HOST's engine
      pp-launch images build --host gpu1 --host gpu2   # on each of these engines
      pp-launch images save -o pp-launch-images.tar    # then, on a node: pp-launch images load -i ...
    """


@images_group.command("build")
@click.option(
    "--base",
    metavar="IMAGE",
    help="Build the stage and guard images on this local image (needs python3 and numpy) instead of importing a "
    "Debian root filesystem made with debootstrap.",
)
@host_option("Build on these Docker engines, one after another (the root filesystem is made here)")
@click.pass_context
def images_build(ctx: click.Context, base: str | None, host_names: tuple[str, ...]) -> None:
    """Build every image pp-launch needs: the base (a Debian root filesystem made with debootstrap and imported),
    pp-launch/stub-worker:latest (the built-in stage) and pp-launch/guard:latest (each run's guard and the
    engine's GPU lock), on it.

    One line per image; the tools' own output only with -v, or when a build fails (its last lines and the log's
    path). Each image records a hash of its inputs: a second call with unchanged inputs says "up to date" and
    rebuilds nothing. A first build takes one to two minutes on a 2-core machine (64 s measured; debootstrap downloads
    about 60 MB); a second, under a second.

    \b
    Examples:
      pp-launch images build
      pp-launch -v images build                 # with debootstrap's and docker build's own lines
      pp-launch images build --host ssh://gpu2  # another engine (nothing is pulled there either)
    """
    from pp_launch.core.hosts import parse_hosts

    verbosity = ctx.obj["verbosity"]
    view = StepView(quiet=verbosity < 0)
    log = steps.BuildLog(echo=view.raw if verbosity > 0 else None)
    try:
        steps.build_images(view, base, parse_hosts(host_names), log)
    finally:
        view.close()
        log.close()


@images_group.command("save")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), metavar="FILE", help="The archive.")
def images_save(output: str) -> None:
    """Write the stage and guard images of this engine to one archive (docker save), for engines that cannot
    build them: each Ray node, each --host (load it there with 'pp-launch images load' or 'docker load').

    \b
    Example:
      pp-launch images save -o pp-launch-images.tar && scp pp-launch-images.tar gpu2:
    """
    names, size = steps.save_images(output)
    click.echo(f"{output}: {', '.join(names)} ({size / (1 << 20):.0f} MiB)")


@images_group.command("load")
@click.option("-i", "--input", "path", required=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE")
@host_option("Load into these Docker engines")
def images_load(path: str, host_names: tuple[str, ...]) -> None:
    """Load an archive of 'pp-launch images save' into this engine (or each --host), as docker load does.

    \b
    Examples:
      pp-launch images load -i pp-launch-images.tar
      pp-launch images load -i pp-launch-images.tar --host gpu1 --host gpu2
    """
    from pp_launch.core.hosts import parse_hosts

    for where, loaded in steps.load_images(path, parse_hosts(host_names)):
        click.echo(f"{where}: loaded {', '.join(loaded) or 'nothing'}")


class StepView:
    """What a build says, one line per image. On a terminal the image being built has a live line (what it does,
    the time so far) that becomes its result; elsewhere each step is a line of its own."""

    takes_steps = True  # images.build_all hands it Steps, not text

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.live: Any = None
        self.began = time.monotonic()
        self.doing = ""
        if sys.stderr.isatty() and not quiet:
            from rich.console import Console
            from rich.status import Status

            self.console = Console(stderr=True, highlight=False)
            self.live = Status(self, console=self.console)  # rendered again and again: the time goes on

    def __call__(self, step: Any) -> None:
        if step.done:
            self._stop()
            if not self.quiet or step.built:
                click.echo(step.text())  # the result of each image, on stdout
            return
        if self.live is None:
            if not self.quiet:
                click.echo(f"images: {step.text()}", err=True)
            return
        self.doing, self.began = step.text(), time.monotonic()
        self.live.start()

    def raw(self, line: str) -> None:
        """A line of the tools' own output (-v), shown above the live line."""
        if self.live is not None:
            self.console.print(f"  {line}", markup=False, soft_wrap=True)
        else:
            click.echo(f"  {line}", err=True)

    def __rich__(self) -> str:
        return f"{self.doing} ({time.monotonic() - self.began:.0f} s)"

    def _stop(self) -> None:
        if self.live is not None:
            self.live.stop()

    def close(self) -> None:
        self._stop()
