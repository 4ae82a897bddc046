"""The worker container driver: the controller's I/O, with a worker image run as a stage container.

Each generation is its own container (tini as init, auto-remove, our labels, GPUs as given), with stdin
attached for commands and stdout read as events; stderr is logs. A container exit becomes the controller's
ProcessExited with the engine's real status; a restart starts a new container. When the controller process
dies, the engine closes the worker's stdin (the worker exits) and the watchdog removes whatever is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import errors, labels, stage_env
from ..chain.plan import StageSpec, new_run_id
from ..chain.ports import QueueInbox, StageGone, StageOutput
from ..docker_engine import DockerStageBackend, Engine
from . import codec as wire
from . import controller as c


@dataclass
class WorkerDriver:
    engine: Engine
    image: str
    arena_ceiling: int = 16 << 20
    backend_name: str = "cpu"
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    name_prefix: str | None = None
    log: Callable[[str], None] = lambda text: None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.run_id = new_run_id()
        self.owner = labels.Owner.current().label()
        self.prefix = self.name_prefix or f"pp-worker-{self.run_id}"
        self.ctl = c.WorkerController(arena_ceiling=self.arena_ceiling, backend=self.backend_name)
        self.inbox = QueueInbox()
        self.docker = DockerStageBackend(self.engine)
        self.ref: str | None = None
        self.notices: list[c.Output] = []  # everything the controller reported, in order
        self._decoders: dict[int, wire.LineDecoder] = {}
        self._t0 = self.clock()

    # ----------------------------------------------------------------------------- driving
    def feed(self, inp: c.Input) -> list[c.Output]:
        outputs = self.ctl.handle(inp)
        for out in outputs:
            self._execute(out)
        self.notices.extend(outputs)
        return outputs

    def command(self, cmd: wire.Message, generation: int | None = None) -> list[c.Output]:
        return self.feed(c.ActorCommand(cmd, self.ctl.generation if generation is None else generation))

    def _execute(self, out: c.Output) -> None:
        if isinstance(out, c.SpawnWorker):
            self._spawn(out.generation)
        elif isinstance(out, c.WriteCommands) and self.ref is not None:
            try:
                self.docker.write_stdin(self.ref, b"".join(wire.encode(cmd) for cmd in out.commands))
            except OSError as exc:
                self.log(f"worker stdin is closed ({exc}); its exit will follow")
        elif isinstance(out, c.KillProcess) and self.ref is not None:
            self.log(f"killing generation {self.ctl.generation}: {out.reason}")
            self.engine.signal(self.ref, 9)

    def _spawn(self, generation: int) -> None:
        env = {
            **self.env,
            stage_env.LIFELINE: "stdin",
            stage_env.STAGE: "0",
            stage_env.NVIDIA_VISIBLE_DEVICES: ",".join(self.gpus) or stage_env.NO_GPU,
        }
        spec = StageSpec(
            index=0,
            name=f"{self.prefix}-g{generation}",
            image=self.image,
            env=env,
            labels=labels.stage_labels(self.run_id, 0, self.owner, self.gpus),
            gpus=self.gpus,
            device_requests=self.device_requests,
        )
        self.ref = self.docker.create(spec, env)
        self._decoders[generation] = wire.LineDecoder(wire.EVENTS)
        gen = generation
        self.docker.start(self.ref, gen, self.inbox.put)  # `stage` carries the generation in events
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
            if not isinstance(event, (StageOutput, StageGone)) or event.stage != self.ctl.generation:
                continue  # nothing, or the output or exit of an older generation's container
            if isinstance(event, StageOutput):
                self._on_output(event)
            else:
                self.feed(c.ProcessExited(event.exit_code if event.exit_code is not None else -1))
        return True

    def _on_output(self, event: StageOutput) -> None:
        if event.stream == "stderr":
            self.log(f"[worker g{event.stage}] {event.data.decode('utf-8', 'backslashreplace')}")
            return
        decoder = self._decoders[event.stage]
        decoder.feed(event.data + b"\n")
        while True:
            try:
                message = decoder.next()
            except wire.ProtocolFault as exc:
                if self.ctl.state in (c.State.INITIALIZING, c.State.RUNNING):
                    self.feed(c.ProtocolBroken(str(exc)))
                return
            if isinstance(message, wire.NeedData):
                return
            self.feed(c.WorkerEventReceived(message))

    # ----------------------------------------------------------------------------- helpers for callers
    def wait_for(self, kind: type | tuple[type, ...], timeout: float = 15.0, since: int = 0) -> Any:
        """The first notice of `kind` after position `since` in `notices`, or None on timeout."""

        def found() -> Any:
            return next((n for n in self.notices[since:] if isinstance(n, kind)), None)

        self.pump(lambda: found() is not None, timeout)
        return found()

    def routed(self, kind: type, timeout: float = 15.0, since: int = 0) -> Any:
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
        self.docker.write_stdin(self.ref, data)

    def close_stdin(self) -> None:
        if self.ref is not None:
            self.docker.close_stdin(self.ref)

    def kill_container(self) -> None:
        if self.ref is not None:
            self.engine.signal(self.ref, 9)

    def close(self) -> None:
        """Remove every container of this driver's run, whatever state it is in."""
        for info in self.engine.containers([f"{labels.RUN}={self.run_id}"]):
            self.engine.remove(info.id)
