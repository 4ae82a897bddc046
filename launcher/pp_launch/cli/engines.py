"""Which engines a housekeeping command (ps, down, gc, logs, wait) looks at: --host and --all-hosts."""

from __future__ import annotations

import sys
from typing import Any

import click

from pp_launch.app import housekeeping
from pp_launch.cli.options import host_option
from pp_launch.core import errors


def host_choice(f: Any) -> Any:
    """--host (repeatable) and --all-hosts, as the housekeeping commands read them (no ring here)."""
    return host_option("Look at these Docker engines instead")(ALL_HOSTS(f))


RAY_OPTION = click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Look at the detached runs on this Ray cluster (HOST:PORT, ray://HOST:PORT, or auto) instead.",
)

ALL_HOSTS = click.option(
    "--all-hosts",
    is_flag=True,
    help="This engine and every host of the chains across hosts started from this machine (or of RUN's).",
)


class Engines(housekeeping.Engines):
    """app/housekeeping.Engines as a command uses it: what it says on stderr, and exit 1 at the end when a host did
    not answer (the command went on with the others)."""

    def __init__(self, names: tuple[str, ...], all_hosts: bool, run: str | None = None) -> None:
        super().__init__(names, all_hosts, run, say=lambda text: click.echo(f"pp-launch: {text}", err=True))

    def finish(self) -> None:
        if self.close():
            sys.exit(errors.EXIT_FAILURE)
