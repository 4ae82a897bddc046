"""The GPU worker controller: swactor's `GpuWorkerCtl` as a pure state machine. No I/O, no clock of its own.

`handle(input)` returns what to do (spawn, write commands, stop a ring pump, kill) and what happened
(running, failed, rejected, ring faulted or quiesced, stopped, routed). The inputs, outputs and states
carry swactor's names; every (state, input) pair is a row of TRANSITIONS that names its handler and the
states it may lead to, so a test can walk the table and compare it with swactor's controller line by line.

Where this port departs from swactor's controller, each time to close a gap it documents or leaves open, the row
says so with a deviation id (D1...D9); README.md ("The GPU worker controller") lists them with reasons.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pp_launch.core.errors import PpLaunchError
from pp_launch.core.worker import codec as wire


class State(enum.Enum):
    IDLE = "Idle"
    STARTING = "Starting"
    RUNNING = "Running"
    SHUTTING_DOWN = "ShuttingDown"
    CRASHED = "Crashed"
    STOPPED = "Stopped"
    KILLING = "Killing"  # D3: the shutdown overran its timeout, a kill was asked for
    FAILING = "Failing"  # D4/D8/D9: failed while its process lives; reported with the status once it exits


# ---------------------------------------------------------------------------------------------- inputs (WorkerCtlEvent)
@dataclass(frozen=True)
class StartWorker:
    pass


@dataclass(frozen=True)
class ProcessStarted:
    pid: int


@dataclass(frozen=True)
class WorkerReady:
    """Swactor's ctl input, fed by the driver when the worker's own WorkerReady event arrives."""

    generation: int
    pid: int = 0
    ring_helper_abi: int = wire.RING_HELPER_ABI


@dataclass(frozen=True)
class ActorCommand:
    """A command an actor wants sent, issued for `generation`."""

    command: wire.Command
    generation: int


@dataclass(frozen=True)
class StdoutEvent:
    event: wire.Message


@dataclass(frozen=True)
class ProcessExited:
    """`status` is the exit code (128+N for signal N, as the engine reports it). `generation`, when given, says
    whose process it was: an earlier generation's exit is not this one's crash (D5)."""

    status: int
    generation: int | None = None


@dataclass(frozen=True)
class RestartRequested:
    pass


@dataclass(frozen=True)
class ShutdownRequested:
    mode: wire.ShutdownMode = "Graceful"


@dataclass(frozen=True)
class WorkerStopped:
    """Swactor's ctl input, fed by the driver when the worker's WorkerStopped event arrives."""

    generation: int
    reason: str = ""


@dataclass(frozen=True)
class TimeAdvanced:
    """Swactor's `advance_time_ms`: the caller's clock, in seconds."""

    now: float


@dataclass(frozen=True)
class ProtocolBroken:
    """D9: the worker's stdout broke the wire (invalid JSON, unknown type...): the worker is at fault."""

    reason: str


Input = (
    StartWorker
    | ProcessStarted
    | WorkerReady
    | ActorCommand
    | StdoutEvent
    | ProcessExited
    | RestartRequested
    | ShutdownRequested
    | WorkerStopped
    | TimeAdvanced
    | ProtocolBroken
)
INPUTS: tuple[type, ...] = (
    StartWorker,
    ProcessStarted,
    WorkerReady,
    ActorCommand,
    StdoutEvent,
    ProcessExited,
    RestartRequested,
    ShutdownRequested,
    WorkerStopped,
    TimeAdvanced,
    ProtocolBroken,
)


# ---------------------------------------------------------------------------------------------- outputs: commands()
@dataclass(frozen=True)
class SpawnWorker:
    """Swactor's `SpawnProcessActor`."""

    generation: int


@dataclass(frozen=True)
class StopRingPump:
    """Swactor's `StopDriverPump`."""

    ring_id: int


@dataclass(frozen=True)
class KillProcess:
    """D3/D7/D8/D9: the process must go (swactor's controller has no kill)."""

    reason: str


@dataclass(frozen=True)
class WriteCommands:
    """Swactor's `serialized_worker_commands()`, in order."""

    commands: tuple[wire.Command, ...]


# ---------------------------------------------------------------------------------------------- outputs: events()
class Failure(enum.Enum):
    PROCESS_EXITED = "ProcessExited"
    INITIALIZATION_TIMEOUT = "InitializationTimeout"
    WORKER_FATAL = "WorkerFatal"  # D4
    PROTOCOL_FAULT = "ProtocolFault"  # D9
    SHUTDOWN_TIMEOUT = "ShutdownTimeout"  # D3


@dataclass(frozen=True)
class WorkerRunning:
    generation: int
    pid: int


@dataclass(frozen=True)
class WorkerFailed:
    generation: int
    reason: Failure
    exit_status: int | None  # D5: swactor's failure has no status
    detail: str = ""


@dataclass(frozen=True)
class CommandRejected:
    command: wire.Command
    reason: str  # NotRunning | OldGenerationHandle


@dataclass(frozen=True)
class RingFaulted:
    ring_id: int
    generation: int


@dataclass(frozen=True)
class RingQuiesced:
    ring_id: int
    generation: int


@dataclass(frozen=True)
class WorkerStoppedNotice:
    """Swactor's `WorkerCtlOut::WorkerStopped` (echoed)."""

    generation: int
    reason: str


@dataclass(frozen=True)
class TerminalStopped:
    generation: int


class Route(enum.Enum):
    EDGE_ESTABLISHER = "edge_establisher"
    RX_OR_ROLE = "rx_or_role"
    TX_OR_ROLE = "tx_or_role"
    STAGE_CONTROLLER = "stage_controller"
    DRIVER_OR_WORKER_SIDE = "driver_or_worker_side"


@dataclass(frozen=True)
class Routed:
    destination: Route
    event: wire.Message


Output = (
    SpawnWorker
    | WriteCommands
    | StopRingPump
    | KillProcess
    | WorkerRunning
    | WorkerFailed
    | CommandRejected
    | RingFaulted
    | RingQuiesced
    | WorkerStoppedNotice
    | TerminalStopped
    | Routed
)


class IllegalTransition(PpLaunchError):
    """Our side's fault: the caller fed an input the current state does not take."""

    def __init__(self, state: State, inp: object, why: str = "") -> None:
        super().__init__(f"{type(inp).__name__} is not allowed in state {state.value}" + (f": {why}" if why else ""))
        self.state = state
        self.input = inp


# Swactor's `route`: one destination per worker event type. Data, not ifs.
ROUTES: dict[type[wire.Message], Route] = {
    wire.RingInstalled: Route.EDGE_ESTABLISHER,
    wire.RingFault: Route.EDGE_ESTABLISHER,
    wire.RingQuiesced: Route.EDGE_ESTABLISHER,
    wire.ObjectLoaded: Route.RX_OR_ROLE,
    wire.ObjectFailed: Route.RX_OR_ROLE,
    wire.ObjectProduced: Route.TX_OR_ROLE,
    wire.StepCompleted: Route.STAGE_CONTROLLER,
    wire.StepFailed: Route.STAGE_CONTROLLER,
    wire.RoleConfigured: Route.STAGE_CONTROLLER,
    wire.RoleFailed: Route.STAGE_CONTROLLER,
    wire.RingBecameReadable: Route.DRIVER_OR_WORKER_SIDE,
    wire.RingBecameWritable: Route.DRIVER_OR_WORKER_SIDE,
    wire.DeviceObjectReleased: Route.DRIVER_OR_WORKER_SIDE,
    wire.ReleaseFailed: Route.DRIVER_OR_WORKER_SIDE,
    wire.WorkerReady: Route.DRIVER_OR_WORKER_SIDE,
    wire.WorkerFatal: Route.DRIVER_OR_WORKER_SIDE,
    wire.WorkerStopped: Route.DRIVER_OR_WORKER_SIDE,
}

LIVE = frozenset({State.RUNNING, State.SHUTTING_DOWN, State.KILLING, State.FAILING})


@dataclass
class WorkerController:
    arena_ceiling: int
    backend: dict[str, Any] = field(default_factory=lambda: dict(wire.CPU_BACKEND))
    init_timeout: float = 10.0  # swactor's initialization_timeout_ms (10000)
    shutdown_timeout: float = 10.0
    fatal_exit_timeout: float = 5.0
    state: State = State.IDLE
    generation: int = 1
    pid: int | None = None
    now: float = 0.0
    rings: set[int] = field(default_factory=set)  # swactor's installed_rings
    _deadline: float | None = None
    _failure: tuple[Failure, str] | None = None

    def handle(self, inp: Input) -> list[Output]:
        """The row of the table decides: its handler computes the next state on a copy, which is committed only
        when the table allows where it went. An illegal input, or a handler that strays, raises
        IllegalTransition and leaves the controller exactly as it was (as h11 computes, then commits)."""
        row = TRANSITIONS.get((self.state, type(inp)))
        if row is None:
            raise IllegalTransition(self.state, inp)
        trial = dataclasses.replace(self, rings=set(self.rings))
        out = row.handler(trial, inp)
        if trial.state not in row.targets:  # the table is the truth; a handler that strays is our bug
            raise IllegalTransition(self.state, inp, f"it would move to {trial.state.value}, which the table lacks")
        self.__dict__.update(trial.__dict__)
        return out

    # ----------------------------------------------------------------------------------- seed: start, ready
    def _start(self, _inp: StartWorker) -> list[Output]:
        if self.pid is not None:
            raise IllegalTransition(self.state, _inp, "a process of this generation is live (D1)")
        self.state = State.STARTING
        return [SpawnWorker(self.generation)]

    def _process_started(self, inp: ProcessStarted) -> list[Output]:
        self.pid = inp.pid
        self.state = State.STARTING
        self._deadline = self.now + self.init_timeout
        init = wire.InitializeWorker(
            worker_generation=self.generation,
            arena_ceiling=self.arena_ceiling,
            required_ring_helper_abi=wire.RING_HELPER_ABI,
            backend=self.backend,
        )
        return [WriteCommands((init,))]

    def _ready(self, inp: WorkerReady) -> list[Output]:
        if inp.ring_helper_abi != wire.RING_HELPER_ABI:  # D2
            detail = f"UnsupportedHelperAbi: worker has {inp.ring_helper_abi}, need {wire.RING_HELPER_ABI}"
            return self._fail(Failure.PROTOCOL_FAULT, detail)
        if inp.generation != self.generation:  # D2: swactor's controller adopts whatever generation it is told
            return self._fail(
                Failure.PROTOCOL_FAULT, f"worker answered as generation {inp.generation}, not {self.generation}"
            )
        self.state = State.RUNNING
        self._deadline = None
        return [WorkerRunning(self.generation, self.pid or inp.pid)]

    # ----------------------------------------------------------------------------------- seed: actor_command
    def _command(self, inp: ActorCommand) -> list[Output]:
        cmd = inp.command
        if self.state is not State.RUNNING:
            return [CommandRejected(cmd, "NotRunning")]
        if inp.generation != self.generation:
            return [CommandRejected(cmd, "OldGenerationHandle")]
        stale = [b.device_handle for b in getattr(cmd, "inputs", ())]
        if isinstance(cmd, wire.ReleaseDeviceObject):
            stale.append(cmd.device_handle)
        if any(h.worker_generation != self.generation for h in stale):
            return [CommandRejected(cmd, "OldGenerationHandle")]
        if isinstance(cmd, wire.InstallRing):
            self.rings.add(cmd.ring_id)
        elif isinstance(cmd, wire.UninstallRing):
            self.rings.discard(cmd.ring_id)
        elif isinstance(cmd, wire.ShutdownWorker):
            self.state = State.SHUTTING_DOWN
            self._deadline = self.now + self.shutdown_timeout  # D3
        return [WriteCommands((cmd,))]

    # ----------------------------------------------------------------------------------- seed: route
    def _stdout(self, inp: StdoutEvent) -> list[Output]:
        ev = inp.event
        out: list[Output] = [Routed(ROUTES[type(ev)], ev)]
        if isinstance(ev, wire.WorkerFatal):  # D4: swactor's controller only routes it
            self._failure = (Failure.WORKER_FATAL, f"WorkerFatal: {ev.reason}")
            if self.state in (State.STARTING, State.RUNNING):
                out += self._fail(Failure.WORKER_FATAL, f"WorkerFatal: {ev.reason}", kill=False)
        return out

    # ----------------------------------------------------------------------------------- seed: process_exited
    def _exited(self, inp: ProcessExited) -> list[Output]:
        if inp.generation is not None and inp.generation != self.generation:
            return []  # D5: an earlier generation's process (killed on restart) is not this one
        if self.state is State.SHUTTING_DOWN and inp.status == 0:
            out: list[Output] = [RingQuiesced(r, self.generation) for r in sorted(self.rings)]
            out.append(TerminalStopped(self.generation))
            self._settle(State.STOPPED)
            return out
        failure, detail = self._failure or (Failure.PROCESS_EXITED, "")
        if self.state is State.KILLING:
            failure, detail = Failure.SHUTDOWN_TIMEOUT, f"shutdown did not finish within {self.shutdown_timeout:g} s"
        detail = detail or f"worker exited with status {inp.status}"
        out = []
        for ring_id in sorted(self.rings):
            out += [RingFaulted(ring_id, self.generation), StopRingPump(ring_id)]
        out.append(WorkerFailed(self.generation, failure, inp.status, detail))
        self._settle(State.CRASHED)
        return out

    def _settle(self, state: State) -> None:
        self.state, self.pid, self._deadline, self._failure = state, None, None, None
        self.rings.clear()  # D6: swactor's controller never clears its installed rings

    # ----------------------------------------------------------------------------------- seed: restart, shutdown
    def _restart(self, _inp: RestartRequested) -> list[Output]:
        out: list[Output] = []
        if self.pid is not None:  # D7: swactor's controller would leave the old process running
            out.append(KillProcess(f"restart as generation {self.generation + 1}"))
        self.generation += 1
        self._settle(State.STARTING)
        return out

    def _shutdown(self, inp: ShutdownRequested) -> list[Output]:
        if self.state is not State.RUNNING:
            return []
        self.state = State.SHUTTING_DOWN
        self._deadline = self.now + self.shutdown_timeout  # D3
        return [WriteCommands((wire.ShutdownWorker(mode=inp.mode),))]

    def _stopped(self, inp: WorkerStopped) -> list[Output]:
        return [WorkerStoppedNotice(inp.generation, inp.reason)]

    # ----------------------------------------------------------------------------------- time and faults
    def _time(self, inp: TimeAdvanced) -> list[Output]:
        self.now = inp.now
        if self._deadline is None or inp.now < self._deadline:
            return []
        self._deadline = None
        if self.state is State.STARTING:  # swactor's InitializationTimeout; D8: the process is killed first
            return self._fail(Failure.INITIALIZATION_TIMEOUT, f"initialization timed out after {self.init_timeout:g} s")
        if self.state is State.SHUTTING_DOWN:
            self.state = State.KILLING
            return [KillProcess(f"shutdown did not finish within {self.shutdown_timeout:g} s")]
        if self.state is State.FAILING:
            return [KillProcess(f"still running {self.fatal_exit_timeout:g} s after failing")]
        return []

    def _protocol(self, inp: ProtocolBroken) -> list[Output]:
        if self.state not in (State.STARTING, State.RUNNING):
            return []
        return self._fail(Failure.PROTOCOL_FAULT, f"protocol fault: {inp.reason}")

    def _fail(self, failure: Failure, detail: str, kill: bool = True) -> list[Output]:
        """The worker is at fault while its process lives: the failure is reported once the process has exited,
        with its status. After WorkerFatal it exits by itself (status 1) and is killed only if it overruns."""
        if self.pid is None:  # nothing runs: report now
            out: list[Output] = [WorkerFailed(self.generation, failure, None, detail)]
            self._settle(State.CRASHED)
            return out
        self.state = State.FAILING
        self._failure = (failure, detail)
        self._deadline = self.now + self.fatal_exit_timeout
        return [KillProcess(detail)] if kill else []

    def _nothing(self, _inp: Input) -> list[Output]:
        return []


@dataclass(frozen=True)
class Row:
    handler: Callable[[WorkerController, Any], list[Output]]
    targets: frozenset[State]
    note: str = ""  # swactor's behaviour, or the deviation id


def _rows() -> dict[tuple[State, type], Row]:
    S, W = State, WorkerController
    every = tuple(State)
    table: dict[tuple[State, type], Row] = {}

    def row(states: tuple[State, ...], inp: type, handler: Any, targets: set[State], note: str = "seed") -> None:
        for s in states:
            table[(s, inp)] = Row(handler, frozenset(targets | {s} if "stay" in note else targets), note)

    row(every, StartWorker, W._start, {S.STARTING}, "seed; D1 refuses while a process is live")
    row(every, ProcessStarted, W._process_started, {S.STARTING})
    row((S.STARTING,), WorkerReady, W._ready, {S.RUNNING, S.FAILING, S.CRASHED}, "seed; D2 checks gen and ABI")
    row(tuple(s for s in every if s is not S.STARTING), WorkerReady, W._nothing, set(), "D2: stay")
    row(every, ActorCommand, W._command, {S.SHUTTING_DOWN}, "seed: stay")
    row(every, StdoutEvent, W._stdout, {S.FAILING, S.CRASHED}, "seed; D4: stay")
    row(every, ProcessExited, W._exited, {S.STOPPED, S.CRASHED}, "seed; D5: stay")
    row(every, RestartRequested, W._restart, {S.STARTING}, "seed; D6, D7")
    row(every, ShutdownRequested, W._shutdown, {S.SHUTTING_DOWN}, "seed: stay")
    row(every, WorkerStopped, W._stopped, set(), "seed: stay")
    row(every, TimeAdvanced, W._time, {S.FAILING, S.KILLING, S.CRASHED}, "seed; D3, D8: stay")
    row(every, ProtocolBroken, W._protocol, {S.FAILING, S.CRASHED}, "D9: stay")
    return table


TRANSITIONS = _rows()
