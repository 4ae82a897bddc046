"""The CLI's error boundary, light enough for `pp-launch --help` to import (only the core's errors)."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator

import click

from pp_launch.core import errors


def message(exc: errors.PpLaunchError, prog: str = "pp-launch") -> str:
    """The one way a library error reaches a user: one plain line, prefixed by the program (a stop the user asked
    for is no error: said as a chain's own stop is)."""
    return f"{prog}: {exc}" if isinstance(exc, errors.Interrupted) else f"{prog}: error: {exc}"


@contextlib.contextmanager
def mapped_errors(prog: str = "pp-launch") -> Iterator[None]:
    """The error boundary: our own errors become one plain message and their exit code, no traceback; Ctrl-C is
    exit 130 with no "Aborted!" (docs/getting-started.md, exit codes). The `pp-launch` group runs every command
    inside it, and `pp-gpu-node` runs inside it too."""
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C where nothing needs a teardown (logs -f, wait, ps): 130, as docker, quietly
        sys.exit(130)
    except errors.PpLaunchError as exc:
        click.echo(message(exc, prog), err=True)
        if isinstance(exc, errors.UsageError):  # options that do not go together: the same hint as Click's errors
            click.echo(f"{prog}: hint: '{_command_path(prog)} --help' lists its options", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError as exc:
        # Click would end the process with 1 and say nothing: it takes a broken pipe for a closed stdout, which
        # never raises here (cli/streams.py). So this one came from inside, where nothing expected it: said, where
        traceback.print_exc()
        click.echo(f"{prog}: error: a pipe broke inside {prog} ({exc}); the traceback above says where", err=True)
        sys.exit(errors.EXIT_FAILURE)


def _command_path(prog: str) -> str:
    """The command that failed: the group's context is the current one by the time its error gets here."""
    ctx = click.get_current_context(silent=True)
    sub = ctx.invoked_subcommand if ctx is not None else None
    return f"{prog} {sub}" if sub else prog
