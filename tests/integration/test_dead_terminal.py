"""On the real engine: a terminal that goes away, or output closed from the start, never stops the
teardown. Before: the reporter's EIO (or AttributeError on a closed stream) escaped before any stage was signalled:
a traceback, exit 1, and the stages' grace skipped."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid

import pytest

from ..helpers import remember_run, run_containers, wait_until

pytestmark = pytest.mark.docker
PP = [sys.executable, "-m", "pp_launch"]


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_a_terminal_that_goes_away_ends_the_chain_with_129_and_every_stage_torn_down(engine, stub_image) -> None:
    prefix = f"tty{uuid.uuid4().hex[:8]}"
    pid, master = pty.fork()
    if pid == 0:  # the launcher, on the pty as its controlling terminal (a session of its own)
        os.execv(
            sys.executable,
            [
                *PP,
                "chain",
                "--stages",
                "3",
                "--gpus",
                "none",
                "--name",
                prefix,
                "--grace",
                "3",
                "--env",
                "STUB_MODE=hold",
                "--env",
                "STUB_LOG_RATE=200",
            ],
        )
    try:
        seen = read_until(master, b"PP_GPU_NODE_ADDR", 60)
        assert b"PP_GPU_NODE_ADDR" in seen, seen[-2000:]
        assert wait_until(
            lambda: len([c for c in engine.containers(["pp-launch.run"]) if c.name.startswith(prefix)]) == 3, 30
        )
        run = next(c.labels["pp-launch.run"] for c in engine.containers(["pp-launch.run"]) if c.name.startswith(prefix))
        remember_run(run)
    finally:
        os.close(master)  # the terminal goes away: the kernel hangs up the launcher's session
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the launcher did not end within 60 s of its terminal going away")
    assert os.waitstatus_to_exitcode(status) == 129
    assert run_containers(engine, run) == []


@pytest.mark.parametrize("closed", ["stdout", "stderr", "both"])
def test_output_closed_from_the_start_is_no_error(engine, stub_image, closed: str) -> None:
    fds = {"stdout": (1,), "stderr": (2,), "both": (1, 2)}[closed]
    prefix = f"closed{uuid.uuid4().hex[:8]}"
    argv = [*PP, "chain", "--stages", "2", "--gpus", "none", "--name", prefix, "--env", "MAX_TOKENS=2"]
    proc = subprocess.Popen(argv, preexec_fn=lambda: [os.close(fd) for fd in fds])
    assert proc.wait(120) == 0  # the demo completed: nothing raised out of a reporter
    assert not [c for c in engine.containers(["pp-launch.run"]) if c.name.startswith(prefix)]
