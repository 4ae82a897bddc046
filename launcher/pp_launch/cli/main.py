"""The `pp-launch` command group; each command lives in its own module beside this one."""

from __future__ import annotations

from typing import Any

import click

from pp_launch import __version__
from pp_launch.cli import signals
from pp_launch.cli.options import mapped_errors

ENVVARS = "PP_LAUNCH"


def _verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """-v/-q after the command name mean what they mean before it (the root's callback has run by then)."""
    obj = ctx.find_root().obj
    if obj is None or not value:
        return
    obj["verbosity"] = -1 if param.name == "quiet" else max(obj["verbosity"], int(value))


class Commands(click.Group):
    """The `pp-launch` group: every command runs inside the one error boundary (options.mapped_errors), and
    takes -v/-q after its name too (not `node`: its arguments are the container's command)."""

    def invoke(self, ctx: click.Context) -> Any:
        with mapped_errors():
            return super().invoke(ctx)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name != "node":
            cmd.params += [
                click.Option(
                    ["-v", "--verbose"],
                    count=True,
                    expose_value=False,
                    callback=_verbosity,
                    help="Say more (-vv: every stage's state changes too).",
                ),
            ]
            if name != "ps":  # ps -q is docker's: run ids only
                quiet = "Only errors and the result; no stage lines."
                cmd.params.append(
                    click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_verbosity, help=quiet)
                )
        super().add_command(cmd, name)


@click.group(
    cls=Commands,
    # PP_LAUNCH_<COMMAND>_<OPTION> sets any option's default, e.g. PP_LAUNCH_CHAIN_GRACE=2
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110, "auto_envvar_prefix": ENVVARS},
)
@click.version_option(__version__, prog_name="pp-launch")
@click.option("-v", "--verbose", count=True, help="Say more (-vv: every stage's state changes too).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final result; no stage lines.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Launch pipeline-parallel inference stages as GPU containers, and never leave one behind.

    \b
    Examples:
      pp-launch chain                      # the 2-stage demo on the built-in image
      pp-launch chain --stages 4 --json    # 4 stages, events as JSON lines
      pp-launch gpus                       # what NVML sees, and who holds what
    """
    ctx.obj = {"verbosity": -1 if quiet else verbose}
    if ctx.invoked_subcommand not in ("chain", "node"):
        signals.release()  # nothing of theirs needs a teardown: Ctrl-C interrupts them as usual


# Each command module registers its commands on `main` when imported (after `main` exists).
from pp_launch.cli import (  # noqa: E402, F401
    chain_cmd,
    compose_cmd,
    gpus_cmd,
    housekeeping_cmd,
    images_cmd,
    node_cmd,
    runs_cmd,
    worker_cmd,
)
