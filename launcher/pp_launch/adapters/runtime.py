"""The chain scope's clock and threads (core/chain/ports.py `Runtime`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


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
        def guarded(call: Callable[[], Any]) -> Any:
            try:
                return call()
            except BaseException as exc:  # handed back: the caller decides what each failure means
                return exc

        if len(calls) <= 1:
            return [guarded(c) for c in calls]
        with ThreadPoolExecutor(max_workers=min(self._max_workers, len(calls)), thread_name_prefix=self._name) as pool:
            return list(pool.map(guarded, calls))
