"""What the chain core needs from the outside world: events in, a backend to act through.

Backends (Docker, child processes, the test fake) push events into an inbox from their own threads;
the core consumes them on one thread. Signal handlers push `StopRequested` too, which is why the inbox
must be safe to call from a signal handler (queue.SimpleQueue is).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from .plan import StageSpec


@dataclass(frozen=True)
class StageOutput:
    stage: int
    stream: Literal["stdout", "stderr"]
    data: bytes
    continued: bool = False  # a later piece of an over-long line: never an announcement


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
    def put(self, event: ChainEvent) -> None: ...

    def get(self, timeout: float) -> ChainEvent | None:
        """The next event, or None when `timeout` seconds pass without one."""
        ...


class QueueInbox:
    """The real inbox. SimpleQueue.put is reentrant, so a signal handler may call it."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[ChainEvent] = queue.SimpleQueue()

    def put(self, event: ChainEvent) -> None:
        self._q.put(event)

    def get(self, timeout: float) -> ChainEvent | None:
        try:
            return self._q.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None


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
        """Names of anything of this run that still exists, asked of the engine by label."""
        ...
