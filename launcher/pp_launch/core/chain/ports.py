"""What the chain core needs from the outside world: events in, a backend to act through.

Backends (Docker, child processes, the test fake) push events into an inbox from their own threads;
the core consumes them on one thread. Signal handlers push `StopRequested` too, which is why the inbox
must be safe to call from a signal handler (adapters/inbox.py's is). Time and threads come through `Runtime`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    by: str = ""  # who asked, when not a signal to this process (`pp-launch down`, through the run's guard)


@dataclass(frozen=True)
class StageFault:
    """Something outside the stage's own exit failed it: a critical GPU error (an Xid) on one of its GPUs."""

    stage: int
    message: str


@dataclass(frozen=True)
class PlaceLost:
    """The run lost what it cannot go on without, outside any stage (its guard on an engine, and no new one): the
    chain ends, exit 1, saying `message`."""

    message: str


ChainEvent = StageOutput | StageGone | StopRequested | StageFault | PlaceLost
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


TAIL_LINES = 20  # while stopping, each stage's last lines are kept whatever is dropped before them (the inbox)


class Runtime(Protocol):
    """Time and concurrency, from outside the core (adapters/runtime.py; tests give a fake clock)."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def run_all(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        """Every call at once; returns once every one has returned (nothing left running): each call's result, or
        the exception it raised, in the order given."""
        ...


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
        """References (engine ids) of what this backend created for the run that still exists, asked of the
        engine: never a container that only carries the run's labels."""
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

    def close(self, timeout: float = 5.0) -> None:
        """The teardown is over: every thread this backend started has ended, waited for at most `timeout`
        seconds (a lost engine's waits are daemons and end with the process)."""
        ...


@runtime_checkable
class HandoffBackend(StageBackend, Protocol):
    """A backend whose stages can all start at once and get their hand-off later on stdin."""

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
