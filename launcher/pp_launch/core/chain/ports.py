"""What the chain core needs from the outside world: events in, a backend to act through.

Backends (Docker, child processes, the test fake) push events into an inbox from their own threads;
the core consumes them on one thread. Signal handlers push `StopRequested` too, which is why the inbox
must be safe to call from a signal handler (queue.SimpleQueue is).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.lines import Line


@dataclass(frozen=True)
class StageOutput:
    stage: int
    stream: Literal["stdout", "stderr"]
    data: bytes
    continued: bool = False  # a later piece of an over-long line: never an announcement
    partial: bool = False  # a piece of a line longer than the line limit (the first piece included)

    @classmethod
    def of(cls, stage: int, stream: Literal["stdout", "stderr"], line: Line) -> StageOutput:
        return cls(stage, stream, line.data, line.continued, not line.complete or line.continued)


@dataclass(frozen=True)
class StageGone:
    """The stage's container (or process) is gone: exited and, for containers, removed by the engine."""

    stage: int
    exit_code: int | None
    detail: str = ""


@dataclass(frozen=True)
class StopRequested:
    signum: int


ChainEvent = StageOutput | StageGone | StopRequested
Sink = Callable[[ChainEvent], None]


class Inbox(Protocol):
    dropped_bytes: int  # stage output dropped while stopping
    dropped_lines: int

    def put(self, event: ChainEvent) -> None: ...

    def get(self, timeout: float) -> ChainEvent | None:
        """The next event, or None when `timeout` seconds pass without one."""
        ...

    def stop_holding_back(self) -> None:
        """Teardown has begun: output beyond the bound is dropped from now on instead of holding the stage
        back, so no reader stops draining the engine (which would hold up the containers' exits)."""
        ...


_WAKE: Any = object()
LINE_COST = 160  # bytes a waiting line costs beyond its payload: the event, its bytes object, the queue's node
TAIL_LINES = 20  # while stopping, each stage's last lines are kept whatever is dropped before them


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
        if isinstance(event, StopRequested) or (self._dropping and isinstance(event, StageGone)):
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


class StageBackend(Protocol):
    """Where stages run. Every method treats "no such container/process" as already done."""

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        """Create the stage (not started) and return its reference (container id, pid...)."""
        ...

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        """Attach output, register the wait for its end, then start: no line and no exit is lost."""
        ...

    def signal(self, ref: str, signum: int) -> None: ...

    def kill(self, ref: str) -> None:
        """SIGKILL through the engine (never only to a client process)."""
        ...

    def remove(self, ref: str) -> None:
        """Force-remove a stage that may never have started (auto-remove only fires after a start)."""
        ...

    def leftovers(self, run_id: str) -> list[str]:
        """References (engine ids) of anything of this run that still exists, asked of the engine by label."""
        ...

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        """For a stage that exists already (adopted): register the wait for its end, as start() does."""
        ...

    def tearing_down(self) -> None:
        """Teardown has begun: output may be discarded unread-as-lines, and an exit need not wait for the last
        lines before it (they are no longer shown in full anyway)."""
        ...

    def hand_over(self, ref: str) -> None:
        """A detached run is up: the stage's stdin stops being the launcher's lifeline (HANDED_OVER)."""
        ...


@runtime_checkable
class HandoffBackend(StageBackend, Protocol):
    """A backend whose stages can all start at once and get their hand-off later on stdin (issue 13)."""

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        """Create the stage under the hand-off entry (core/chain/handoff.py): it waits for its peers on stdin,
        then execs the image's own entrypoint and command."""
        ...

    def deliver(self, ref: str, data: bytes) -> None:
        """Write hand-off lines on the stage's stdin (the lifeline stays open)."""
        ...


# Written on a stage's stdin lifeline when its detached run is handed over: from then on the end of stdin
# (the launcher exiting) no longer means "stop". The built-in stage entry honours it.
HANDED_OVER = b"PP_DETACHED\n"
