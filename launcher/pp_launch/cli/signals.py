"""Stop signals for the CLI entry points, installed before anything heavy is imported.

A signal that arrives while the launcher is still importing or planning is held, then handed to the
chain (or node) the moment it exists; so even an early Ctrl-C ends in a clean teardown and 128+N.
Only the CLI uses this module: the library never installs signal handlers.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NODE_SIGNALS = (*STOP_SIGNALS, signal.SIGQUIT)

_pending: list[int] = []
_target: Callable[[int], None] | None = None
_arrivals: int = -1  # the read end of the wakeup pipe: one byte per signal, in the order they arrived
_told: collections.Counter[int] = collections.Counter()  # signals dispatched from the pipe, their handler not run yet


def _handler(signum: int, _frame: FrameType | None) -> None:
    """Python runs the handlers of signals that arrived together in the order of their numbers (SIGINT before
    SIGTERM), not of their arrival; the wakeup pipe has that order: every signal in it is dispatched, in it. A
    handler whose signal was dispatched so already does nothing more; one whose byte never came (a full pipe,
    another wakeup fd) dispatches its own."""
    for arrived in _read_arrivals():
        if arrived in NODE_SIGNALS:  # another handler's signal (a library's own) is its own business
            _told[arrived] += 1
            _dispatch(arrived)
    if _told[signum] > 0:
        _told[signum] -= 1
    else:
        _dispatch(signum)


def _read_arrivals() -> bytes:
    if _arrivals < 0:
        return b""
    got = b""
    with contextlib.suppress(OSError):  # empty (BlockingIOError): nothing more came
        while chunk := os.read(_arrivals, 256):
            got += chunk
    return got


def _dispatch(signum: int) -> None:
    if _target is None:
        _pending.append(signum)
    else:
        _target(signum)


def install(signals: tuple[signal.Signals, ...] = NODE_SIGNALS) -> None:
    global _arrivals
    for s in signals:
        signal.signal(s, _handler)
    with contextlib.suppress(ValueError, OSError):  # not the main thread, or no pipe: number order, as before
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        _arrivals = r


def route_to(target: Callable[[int], None]) -> None:
    """From now on every stop signal goes to `target`; those held so far are delivered first."""
    global _target
    _target = target
    while _pending:
        target(_pending.pop(0))


def deliver(signum: int) -> None:
    """A stop from within this process (a lifeline that ended), routed as the signal `signum` would be."""
    _dispatch(signum)


def pending() -> int | None:
    return _pending[0] if _pending else None


def release() -> None:
    """For commands with nothing to tear down: default behaviour back, and any held signal delivered now."""
    global _target
    _target = None
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for s in NODE_SIGNALS:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    while _pending:
        os.kill(os.getpid(), _pending.pop(0))
