"""Stop signals are taken in the order they arrived (cli/signals.py). Python runs the handlers of signals that
arrived together in the order of their numbers, so a SIGTERM then a SIGINT that land while the launcher is busy
would be taken as SIGINT first (exit 130, not the 143 the first signal decides: the chaos matrix saw it under
load). The wakeup pipe, which the C handler writes as each signal arrives, has their order; a real pipe here."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from pp_launch.cli import signals


@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[int]]]:
    """The module's wakeup pipe replaced by one of the test's; what it dispatches, in order."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    taken: list[int] = []
    monkeypatch.setattr(signals, "_arrivals", r)
    monkeypatch.setattr(signals, "_told", signals.collections.Counter())
    monkeypatch.setattr(signals, "_target", taken.append)
    yield w, taken
    os.close(r)
    os.close(w)


def test_two_signals_run_in_number_order_are_taken_in_arrival_order_once_each(arrivals) -> None:  # type: ignore[no-untyped-def]
    w, taken = arrivals
    os.write(w, bytes([signal.SIGTERM, signal.SIGINT]))  # SIGTERM arrived first
    signals._handler(signal.SIGINT, None)  # Python runs SIGINT's handler first (the lower number)
    signals._handler(signal.SIGTERM, None)
    assert taken == [signal.SIGTERM, signal.SIGINT]


def test_a_signal_whose_byte_never_came_is_still_taken(arrivals) -> None:  # type: ignore[no-untyped-def]
    _, taken = arrivals  # a full pipe, or another wakeup fd: nothing to read
    signals._handler(signal.SIGHUP, None)
    assert taken == [signal.SIGHUP]


def test_another_handlers_signal_in_the_pipe_is_not_a_stop(arrivals) -> None:  # type: ignore[no-untyped-def]
    w, taken = arrivals
    os.write(w, bytes([signal.SIGUSR1, signal.SIGINT]))
    signals._handler(signal.SIGINT, None)
    assert taken == [signal.SIGINT]
