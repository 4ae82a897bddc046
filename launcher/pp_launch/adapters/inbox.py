"""The chain's inbox: events from the backends' threads and signal handlers, read by the scope on one thread."""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

from pp_launch.core.chain.ports import TAIL_LINES, ChainEvent, StageFault, StageGone, StageOutput, StopRequested

_WAKE: Any = object()
LINE_COST = 160  # bytes a waiting line costs beyond its payload: the event, its bytes object, the queue's node


class QueueInbox:
    """The real inbox. SimpleQueue.put is reentrant, so a signal handler may call it.

    Output is bounded in bytes and in lines: a reader thread that finds `max_output` bytes (payload plus
    LINE_COST per line) or `max_lines` lines waiting blocks until the consumer catches up (the engine then holds
    back the stage, as a pipe would), so a stage printing 100 MB, or four million empty lines, cannot grow the
    launcher by more than the bound. Exits and stop requests never wait, and a stop request overtakes the output
    already waiting (as do exits once stopping has begun): stopping never waits behind output. While stopping,
    output beyond the bound is not held back but set aside per stage: each stage's last TAIL_LINES lines are
    kept (delivered once the queue is empty, in order), older ones dropped and counted (`dropped_lines`,
    `dropped_bytes`). Only reentrant operations (deque.append, SimpleQueue.put) are used on the way in, so a
    signal handler may put.
    """

    def __init__(self, max_output: int = 1 << 20, max_lines: int = 8192) -> None:
        self._q: queue.SimpleQueue[ChainEvent] = queue.SimpleQueue()
        self._max_output = max_output
        self._max_lines = max_lines
        self._pending_output = 0
        self._pending_lines = 0
        self._room = threading.Condition()
        self._dropping = False
        self._urgent: collections.deque[ChainEvent] = collections.deque()
        self._tails: dict[int, collections.deque[StageOutput]] = {}
        self.dropped_bytes = 0  # output dropped while stopping (never before)
        self.dropped_lines = 0

    def _full(self) -> bool:
        return self._pending_output > self._max_output or self._pending_lines >= self._max_lines

    def put(self, event: ChainEvent) -> None:
        if isinstance(event, StopRequested | StageFault) or (self._dropping and isinstance(event, StageGone)):
            self._urgent.append(event)
            self._q.put(_WAKE)  # wakes a get() that waits on an empty queue
            return
        if isinstance(event, StageOutput):
            with self._room:
                while self._full() and not self._dropping:
                    self._room.wait(0.5)
                if self._dropping and (self._full() or event.stage in self._tails):
                    tail = self._tails.setdefault(event.stage, collections.deque())
                    tail.append(event)  # once a stage's lines are set aside, all its later ones are too (order)
                    if len(tail) > TAIL_LINES:
                        old = tail.popleft()
                        self.dropped_lines += 1
                        self.dropped_bytes += len(old.data)
                    return
                self._pending_output += len(event.data) + LINE_COST
                self._pending_lines += 1
        self._q.put(event)

    def stop_holding_back(self) -> None:
        with self._room:
            self._dropping = True
            self._room.notify_all()

    def _tail_line(self) -> StageOutput | None:
        with self._room:
            for stage in sorted(self._tails):
                tail = self._tails[stage]
                if tail:
                    return tail.popleft()
                del self._tails[stage]
        return None

    def get(self, timeout: float) -> ChainEvent | None:
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self._urgent:
                return self._urgent.popleft()
            try:
                event = self._q.get_nowait()
            except queue.Empty:
                if self._tails and (held := self._tail_line()) is not None:
                    return held  # the queue is empty: a stage's kept last lines, after all its earlier ones
                try:
                    event = self._q.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    return None
            if event is not _WAKE:
                break
        if isinstance(event, StageOutput):
            with self._room:
                self._pending_output -= len(event.data) + LINE_COST
                self._pending_lines -= 1
                self._room.notify_all()
        return event
