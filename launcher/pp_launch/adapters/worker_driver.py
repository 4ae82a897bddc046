"""The worker container driver: the controller's I/O, with a worker image run as a stage container.

Each generation is its own container (tini as init, auto-remove, our labels, GPUs as given), with stdin
attached for commands and stdout read as events; stderr is logs. A container exit becomes the controller's
ProcessExited with the engine's real status; a restart starts a new container. On a real engine the driver's
run has a guard there (adapters/guard.py), started before its first container, which records each
generation's id before it starts: when the controller process dies, the engine closes the worker's stdin (the
worker exits), and the guard (and the local watchdog) remove whatever of those ids is left. The driver's own
teardown also acts on the ids it created, never on a label.

The arena (docs/worker-wire.md): swactor's controller hands its worker an inherited memory file, `SWACTOR_ARENA_FD` and
`SWACTOR_ARENA_BYTES`. A container cannot inherit a descriptor from us, so the driver makes the memory file
on the host's tmpfs (/dev/shm), maps it itself, bind-mounts it into the container, and starts the image's
own entrypoint and command under `/bin/sh`, which opens it as descriptor 3 first. Both sides then see the
same pages. The host's name for the file is unlinked as soon as the worker is ready (both sides keep it
open), so a controller killed later leaves no file behind.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pp_launch.adapters import identity, watchdog
from pp_launch.adapters.docker_engine import DockerStageBackend, Engine
from pp_launch.adapters.guard import RunGuard
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.core import errors, labels, stage_env
from pp_launch.core.chain.plan import Mount, StageSpec
from pp_launch.core.chain.ports import StageGone, StageOutput
from pp_launch.core.chain.teardown import Teardown, TeardownFailed
from pp_launch.core.worker import codec as wire
from pp_launch.core.worker import controller as c
from pp_launch.core.worker import record

ARENA_FD = "SWACTOR_ARENA_FD"
ARENA_BYTES = "SWACTOR_ARENA_BYTES"
STAGE_INDEX = "SWACTOR_STAGE_INDEX"
DEV = "DEV"
TAIL_LINES = 20  # the worker's last stderr lines kept for a failure's message
ARENA_PATH = "/run/pp-launch-arena"  # where the memory file appears inside the container
ARENA_FD_NUMBER = 3
ARENA_ENTRY = ("/bin/sh", "-c", f'exec {ARENA_FD_NUMBER}<>"{ARENA_PATH}" && exec "$@"', "pp-arena")
HOST_SHM = "/dev/shm"


class Arena:
    """A memory file shared with one worker container."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def write_record(self, layout: record.RingLayout, obj: record.ObjectRecord) -> int:
        """Write `obj` where swactor's node writes an ingress record: at the ring's data_offset. Returns its size."""
        data = obj.encode()
        if len(data) > layout.data_capacity or layout.data_offset + len(data) > self.size:
            raise errors.PpLaunchError(
                f"a {len(data)}-byte record does not fit ring {layout.ring_id} "
                f"({layout.data_capacity} bytes at offset {layout.data_offset} of a {self.size}-byte arena)"
            )
        self.map[layout.data_offset : layout.data_offset + len(data)] = data
        return len(data)

    def read_record(self, layout: record.RingLayout) -> record.ObjectRecord:
        """The record at the ring's data_offset (raises record.RecordError when there is none)."""
        with memoryview(self.map) as view:  # released at once: the map can still be closed
            return record.decode_record(view, layout.data_offset, layout.data_capacity - record.HEADER_LEN)

    def close(self) -> None:
        self.unlink()
        self.map.close()


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
    stage_backend: Any = None  # where worker containers run; None: the engine's (DockerStageBackend). Tests: fakes.
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
        self.guard: RunGuard | None = None  # on a real engine: started with the first generation
        self.docker = (
            self.stage_backend
            if self.stage_backend is not None
            else DockerStageBackend(self.engine, record=self._record, expect=self._expect)
        )
        self.created: list[str] = []  # every generation's container id: what close() tears down
        self.ref: str | None = None
        self.arena: Arena | None = None
        self.notices: list[c.Output] = []  # everything the controller reported, in order
        self._decoders: dict[int, wire.LineDecoder] = {}
        self._arenas: list[Arena] = []
        self.stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)  # of the current generation
        self.stdout_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._t0 = self.clock() if self.started_at is None else self.started_at

    def _expect(self, name: str) -> None:
        """Before a generation's create on a real engine: the run's guard is up (started once), and told the name."""
        if self.guard is None:
            self.guard = RunGuard.start(self.engine, self.run_id, self.owner, watchdog.MAX_GRACE)
        self.guard.expect(name)

    def _record(self, ref: str) -> None:
        assert self.guard is not None
        self.guard.own(ref)

    def note(self, direction: str, text: str) -> None:
        """One trace line: `>` sent to the worker, `<` from its stdout, `#` what the node did besides."""
        if self.trace is not None:
            self.trace(f"{self.clock() - self._t0:8.3f} g{self.ctl.generation} {direction} {text}")

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
                self.docker.write_stdin(self.ref, b"".join(data))
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
        env = {
            STAGE_INDEX: "0",
            DEV: str(self.backend.get("device", "CPU")),
            **self.env,
            stage_env.LIFELINE: "stdin",
            stage_env.STAGE: "0",
            stage_env.NVIDIA_VISIBLE_DEVICES: ",".join(self.gpus) or stage_env.NO_GPU,
        }
        mounts: tuple[Mount, ...] = ()
        entrypoint: tuple[str, ...] | None = None
        command: tuple[str, ...] | None = None
        if self.share_arena:
            self.arena = Arena(f"{HOST_SHM}/pp-launch-arena-{self.run_id}-g{generation}", self.arena_ceiling)
            self._arenas.append(self.arena)
            env.update({ARENA_FD: str(ARENA_FD_NUMBER), ARENA_BYTES: str(self.arena_ceiling)})
            mounts = (Mount(self.arena.path, ARENA_PATH),)
            config = self.engine.image_config(self.image) or {}
            entrypoint = ARENA_ENTRY
            command = (*(config.get("Entrypoint") or ()), *(config.get("Cmd") or ()))
        spec = StageSpec(
            index=0,
            name=f"{self.prefix}-g{generation}",
            image=self.image,
            env=env,
            labels=labels.stage_labels(self.run_id, 0, self.owner, self.gpus),
            gpus=self.gpus,
            device_requests=self.device_requests,
            entrypoint=entrypoint,
            command=command,
            mounts=mounts,
        )
        self.ref = self.docker.create(spec, env)
        self.created.append(self.ref)
        self._decoders[generation] = wire.LineDecoder(wire.EVENTS)
        self.stderr_tail.clear()
        self.stdout_tail.clear()
        self.note("#", f"started worker container {self.ref[:12]} (generation {generation})")
        self.docker.start(self.ref, generation, self.inbox.put)  # `stage` carries the generation in events
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
            self.feed(c.TimeAdvanced(self.clock() - self._t0))
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
        self.docker.write_stdin(self.ref, data)

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
            self.docker.close_stdin(self.ref)

    def kill_container(self) -> None:
        if self.ref is not None:
            self.note("#", f"killed worker container {self.ref[:12]} (SIGKILL)")
            self.engine.signal(self.ref, 9)

    def close(self, grace: float = 0.0, kill_wait: float = 10.0) -> None:
        """Every container of this driver's run through the one teardown (SIGTERM, `grace` (none: the worker wire has
        its own graceful ShutdownWorker, this is the cleanup after it), SIGKILL, the engine's
        word that it is gone; one never started is removed by force), and every arena file. TeardownFailed, its
        errors typed, when a container cannot be confirmed gone."""
        try:
            found = [ref for ref in self.created if self.engine.inspect(ref) is not None]  # ours: by id only
            teardown = Teardown(self.docker, ThreadRuntime(self.clock), grace, kill_wait)

            def gone(ref: str) -> bool:
                return self.engine.inspect(ref) is None

            def wait(done: Callable[[], bool], deadline: float) -> None:
                while not done() and self.clock() < deadline:
                    time.sleep(0.05)

            name = lambda r: f"worker container {r[:12]}"  # noqa: E731
            left = teardown.stop(found, ref=lambda r: r, gone=gone, wait=wait, name=name)
            for ref in left:  # created, never started: auto-remove does not apply
                teardown.call(f"removing worker container {ref[:12]}", self.docker.remove, ref)
            left = [ref for ref in left if not gone(ref)]
            self.docker.close()
            if self.guard is not None:
                self.guard.close(wait=0.0 if left else 10.0)  # nothing left: it finds nothing, and goes
                self.guard = None
            if left or teardown.errors:
                raise TeardownFailed(f"worker run {self.run_id}", left, teardown.errors)
        finally:
            for arena in self._arenas:
                arena.close()
            self._arenas.clear()
