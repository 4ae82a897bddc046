"""Fakes at the I/O boundary of the chain core: a scripted backend, a clock, an inbox that advances it."""

from __future__ import annotations

import collections
import hashlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pp_launch.core import events
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import ChainEvent, Sink, StageGone, StageOutput
from pp_launch.core.errors import EngineError, EngineLost, NameInUse
from pp_launch.core.lines import LineSplitter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeInbox:
    """Events are delivered in order; waiting on an empty inbox advances the fake clock by the timeout."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self.holding_back = True
        self.q: collections.deque[ChainEvent] = collections.deque()
        self.scheduled: list[tuple[float, ChainEvent]] = []

    def put(self, event: ChainEvent) -> None:
        self.q.append(event)

    def stop_holding_back(self) -> None:
        self.holding_back = False

    def at(self, when: float, event: ChainEvent) -> None:
        self.scheduled.append((when, event))

    def get(self, timeout: float) -> ChainEvent | None:
        if not self.q:
            due = sorted((t, i) for i, (t, _) in enumerate(self.scheduled) if t <= self.clock.now + timeout)
            if due:
                t, i = due[0]
                self.clock.now = max(self.clock.now, t)
                return self.scheduled.pop(i)[1]
            self.clock.now += max(timeout, 0.0)
            return None
        return self.q.popleft()


def node_id(k: int) -> str:
    return hashlib.sha256(f"stage-{k}".encode()).hexdigest()


@dataclass
class StageScript:
    announce: bool = True
    line: str | None = None  # printed in place of the real announcement
    fail_create: bool = False
    fail_start: bool = False
    ignore_sigterm: bool = False
    exit_code_on_start: int | None = None  # exits right after starting (after its announcement, if any)
    exit_at: tuple[float, int] | None = None  # (fake time, code): exits then, and the engine removes it


@dataclass
class FakeBackend:
    scripts: Mapping[int, StageScript] = field(default_factory=dict)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    envs: dict[int, dict[str, str]] = field(default_factory=dict)
    existing: dict[str, int] = field(default_factory=dict)  # ref -> stage, what the "engine" holds
    foreign: set[str] = field(default_factory=set)  # names held by containers that are not ours
    refuse_signal: set[int] = field(default_factory=set)  # stages whose signal the engine refuses
    lost: bool = False  # the engine stopped answering: every call raises EngineLost
    stuck: set[str] = field(default_factory=set)  # refs the engine cannot remove
    sinks: dict[str, tuple[int, Sink]] = field(default_factory=dict)
    inbox: FakeInbox | None = None

    def script(self, k: int) -> StageScript:
        return self.scripts.get(k, StageScript())

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        self.calls.append(("create", spec.index))
        if self.script(spec.index).fail_create:
            raise EngineError(f"create refused for {spec.name}")
        if spec.name in self.foreign:
            raise NameInUse(f"container name {spec.name} is already in use")
        self.envs[spec.index] = dict(env)
        self.existing[spec.name] = spec.index
        return spec.name

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        self.calls.append(("start", stage))
        s = self.script(stage)
        if s.fail_start:
            raise EngineError('could not select device driver "" with capabilities: [[gpu]]')
        self.sinks[ref] = (stage, sink)
        sink(StageOutput(stage, "stdout", f"stage {stage} booting".encode()))
        if s.line is not None:  # framed as the real backends frame it: lines over the limit come in pieces
            for line in LineSplitter().feed(s.line.encode() + b"\n"):
                sink(StageOutput.of(stage, "stdout", line))
        elif s.announce:
            sink(StageOutput(stage, "stdout", f"PP_GPU_NODE_ADDR {node_id(stage)} 127.0.0.1:{7000 + stage}".encode()))
        if s.exit_code_on_start is not None:
            self._gone(ref, s.exit_code_on_start)
        if s.exit_at is not None and self.inbox is not None:
            when, code = s.exit_at
            del self.existing[ref]
            self.inbox.at(when, StageGone(stage, code))

    def _gone(self, ref: str, code: int) -> None:
        if ref in self.existing:
            del self.existing[ref]
            stage, sink = self.sinks[ref]
            sink(StageGone(stage, code))

    def _check(self) -> None:
        if self.lost:
            raise EngineLost("the Docker engine at unix:///fake.sock stopped (its socket refuses connections)")

    def signal(self, ref: str, signum: int) -> None:
        self.calls.append(("signal", self.sinks.get(ref, (None,))[0], signum))
        self._check()
        if self.sinks.get(ref, (None,))[0] in self.refuse_signal:
            raise EngineError(f"cannot signal container {ref}: permission denied")
        if ref in self.sinks and not self.script(self.sinks[ref][0]).ignore_sigterm:
            self._gone(ref, 0)

    def kill(self, ref: str) -> None:
        self.calls.append(("kill", self.sinks.get(ref, (None,))[0]))
        self._check()
        self._gone(ref, 128 + signal.SIGKILL)

    def remove(self, ref: str) -> None:
        self.calls.append(("remove", ref))
        assert ref not in self.foreign, f"removed {ref}, a container that is not ours"
        self._check()
        if ref in self.stuck:
            return
        if ref in self.sinks:
            self._gone(ref, 137)
        self.existing.pop(ref, None)

    def leftovers(self, run_id: str) -> list[str]:
        self._check()
        return sorted(self.existing)

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        self.calls.append(("watch", stage))
        self.sinks[ref] = (stage, sink)

    def tearing_down(self) -> None:
        self.calls.append(("tearing_down",))

    def close(self, timeout: float = 5.0) -> None:
        self.calls.append(("close",))

    def hand_over(self, ref: str) -> None:
        self.calls.append(("hand_over", self.sinks[ref][0]))


@dataclass
class RecordingReporter:
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lines: list[tuple[int, str, str]] = field(default_factory=list)
    states: list[tuple[int, str]] = field(default_factory=list)

    typed: list[events.Event] = field(default_factory=list)

    def event(self, event: events.Event) -> None:
        self.typed.append(event)
        self.events.append((event.NAME, event.fields()))  # as --json shows them

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        self.lines.append((stage, stream, text))

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        self.states.append((stage, state.value))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [f for (n, f) in self.events if n == name]


@dataclass
class FakeHandoffBackend(FakeBackend):
    """A backend that brings every stage up at once: create_waiting makes a stage that announces only
    once its hand-off arrives (deliver); a plain create (--handoff stdin) announces at once."""

    waiting: set[str] = field(default_factory=set)
    delivered: dict[int, list[str]] = field(default_factory=dict)

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        ref = self.create(spec, env)
        self.calls[-1] = ("create_waiting", spec.index)
        self.waiting.add(ref)
        return ref

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        if ref not in self.waiting:
            return super().start(ref, stage, sink)
        self.calls.append(("start", stage))
        self.sinks[ref] = (stage, sink)

    def deliver(self, ref: str, data: bytes) -> None:
        stage, sink = self.sinks[ref]
        lines = data.decode().splitlines()
        self.calls.append(("deliver", stage))
        self.delivered[stage] = lines
        if ref in self.waiting:  # the entry: NAME=value lines, then DONE, then the worker starts
            assert lines[-1] == "PP_HANDOFF_DONE"
            self.envs[stage].update(dict(line.split("=", 1) for line in lines[:-1]))
            self.waiting.discard(ref)
            super().start(ref, stage, sink)
            self.calls.pop()  # that start was the worker's exec, not a second container start
