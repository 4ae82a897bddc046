"""The worker controller driving real stub-worker containers, and `pp-launch worker check`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pp_launch.app import worker_check
from pp_launch.app.worker_driver import WorkerDriver
from pp_launch.core import labels
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c
from pp_launch.testing.worker import ARENA_BYTES, ObjectRecord, ring_layouts

from ..helpers import Launcher, guard_of, run_containers, spawn, wait_until
from ..unit.test_worker_driver import DOCS, golden

pytestmark = pytest.mark.docker


def test_full_lifecycle_with_a_kill_in_the_middle(engine, stub_image) -> None:
    d = WorkerDriver(engine, stub_image, arena_ceiling=ARENA_BYTES, env={"STUB_MODE": "worker"})
    ingress, _ = ring_layouts([1, 2])
    try:
        d.start()
        running = d.wait_for(c.WorkerRunning)
        assert running is not None and running.generation == 1
        d.command(worker_check.configure_role())
        for ring_id in (1, 2):
            d.command(worker_check.install_ring(ring_id))
        d.write_record(ingress, ObjectRecord.of_words(object_id=10, sequence=0, words=[3]))
        d.command(w.RingReadable(ring_id=1))
        loaded = d.routed(w.ObjectLoaded)
        assert (loaded.object_id, loaded.sequence, loaded.device_handle.worker_generation, loaded.edge_id) == (
            10,
            0,
            1,
            101,
        )
        assert d.arena is not None and not os.path.exists(d.arena.path), "the host's name goes once it is ready"
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
        ]
        assert wait_until(lambda: engine.inspect(first_container) is None, 10)

        guard = guard_of(engine, d.run_id)
        d.start()  # RestartRequested, then StartWorker: swactor's two steps
        assert d.wait_for(c.WorkerRunning, since=since).generation == 2
        assert d.ref != first_container
        assert guard_of(engine, d.run_id) == guard and len(guard) == 1  # a generation is an attempt of the one run
        stale = w.ReleaseDeviceObject(device_handle=loaded.device_handle)
        assert d.command(stale) == [c.CommandRejected(stale, "OldGenerationHandle")]

        since = len(d.notices)
        d.feed(c.ShutdownRequested())
        assert d.wait_for(c.TerminalStopped, since=since) == c.TerminalStopped(2)
        assert d.wait_for(c.WorkerStoppedNotice, since=since) == c.WorkerStoppedNotice(2, "Graceful")
        assert not [n for n in after if isinstance(n, c.WorkerFailed) and n.generation == 2]
        assert wait_until(lambda: run_containers(engine, d.run_id) == [], 5)  # its guard goes with d.close()
    finally:
        d.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("pp-worker-g")]  # each generation's, joined
    assert guard_of(engine, d.run_id) == []


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
        ("sequence", "4. node writes MO01 records -> loaded", '"sequence":1,'),
        ("shutdown", "11. graceful shutdown -> stopped, exit 0", "the worker exited with status 3"),
        ("payload-bytes", "6. egress record read back", "committed_bytes is 4, but the record read back is 44"),
        ("slots", "4. node writes MO01 records -> loaded", "WorkerFatal InvalidObjectHeader"),
        ("earlier-wire", "1. initialize", "speaks an earlier swactor wire: it needs helper_abi_version"),
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
        "from pp_launch.app.worker_driver import WorkerDriver\n"
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
    assert len(run_containers(engine, run)) == 1 and len(guard_of(engine, run)) == 1  # the worker, and its guard
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    assert wait_until(lambda: engine.containers([f"{labels.RUN}={run}"]) == [], 10)
    assert time.monotonic() - t0 < 5


SWACTOR_LIKE_IMAGE = "pp-launch-tests/swactor-like-worker:latest"
WORKERS = Path(__file__).resolve().parents[1] / "workers"


@pytest.fixture(scope="module")
def swactor_like_image(engine, stub_image, tmp_path_factory) -> Iterator[str]:
    """An image whose entrypoint is tests/workers/swactor_like_worker.py (behaves as swactor's own worker does),
    on the stub image (for its python3); removed when the module ends."""
    context = tmp_path_factory.mktemp("swactor-like")
    shutil.copy(WORKERS / "swactor_like_worker.py", context / "worker.py")
    (context / "Dockerfile").write_text(
        f"FROM {stub_image}\nCOPY worker.py /opt/pp-tests/worker.py\n"
        'ENTRYPOINT ["python3", "-u", "/opt/pp-tests/worker.py"]\nCMD []\n'
    )
    engine.build(str(context), SWACTOR_LIKE_IMAGE, {}, {"pp-launch-tests": "swactor-like"}, lambda text: None)
    try:
        yield SWACTOR_LIKE_IMAGE
    finally:
        engine.remove_image(SWACTOR_LIKE_IMAGE)


def test_worker_check_passes_on_a_worker_that_behaves_as_swactors_and_traces_the_golden_exchange(
    engine, swactor_like_image
) -> None:
    check = Launcher("worker", "check", swactor_like_image, "--trace")
    assert check.wait(120) == 0, "\n".join(check.stdout_lines) + check.stderr_text()
    lines = check.stdout_lines
    assert len([line for line in lines if line.startswith("PASS")]) == 12
    assert lines[-1] == "12/12 steps passed: conformant"
    trace = [line for line in lines if not line.startswith(("PASS", "12/12"))]
    block = DOCS.read_text().split("<!-- golden: worker check --trace -->\n```text\n", 1)[1].split("\n```", 1)[0]
    assert golden("\n".join(trace)) == golden(block)


def test_worker_check_json_report_on_a_swactor_like_worker(engine, swactor_like_image) -> None:
    check = Launcher("worker", "check", swactor_like_image, "--json")
    assert check.wait(120) == 0, check.stderr_text()
    (doc,) = [json.loads(line) for line in check.stdout_lines]
    assert doc["conformant"] is True and doc["passed"] == doc["total"] == 12
    assert {s["verdict"] for s in doc["steps"]} == {"PASS"}


def test_the_driver_runs_a_swactor_like_worker_in_swactors_order(engine, swactor_like_image) -> None:
    """spawn, initialize, two rings, the role, a node-written record, ExecuteStep, the egress record read back,
    release, a restart to generation 2, shutdown: 15 exchanges, each checked."""
    d = WorkerDriver(engine, swactor_like_image, arena_ceiling=ARENA_BYTES)
    ingress, egress = ring_layouts([1, 2])
    seen: list[str] = []
    try:
        d.start()
        assert d.wait_for(c.WorkerRunning).generation == 1
        seen.append("ready")
        for ring_id in (1, 2):
            d.command(worker_check.install_ring(ring_id))
            assert d.routed(w.RingInstalled, since=len(d.notices) - 1).ring_id == ring_id
            seen.append(f"ring {ring_id}")
        since = len(d.notices)
        d.command(worker_check.configure_role())
        assert d.routed(w.RoleConfigured, since=since).role_id == worker_check.ROLE
        seen.append("role")
        for sequence in (0, 1):
            d.write_record(ingress, ObjectRecord.of_words(object_id=20 + sequence, sequence=sequence, words=[5]))
            seen.append(f"record {sequence} written")
            since = len(d.notices)
            d.command(w.RingReadable(ring_id=1))
            loaded = d.routed(w.ObjectLoaded, since=since)
            assert (loaded.object_id, loaded.sequence, loaded.extent) == (20 + sequence, sequence, 4)
            seen.append(f"loaded {sequence}")
            since = len(d.notices)
            d.command(worker_check.execute_step(1 + sequence, loaded, sequence=sequence))
            produced = d.routed(w.ObjectProduced, since=since)
            assert d.routed(w.StepCompleted, since=since).step_id == 1 + sequence
            seen.append(f"step {sequence}")
            back = d.read_record(egress)
            assert (back.object_id, back.sequence, back.size) == (500, sequence, produced.committed_bytes)
            seen.append(f"egress {sequence} read back")
        since = len(d.notices)
        d.command(w.ReleaseDeviceObject(device_handle=loaded.device_handle))
        assert d.routed(w.DeviceObjectReleased, since=since).device_handle == loaded.device_handle
        seen.append("released")
        d.feed(c.RestartRequested())
        d.feed(c.StartWorker())
        assert d.wait_for(c.WorkerRunning, since=since).generation == 2
        seen.append("generation 2")
        since = len(d.notices)
        d.feed(c.ShutdownRequested())
        assert d.wait_for(c.TerminalStopped, since=since) == c.TerminalStopped(2)
        seen.append("stopped")
    finally:
        d.close()
    assert len(seen) == 15, seen
    assert engine.containers([f"{labels.RUN}={d.run_id}"]) == []
