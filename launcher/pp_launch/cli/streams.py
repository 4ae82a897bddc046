"""Standard output and error that never stop the launcher.

A terminal that went away (its pty holder killed: EIO), a reader that closed the pipe (EPIPE), or a stream closed
before we started (`>&-`, `2>&-`: Python's sys.stdout is then None) must not raise out of a reporter in the middle
of a chain: the teardown still sends every stage its SIGTERM and grace. A stream that fails once falls silent
for good; the hang-up itself (SIGHUP) ends the chain with 129 like any stop signal.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class Quiet:
    """A text stream that swallows write errors and then stays silent; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.failed = stream is None

    def retarget(self, stream: TextIO) -> None:
        """Write to `stream` from now on (the same object stays sys.stderr: whoever holds it follows)."""
        self._stream, self.failed = stream, False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                return self._stream.write(text)  # type: ignore[union-attr]
            except (OSError, ValueError):
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._stream.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):
                self.failed = True

    def isatty(self) -> bool:
        try:
            return not self.failed and bool(self._stream.isatty())  # type: ignore[union-attr]
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("stream is closed")
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def install() -> None:
    """Wrap sys.stdout and sys.stderr (once) so that no write to them raises."""
    if not isinstance(sys.stdout, Quiet):
        sys.stdout = Quiet(sys.stdout)
    if not isinstance(sys.stderr, Quiet):
        sys.stderr = Quiet(sys.stderr)


def set_aside_ray_output(verbosity: int | None = None) -> str:
    """Unless -v: what Ray's own code writes to this process's stderr (its C++ core worker's log lines, its
    Python loggers) goes to a file of the user's state, and our own stderr keeps the terminal. Returns the file's
    path ("" when shown, or when stderr is closed). verbosity: the global -v/-q's (None: the current command's)."""
    if verbosity is None:
        import click

        ctx = click.get_current_context(silent=True)
        verbosity = int(((ctx.find_root().obj if ctx is not None else None) or {}).get("verbosity", 0))
    if verbosity > 0:
        return ""
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # no Ray here: the command says so; nothing of Ray's to set aside
        return ""
    from pp_launch.app import runs

    try:
        sys.stderr.flush()
        terminal = os.dup(2)
    except (OSError, ValueError):
        return ""
    fd, path = runs.ray_log()
    os.dup2(fd, 2)  # fd 2 itself: C++ code writes there, whatever Python's sys.stderr is
    kept = open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115 (for the process)
    ours = open(terminal, "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    if isinstance(sys.stderr, Quiet):
        sys.stderr.retarget(ours)
    else:
        sys.stderr = Quiet(ours)
    import logging  # only when Ray runs: not a cost of every command

    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(logging.StreamHandler(kept))
    ray_logger.propagate = False  # never to the root logger's last resort, which writes to our stderr
    return str(path)
