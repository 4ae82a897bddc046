"""Stop signals for the CLI entry points, installed before anything heavy is imported.

A signal that arrives while the launcher is still importing or planning is held, then handed to the
chain (or node) the moment it exists; so even an early Ctrl-C ends in a clean teardown and 128+N.
Only the CLI uses this module: the library never installs signal handlers.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NODE_SIGNALS = (*STOP_SIGNALS, signal.SIGQUIT)

_pending: list[int] = []
_target: Callable[[int], None] | None = None


def _handler(signum: int, _frame: FrameType | None) -> None:
    if _target is None:
        _pending.append(signum)
    else:
        _target(signum)


def install(signals: tuple[signal.Signals, ...] = NODE_SIGNALS) -> None:
    for s in signals:
        signal.signal(s, _handler)


def route_to(target: Callable[[int], None]) -> None:
    """From now on every stop signal goes to `target`; those held so far are delivered first."""
    global _target
    _target = target
    while _pending:
        target(_pending.pop(0))


def deliver(signum: int) -> None:
    """A stop from within this process (a lifeline that ended), routed as the signal `signum` would be."""
    _handler(signum, None)


def pending() -> int | None:
    return _pending[0] if _pending else None


def release() -> None:
    """For commands with nothing to tear down: default behaviour back, and any held signal delivered now."""
    import os

    global _target
    _target = None
    for s in NODE_SIGNALS:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    while _pending:
        os.kill(os.getpid(), _pending.pop(0))
