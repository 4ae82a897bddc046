"""The chain scope: start every stage, hand each one its peers, supervise, and tear everything down.

In the spirit of a Trio nursery: the scope records every stage the moment its creation is attempted,
and every way out of `run()` (all stages done, a stage failing, a signal, a bug) goes through the same
teardown with its own budget. Signals never interrupt bookkeeping: a handler only puts `StopRequested`
into the inbox, and the scope acts on it between events.

Pure: all I/O goes through the backend port and the reporter; time and threads come from the Runtime port.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pp_launch.core import errors, events, stage_env
from pp_launch.core.announce import PREFIX, AnnouncementError, StageAnnouncement, parse_line
from pp_launch.core.chain import handoff, rendezvous
from pp_launch.core.chain.phases import Happening, Phase, Row, decide
from pp_launch.core.chain.phases import exit_code as concrete
from pp_launch.core.chain.plan import ChainPlan, StageSpec
from pp_launch.core.chain.ports import TAIL_LINES as KEPT_WHILE_STOPPING
from pp_launch.core.chain.ports import (
    ChainEvent,
    HandoffBackend,
    Inbox,
    PlaceLost,
    Runtime,
    StageBackend,
    StageFault,
    StageGone,
    StageOutput,
    StopRequested,
)
from pp_launch.core.chain.teardown import Teardown
from pp_launch.core.events import RosterEntry
from pp_launch.core.lines import count, display

TAIL_LINES = 10


class Reporter(Protocol):
    """Where the scope says what happens: events (docs/formats.md), stage log lines, status for a live view."""

    def event(self, event: events.Event) -> None: ...

    def stage_line(self, stage: int, stream: str, text: str) -> None: ...

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None: ...


class RosterIncomplete(errors.PpLaunchError):
    def __init__(self, missing: list[int]) -> None:
        super().__init__(f"stages not announced: {', '.join(map(str, missing))}")
        self.missing = missing


class DuplicateNodeId(errors.PpLaunchError):
    """Two stages announced one node id: a ring of N stages would have N-1 nodes, and a peer would be ambiguous."""

    def __init__(self, first: int, second: int, node_id_hex: str) -> None:
        super().__init__(
            f"stages {first} and {second} announced the same node id {node_id_hex[:8]}… ({node_id_hex}); "
            "every stage must be a node of its own (is one key or state directory shared between stages?)"
        )
        self.stages = (first, second)
        self.node_id_hex = node_id_hex


def resolve_roster(announcements: Mapping[int, StageAnnouncement | None], num_stages: int) -> list[RosterEntry]:
    """Every stage's announcement in stage order; RosterIncomplete lists the missing stages, ascending;
    DuplicateNodeId names the first two stages that announced one node id."""
    missing = [k for k in range(num_stages) if announcements.get(k) is None]
    if missing:
        raise RosterIncomplete(missing)
    seen: dict[str, int] = {}
    for k in range(num_stages):
        node = announcements[k].node_id_hex  # type: ignore[union-attr]
        if node in seen:
            raise DuplicateNodeId(seen[node], k, node)
        seen[node] = k
    return [
        RosterEntry(stage_index=k, node_id_hex=a.node_id_hex, node_id_short=a.node_id_short)
        for k in range(num_stages)
        if (a := announcements[k]) is not None
    ]


@dataclass
class _Stage:
    spec: StageSpec
    ref: str | None = None  # the engine's id for our create: a container is ours only by it
    started_at: float = 0.0
    announcement: StageAnnouncement | None = None
    state: events.StageState | None = None  # moved only through events.STAGE_TRANSITIONS (ChainScope._move)
    exit_code: int | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    # What the scope decides on, read from the state alone.
    @property
    def attempted(self) -> bool:
        return self.state is not None

    @property
    def started(self) -> bool:
        return self.state in events.STARTED or self.state is events.StageState.GONE

    @property
    def gone(self) -> bool:
        return self.state in events.ENDED

    @property
    def running(self) -> bool:
        return self.state in events.STARTED


class QuietReporter:
    """For adopted teardowns (`down`, the watchdog): they report through their own messages."""

    def event(self, event: events.Event) -> None:
        pass

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        pass

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        pass


@dataclass(frozen=True)
class Found:
    """A container of a run that already exists (found by its run label): what `down` and the watchdog adopt."""

    ref: str  # the engine's id
    name: str
    running: bool


@dataclass(frozen=True)
class ChainOutcome:
    exit_code: int
    reason: str  # completed | stage_failed | signal | detached | error
    message: str = ""
    failed_stage: int | None = None
    removed: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    roster: tuple[RosterEntry, ...] = ()


@dataclass(frozen=True)
class _End:
    exit_code: int
    reason: str
    message: str = ""
    stage: int | None = None


class ChainScope:
    def __init__(
        self,
        plan: ChainPlan,
        backend: StageBackend,
        inbox: Inbox,
        reporter: Reporter,
        runtime: Runtime,
        detach: bool = False,
        kill_wait: float = 15.0,
        passthrough: Callable[[str, bytes], None] | None = None,
    ) -> None:
        """passthrough: the plan's one stage runs in the foreground, as `docker run` runs it (`pp-gpu-node`, the
        testing kit's StageContainer): its output passed through as it comes and never read, no address awaited, its
        exit code the run's, a stop's signal passed on to it (each later one too) and the one teardown after the
        grace. An engine that refuses its create or start raises that error (as `docker run` reports it) once what
        was created is gone."""
        self.plan = plan
        self.backend = backend
        self.inbox = inbox
        self.reporter = reporter
        self.runtime = runtime
        self.clock = runtime.now
        self.detach = detach
        self.kill_wait = kill_wait
        self.stages = [_Stage(spec) for spec in plan.stages]
        self._by_index = {st.spec.index: st for st in self.stages}  # events name a stage by its index
        self._phase = Phase.STARTING  # changed only by the table (core/chain/phases.py)
        self._roster: list[RosterEntry] = []
        self._td = Teardown(backend, runtime, plan.grace, kill_wait)  # its errors gathered, typed
        self._places_lost: list[str] = []  # what the backend said the run lost (PlaceLost), while running or stopping
        self.passthrough = passthrough
        self._signum: int = signal.SIGTERM  # what the teardown sends: a foreground stage gets the stop's own signal

    @classmethod
    def adopt(
        cls,
        run_id: str,
        found: list[Found],
        backend: StageBackend,
        inbox: Inbox,
        reporter: Reporter,
        grace: float,
        runtime: Runtime,
        kill_wait: float = 15.0,
    ) -> ChainScope:
        """A scope over containers that exist already, so that `down` and the watchdog tear a run down with the
        chain's own teardown: each running one's removal is waited on, every one is known by its engine id."""
        specs = tuple(StageSpec(index=k, name=f.name, image="", env={}, labels={}) for k, f in enumerate(found))
        plan = ChainPlan(run_id=run_id, stages=specs, grace=grace)
        scope = cls(plan, backend, inbox, reporter, runtime, detach=False, kill_wait=kill_wait)
        for st, f in zip(scope.stages, found, strict=True):
            st.ref = f.ref
            scope._move(st, events.StageInput.ADOPT_RUNNING if f.running else events.StageInput.ADOPT_STOPPED)
            if f.running:
                backend.watch(f.ref, st.spec.index, inbox.put)
        return scope

    def stop(self, reason: str = "down") -> ChainOutcome:
        """Tear down what the scope holds (the adopted containers), exactly as a chain's end does."""
        row = self._row(Happening.TAKEN_DOWN)
        removed, orphans, exit_code = self._teardown(reason, errors.EXIT_OK if row.exit_code is None else row.exit_code)
        message = f"{len(removed)} containers stopped and removed"
        if self._td.errors:
            message += "; teardown errors: " + "; ".join(map(str, self._td.errors))
        return ChainOutcome(exit_code, reason, message, None, removed, orphans)

    # -------------------------------------------------------------------------------- public API
    def fail_stage(self, stage: int, message: str) -> None:
        """From any thread: stage `stage` failed for a reason outside its exit (its GPU faulted); only enqueues."""
        self.inbox.put(StageFault(stage, message))

    def request_stop(self, signum: int, by: str = "") -> None:
        """Safe from a signal handler: only enqueues. by: who asked, when not a signal to this process."""
        self.inbox.put(StopRequested(signum, by))

    def lose_place(self, message: str) -> None:
        """From any thread: the run lost what it cannot go on without (PlaceLost); only enqueues."""
        self.inbox.put(PlaceLost(message))

    def run(self) -> ChainOutcome:
        try:
            if self.passthrough is not None and self._phase is Phase.STARTING:
                self._bring_up_foreground()
            end = (self._bring_up() if self._phase is Phase.STARTING else None) or self._supervise()
        except BaseException as exc:
            starting = self.passthrough is not None and self._phase is Phase.STARTING
            refused = starting and isinstance(exc, errors.PpLaunchError)
            row = self._row(Happening.NOT_STARTED_FOREGROUND if refused else Happening.BUG)
            own = exc.exit_code if isinstance(exc, errors.PpLaunchError) else errors.EXIT_FAILURE
            code = errors.EXIT_FAILURE if row.exit_code is None else concrete(row.exit_code, own=own)
            self._teardown(row.ends or "error", code)  # a bug while stopping: the stop's code
            raise
        if end.reason == "detached":
            return ChainOutcome(0, "detached", end.message, roster=tuple(self._roster))
        removed, orphans, exit_code = self._teardown(end.reason, end.exit_code, end.message)
        message = self._with_lost(end.message)
        if self._td.lost is None and self._td.errors:
            message += "; teardown errors: " + "; ".join(map(str, self._td.errors))
        if dropped := self.dropped_note():
            message += f"; {dropped}"
        reason = self._lost_place(end.reason)
        return ChainOutcome(exit_code, reason, message, end.stage, removed, orphans, tuple(self._roster))

    def _lost_place(self, reason: str) -> str:
        """A chain whose engine the teardown found gone lost its place (`place_lost`), however its stages ended: an
        engine that stops (systemctl stop, restart) stops them first, each exiting as it does on SIGTERM."""
        lost = self._td.lost is not None or bool(self._places_lost)
        return "place_lost" if lost and reason in ("completed", "stage_failed") else reason

    def _with_lost(self, message: str) -> str:
        """The chain's end, and the engine the teardown found gone, with what may be left and who removes it."""
        if self._td.lost is None:
            return message
        run = self.plan.run_id
        return (
            f"{message}; then {self._td.lost}. Its containers of run {run} may still be there: this run's watchdog "
            f"removes them when the engine is back (it keeps trying for a while), or run 'pp-launch down {run}' "
            "(or 'pp-launch gc') then"
        )

    # -------------------------------------------------------------------------------- bring-up
    def _bring_up_foreground(self) -> None:
        """The one stage created and started, then nothing to await (`passthrough`); the engine's refusal raises."""
        st = self.stages[0]
        self._move(st, events.StageInput.CREATE)
        st.ref = self.backend.create(st.spec, dict(st.spec.env))
        self._move(st, events.StageInput.CREATED)
        self.backend.start(st.ref, st.spec.index, self.inbox.put)
        self._move(st, events.StageInput.START)
        self._row(Happening.STARTED_FOREGROUND)
        spec = st.spec
        self.reporter.event(
            events.StageStarted(stage=spec.index, container=spec.name, image=spec.image, gpus=spec.gpus)
        )

    def _bring_up(self) -> _End | None:
        image = self.plan.stages[0].image if self.stages else ""
        self.reporter.event(events.ChainStarting(stages=len(self.stages), image=image))
        end = self._bring_up_parallel() if self._parallel() else self._bring_up_in_turn()
        if end is not None:
            return end
        try:
            self._roster = resolve_roster({s.spec.index: s.announcement for s in self.stages}, len(self.stages))
        except DuplicateNodeId as exc:
            return self._end(Happening.BAD_ANNOUNCEMENT, str(exc), exc.stages[1])
        self.reporter.event(events.StageRoster(drive_seq=1, stages=tuple(self._roster)))
        for st in self.stages:
            if not st.gone:
                self._move(st, events.StageInput.ROSTER)
        if not self.detach:
            return self._end(Happening.ALL_ANNOUNCED)
        for st in self.stages:
            if st.ref is not None and not st.gone:
                self.backend.hand_over(st.ref)
        up = f"run {self.plan.run_id} is up with {count(len(self.stages), 'stage')}"
        return self._end(Happening.ALL_ANNOUNCED_DETACH, up)

    def _parallel(self) -> bool:
        """Every container at once where the backend can hand off later and stdin is the lifeline."""
        lifeline = all(s.env.get(stage_env.LIFELINE) == "stdin" for s in self.plan.stages)
        return self.plan.parallel and len(self.stages) > 1 and lifeline and isinstance(self.backend, HandoffBackend)

    def _bring_up_in_turn(self) -> _End | None:
        first: StageAnnouncement | None = None
        prev: StageAnnouncement | None = None
        for st in self.stages:
            end = self._start_stage(st, prev, first)
            if end is not None:
                return end
            prev = st.announcement
            first = first or prev
        return None

    def _bring_up_parallel(self) -> _End | None:
        """Create and start every stage at once; then hand each stage its peers the moment they are known:
        `env`, stage k >= 1's entry gets PEER_*/FIRST_PEER_* once stage k-1 announced and execs the worker (stage 0
        has no peers: it runs its own command from the start, as every stage of a --rendezvous run does);
        `stdin`, the workers run from the start and stage k >= 1 reads PP_PEER/PP_FIRST_PEER lines."""
        backend = self.backend
        assert isinstance(backend, HandoffBackend)
        waiting = self.plan.handoff == "env" and not self.plan.rendezvous
        for st in self.stages:
            self._move(st, events.StageInput.CREATE)

        def create(st: _Stage) -> str:
            env = dict(st.spec.env)
            if waiting and st.spec.index > 0:
                return backend.create_waiting(st.spec, env)
            return backend.create(st.spec, env)

        def start(st: _Stage) -> None:
            assert st.ref is not None
            st.started_at = self.clock()
            backend.start(st.ref, st.spec.index, self.inbox.put)

        end = self._all_at_once(events.StageInput.CREATED, self.stages, create)
        if end is None:
            end = self._all_at_once(events.StageInput.START, [st for st in self.stages if st.ref is not None], start)
        if end is None:
            for st in self.stages:
                self._meet(st)
        return end or self._hand_off_as_they_announce(waiting)

    def _all_at_once(self, done: events.StageInput, todo: list[_Stage], step: Callable[[_Stage], Any]) -> _End | None:
        """One engine step (create, or start) for every stage at once; each stage that made it moves on (`done`),
        the first that failed ends the bring-up. A bug is raised once every stage's result is recorded (the
        teardown then removes every container created so far)."""
        results = self.runtime.run_all([lambda st=st: step(st) for st in todo])  # type: ignore[misc]
        failed: tuple[_Stage, errors.PpLaunchError] | None = None
        for st, result in zip(todo, results, strict=True):
            if isinstance(result, errors.PpLaunchError):
                failed = failed or (st, result)
            elif not isinstance(result, BaseException):
                if done is events.StageInput.CREATED:
                    st.ref = result
                self._move(st, done)
        bugs = [r for r in results if isinstance(r, BaseException) and not isinstance(r, errors.PpLaunchError)]
        if bugs:
            raise bugs[0]
        if done is events.StageInput.START:
            for st in (s for s in self.stages if s.started):
                spec = st.spec
                self.reporter.event(
                    events.StageStarted(stage=spec.index, container=spec.name, image=spec.image, gpus=spec.gpus)
                )
        if failed is None:
            return None
        bad, why = failed
        return self._not_started(bad, why)

    def _hand_off_as_they_announce(self, waiting: bool) -> _End | None:
        """Stage by stage: wait for its announcement (its own --addr-timeout), hand it to the next stage."""
        first: StageAnnouncement | None = None
        prev: StageAnnouncement | None = None
        for k, st in enumerate(self.stages):
            end = self._pump(self._announced(st), st.started_at + self.plan.addr_timeout)
            if end is not None:
                return end
            if st.announcement is None:
                return self._not_announced(st)
            prev = st.announcement
            first = first or prev
            if k + 1 < len(self.stages) and not self.plan.rendezvous:  # a rendezvous run's stages need no peers
                after = self.stages[k + 1].spec
                data = (
                    handoff.env_lines(prev, first, after.first_peer_env(first))
                    if waiting
                    else handoff.peer_lines(prev, first)
                )
                end = self._deliver(self.stages[k + 1], data, restart_clock=waiting)
                if end is not None:
                    return end
        return None

    @staticmethod
    def _announced(st: _Stage) -> Callable[[], bool]:
        return lambda: st.announcement is not None

    def _deliver(self, st: _Stage, data: bytes, restart_clock: bool = True) -> _End | None:
        backend = self.backend
        assert isinstance(backend, HandoffBackend) and st.ref is not None
        if st.gone:
            return None  # its exit is handled as any exit
        try:
            backend.deliver(st.ref, data)
        except (OSError, errors.PpLaunchError) as exc:
            k = st.spec.index
            return self._end(Happening.NOT_STARTED, f"stage {k} ({st.spec.where()}): hand-off failed: {exc}", k)
        if restart_clock:  # its worker starts now: --addr-timeout counts from here
            st.started_at = self.clock()
        return None

    def _not_announced(self, st: _Stage) -> _End:
        k = st.spec.index
        missing = ", ".join(str(s.spec.index) for s in self.stages if s.announcement is None)
        end = self._end(
            Happening.NOT_ANNOUNCED,
            f"stage {k} ({st.spec.where()}) did not announce its address within {self.plan.addr_timeout:g} s "
            f"(--addr-timeout); stages not announced: {missing}" + self._tail(st),
            k,
        )
        assert end is not None  # the table ends a chain that is coming up here
        return end

    def _start_stage(self, st: _Stage, prev: StageAnnouncement | None, first: StageAnnouncement | None) -> _End | None:
        spec, k = st.spec.with_first_peer(first), st.spec.index  # in turn: stage 0's address is known at create
        self._move(st, events.StageInput.CREATE)
        env = spec.launch_env(prev, first)
        try:
            st.ref = self.backend.create(spec, env)
            self._move(st, events.StageInput.CREATED)
            st.started_at = self.clock()
            self.backend.start(st.ref, k, self.inbox.put)
            self._move(st, events.StageInput.START)
        except errors.PpLaunchError as exc:
            return self._not_started(st, exc)
        self.reporter.event(events.StageStarted(stage=k, container=spec.name, image=spec.image, gpus=spec.gpus))
        self._meet(st)
        deadline = st.started_at + self.plan.addr_timeout
        end = self._pump(lambda: st.announcement is not None, deadline)
        if end is not None:
            return end
        if st.announcement is None:
            return self._not_announced(st)
        return None

    def _supervise(self) -> _End:
        end = self._pump(lambda: all(s.gone for s in self.stages), None)
        if end is not None:
            return end
        end = self._end(Happening.ALL_EXITED, "every stage exited 0")
        assert end is not None  # the table ends a running chain here
        return end

    # -------------------------------------------------------------------------------- the table
    def _row(self, happening: Happening) -> Row:
        """The table's row for what happened in the current phase; the phase is the row's from now on."""
        row = decide(self._phase, happening)
        self._phase = row.then
        return row

    def _end(
        self,
        happening: Happening,
        message: str = "",
        stage: int | None = None,
        signum: int | None = None,
        own: int | None = None,
    ) -> _End | None:
        """The chain's end when the table's row for `happening` ends it (its reason and exit code), else None."""
        row = self._row(happening)
        if row.forward and signum is not None:
            for st in (s for s in self.stages if s.running):
                self._td.call(f"signal {signum} to stage {st.spec.index}", self.backend.signal, st.ref, signum)
        if row.ends is None or row.exit_code is None:
            return None
        return _End(concrete(row.exit_code, signum, own), row.ends, message, stage)

    def _not_started(self, st: _Stage, why: errors.PpLaunchError) -> _End | None:
        """A stage that could not be created or started. Before any stage of the chain started, the error's own
        exit code stands (a name held by someone else is a configuration error: exit 2)."""
        first = not any(s.started for s in self.stages)
        row = self._row(Happening.NOT_STARTED_FIRST if first else Happening.NOT_STARTED)
        if row.ends is None or row.exit_code is None:
            return None
        k = st.spec.index
        message = f"stage {k} ({st.spec.where()}) could not start: {why}"
        return _End(concrete(row.exit_code, own=why.exit_code), row.ends, message, k)

    @property
    def _stopping(self) -> bool:
        return self._phase in (Phase.STOPPING, Phase.HURRYING)

    # -------------------------------------------------------------------------------- events
    def _pump(self, done: Callable[[], bool], deadline: float | None) -> _End | None:
        """Handle events until `done()`, the deadline, or an event that ends the chain."""
        while not done():
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - self.clock())
                if wait <= 0:
                    return None
            event = self.inbox.get(wait)
            if event is not None:
                end = self._handle(event)
                if end is not None:
                    return end
        return None

    def _handle(self, event: ChainEvent) -> _End | None:
        if isinstance(event, StopRequested):
            return self._on_stop(event.signum, event.by)
        if isinstance(event, StageFault):  # the stage failed by its GPU: the chain ends as when a stage fails
            return self._end(Happening.GPU_FAULT, event.message, event.stage)
        if isinstance(event, PlaceLost):
            self._places_lost.append(event.message)
            return self._end(Happening.PLACE_LOST, event.message)
        st = self._by_index[event.stage]
        if isinstance(event, StageOutput):
            return self._on_output(st, event)
        return self._on_gone(st, event)

    def _on_stop(self, signum: int, by: str = "") -> _End | None:
        """The first stop ends the chain; one while stopping hurries the teardown (the table's HURRYING). A foreground
        stage is sent the first stop's own signal, and each later one is passed on to it (the table's `forward`)."""
        name = by or (signal.Signals(signum).name if signum in signal.valid_signals() else str(signum))
        if self.passthrough is None:
            return self._end(Happening.STOP, f"stopped by {name}", signum=signum)
        if not self._stopping:
            self._signum = signum
        return self._end(Happening.STOP_FOREGROUND, f"stopped by {name}", signum=signum)

    def _on_output(self, st: _Stage, event: StageOutput) -> _End | None:
        if self.passthrough is not None:  # the foreground stage's bytes as they come; nothing is read in them
            self.passthrough(event.stream, event.data)
            return None
        text = display(event.data)
        st.tail.append(text)
        self.reporter.stage_line(st.spec.index, event.stream, text)
        if event.stream != "stdout" or event.continued or st.announcement is not None or self._stopping:
            return None
        if st.state is not events.StageState.STARTING:  # only a started stage awaits its announcement: a line read
            return None  # after the teardown (the chain ended) is shown, never taken
        if event.partial:  # longer than the line limit: never handed on, even cut to its first piece
            if event.data.lstrip(b" \t").startswith(PREFIX.encode()):
                k = st.spec.index
                msg = f"stage {k} ({st.spec.where()}): an announcement longer than the line limit was rejected"
                return self._end(Happening.BAD_ANNOUNCEMENT, msg, k)
            return None
        try:
            announcement = parse_line(event.data.decode("utf-8", errors="backslashreplace"))
        except AnnouncementError as exc:
            k = st.spec.index
            return self._end(Happening.BAD_ANNOUNCEMENT, f"stage {k} ({st.spec.where()}): {exc}", k)
        if announcement is not None:
            self._announced_as(st, announcement)
        return None

    def _announced_as(self, st: _Stage, announcement: StageAnnouncement) -> None:
        st.announcement = announcement
        elapsed = round(self.clock() - st.started_at, 3)
        self.reporter.event(
            events.StageAnnounced(
                stage=st.spec.index,
                node_id_hex=announcement.node_id_hex,
                direct=announcement.direct,
                elapsed_s=elapsed,
            )
        )
        self._move(st, events.StageInput.ANNOUNCE, f"{announcement.direct} in {elapsed:.2f} s")

    def _meet(self, st: _Stage) -> None:
        """--rendezvous torch: a started stage needs no announcement; it is taken as announced at the master's
        address (core/chain/rendezvous.py), so the roster is the running stages."""
        if self.plan.rendezvous and st.ref is not None and st.announcement is None and not st.gone:
            self._announced_as(st, rendezvous.announced(st.ref, st.spec.env))

    def _on_gone(self, st: _Stage, event: StageGone) -> _End | None:
        if st.gone:
            return None
        st.exit_code = event.exit_code
        k = st.spec.index
        if self.passthrough is not None and event.exit_code is not None:
            happening, message = Happening.EXIT_FOREGROUND, ""
        elif self.passthrough is not None:
            happening = Happening.EXIT_FAILED
            why = event.detail or "the engine gave no exit status"
            message = (
                f"lost track of the stage container {(st.ref or '')[:12]} ({why}); its guard removes it when the "
                "engine answers again"
            )
        elif event.exit_code != 0:
            happening = Happening.EXIT_FAILED
            code = "unknown" if event.exit_code is None else str(event.exit_code)
            detail = f" ({event.detail})" if event.detail else ""
            message = f"stage {k} ({st.spec.where()}) exited with code {code}{detail}" + self._tail(st)
        elif st.announcement is None:
            happening = Happening.EXIT_EARLY
            message = f"stage {k} ({st.spec.where()}) exited with code 0 before announcing its address" + self._tail(st)
        else:
            happening, message = Happening.EXIT_DONE, ""
        row = decide(self._phase, happening)  # what the exit is called; _end below takes the row
        reason = row.stage or events.ExitReason.STOPPED
        self.reporter.event(
            events.StageExited(stage=k, exit_code=event.exit_code, reason=reason, detail=event.detail or None)
        )
        self._move(st, events.StageInput.GONE, f"exit {event.exit_code}")
        return self._end(happening, message, k, own=event.exit_code)

    def _move(self, st: _Stage, inp: events.StageInput, detail: str = "") -> None:
        """Every change of a stage's state goes through the table (events.STAGE_TRANSITIONS)."""
        st.state = events.next_state(st.state, inp)
        self.reporter.stage_state(st.spec.index, st.state, detail)

    @staticmethod
    def _tail(st: _Stage) -> str:
        if not st.tail:
            return "; it printed nothing"
        return "; its last lines:\n" + "\n".join(f"  [stage {st.spec.index}] {line}" for line in st.tail)

    # -------------------------------------------------------------------------------- teardown
    def _drain_output(self) -> None:
        """Every stage line still waiting, and each stage's kept last lines, is shown before the chain says it
        stopped: a stage's result is never lost behind a flood."""
        while (event := self.inbox.get(0)) is not None:
            if isinstance(event, StageOutput):
                self._on_output(self._by_index[event.stage], event)
            elif isinstance(event, PlaceLost):  # found while stopping (a Ray node gone): the chain lost a place
                self._places_lost.append(event.message)

    def dropped_note(self) -> str:
        """What the bound on waiting output dropped while stopping, in words ('' when nothing was)."""
        lines, size = self.inbox.dropped_lines, self.inbox.dropped_bytes
        if not lines:
            return ""
        return (
            f"{lines} line{'s' if lines != 1 else ''} ({size} bytes) of stage output dropped while stopping "
            f"(each stage's last {KEPT_WHILE_STOPPING} lines kept)"
        )

    def _leftovers(self) -> list[str]:
        """What the engine still holds of the run (by label, as ids); when the engine is lost, every stage we
        created and never saw gone: possibly left, said so, never claimed removed."""
        found: list[str] = []
        if self._td.call("asking what is left", lambda: found.extend(self.backend.leftovers(self.plan.run_id))):
            return found
        return [st.ref for st in self.stages if st.ref is not None and not st.gone]

    def _teardown(self, reason: str, exit_code: int, message: str = "") -> tuple[tuple[str, ...], tuple[str, ...], int]:
        """The one teardown (core/chain/teardown.py) over every started stage, events flowing meanwhile; then
        the stages that never started are removed by force, and the engine confirms that nothing is left. The
        exit code is the one the table gave the chain's end; how the teardown ends is the table's too."""
        self.inbox.stop_holding_back()  # stopping never waits behind output
        self.backend.tearing_down()
        self._stop_started(reason)
        self._remove_unstarted()
        orphans = self._leftovers()
        for ref in orphans:
            self._td.call(f"removing {ref[:12]}", self.backend.remove, ref)
        if orphans:
            orphans = self._leftovers()
        removed = tuple(s.spec.name for s in self.stages if s.ref is not None and s.ref not in orphans)
        row = self._row(Happening.TORN_DOWN_UNCLEAN if orphans or self._td.errors else Happening.TORN_DOWN)
        if row.exit_code is not None:
            exit_code = concrete(row.exit_code)  # not a clean teardown: never 0 and never 128+N
        # every thread it started for this run has ended (bounded), so that each stage's output has all come in
        # (its removal is confirmed before the engine has sent the end of its stream); a lost engine's reads and
        # waits never end by themselves: they are not waited for (daemons, they end with the process)
        self.backend.close(0.0 if self._td.lost is not None else 5.0)
        self._drain_output()
        if (lost := self._lost_place(reason)) != reason:
            reason, message = lost, self._with_lost(message)
        self.reporter.event(
            events.ChainStopped(
                reason=events.StopReason(reason),
                exit_code=exit_code,
                removed=removed,
                orphans=tuple(orphans),
                output_dropped_bytes=self.inbox.dropped_bytes if self.inbox.dropped_lines else None,
                output_dropped_lines=self.inbox.dropped_lines or None,
                message=message if message and reason in ("stage_failed", "error", "place_lost") else None,
            )
        )
        return removed, tuple(orphans), exit_code

    def _stop_started(self, reason: str) -> None:
        """SIGTERM to every running stage at once, one shared grace (cut short by a second stop request),
        SIGKILL to those still there, and the engine's word that each is gone."""
        live = [s for s in self.stages if s.running]  # each has its ref
        if not live:
            return
        stopping = events.ChainStopping(reason=events.StopReason(reason), stages=len(live), grace=self.plan.grace)
        self.reporter.event(stopping)
        for st in live:
            self._move(st, events.StageInput.STOP)
        self._td.stop(
            live,
            signum=self._signum,
            ref=lambda st: st.ref or "",
            gone=lambda st: st.gone,
            wait=self._wait,
            on_kill=lambda st: self._move(st, events.StageInput.KILL, "grace over: SIGKILL"),
            hurry=lambda: self._phase is Phase.HURRYING,
            name=lambda st: f"stage {st.spec.index}",
        )

    def _wait(self, done: Callable[[], bool], deadline: float) -> None:
        """The teardown's wait: events keep flowing (exits, last lines, a second stop request)."""
        self._pump(done, deadline)

    def _remove_unstarted(self) -> None:
        """Never started (auto-remove does not apply), or the engine never confirmed: remove by force, by the id
        the engine returned for our create. A create that failed made nothing of ours: a container holding the
        name belongs to someone else and is never touched."""
        for st in self.stages:
            if not st.attempted or st.gone:
                continue
            done = st.ref is None or self._td.call(f"removing stage {st.spec.index}", self.backend.remove, st.ref)
            if not st.started and done:
                self._move(st, events.StageInput.REMOVED, "removed" if st.ref else "never created")
