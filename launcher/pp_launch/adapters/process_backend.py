"""Stages as child processes (`pp-launch chain --gpu-node PATH`), as swactor's orchestrator ran them.

Each stage is PATH with the stage environment, in its own process group; its stdout carries the
announcement. Stop signals go to the whole group; a kill is SIGKILL to the group. When PATH is
pp-gpu-node (or the docker-gpu-node.sh shim), each child's container joins the chain's run
(PP_LAUNCH_RUN), so the chain's final check asks the engine about them too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from pp_launch.adapters.runtime import Nursery
from pp_launch.core import errors, stage_env
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import Sink, StageGone, StageOutput
from pp_launch.core.lines import LineSplitter
from pp_launch.core.stage_env import FORWARD_ENV, NODE_FORWARDED, PARENT_LIFELINE, RUN_ENV

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None]:
    """In the child before exec: SIGTERM when the launcher dies (Linux PR_SET_PDEATHSIG), so a stage process in
    its own session never outlives it. The signal follows the thread that started the child: start() runs on
    the chain's own thread, which lives as long as the launcher. If the launcher is already gone, stop now."""

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child between fork and exec only calls

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


class ProcessStageBackend:
    def __init__(
        self,
        path: str,
        run_id: str,
        grace: float,
        engine_leftovers: Callable[[str], list[str]] | None = None,
        settle: float = 10.0,
    ) -> None:
        """engine_leftovers: asks the engine for the run's containers (None: PATH runs no containers we know of).
        settle: how long to wait for the children's own watchdogs to remove their containers."""
        self.path = path
        self.run_id = run_id
        self.grace = grace
        self.engine_leftovers = engine_leftovers
        self.settle = settle
        self._pending: dict[str, dict[str, str]] = {}  # created, not yet started: its environment
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._threads = Nursery("the pp-gpu-node children")  # every reader and wait, joined by close()

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        full = dict(os.environ)
        full.update(env)
        full[RUN_ENV] = self.run_id
        full.setdefault("PP_IMAGE", spec.image)
        full.setdefault("PP_CONTAINER_PREFIX", spec.name.rsplit("-", 1)[0])
        full.setdefault("PP_STOP_GRACE", f"{self.grace:g}")
        full.setdefault("PP_STAGE_NETWORK", spec.network)
        if spec.gpus:
            full["PP_GPUS"] = "device=" + ",".join(spec.gpus)
        if spec.entrypoint:
            full["PP_ENTRYPOINT"] = spec.entrypoint[0]
        # Every variable the chain sets for the stage (--env, --stage-env, --seed-*) reaches its container,
        # not only the names pp-gpu-node forwards on its own.
        known = {*stage_env.FORWARDED, *NODE_FORWARDED, stage_env.LIFELINE, stage_env.NVIDIA_VISIBLE_DEVICES}
        extra = [n for n in env if n not in known]
        listed = [n for n in full.get(FORWARD_ENV, "").split(",") if n.strip()]
        if extra:
            full[FORWARD_ENV] = ",".join(dict.fromkeys([*listed, *extra]))
        self._pending[spec.name] = full
        return spec.name

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        env = self._pending.pop(ref)
        env[PARENT_LIFELINE] = "stdin"
        try:
            proc = subprocess.Popen(
                [self.path],
                env=env,
                stdin=subprocess.PIPE,  # never written: its end tells the child we are gone (PP_PARENT_LIFELINE)
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except OSError as exc:
            raise errors.EngineError(f"cannot run --gpu-node {self.path}: {exc.strerror}") from None
        self._procs[ref] = proc
        readers = [
            self._threads.start(self._read, proc.stdout, "stdout", stage, sink, name=f"stage-{stage}-stdout"),
            self._threads.start(self._read, proc.stderr, "stderr", stage, sink, name=f"stage-{stage}-stderr"),
        ]
        self._threads.start(self._wait, proc, readers, stage, sink, name=f"stage-{stage}-wait")

    @staticmethod
    def _read(pipe: object, stream: Literal["stdout", "stderr"], stage: int, sink: Sink) -> None:
        splitter = LineSplitter()
        fd = pipe.fileno()  # type: ignore[attr-defined]
        while chunk := os.read(fd, 65536):
            for line in splitter.feed(chunk):
                sink(StageOutput.of(stage, stream, line))
        for line in splitter.close():
            sink(StageOutput.of(stage, stream, line))

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], readers: list[threading.Thread], stage: int, sink: Sink) -> None:
        code = proc.wait()
        for r in readers:
            r.join(timeout=5.0)
        sink(StageGone(stage, 128 - code if code < 0 else code))

    def signal(self, ref: str, signum: int) -> None:
        proc = self._procs.get(ref)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    def kill(self, ref: str) -> None:
        self.signal(ref, signal.SIGKILL)

    def remove(self, ref: str) -> None:
        self._pending.pop(ref, None)
        self.kill(ref)

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        raise errors.EngineError("child processes of another launcher cannot be adopted")

    def tearing_down(self) -> None:
        """Child output is small (a pipe per child): read it to its end as ever."""

    def close(self, timeout: float = 5.0) -> None:
        self._threads.join(timeout)

    def hand_over(self, ref: str) -> None:
        """Never reached: a detached run cannot have child processes (they end with the launcher)."""

    def leftovers(self, run_id: str) -> list[str]:
        alive = [ref for ref, p in self._procs.items() if p.poll() is None]
        if self.engine_leftovers is None:
            return alive
        deadline = time.monotonic() + self.settle
        while (left := self.engine_leftovers(run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)  # a killed pp-gpu-node's watchdog is removing its container
        return alive + left
