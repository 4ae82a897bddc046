"""The chain scope's clock and threads (core/chain/ports.py `Runtime`)."""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class ThreadRuntime:
    """time.monotonic (or the clock given), and calls run at once on up to `max_workers` threads; every thread
    is joined before run_all returns."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_workers: int = 16, name: str = "pp") -> None:
        self._clock = clock
        self._max_workers = max_workers
        self._name = name

    def now(self) -> float:
        return self._clock()

    def run_all(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        return run_all(calls, self._name, self._max_workers)


def run_all(calls: Sequence[Callable[[], Any]], name: str, max_workers: int = 16) -> list[Any]:
    """Every call at once, on up to `max_workers` threads of one nursery, all joined before this returns: their
    results in order, an exception standing as its call's result (the caller decides what each failure means)."""

    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BaseException as exc:  # handed back
            return exc

    if len(calls) <= 1:
        return [guarded(c) for c in calls]
    results: list[Any] = [None] * len(calls)
    todo = iter(range(len(calls)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                k = next(todo, None)
            if k is None:
                return
            results[k] = guarded(calls[k])

    with Nursery(name) as nursery:
        for i in range(min(max_workers, len(calls))):
            nursery.start(worker, name=f"{name}-{i}")
    return results


def map_all(fn: Callable[[T], R], items: Iterable[T], name: str, max_workers: int = 16) -> list[R]:
    """fn(item) for every item at once (run_all), the results in order; the first exception, in order, raised
    once every call has ended (as a thread pool's map)."""
    raised: dict[int, BaseException] = {}  # a call's own exception (a result may be an exception object too)

    def call(k: int, item: T) -> R | None:
        try:
            return fn(item)
        except BaseException as exc:
            raised[k] = exc
            return None

    results = run_all([lambda k=k, item=item: call(k, item) for k, item in enumerate(items)], name, max_workers)  # type: ignore[misc]
    if raised:
        raise raised[min(raised)]
    return results


class Nursery:
    """One owner's threads, in the manner of a trio nursery: every thread the owner runs is started here, and
    `join` waits for all of them within one bound. A thread that cannot be joined in it (a read from an engine that
    was lost never ends) is never silently left: `report` is told its name and its owner's, once, and `join`
    returns the names; it is a daemon, and ends with the process. The default report is the `pp_launch` logger
    (shown with -v: cli/main.py)."""

    def __init__(self, owner: str, report: Callable[[str], None] | None = None) -> None:
        self.owner = owner
        self._report = report or _log
        self._started: list[threading.Thread] = []
        self._reported: set[int] = set()
        self._lock = threading.Lock()

    def start(self, target: Callable[..., Any], *args: Any, name: str, daemon: bool = True) -> threading.Thread:
        """daemon=False: the process waits for it at its exit too (a run's own thread, whose teardown must end)."""
        thread = threading.Thread(target=target, args=args, daemon=daemon, name=name)
        with self._lock:
            self._started.append(thread)
        thread.start()
        return thread

    def join(self, timeout: float | None = 5.0) -> list[str]:
        """Wait until every thread has ended, at most `timeout` seconds in all (None: however long it takes); the
        names of those still running, each reported (once)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            started = list(self._started)
        for thread in started:
            if thread.ident is not None:  # started (an interrupt may land between its making and its start)
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._started = [t for t in self._started if t.is_alive()]
            left = [t for t in self._started if id(t) not in self._reported]
            self._reported.update(id(t) for t in left)
            names = [t.name for t in self._started]
        for t in left:
            self._report(f"{self.owner}: thread {t.name} still runs after {timeout:g} s; it ends with the process")
        return names

    def __enter__(self) -> Nursery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.join(None)


def _log(text: str) -> None:
    import logging

    logging.getLogger("pp_launch.threads").info(text)


class StopLatch:
    """A wait that a stop ends early (a signal, or `down` told to a run's guard): the backoff between two attempts.
    `request_stop` is safe from a signal handler: it sets two fields and writes one byte to a pipe."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.by = ""
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)

    def request_stop(self, signum: int, by: str = "") -> None:
        if self.signum is None:
            self.signum, self.by = signum, by
        with contextlib.suppress(OSError):
            os.write(self._w, b"x")

    def wait(self, seconds: float) -> bool:
        """True when stopped before `seconds` passed (or already)."""
        if self.signum is None:
            with contextlib.suppress(InterruptedError):
                select.select([self._r], [], [], seconds)
        return self.signum is not None

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
