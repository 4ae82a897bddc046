"""This process's own descriptors and directories (pp-gpu-node): what the node does on its machine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable

from pp_launch.adapters.runtime import Nursery


def write_all(fd: int, data: bytes) -> None:
    """Every byte to `fd`; a reader that went away ends the write quietly (the stage runs on until stopped)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[n:]


def on_stdin_end(callback: Callable[[], None]) -> None:
    """A child of `chain --gpu-node`: stdin is a pipe the launcher holds and never writes. Its end (the launcher
    died, SIGKILL included) calls `callback` once, from a daemon thread."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        callback()

    _LIFELINE.start(watch, name="parent-lifeline")  # it ends the process: never joined


_LIFELINE = Nursery("a pp-gpu-node child's lifeline")


def ensure_dirs(paths: Iterable[str]) -> None:
    for path in paths:
        os.makedirs(path, exist_ok=True)


def free_port() -> int:
    """A TCP port no socket of this machine listens on now (the kernel's pick): for a rendezvous's master."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
