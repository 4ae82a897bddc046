"""The `pp-launch` command group; each command lives in its own module beside this one."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

import click

from pp_launch import __version__
from pp_launch.cli import signals
from pp_launch.cli.boundary import mapped_errors

ENVVARS = "PP_LAUNCH"

# Each command's module, imported only when the command runs (docker, rich and the rest load there), and its one
# line in `pp-launch --help`.
COMMANDS = {
    "chain": ("chain_cmd", "Start a chain of stages and supervise it until it ends."),
    "compose": ("compose_cmd", "Write a chain as a Compose project."),
    "down": ("housekeeping_cmd", "Stop runs: SIGTERM, grace, SIGKILL, removal confirmed."),
    "gc": ("housekeeping_cmd", "Remove containers whose launcher is gone."),
    "gpus": ("gpus_cmd", "Show the GPUs, their use and who holds each."),
    "images": ("images_cmd", "Build the images pp-launch needs, with no registry."),
    "logs": ("runs_cmd", "Print a run's output, each line prefixed with its stage."),
    "node": ("node_cmd", "Run one stage container in the foreground (pp-gpu-node)."),
    "ps": ("housekeeping_cmd", "List runs and their stages."),
    "uninstall": ("housekeeping_cmd", "Remove everything of yours pp-launch made: records, images, state."),
    "wait": ("runs_cmd", "Wait until a run is up, or until it ended."),
    "worker": ("worker_cmd", "Drive and check GPU workers over the worker wire."),
}


DOCKER_WORDS = {"stop": "down", "rm": "down", "kill": "down", "run": "chain", "start": "chain", "up": "chain",
                "ls": "ps", "list": "ps", "build": "images build", "top": "ps", "inspect": "ps"}  # fmt: skip
VOLUME_COMMANDS = ("chain", "compose")  # their -v is docker run's --volume; --verbose (or pp-launch -v CMD) says more


def _verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """-v/-q after the command name mean what they mean before it (the root's callback has run by then)."""
    obj = ctx.find_root().obj
    if obj is None or not value:
        return
    obj["verbosity"] = -1 if param.name == "quiet" else max(obj["verbosity"], int(value))


class OneLineUsage(click.UsageError):
    """A usage error in the one style of every pp-launch error: `pp-launch: error: ...` and a hint, exit 2."""

    def show(self, file: Any = None) -> None:
        path = " ".join(["pp-launch", *(self.ctx.command_path.split()[1:] if self.ctx is not None else [])])
        click.echo(f"pp-launch: error: {self.format_message()}", err=True)
        click.echo(f"pp-launch: hint: '{path} --help' lists its options", err=True)


def one_line(exc: click.UsageError) -> OneLineUsage:
    if isinstance(exc, OneLineUsage):
        return exc
    return OneLineUsage(exc.format_message(), exc.ctx)


class Commands(click.Group):
    """The `pp-launch` group: every command runs inside the one error boundary (options.mapped_errors), and
    takes -v/-q after its name too (not `node`: its arguments are the container's command)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with mapped_errors():
                return super().invoke(ctx)
        except click.UsageError as exc:  # a command's own flags, or its body's BadParameter
            raise one_line(exc) from None

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:  # the group's own: an unknown command, a bad root flag
            raise one_line(exc) from None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command says which one was meant: docker's word for ours (stop, rm, run, ls, images...), or
        the closest name."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), 1)
            meant = DOCKER_WORDS.get(name) or (close[0] if close else "")
            hint = f"; did you mean 'pp-launch {meant}'?" if meant else ""
            raise click.UsageError(f"no command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"pp_launch.cli.{COMMANDS[cmd_name][0]}")  # registers itself on `main`
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list without importing any command: each one's line from COMMANDS."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            loaded = self.commands.get(name)
            text = loaded.get_short_help_str(limit) if loaded else COMMANDS[name][1]
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name in COMMANDS and cmd.short_help is None:
            cmd.short_help = COMMANDS[name][1]  # one line in --help, imported or not
        if name not in ("node", "compose"):  # compose writes a file: nothing to say more or less of
            cmd.params += [
                click.Option(
                    ["--verbose"] if name in VOLUME_COMMANDS else ["-v", "--verbose"],
                    count=True,
                    expose_value=False,
                    callback=_verbosity,
                    help="Say more (twice: every stage's state changes too; -v is docker run's --volume here, "
                    "'pp-launch -vv chain' says more too)."
                    if name in VOLUME_COMMANDS
                    else "Say more (-vv: every stage's state changes too).",
                ),
            ]
            if name != "ps":  # ps -q is docker's: run ids only
                quiet = (
                    "Only errors and the result: the stages' own output is hidden, your program's result lines too "
                    "(--attach K shows one stage's)."
                    if name in VOLUME_COMMANDS
                    else "Only errors and the result; no stage lines."
                )
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
@click.option(
    "-H",
    "--host",
    "docker_host",
    metavar="URL",
    help="The Docker engine, as docker -H (unix://, tcp://, ssh://): DOCKER_HOST for this command.",
)
@click.option(
    "--context",
    "docker_context",
    metavar="NAME",
    help="The Docker context, as docker --context: DOCKER_CONTEXT for this command.",
)
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool, docker_host: str | None, docker_context: str | None) -> None:
    """Launch pipeline-parallel inference stages as GPU containers, and never leave one behind.

    \b
    Examples:
      pp-launch chain                      # the 2-stage demo on the built-in image
      pp-launch chain --stages 4 --json    # 4 stages, events as JSON lines
      pp-launch gpus                       # what NVML sees, and who holds what
      pp-launch -H ssh://gpu2 ps           # another engine, as docker -H
    """
    ctx.obj = {"verbosity": -1 if quiet else verbose}
    if verbose > 0 and not quiet:
        _notes_on_stderr()
    if docker_host is not None and docker_context is not None:
        raise click.UsageError("-H/--host and --context do not go together (as with docker): give one")
    if docker_host is not None:  # as docker: the flag wins over the environment, and is what children see
        os.environ["DOCKER_HOST"] = docker_host
        os.environ.pop("DOCKER_CONTEXT", None)
    if docker_context is not None:
        os.environ["DOCKER_CONTEXT"] = docker_context
        os.environ.pop("DOCKER_HOST", None)
    if ctx.invoked_subcommand not in ("chain", "node"):
        signals.release()  # nothing of theirs needs a teardown: Ctrl-C interrupts them as usual


def _notes_on_stderr() -> None:
    """-v: pp-launch's own log (a thread not joined at its owner's end: adapters/runtime.py) said on stderr."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pp-launch: note: %(message)s"))
    log = logging.getLogger("pp_launch")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def load_all() -> click.Group:
    """Every command imported (what the lazy group defers): for tools that walk the whole tree."""
    for module, _ in COMMANDS.values():
        importlib.import_module(f"pp_launch.cli.{module}")
    return main
