"""Standard output and error that never stop the launcher (issue #23 item 6).

A terminal that went away (its pty holder killed: EIO), a reader that closed the pipe (EPIPE), or a stream closed
before we started (`>&-`, `2>&-`: Python's sys.stdout is then None) must not raise out of a reporter in the middle
of a chain: the teardown still sends every stage its SIGTERM and grace. A stream that fails once falls silent
for good; the hang-up itself (SIGHUP) ends the chain with 129 like any stop signal.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Quiet:
    """A text stream that swallows write errors and then stays silent; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.failed = stream is None

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
