"""The worker container driver: the controller's I/O, with a worker image run as a stage container.

Each generation is its own container (tini as init, auto-remove, our labels, GPUs as given), with stdin
attached for commands and stdout read as events; stderr is logs. The driver's generations are the attempts of one
run on the chain's own pipeline (app/launch.py, `Run`), started as the worker's controller asks: the run's guard on
the engine (adapters/guard.py) comes up with the first generation and records each one's id before it starts; each
generation runs in the foreground of the chain's scope (its output passed to this driver, never read by the scope),
and ends through the chain's one teardown. A container exit becomes the controller's ProcessExited with the engine's
real status; a restart starts a new generation. When the controller process dies, the engine closes the worker's
stdin (the worker exits), and the guard (and the local watchdog) remove whatever of those ids is left. Nothing is
ever acted on by a label: only by the ids the engine gave.

The arena (docs/worker-wire.md) is a memory file on the host's tmpfs, bind-mounted into each generation's container
and opened there as descriptor 3 before the image's own entrypoint runs (adapters/arena.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pp_launch.adapters import arena, identity
from pp_launch.adapters.arena import Arena
from pp_launch.adapters.docker_engine import Engine
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.app.docker_site import DockerSite
from pp_launch.app.launch import Foreground, Run
from pp_launch.app.planning import Given
from pp_launch.app.request import GpuOptions, Hooks, Launched, LaunchRequest
from pp_launch.core import errors, labels, stage_env
from pp_launch.core.chain.plan import ChainRequest, StageSpec
from pp_launch.core.chain.ports import StageGone, StageOutput
from pp_launch.core.chain.teardown import TeardownFailed
from pp_launch.core.container import ContainerOptions, MountSpec
from pp_launch.core.worker import codec as wire
from pp_launch.core.worker import controller as c
from pp_launch.core.worker import record

STAGE_INDEX = "SWACTOR_STAGE_INDEX"
DEV = "DEV"
TAIL_LINES = 20  # the worker's last stderr lines kept for a failure's message
KILL_WAIT = 10.0  # after a generation's SIGKILL, how long the engine has to confirm it gone


@dataclass
class WorkerDriver:
    engine: Engine
    image: str
    arena_ceiling: int = 16 << 20
    backend: Mapping[str, Any] = field(default_factory=lambda: dict(wire.CPU_BACKEND))
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    name_prefix: str | None = None
    share_arena: bool = True
    log: Callable[[str], None] = lambda text: None
    stage_backend: Any = None  # where worker containers run; None: the engine's, under the run's guard. Tests: fakes.
    clock: Callable[[], float] = time.monotonic
    trace: Callable[[str], None] | None = None  # every line exchanged, with direction and time since start
    init_timeout: float = 10.0  # swactor's initialization_timeout_ms
    started_at: float | None = None  # the trace's time origin (default: now); several drivers can share one

    def __post_init__(self) -> None:
        self.run_id = identity.new_run_id()
        self.owner = identity.current_owner().label()
        self.prefix = self.name_prefix or f"pp-worker-{self.run_id}"
        self.ctl = c.WorkerController(
            arena_ceiling=self.arena_ceiling, backend=dict(self.backend), init_timeout=self.init_timeout
        )
        self.inbox = QueueInbox()
        # no grace at the teardown: the worker wire has its own graceful ShutdownWorker, the teardown is the cleanup
        chain = ChainRequest(stages=1, image=self.image, grace=0.0)
        self.request = LaunchRequest(
            chain, GpuOptions(mode="none"), run_id=self.run_id, owner=self.owner, keep_logs=False, kill_wait=KILL_WAIT
        )
        self.specs: dict[int, StageSpec] = {}  # each generation's stage, described as it comes
        # the driver's engine as the chain's site, each generation's stage the one described; with an in-process
        # stage backend (tests) there is no image and no guard, and that backend runs the stages
        self.place = DockerSite.to_launch(
            self.request, planner=Given(self.specs.__getitem__), engine=self.engine, backend=self.stage_backend
        )
        self.run: Run | None = None  # the pipeline's run: prepared with the first generation
        self.generation: Foreground | None = None  # the current one
        self._generations: list[Foreground] = []
        self.ref: str | None = None
        self.arena: Arena | None = None
        self.notices: list[c.Output] = []  # everything the controller reported, in order
        self._decoders: dict[int, wire.LineDecoder] = {}
        self._arenas: list[Arena] = []
        self.stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)  # of the current generation
        self.stdout_tail: deque[str] = deque(maxlen=TAIL_LINES)
        # Two clocks: the trace's origin (shared by the drivers of one check), and this controller's own, which
        # starts at 0 with it: its deadlines (the 10 s initialization) count from its own start, not the check's.
        self._born = self.clock()
        self._t0 = self._born if self.started_at is None else self.started_at

    def note(self, direction: str, text: str) -> None:
        """One trace line: `>` sent to the worker, `<` from its stdout, `#` what the node did besides."""
        if self.trace is not None:
            self.trace(f"{self.clock() - self._t0:8.3f} g{self.ctl.generation} {direction} {text}")

    def _backend(self) -> Any:
        """The current generation's backend, which writes to its container's stdin."""
        if self.generation is None:
            raise errors.PpLaunchError("no worker container")
        return self.generation.backend

    # ----------------------------------------------------------------------------- driving
    def feed(self, inp: c.Input) -> list[c.Output]:
        outputs = self.ctl.handle(inp)
        self.notices.extend(outputs)
        for out in outputs:
            self._execute(out)
        return outputs

    def command(self, cmd: wire.Command, generation: int | None = None) -> list[c.Output]:
        return self.feed(c.ActorCommand(cmd, self.ctl.generation if generation is None else generation))

    def start(self) -> None:
        """StartWorker; after a crash, RestartRequested then StartWorker (swactor's two steps)."""
        if self.ctl.state is c.State.CRASHED:
            self.feed(c.RestartRequested())
        self.feed(c.StartWorker())

    def _execute(self, out: c.Output) -> None:
        if isinstance(out, c.SpawnWorker):
            self._spawn(out.generation)
        elif isinstance(out, c.WriteCommands) and self.ref is not None:
            data = [wire.encode(cmd) for cmd in out.commands]
            for line in data:
                self.note(">", line.decode().rstrip("\n"))
            try:
                self._backend().write_stdin(self.ref, b"".join(data))
            except OSError as exc:
                self.log(f"worker stdin is closed ({exc}); its exit will follow")
        elif isinstance(out, c.KillProcess) and self.ref is not None:
            self.log(f"killing the worker container {self.ref[:12]}: {out.reason}")
            self.engine.signal(self.ref, 9)
        elif isinstance(out, c.WorkerRunning) and self.arena is not None:
            self.arena.unlink()  # both ends hold it open now; nothing is left on the host after us
        elif isinstance(out, c.Routed):
            ev = out.event
            if isinstance(ev, wire.WorkerReady):  # swactor's driver side turns these into ctl inputs
                self.feed(c.WorkerReady(ev.worker_generation, ev.pid, ev.ring_helper_abi))
            elif isinstance(ev, wire.WorkerStopped):
                self.feed(c.WorkerStopped(self.ctl.generation, ev.reason))

    def _spawn(self, generation: int) -> None:
        """A new generation: an attempt of the driver's run on the pipeline, in the foreground, its output and
        its exit sent to this driver's inbox; returns once its container runs (the engine's refusal raises)."""
        env = {
            STAGE_INDEX: "0",
            DEV: str(self.backend.get("device", "CPU")),
            **self.env,
            stage_env.LIFELINE: "stdin",
            stage_env.STAGE: "0",
            stage_env.NVIDIA_VISIBLE_DEVICES: ",".join(self.gpus) or stage_env.NO_GPU,
        }
        mounts: tuple[MountSpec, ...] = ()
        entrypoint: tuple[str, ...] | None = None
        command: tuple[str, ...] | None = None
        if self.share_arena:
            self.arena = Arena(f"{arena.HOST_SHM}/pp-launch-arena-{self.run_id}-g{generation}", self.arena_ceiling)
            self._arenas.append(self.arena)
            env.update({arena.FD_ENV: str(arena.FD_NUMBER), arena.BYTES_ENV: str(self.arena_ceiling)})
            mounts = (MountSpec("bind", arena.INSIDE, self.arena.path),)
            config = self.engine.image_config(self.image) or {}
            entrypoint = arena.ENTRY
            command = (*(config.get("Entrypoint") or ()), *(config.get("Cmd") or ()))
        self.specs[generation] = StageSpec(
            index=0,
            name=f"{self.prefix}-g{generation}",
            image=self.image,
            env=env,
            labels=labels.stage_labels(self.run_id, 0, self.owner, self.gpus),
            gpus=self.gpus,
            device_requests=self.device_requests,
            entrypoint=entrypoint,
            command=command,
            options=ContainerOptions(mounts=mounts),
        )
        if self.run is None:  # the run's guard comes up with its first generation
            self.run = Run(self.request, self.place, Hooks(say=self.log))
        self._decoders[generation] = wire.LineDecoder(wire.EVENTS)
        self.stderr_tail.clear()
        self.stdout_tail.clear()
        run, this = (
            self.run,
            dataclasses.replace(self.request, chain=dataclasses.replace(self.request.chain, attempt=generation)),
        )

        def output(stream: str, data: bytes) -> None:
            self.inbox.put(StageOutput(generation, stream, data))  # type: ignore[arg-type]

        def ended(g: Foreground) -> None:
            if g.started:  # it ran: its end is the controller's ProcessExited (else _spawn raises the error)
                self.inbox.put(StageGone(generation, g.exit_code))

        self.generation = Foreground(lambda hooks: run.attempt(this, hooks), output, ended, f"pp-worker-g{generation}")
        self._generations.append(self.generation)
        self.ref = self.generation.ref
        self.note("#", f"started worker container {self.ref[:12]} (generation {generation})")
        pid = int((self.engine.inspect(self.ref) or {}).get("State", {}).get("Pid", 0))
        self.feed(c.ProcessStarted(pid=pid))

    def pump(self, until: Callable[[], bool], timeout: float) -> bool:
        """Feed worker events, exits and time to the controller until `until()` or the timeout."""
        deadline = self.clock() + timeout
        while not until():
            left = deadline - self.clock()
            if left <= 0:
                return False
            event = self.inbox.get(min(left, 0.2))
            self.feed(c.TimeAdvanced(self.clock() - self._born))
            if isinstance(event, StageOutput) and event.stage == self.ctl.generation:
                self._on_output(event)
            elif isinstance(event, StageGone):
                status = event.exit_code if event.exit_code is not None else -1
                self.note("#", f"worker container of generation {event.stage} exited with status {status}")
                self.feed(c.ProcessExited(status, generation=event.stage))
        return True

    def _on_output(self, event: StageOutput) -> None:
        text = event.data.decode("utf-8", "backslashreplace")
        if event.stream == "stderr":
            self.stderr_tail.append(text)
            self.log(f"[worker g{event.stage}] {text}")
            return
        self.stdout_tail.append(text)
        self.note("<", text)
        decoder = self._decoders[event.stage]
        decoder.feed(event.data + b"\n")
        while True:
            try:
                message = decoder.next()
            except wire.ProtocolFault as exc:
                self.feed(c.ProtocolBroken(str(exc)))
                return
            if isinstance(message, wire.NeedData):
                return
            self.feed(c.StdoutEvent(message))

    # ----------------------------------------------------------------------------- helpers for callers
    def wait_for(self, kind: type | tuple[type, ...], timeout: float = 15.0, since: int = 0) -> Any:
        """The first notice of `kind` after position `since` in `notices`, or None on timeout."""

        def found() -> Any:
            return next((n for n in self.notices[since:] if isinstance(n, kind)), None)

        self.pump(lambda: found() is not None, timeout)
        return found()

    def routed(self, kind: type | tuple[type, ...], timeout: float = 15.0, since: int = 0) -> Any:
        def found() -> Any:
            return next(
                (n.event for n in self.notices[since:] if isinstance(n, c.Routed) and isinstance(n.event, kind)), None
            )

        self.pump(lambda: found() is not None, timeout)
        return found()

    def write_raw(self, data: bytes) -> None:
        """Bypass the controller (conformance checks of the worker's own strictness)."""
        if self.ref is None:
            raise errors.PpLaunchError("no worker container")
        self.note(">", data.decode("utf-8", "backslashreplace").rstrip("\n"))
        self._backend().write_stdin(self.ref, data)

    def write_record(self, layout: record.RingLayout, obj: record.ObjectRecord) -> int:
        """Write an ingress record into the worker's arena as swactor's node does, before `RingReadable`."""
        if self.arena is None:
            raise errors.PpLaunchError("no arena is shared with the worker (share_arena=False)")
        size = self.arena.write_record(layout, obj)
        self.note(
            "#",
            f"wrote MO01 record object {obj.object_id} sequence {obj.sequence} extent {obj.extent} "
            f"({size} bytes) at offset {layout.data_offset} of ring {layout.ring_id}",
        )
        return size

    def read_record(self, layout: record.RingLayout) -> record.ObjectRecord:
        """Read back the record a step wrote to an egress ring, as swactor's node does."""
        if self.arena is None:
            raise errors.PpLaunchError("no arena is shared with the worker (share_arena=False)")
        obj = self.arena.read_record(layout)
        self.note(
            "#",
            f"read MO01 record object {obj.object_id} sequence {obj.sequence} extent {obj.extent} "
            f"({obj.size} bytes) at offset {layout.data_offset} of ring {layout.ring_id}",
        )
        return obj

    def close_stdin(self) -> None:
        if self.ref is not None:
            self.note("#", "closed the worker's stdin")
            self._backend().close_stdin(self.ref)

    def kill_container(self) -> None:
        if self.ref is not None:
            self.note("#", f"killed worker container {self.ref[:12]} (SIGKILL)")
            self.engine.signal(self.ref, 9)

    def close(self) -> None:
        """The current generation through the chain's one teardown (SIGTERM and no grace: the worker wire has its
        own graceful ShutdownWorker, this is the cleanup after it; SIGKILL; the engine's word that it is gone, or
        removed by its id), every generation's thread joined, the run's guard let go of, and every arena file.
        TeardownFailed names a container that cannot be confirmed gone."""
        left: list[str] = []
        failed: BaseException | None = None
        last: Launched | None = None
        try:
            for g in self._generations:
                g.stop("the worker driver's close")
                if g.done is not None:
                    last = g.done
                    left += [ref for ref in g.done.outcome.orphans] if g.done.outcome is not None else []
                failed = failed or g.error
            self._generations.clear()
        finally:
            try:
                if self.run is not None:
                    self.run.finish(last)
                    self.run = None
            finally:
                for a in self._arenas:
                    a.close()
                self._arenas.clear()
        if left:
            raise TeardownFailed(f"worker run {self.run_id}", left, ())
        if failed is not None:
            raise failed
