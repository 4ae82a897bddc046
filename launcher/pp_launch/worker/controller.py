"""The GPU worker controller: a pure state machine (a port of the seed's GpuWorkerCtl, its gaps fixed).

No I/O and no clock of its own: `handle(input)` returns what to do (spawn, write, stop a pump, kill) and
what happened (running, failed, rejected, ring faulted or quiesced, stopped). Transitions are a table,
(state, input type) -> handler, so an illegal move raises one typed error naming both, and a test can walk
the table.

Rules (the seed's): generation starts at 1; a command when not running is rejected (NotRunning); a command,
input handle or release handle of another generation is rejected (OldGeneration); a crash faults every
installed ring in ascending order and stops its pump, then reports the failure; a clean exit while shutting
down quiesces every ring, then reports a terminal stop; a restart increments the generation.
Fixed gaps: a shutdown that overruns its timeout moves to Killing and asks for a kill; WorkerFatal fails the
controller; a failure carries the exit status; the installed rings are cleared on crash and on restart;
initialization times out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import codec as wire


class State(enum.Enum):
    IDLE = "Idle"
    SPAWNING = "Spawning"  # spawn asked for, process not reported yet
    INITIALIZING = "Initializing"  # InitializeWorker sent, WorkerReady awaited
    RUNNING = "Running"
    SHUTTING_DOWN = "ShuttingDown"  # ShutdownWorker sent
    KILLING = "Killing"  # shutdown overran its timeout: kill asked for
    FAILING = "Failing"  # failed (fatal, timeout, protocol): waiting for the process to exit for its status
    FAILED = "Failed"  # may be restarted
    STOPPED = "Stopped"  # terminal


# ---------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class StartRequested:
    pass


@dataclass(frozen=True)
class ProcessStarted:
    pid: int


@dataclass(frozen=True)
class WorkerEventReceived:
    event: wire.Message


@dataclass(frozen=True)
class ProtocolBroken:
    """The worker's stdout broke the wire (invalid JSON, unknown type...): the worker is at fault."""

    reason: str


@dataclass(frozen=True)
class ActorCommand:
    """A command an actor wants sent, issued for `generation`."""

    command: wire.Message
    generation: int


@dataclass(frozen=True)
class ProcessExited:
    status: int


@dataclass(frozen=True)
class RestartRequested:
    pass


@dataclass(frozen=True)
class ShutdownRequested:
    mode: str = "Graceful"


@dataclass(frozen=True)
class TimeAdvanced:
    now: float


Input = (
    StartRequested
    | ProcessStarted
    | WorkerEventReceived
    | ProtocolBroken
    | ActorCommand
    | ProcessExited
    | RestartRequested
    | ShutdownRequested
    | TimeAdvanced
)


# ---------------------------------------------------------------------------------------------- outputs: do
@dataclass(frozen=True)
class SpawnWorker:
    generation: int


@dataclass(frozen=True)
class WriteCommands:
    commands: tuple[wire.Message, ...]


@dataclass(frozen=True)
class StopRingPump:
    ring_id: int


@dataclass(frozen=True)
class KillProcess:
    reason: str


# ---------------------------------------------------------------------------------------------- outputs: happened
@dataclass(frozen=True)
class WorkerRunning:
    generation: int
    pid: int


@dataclass(frozen=True)
class WorkerFailed:
    generation: int
    reason: str
    exit_status: int | None


@dataclass(frozen=True)
class CommandRejected:
    command: wire.Message
    reason: str  # NotRunning | OldGeneration


@dataclass(frozen=True)
class RingFaulted:
    ring_id: int
    generation: int


@dataclass(frozen=True)
class RingQuiesced:
    ring_id: int
    generation: int


@dataclass(frozen=True)
class WorkerStopped:
    generation: int
    reason: str


@dataclass(frozen=True)
class TerminalStop:
    generation: int


@dataclass(frozen=True)
class Routed:
    destination: str
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
    | WorkerStopped
    | TerminalStop
    | Routed
)


class IllegalTransition(Exception):
    """Our side's fault: the caller fed an input the current state does not take."""

    def __init__(self, state: State, inp: object) -> None:
        super().__init__(f"{type(inp).__name__} is not allowed in state {state.value}")
        self.state = state
        self.input = inp


# Where each worker event goes: (first choice, otherwise); the first when CHOICE says so. Data, not ifs.
ROUTES: dict[type[wire.Message], tuple[str, str]] = {
    wire.RingInstalled: ("edge_establisher", "edge_establisher"),
    wire.RingQuiesced: ("edge_establisher", "edge_establisher"),
    wire.ObjectLoaded: ("rx", "role"),
    wire.ObjectProduced: ("tx", "role"),
    wire.RoleConfigured: ("stage_controller", "stage_controller"),
    wire.RoleFailed: ("stage_controller", "stage_controller"),
    wire.StepCompleted: ("stage_controller", "stage_controller"),
    wire.StepFailed: ("stage_controller", "stage_controller"),
    wire.DeviceObjectReleased: ("driver", "worker_side"),
    wire.ReleaseFailed: ("driver", "worker_side"),
}


def _ring_direction(ctl: WorkerController, ev: Any) -> str | None:
    return ctl.rings.get(ev.ring_id)


CHOICE: dict[type[wire.Message], Callable[[WorkerController, Any], bool]] = {
    wire.ObjectLoaded: lambda ctl, ev: _ring_direction(ctl, ev) == "ingress",  # an rx pump feeds the role
    wire.ObjectProduced: lambda ctl, ev: _ring_direction(ctl, ev) == "egress",  # a tx pump drains it
    wire.DeviceObjectReleased: lambda ctl, ev: ev.device_handle in ctl.driver_releases,  # asked by the driver
    wire.ReleaseFailed: lambda ctl, ev: ev.device_handle in ctl.driver_releases,
}

LIVE = (State.SPAWNING, State.INITIALIZING, State.RUNNING)


@dataclass
class WorkerController:
    arena_ceiling: int
    backend: str = "cpu"
    init_timeout: float = 30.0
    shutdown_timeout: float = 10.0
    fatal_exit_timeout: float = 5.0
    state: State = State.IDLE
    generation: int = 1
    pid: int | None = None
    now: float = 0.0
    rings: dict[int, str] = field(default_factory=dict)  # installed ring id -> direction
    driver_releases: set[wire.DeviceHandle] = field(default_factory=set)
    _deadline: float | None = None
    _failure: str = ""

    def handle(self, inp: Input) -> list[Output]:
        if isinstance(inp, ActorCommand):
            return self._on_command(inp)
        if isinstance(inp, TimeAdvanced):
            return self._on_time(inp.now)
        handler = TRANSITIONS.get((self.state, type(inp)))
        if handler is None:
            raise IllegalTransition(self.state, inp)
        return handler(self, inp)

    # ----------------------------------------------------------------------------------- lifecycle
    def _spawn(self, _inp: Input) -> list[Output]:
        self.state = State.SPAWNING
        return [SpawnWorker(self.generation)]

    def _on_started(self, inp: ProcessStarted) -> list[Output]:
        self.pid = inp.pid
        self.state = State.INITIALIZING
        self._deadline = self.now + self.init_timeout
        init = wire.InitializeWorker(
            worker_generation=self.generation,
            arena_ceiling=self.arena_ceiling,
            required_ring_helper_abi=wire.RING_HELPER_ABI,
            backend=self.backend,
        )
        return [WriteCommands((init,))]

    def _on_init_event(self, inp: WorkerEventReceived) -> list[Output]:
        ev = inp.event
        if isinstance(ev, wire.WorkerFatal):
            return self._fail(f"WorkerFatal: {ev.reason}", kill=False)
        if not isinstance(ev, wire.WorkerReady):
            return self._fail(f"expected WorkerReady, got {type(ev).__name__}")
        if ev.ring_helper_abi != wire.RING_HELPER_ABI:
            return self._fail(f"UnsupportedHelperAbi: worker has {ev.ring_helper_abi}, need {wire.RING_HELPER_ABI}")
        if ev.worker_generation != self.generation:
            return self._fail(f"worker answered as generation {ev.worker_generation}, not {self.generation}")
        self.state = State.RUNNING
        self._deadline = None
        return [WorkerRunning(self.generation, self.pid or ev.pid)]

    def _on_event(self, inp: WorkerEventReceived) -> list[Output]:
        ev = inp.event
        if isinstance(ev, wire.WorkerFatal):
            return self._fail(f"WorkerFatal: {ev.reason}", kill=False)
        if isinstance(ev, wire.WorkerStopped):
            return [WorkerStopped(self.generation, ev.reason)]
        if isinstance(ev, (wire.WorkerReady,)):
            return self._fail("WorkerReady twice")
        out: list[Output] = []
        if isinstance(ev, wire.RingQuiesced) and ev.ring_id in self.rings:
            del self.rings[ev.ring_id]
            out.append(RingQuiesced(ev.ring_id, self.generation))
        route = ROUTES.get(type(ev))
        if route is not None:
            choose = CHOICE.get(type(ev))
            out.append(Routed(route[0] if choose is None or choose(self, ev) else route[1], ev))
        if isinstance(ev, (wire.DeviceObjectReleased, wire.ReleaseFailed)):
            self.driver_releases.discard(ev.device_handle)
        return out

    def _on_protocol_broken(self, inp: ProtocolBroken) -> list[Output]:
        return self._fail(f"protocol fault: {inp.reason}")

    def _fail(self, reason: str, kill: bool = True) -> list[Output]:
        """The worker is at fault but its process lives: report the failure once it has exited, with its status.
        After WorkerFatal it exits by itself (status 1), and is killed only if it overruns; otherwise at once."""
        self.state = State.FAILING
        self._failure = reason
        self._deadline = self.now + self.fatal_exit_timeout
        return [KillProcess(reason)] if kill else []

    def _on_exit(self, inp: ProcessExited) -> list[Output]:
        """Unexpected exit (a crash), or the exit that follows a failure: fault the rings, report."""
        reason = self._failure or f"worker exited unexpectedly with status {inp.status}"
        out = self._fault_rings()
        out.append(WorkerFailed(self.generation, reason, inp.status))
        self.state, self.pid, self._deadline, self._failure = State.FAILED, None, None, ""
        return out

    def _fault_rings(self) -> list[Output]:
        out: list[Output] = []
        for ring_id in sorted(self.rings):
            out += [RingFaulted(ring_id, self.generation), StopRingPump(ring_id)]
        self.rings.clear()
        self.driver_releases.clear()
        return out

    def _shutdown(self, inp: ShutdownRequested) -> list[Output]:
        self.state = State.SHUTTING_DOWN
        self._deadline = self.now + self.shutdown_timeout
        return [WriteCommands((wire.ShutdownWorker(mode=inp.mode),))]  # type: ignore[arg-type]  # checked at runtime

    def _shutdown_idle(self, _inp: ShutdownRequested) -> list[Output]:
        self.state = State.STOPPED
        return [TerminalStop(self.generation)]

    def _on_shutdown_exit(self, inp: ProcessExited) -> list[Output]:
        if inp.status != 0:
            out = self._fault_rings()
            out.append(
                WorkerFailed(self.generation, f"worker exited with status {inp.status} while shutting down", inp.status)
            )
        else:
            out = []
            for ring_id in sorted(self.rings):
                out += [RingQuiesced(ring_id, self.generation), StopRingPump(ring_id)]
            self.rings.clear()
        self.state, self.pid, self._deadline = State.STOPPED, None, None
        out.append(TerminalStop(self.generation))
        return out

    def _on_killed_exit(self, inp: ProcessExited) -> list[Output]:
        out = self._fault_rings()
        out.append(WorkerFailed(self.generation, "shutdown timed out: killed", inp.status))
        out.append(TerminalStop(self.generation))
        self.state, self.pid, self._deadline = State.STOPPED, None, None
        return out

    def _restart(self, _inp: RestartRequested) -> list[Output]:
        self.generation += 1
        self.rings.clear()
        self.driver_releases.clear()
        self.state = State.SPAWNING
        return [SpawnWorker(self.generation)]

    def _ignore(self, _inp: Input) -> list[Output]:
        return []

    def _on_time(self, now: float) -> list[Output]:
        self.now = now
        if self._deadline is None or now < self._deadline:
            return []
        self._deadline = None
        if self.state == State.INITIALIZING:
            return self._fail(f"initialization timed out after {self.init_timeout:g} s")
        if self.state == State.SHUTTING_DOWN:
            self.state = State.KILLING
            return [KillProcess(f"shutdown did not finish within {self.shutdown_timeout:g} s")]
        if self.state == State.FAILING:
            return [KillProcess(f"still running {self.fatal_exit_timeout:g} s after failing")]
        return []

    # ----------------------------------------------------------------------------------- actor commands
    def _on_command(self, inp: ActorCommand) -> list[Output]:
        cmd = inp.command
        if self.state != State.RUNNING:
            return [CommandRejected(cmd, "NotRunning")]
        handles = list(getattr(cmd, "inputs", ()))
        if isinstance(cmd, wire.ReleaseDeviceObject):
            handles.append(cmd.device_handle)
        if inp.generation != self.generation or any(h.worker_generation != self.generation for h in handles):
            return [CommandRejected(cmd, "OldGeneration")]
        if isinstance(cmd, wire.InstallRing):
            self.rings[cmd.ring_id] = cmd.direction
        if isinstance(cmd, wire.ReleaseDeviceObject):
            self.driver_releases.add(cmd.device_handle)
        return [WriteCommands((cmd,))]


H = Callable[[WorkerController, Any], list[Output]]
TRANSITIONS: dict[tuple[State, type], H] = {
    (State.IDLE, StartRequested): WorkerController._spawn,
    (State.IDLE, ShutdownRequested): WorkerController._shutdown_idle,
    (State.SPAWNING, ProcessStarted): WorkerController._on_started,
    (State.SPAWNING, ProcessExited): WorkerController._on_exit,
    (State.SPAWNING, ShutdownRequested): WorkerController._shutdown_idle,
    (State.INITIALIZING, WorkerEventReceived): WorkerController._on_init_event,
    (State.INITIALIZING, ProtocolBroken): WorkerController._on_protocol_broken,
    (State.INITIALIZING, ProcessExited): WorkerController._on_exit,
    (State.INITIALIZING, ShutdownRequested): WorkerController._shutdown,
    (State.RUNNING, WorkerEventReceived): WorkerController._on_event,
    (State.RUNNING, ProtocolBroken): WorkerController._on_protocol_broken,
    (State.RUNNING, ProcessExited): WorkerController._on_exit,
    (State.RUNNING, ShutdownRequested): WorkerController._shutdown,
    (State.SHUTTING_DOWN, WorkerEventReceived): WorkerController._on_event,
    (State.SHUTTING_DOWN, ProtocolBroken): WorkerController._ignore,
    (State.SHUTTING_DOWN, ProcessExited): WorkerController._on_shutdown_exit,
    (State.SHUTTING_DOWN, ShutdownRequested): WorkerController._ignore,
    (State.KILLING, WorkerEventReceived): WorkerController._ignore,
    (State.KILLING, ProtocolBroken): WorkerController._ignore,
    (State.KILLING, ProcessExited): WorkerController._on_killed_exit,
    (State.KILLING, ShutdownRequested): WorkerController._ignore,
    (State.FAILING, WorkerEventReceived): WorkerController._ignore,
    (State.FAILING, ProtocolBroken): WorkerController._ignore,
    (State.FAILING, ProcessExited): WorkerController._on_exit,
    (State.FAILED, RestartRequested): WorkerController._restart,
    (State.FAILED, ShutdownRequested): WorkerController._shutdown_idle,
    (State.STOPPED, ShutdownRequested): WorkerController._ignore,
}
