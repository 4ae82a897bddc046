"""An in-process stand-in for a Docker engine running worker containers, for unit tests of the worker driver and
the conformance check: each "container" is the built-in stub worker's own serve() on a thread, fed through a pipe,
its events framed into lines as the real backend frames them, and its arena the driver's real memory file."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pp_launch.adapters.docker_engine import ContainerInfo
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import Sink, StageGone, StageOutput
from pp_launch.core.errors import EngineError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "stub-worker"))
import pp_stub_worker  # the image's own worker code, run in-process

from ..workers import swactor_like_worker

SWACTOR_LIKE = "swactor-like"  # the image name that runs tests/workers/swactor_like_worker.py instead of the stub
REFUSED = "refused"  # the image name whose create the fake engine refuses


class _Lines(io.TextIOBase):
    """The worker's stdout: whole lines go to the sink, unless the container was killed."""

    def __init__(self, box: _Box, stage: int, sink: Sink, stream: str = "stdout") -> None:
        self.box, self.stage, self.sink, self.buf, self.stream = box, stage, sink, "", stream

    def write(self, text: str) -> int:
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            if not self.box.killed:
                self.sink(StageOutput(self.stage, self.stream, line.encode()))  # type: ignore[arg-type]
        return len(text)


@dataclass
class _Box:
    spec: StageSpec
    env: dict[str, str]
    write_fd: int | None = None
    killed: bool = False
    alive: bool = False
    thread: threading.Thread | None = None
    labels: dict[str, str] = field(default_factory=dict)


class FakeWorkerEngine:
    """Both the Engine the driver asks (inspect, signal, containers, remove, image_config) and its stage backend
    (create, start, write_stdin, close_stdin)."""

    address = "fake://worker-engine"

    def __init__(self) -> None:
        self.boxes: dict[str, _Box] = {}
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------------------- the engine's side
    def image_config(self, image: str) -> Mapping[str, Any]:
        return {"Entrypoint": ["python3", "-u", "/usr/local/lib/pp-stub/pp_stub.py"], "Cmd": None}

    def inspect(self, ref: str) -> dict[str, Any] | None:
        box = self.boxes.get(ref)
        return {"State": {"Pid": 4242, "Running": True}} if box is not None and box.alive else None

    def signal(self, ref: str, signum: int) -> None:
        if signum == 9:
            self.kill(ref)

    def containers(self, label_filters: list[str]) -> list[ContainerInfo]:
        wanted = dict(f.split("=", 1) for f in label_filters if "=" in f)
        return [
            ContainerInfo(ref, b.spec.name, b.spec.image, "running", 0, b.labels)
            for ref, b in self.boxes.items()
            if b.alive and all(b.labels.get(k) == v for k, v in wanted.items())
        ]

    def remove(self, ref: str) -> None:
        self.kill(ref)

    # ------------------------------------------------------------------------------- the backend's side
    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        if spec.image == REFUSED:
            raise EngineError(f"the engine refused to create {spec.name}")
        ref = f"fake{next(self._ids):04d}"
        self.boxes[ref] = _Box(spec, dict(env), labels=dict(spec.labels))
        return ref

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        box = self.boxes[ref]
        read_fd, box.write_fd = os.pipe()
        env = dict(box.env)
        arena_fd = None
        if box.spec.options.mounts:  # the driver's arena file, as the container's /bin/sh would open it on fd 3
            arena_fd = os.open(box.spec.options.mounts[0].source, os.O_RDWR)
            env["SWACTOR_ARENA_FD"] = str(arena_fd)

        def run() -> None:
            with os.fdopen(read_fd, "rb") as inp:
                out, err = _Lines(box, stage, sink), _Lines(box, stage, sink, "stderr")
                if box.spec.image == SWACTOR_LIKE:
                    code = swactor_like_worker.serve(inp, out, err, env)
                else:
                    code = pp_stub_worker.serve(inp=inp, out=out, env=env, err=err)
            if arena_fd is not None:
                with contextlib.suppress(OSError):  # the worker closes its inherited arena itself
                    os.close(arena_fd)
            box.alive = False
            sink(StageGone(stage, 137 if box.killed else code))

        box.alive = True
        box.thread = threading.Thread(target=run, daemon=True, name=f"fake-worker-{ref}")
        box.thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Every ended fake worker's thread is joined (the backend's close: its threads joined, bounded)."""
        for box in self.boxes.values():
            if box.thread is not None and not box.alive:
                box.thread.join(timeout)

    def write_stdin(self, ref: str, data: bytes) -> None:
        fd = self.boxes[ref].write_fd
        if fd is None:
            raise OSError("stdin is closed")
        os.write(fd, data)

    def close_stdin(self, ref: str) -> None:
        box = self.boxes[ref]
        if box.write_fd is not None:
            os.close(box.write_fd)
            box.write_fd = None

    def tearing_down(self) -> None:
        """Nothing to hurry: each fake worker ends as its stdin closes or it is killed."""

    def leftovers(self, run_id: str) -> list[str]:
        return [c.id for c in self.containers([f"pp-launch.run={run_id}"])]

    def kill(self, ref: str) -> None:
        box = self.boxes.get(ref)
        if box is not None and box.alive:
            box.killed = True
            self.close_stdin(ref)
            if box.thread is not None:
                box.thread.join(5)
