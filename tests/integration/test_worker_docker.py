"""The worker controller driving real stub-worker containers, and `pp-launch worker check`."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from pp_launch import labels
from pp_launch.worker import codec as w
from pp_launch.worker import controller as c
from pp_launch.worker.driver import WorkerDriver

from ..helpers import Launcher, spawn, wait_until

pytestmark = pytest.mark.docker


def test_full_lifecycle_with_a_kill_in_the_middle(engine, stub_image) -> None:
    d = WorkerDriver(engine, stub_image, env={"STUB_MODE": "worker"})
    try:
        d.feed(c.StartRequested())
        assert d.wait_for(c.WorkerRunning) == c.WorkerRunning(1, d.wait_for(c.WorkerRunning).pid)
        d.command(w.ConfigureRole(role_id="r", config={}))
        for ring_id, direction in ((1, "ingress"), (2, "egress"), (3, "egress")):
            d.command(
                w.InstallRing(
                    ring_id=ring_id,
                    edge_id=f"e{ring_id}",
                    port_id="p",
                    direction=direction,
                    layout={},
                    object_spec={"extent": 32},
                )
            )
        d.command(w.RingReadable(ring_id=1))
        loaded = d.routed(w.ObjectLoaded)
        assert (loaded.sequence, loaded.device_handle.worker_generation) == (0, 1)
        first_container = d.ref

        since = len(d.notices)
        engine.signal(first_container, signal.SIGKILL)  # `docker kill` from outside
        failed = d.wait_for(c.WorkerFailed, since=since)
        assert failed == c.WorkerFailed(1, "worker exited unexpectedly with status 137", 137)
        after = d.notices[since:]
        assert [n for n in after if isinstance(n, (c.RingFaulted, c.StopRingPump))] == [
            c.RingFaulted(1, 1),
            c.StopRingPump(1),
            c.RingFaulted(2, 1),
            c.StopRingPump(2),
            c.RingFaulted(3, 1),
            c.StopRingPump(3),
        ]
        assert wait_until(lambda: engine.inspect(first_container) is None, 5)

        d.feed(c.RestartRequested())
        assert d.wait_for(c.WorkerRunning, since=since).generation == 2
        assert d.ref != first_container
        stale = w.ReleaseDeviceObject(device_handle=loaded.device_handle)
        assert d.command(stale) == [c.CommandRejected(stale, "OldGeneration")]

        since = len(d.notices)
        d.feed(c.ShutdownRequested())
        assert d.wait_for(c.TerminalStop, since=since) == c.TerminalStop(2)
        assert d.wait_for(c.WorkerStopped, since=since) == c.WorkerStopped(2, "Graceful")
        assert not [n for n in d.notices[since:] if isinstance(n, c.WorkerFailed)]
        assert wait_until(lambda: engine.containers([f"{labels.RUN}={d.run_id}"]) == [], 5)
    finally:
        d.close()


def test_worker_check_passes_on_the_stub(engine, stub_image) -> None:
    check = Launcher("worker", "check", stub_image)
    assert check.wait(120) == 0, check.stderr_text()
    lines = check.stdout_lines
    assert len([line for line in lines if line.startswith("PASS")]) == 11
    assert lines[-1] == "11/11 steps passed: conformant"


@pytest.mark.parametrize(
    ("misbehaviour", "step", "reason"),
    [
        ("sequence", "4. readable -> loaded", "ObjectLoaded sequence 1, expected 0"),
        ("shutdown", "10. graceful shutdown -> stopped, exit 0", "expected exit 0 after WorkerStopped"),
    ],
)
def test_worker_check_fails_naming_the_step(engine, stub_image, misbehaviour: str, step: str, reason: str) -> None:
    check = Launcher("worker", "check", stub_image, "--env", f"STUB_WORKER_MISBEHAVE={misbehaviour}")
    assert check.wait(120) == 1
    failed = [line for line in check.stdout_lines if line.startswith("FAIL")]
    assert len(failed) == 1 and step in failed[0] and reason in failed[0]
    assert "NOT conformant" in check.stdout_lines[-1]


def test_when_the_controller_dies_the_worker_sees_end_of_stdin_and_goes(engine, stub_image) -> None:
    program = (
        "import sys, time\n"
        "from pp_launch.docker_engine import connect\n"
        "from pp_launch.worker.driver import WorkerDriver\n"
        "from pp_launch.worker import controller as c\n"
        f"d = WorkerDriver(connect(), {stub_image!r}, env={{'STUB_MODE': 'worker'}})\n"
        "d.feed(c.StartRequested())\n"
        "assert d.wait_for(c.WorkerRunning) is not None\n"
        "print(d.run_id, flush=True)\n"
        "time.sleep(600)\n"
    )
    import subprocess

    proc = spawn([sys.executable, "-c", program], {**os.environ}, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    run = proc.stdout.readline().decode().strip()
    assert len(engine.containers([f"{labels.RUN}={run}"])) == 1
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    assert wait_until(lambda: engine.containers([f"{labels.RUN}={run}"]) == [], 10)
    assert time.monotonic() - t0 < 5
