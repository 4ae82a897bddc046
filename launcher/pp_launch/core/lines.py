"""Bounded line splitting and safe display of stage output.

A stage may print anything: one endless line, random bytes. The launcher keeps at most `max_line`
bytes per stream in memory; a longer line is passed on in pieces (nothing is dropped), each marked
as a continuation after the first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class Line:
    data: bytes
    continued: bool = False  # a piece of a line longer than max_line, after its first piece
    complete: bool = True  # False: the line goes on in the next piece


class LineSplitter:
    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._max = max_line
        self._buf = bytearray()
        self._continuing = False

    def feed(self, data: bytes) -> Iterator[Line]:
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            end = len(data) if nl < 0 else nl
            room = self._max - len(self._buf)
            if end - start > room:
                self._buf += data[start : start + room]
                yield Line(bytes(self._buf), continued=self._continuing, complete=False)
                self._buf.clear()
                self._continuing = True
                start += room
                continue
            self._buf += data[start:end]
            if nl < 0:
                return
            yield Line(bytes(self._buf), continued=self._continuing)
            self._buf.clear()
            self._continuing = False
            start = nl + 1

    def close(self) -> Iterator[Line]:
        """What is left when the stream ends without a final newline."""
        if self._buf:
            yield Line(bytes(self._buf), continued=self._continuing)
        self._buf.clear()
        self._continuing = False


def display(data: bytes) -> str:
    """Text safe for a terminal: invalid UTF-8 and control characters (other than tab) are escaped."""
    text = data.decode("utf-8", errors="backslashreplace").rstrip("\r")
    if text.isprintable() or all(c == "\t" or c.isprintable() for c in text):
        return text
    return "".join(c if c == "\t" or c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def count(n: int, noun: str) -> str:
    """'1 stage', '2 stages': how every message counts."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
