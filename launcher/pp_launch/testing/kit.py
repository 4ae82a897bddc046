"""Test your own stage images the way pp-launch tests its own: on a real engine, with our labels, lifeline,
tini and auto-remove, and nothing left behind.

- `StageContainer(image, stage=0, num_stages=1, env=..., gpus=...)`: a pp-launch stage under test, in the
  testcontainers style (`with_env`, `with_name`, `with_command`, a `with` block): created with our labels, tini as
  init, daemon-side auto-remove and the stdin lifeline, then attached, then started (nothing it prints is missed).
  `wait_for_announcement()` returns the parsed `PP_GPU_NODE_ADDR` line (docs/formats.md), or raises StageExited (it
  ended first: exit code and last lines) or StageTimeout (still running); `lines()` is what it printed,
  `exit_code()` how it ended; `stop()` is our teardown (SIGTERM, the grace, then a kill through the engine).
- `Chain(image, stages=N, ...)`: a context manager over the library's chain (the options of `pp-launch chain`:
  GPUs, attach mode, inventory, env, grace, timeouts, hand-off and bring-up modes). It yields a `RunningChain`
  once every stage announced (the roster, the events, each stage's lines) and tears the chain down when the
  block ends, however it ends.
- `WorkerUnderTest(image)`: the steps of `pp-launch worker check` as methods a test calls in its own order.
"""

from __future__ import annotations

import dataclasses
import shlex
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pp_launch.app import chain as steps
from pp_launch.app import launch, worker_check
from pp_launch.app.docker_site import DockerSite
from pp_launch.app.hosts import engine_here
from pp_launch.app.planning import Given
from pp_launch.app.worker_driver import WorkerDriver
from pp_launch.core import errors, events
from pp_launch.core.announce import StageAnnouncement, parse_line
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainRequest, build_plan
from pp_launch.core.chain.teardown import TeardownFailed
from pp_launch.core.container import ContainerOptions
from pp_launch.core.gpu.requests import device_requests

DEFAULT_GRACE = 5.0
KILL_WAIT = 30.0  # after SIGKILL, how long the engine has to confirm a stage gone


class StageExited(AssertionError):
    """The stage ended before it printed what was waited for; carries its exit code and last lines."""

    def __init__(self, message: str, exit_code: int | None, last_lines: list[str]) -> None:
        super().__init__(message)
        self.exit_code, self.last_lines = exit_code, last_lines


class StageTimeout(TimeoutError):
    """The stage still runs but did not print what was waited for in time; carries its last lines."""

    def __init__(self, message: str, last_lines: list[str]) -> None:
        super().__init__(message)
        self.last_lines = last_lines


class StageContainer:
    """One pp-launch stage under test, in the testcontainers style: configure (the constructor, or `with_env`,
    `with_name`, `with_command`), `start()` (or a `with` block), wait, read, `stop()`. Every builder it offers
    takes effect; it is no testcontainers `DockerContainer`, whose other builders a stage could not honour."""

    def __init__(
        self,
        image: str,
        stage: int = 0,
        num_stages: int = 1,
        env: Mapping[str, str] | None = None,
        gpus: tuple[str, ...] = (),
        gpu_attach: str = "request",
        grace: float = DEFAULT_GRACE,
        command: tuple[str, ...] = (),
        name: str | None = None,
        **docker_run: Any,
    ) -> None:
        """docker_run: docker run's options, as Chain takes them (volume=[...] or volumes, shm_size=..., ...); the
        stage gets these mounts alone (no caches: the test describes its stage whole)."""
        self.image, self.stage, self.num_stages, self.grace = image, stage, num_stages, grace
        self.container = ContainerOptions.from_keys(num_stages, docker_run)
        self.stage_env = dict(env or {})
        self.gpus, self.gpu_attach, self.stage_command = tuple(gpus), gpu_attach, tuple(command)
        self.name = name
        self.run_id: str | None = None
        self.ref: str | None = None
        self._lines: list[str] = []
        self._exit: int | None = None
        self._gone = threading.Event()
        self._cond = threading.Condition()
        self._run: launch.Foreground | None = None  # the run, on a thread of its own: joined by stop()

    # ------------------------------------------------------------------------------------------ builders
    def _unstarted(self, what: str) -> None:
        if self.ref is not None:
            raise RuntimeError(f"{what} after start() has no effect on a running stage")

    def with_env(self, key: str, value: str) -> StageContainer:
        """Set a variable in the stage's environment (PEER_DIRECT and the like included)."""
        self._unstarted("with_env")
        self.stage_env[key] = value
        return self

    def with_name(self, name: str) -> StageContainer:
        """The container's name (default `pp-<run>-<stage>`)."""
        self._unstarted("with_name")
        self.name = name
        return self

    def with_command(self, command: str | tuple[str, ...] | list[str]) -> StageContainer:
        """The command after the image's entrypoint (a string is split as a shell would, without a shell)."""
        self._unstarted("with_command")
        self.stage_command = tuple(shlex.split(command) if isinstance(command, str) else command)
        return self

    def get_container_host_ip(self) -> str:
        """Stages use the host's network: what they announce is reached on this machine's loopback."""
        return "127.0.0.1"

    def __enter__(self) -> StageContainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ life
    def start(self) -> StageContainer:
        """A run of this one stage through the chain's own pipeline (app/launch.py), on DOCKER_HOST's engine: the
        run's guard first (a test process killed at any moment leaves no stage behind), the stage in the foreground
        of the chain's scope. Returns once it runs; the engine's refusal (or any error before) is raised here."""
        self._unstarted("start")
        request = ChainRequest(
            stages=self.num_stages,
            image=self.image,
            env=tuple(self.stage_env.items()),
            container=self.container,
            caches="none",
        )
        gpus = [self.gpus if k == self.stage else () for k in range(self.num_stages)]
        owner, run_id = steps.owner_label(False), steps.new_run_id()
        plan = build_plan(request, {}, owner, gpus, [device_requests(g, self.gpu_attach) for g in gpus], run_id)
        spec = plan.stages[self.stage]
        if self.stage_command:
            spec = dataclasses.replace(spec, command=self.stage_command)
        if self.name:
            spec = dataclasses.replace(spec, name=self.name)
        self.run_id, self.name = run_id, spec.name
        one = launch.LaunchRequest(
            dataclasses.replace(request, stages=1, grace=self.grace),
            launch.GpuOptions(mode="none"),  # the stage's GPUs are the test's own choice
            run_id=run_id,
            owner=owner,
            keep_logs=False,
            kill_wait=KILL_WAIT,
        )
        place = DockerSite.to_launch(one, planner=Given(lambda attempt: spec))
        self._run = launch.Foreground(
            lambda hooks: launch.launch(one, hooks, place=place), self._output, self._ended, f"pp-stage-{self.stage}"
        )
        self.ref = self._run.ref
        return self

    def _output(self, stream: str, data: bytes) -> None:
        with self._cond:
            self._lines.append(data.decode("utf-8", "backslashreplace").rstrip("\n"))
            self._cond.notify_all()

    def _ended(self, run: launch.Foreground) -> None:
        with self._cond:
            self._exit = run.exit_code
            self._gone.set()
            self._cond.notify_all()  # a wait for a line ends: the stage is gone

    def stop(self) -> None:
        """The one teardown, by the chain's own scope: SIGTERM, up to the grace, SIGKILL, then up to 30 s for the
        engine to confirm it gone, else removed by its id; then the run's guard goes. TeardownFailed when something
        may be left."""
        run, self._run = self._run, None
        if run is None:
            return
        run.stop("StageContainer.stop()")
        ended = run.done.outcome if run.done is not None else None
        if run.error is not None:
            raise run.error
        if ended is not None and ended.orphans:
            raise TeardownFailed(f"stage {self.stage} ({self.name}): {ended.message}", ended.orphans, ())

    # ------------------------------------------------------------------------------------------ output
    def lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def exit_code(self, timeout: float = 0.0) -> int | None:
        """How it ended (None while it runs, or when the engine could not say); waits up to `timeout`."""
        self._gone.wait(timeout)
        return self._exit

    def _last(self, n: int = 20) -> str:
        return "".join(f"\n  | {line}" for line in self._lines[-n:]) or " (it printed nothing)"

    def wait_for_line(self, predicate: Any, timeout: float = 60.0, what: str = "such a line") -> str:
        """The first line for which `predicate` holds (a str: the line contains it). StageExited when the stage ended
        first (its exit code and last lines), StageTimeout when it still runs after `timeout` seconds."""
        test = (lambda line: predicate in line) if isinstance(predicate, str) else predicate
        if isinstance(predicate, str) and what == "such a line":
            what = f"a line with {predicate!r}"  # the message says which text was awaited
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self._lines:
                    if test(line):
                        return line
                who = f"stage {self.stage} ({self.name}, image {self.image})"
                if self._gone.is_set():
                    raise StageExited(
                        f"{who} exited with code {self._exit} before printing {what}; its last lines:{self._last()}",
                        self._exit,
                        self._lines[-20:],
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StageTimeout(
                        f"{who} printed no {what} within {timeout:g} s ({len(self._lines)} lines; "
                        f"still running); its last lines:{self._last()}",
                        self._lines[-20:],
                    )
                self._cond.wait(min(left, 0.2))

    def wait_for_announcement(self, timeout: float = 60.0) -> StageAnnouncement:
        line = self.wait_for_line(lambda text: parse_line(text) is not None, timeout, "its PP_GPU_NODE_ADDR line")
        found = parse_line(line)
        assert found is not None
        return found


# ---------------------------------------------------------------------------------------------- chains
class _Collect:
    def __init__(self) -> None:
        self.events: list[events.Event] = []
        self.lines: dict[int, list[str]] = {}
        self.cond = threading.Condition()

    def event(self, event: events.Event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        with self.cond:
            self.lines.setdefault(stage, []).append(text)
            self.cond.notify_all()

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        pass


@dataclass
class RunningChain:
    """A chain whose stages all announced: its run id, the roster (one entry per stage, in stage order)."""

    run_id: str
    roster: tuple[events.RosterEntry, ...]
    _collect: _Collect = field(repr=False)
    _run: launch.Background | None = field(default=None, repr=False)

    def all_events(self) -> list[events.Event]:
        """The events so far (docs/formats.md), typed."""
        with self._collect.cond:
            return list(self._collect.events)

    def lines(self, stage: int) -> list[str]:
        with self._collect.cond:
            return list(self._collect.lines.get(stage, []))

    @property
    def announcements(self) -> list[events.StageAnnounced]:
        return [e for e in self.all_events() if isinstance(e, events.StageAnnounced)]

    def _ended(self) -> bool:
        return self._run is not None and self._run.ended.is_set()

    def wait_for_line(self, stage: int, predicate: Any, timeout: float = 60.0, what: str = "such a line") -> str:
        """The first line of `stage` for which `predicate` holds (a str: the line contains it). StageExited when
        the chain ended first (its exit code and the stage's last lines), StageTimeout after `timeout` seconds."""
        test = (lambda line: predicate in line) if isinstance(predicate, str) else predicate
        if isinstance(predicate, str) and what == "such a line":
            what = f"a line with {predicate!r}"  # the message says which text was awaited
        deadline = time.monotonic() + timeout
        with self._collect.cond:
            while True:
                seen = self._collect.lines.get(stage, [])
                for line in seen:
                    if test(line):
                        return line
                last = "".join(f"\n  | {line}" for line in seen[-20:]) or " (it printed nothing)"
                if self._ended():
                    assert self._run is not None
                    done = self._run.done.outcome if self._run.done is not None else None
                    code = done.exit_code if done is not None else None
                    why = f": {done.message}" if done is not None and done.message else ""
                    raise StageExited(
                        f"chain {self.run_id} ended (exit {code}{why}) before stage {stage} printed {what}; "
                        f"stage {stage}'s last lines:{last}",
                        code,
                        seen[-20:],
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    who = f"stage {stage} of chain {self.run_id}"
                    raise StageTimeout(
                        f"{who} printed no {what} within {timeout:g} s ({len(seen)} lines; still "
                        f"running); its last lines:{last}",
                        seen[-20:],
                    )
                self._collect.cond.wait(min(left, 0.2))

    def wait(self, timeout: float | None = None) -> int:
        """Until the chain ends by itself (every stage exited, or one failed): its exit code (docs/chain.md).
        StageTimeout when it still runs after `timeout` seconds; what stopped the launch, raised, when it could
        not finish."""
        assert self._run is not None
        if not self._run.join(timeout):
            raise StageTimeout(f"chain {self.run_id} still runs after {timeout:g} s", [])
        if self._run.error is not None:
            raise self._run.error
        assert self._run.done is not None and self._run.done.outcome is not None
        return int(self._run.done.outcome.exit_code)


@contextmanager
def Chain(
    image: str = BUILTIN_IMAGE,
    stages: int = 2,
    *,
    gpus: str = "none",
    gpus_per_stage: int = 1,
    gpu_attach: str = "request",
    gpu_inventory: str | None = None,
    env: Mapping[str, str] | None = None,
    grace: float = DEFAULT_GRACE,
    addr_timeout: float = 60.0,
    handoff: str = "env",
    bring_up: str = "parallel",
    timeout: float = 120.0,
    **docker_run: Any,
) -> Iterator[RunningChain]:
    """A chain for the length of a `with` block: yields once every stage announced; torn down at the end.
    docker_run: docker run's options for every stage, as `pp-launch chain` takes them (docs/chain.md), under the chain
    file's names or the plural ones: volume=[...] (or volumes), stage_volume, mount, shm_size="2g", ipc="host",
    ulimit, device, cap_add, user, workdir, label; a value docker would refuse raises ValueError naming it."""
    run_id = steps.new_run_id()
    request = launch.LaunchRequest(
        ChainRequest(
            stages=stages,
            image=image,
            env=tuple((env or {}).items()),
            grace=grace,
            addr_timeout=addr_timeout,
            handoff=handoff,
            parallel=bring_up == "parallel",
            container=ContainerOptions.from_keys(stages, docker_run),
        ),
        launch.GpuOptions(mode=gpus, per_stage=gpus_per_stage, attach=gpu_attach, inventory_path=gpu_inventory),
        run_id=run_id,
        keep_logs=False,  # a suite's chains leave nothing in the user's state
    )  # every rule between the options holds here as on the command line
    collect = _Collect()
    roster = lambda event: isinstance(event, events.StageRoster)  # noqa: E731
    run = launch.Background(lambda hooks: launch.launch(request, hooks), collect, roster, name=f"pp-chain-{run_id}")
    try:  # from here on, whatever happens (a Ctrl-C too), the chain is stopped and joined
        if not run.settled(timeout):
            ended = run.done.outcome.message if run.done is not None and run.done.outcome else ""
            why = run.error or ended or f"no roster within {timeout}s"
            raise RuntimeError(f"chain {run_id} of {image} did not come up: {why}")
        with collect.cond:
            up = next(e for e in collect.events if isinstance(e, events.StageRoster)).stages
        yield RunningChain(run_id, up, collect, run)
    finally:
        run.stop("the Chain's with block ended")  # its teardown is bounded (the grace, then the kill wait)


# ---------------------------------------------------------------------------------------------- workers
class WorkerUnderTest:
    """`pp-launch worker check`'s steps as methods (initialize, configure, install, readable, execute, egress,
    release, uninstall, stale_after_restart, invalid_json, shutdown, end_of_stdin), driving the worker as
    swactor's node does (docs/worker-wire.md); each returns what it saw and raises StepFailure with the reason. Use as a
    context manager: the worker container goes at the end. For your own sequence, use `.driver` (a WorkerDriver)
    with `pp_launch.worker` (MO01 records and ring layouts)."""

    StepFailure = worker_check.StepFailure
    STEPS = tuple(method for _name, method in worker_check.Conformance.STEPS)

    def __init__(self, image: str, env: Mapping[str, str] | None = None, timeout: float = worker_check.STEP_TIMEOUT):
        self.conformance = worker_check.Conformance(
            engine_here(), image, dict(env or {}), lambda text: None, timeout=timeout
        )

    def __getattr__(self, name: str) -> Any:
        if name in self.STEPS:
            return getattr(self.conformance, name)
        raise AttributeError(name)

    @property
    def driver(self) -> WorkerDriver:
        return self.conformance.d

    def close(self) -> None:
        self.conformance.d.close()

    def __enter__(self) -> WorkerUnderTest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_answers() -> bool:
    try:
        engine_here(timeout=5)
    except errors.PpLaunchError:
        return False
    return True


__all__ = [
    "BUILTIN_IMAGE",
    "Chain",
    "RunningChain",
    "StageContainer",
    "StageExited",
    "StageTimeout",
    "WorkerUnderTest",
    "engine_answers",
]
