"""Where a housekeeping command (ps, down, gc, logs, wait) looks: --host, --all-hosts, --ray; and how it speaks."""

from __future__ import annotations

import sys
from typing import Any

import click

from pp_launch.app import runs
from pp_launch.cli import streams
from pp_launch.cli.options import host_option


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


def where(names: tuple[str, ...], all_hosts: bool, ray_address: str | None) -> runs.Where:
    """Where a housekeeping command looks, as its options say (Ray's own output set aside unless -v)."""
    return runs.Where(names, all_hosts, ray_address, quiet_ray=lambda: streams.set_aside_ray_output())


def voice() -> runs.Voice:
    """A use case's answer on stdout (each as it comes: `wait` and `logs -f` are read as they go), its notes and
    errors on stderr."""
    out = sys.stdout

    def answer(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    return runs.Voice(answer=answer, note=lambda text: click.echo(text, err=True))
