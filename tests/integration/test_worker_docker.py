"""The worker controller driving real stub-worker containers, and `pp-launch worker check`."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from pp_launch.adapters.worker_driver import WorkerDriver
from pp_launch.core import labels
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c

from ..helpers import Launcher, spawn, wait_until

pytestmark = pytest.mark.docker


def test_full_lifecycle_with_a_kill_in_the_middle(engine, stub_image) -> None:
    d = WorkerDriver(engine, stub_image, env={"STUB_MODE": "worker"})
    try:
        d.start()
        running = d.wait_for(c.WorkerRunning)
        assert running is not None and running.generation == 1
        d.command(w.ConfigureRole(role_id=1, config={"stage_index": 0}))
        for ring_id, direction in ((1, "ingress"), (2, "egress"), (3, "egress")):
            d.command(
                w.InstallRing(
                    ring_id=ring_id,
                    edge_id=10 + ring_id,
                    port_id="p",
                    direction=direction,
                    layout={},
                    object_spec={"max_extent": 32, "alignment": 8},
                )
            )
        d.command(w.RingReadable(ring_id=1))
        loaded = d.routed(w.ObjectLoaded)
        assert (loaded.sequence, loaded.device_handle.worker_generation, loaded.edge_id) == (0, 1, 11)
        assert d.arena is not None and (loaded.object_id, 0) in {(o, s) for _, o, s, _ in d.arena.records()}
        assert not os.path.exists(d.arena.path), "the host's name for the arena is gone once the worker is ready"
        first_container = d.ref

        since = len(d.notices)
        engine.signal(first_container, signal.SIGKILL)  # `docker kill` from outside
        failed = d.wait_for(c.WorkerFailed, since=since)
        assert failed == c.WorkerFailed(1, c.Failure.PROCESS_EXITED, 137, "worker exited with status 137")
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

        d.start()  # RestartRequested, then StartWorker: the seed's two steps
        assert d.wait_for(c.WorkerRunning, since=since).generation == 2
        assert d.ref != first_container
        stale = w.ReleaseDeviceObject(device_handle=loaded.device_handle)
        assert d.command(stale) == [c.CommandRejected(stale, "OldGenerationHandle")]

        since = len(d.notices)
        d.feed(c.ShutdownRequested())
        assert d.wait_for(c.TerminalStopped, since=since) == c.TerminalStopped(2)
        assert d.wait_for(c.WorkerStoppedNotice, since=since) == c.WorkerStoppedNotice(2, "Graceful")
        assert not [n for n in d.notices[since:] if isinstance(n, c.WorkerFailed)]
        assert wait_until(lambda: engine.containers([f"{labels.RUN}={d.run_id}"]) == [], 5)
    finally:
        d.close()


def test_an_actor_shutdown_command_ends_in_a_clean_stop_not_a_failure(engine, stub_image) -> None:
    """The port's old bug: ShutdownWorker sent as an actor command left the state Running, so exit 0 was a crash."""
    d = WorkerDriver(engine, stub_image, env={"STUB_MODE": "worker"})
    try:
        d.start()
        assert d.wait_for(c.WorkerRunning) is not None
        d.command(w.ShutdownWorker(mode="AbortInFlight"))
        assert d.wait_for((c.TerminalStopped, c.WorkerFailed)) == c.TerminalStopped(1)
    finally:
        d.close()


def test_worker_check_passes_on_the_stub(engine, stub_image) -> None:
    check = Launcher("worker", "check", stub_image)
    assert check.wait(120) == 0, check.stderr_text()
    lines = check.stdout_lines
    assert len([line for line in lines if line.startswith("PASS")]) == 12
    assert lines[-1] == "12/12 steps passed: conformant"


@pytest.mark.parametrize(
    ("misbehaviour", "step", "reason"),
    [
        ("sequence", "4. readable -> loaded", "ObjectLoaded sequence 1, expected 0"),
        ("shutdown", "11. graceful shutdown -> stopped, exit 0", "expected exit 0 after WorkerStopped"),
    ],
)
def test_worker_check_fails_naming_the_step(engine, stub_image, misbehaviour: str, step: str, reason: str) -> None:
    check = Launcher("worker", "check", stub_image, "--env", f"STUB_WORKER_MISBEHAVE={misbehaviour}")
    assert check.wait(120) == 1
    failed = [line for line in check.stdout_lines if line.startswith("FAIL")]
    assert len(failed) == 1 and step in failed[0] and reason in failed[0]
    assert "NOT conformant" in check.stdout_lines[-1]


def test_worker_check_names_the_first_step_for_the_old_string_id_wire(engine, stub_image) -> None:
    check = Launcher("worker", "check", stub_image, "--env", "STUB_WORKER_MISBEHAVE=string-ids")
    assert check.wait(120) == 1
    first = next(line for line in check.stdout_lines if line.startswith("FAIL"))
    assert first.startswith("FAIL   1. initialize:") and "backend must be an object" in first, first


def test_when_the_controller_dies_the_worker_sees_end_of_stdin_and_goes(engine, stub_image) -> None:
    program = (
        "import sys, time\n"
        "from pp_launch.adapters.docker_engine import connect\n"
        "from pp_launch.adapters.worker_driver import WorkerDriver\n"
        "from pp_launch.core.worker import controller as c\n"
        f"d = WorkerDriver(connect(), {stub_image!r}, env={{'STUB_MODE': 'worker'}})\n"
        "d.start()\n"
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
