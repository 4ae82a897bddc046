"""The worker driver and the conformance check without Docker: the built-in stub worker's own code, and a worker
that behaves as swactor's tinygrad_cpu_worker.py does (tests/workers/), run in-process behind a fake engine
(tests/unit/fake_worker.py), sharing the driver's real arena file. The check drives them as docs/worker-wire.md says."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pp_launch.app import worker_check
from pp_launch.app.worker_driver import WorkerDriver
from pp_launch.core.errors import EngineError
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c
from pp_launch.testing.worker import ObjectRecord, ring_layouts

from .fake_worker import REFUSED, SWACTOR_LIKE, FakeWorkerEngine

DOCS = Path(__file__).resolve().parents[2] / "docs" / "worker-wire.md"
GENEROUS = 30.0  # a wait no failure in these tests may come near


def driver(image: str = "stub", **env: str) -> tuple[WorkerDriver, FakeWorkerEngine]:
    fake = FakeWorkerEngine()
    d = WorkerDriver(fake, image, arena_ceiling=16384, env={"STUB_MODE": "worker", **env}, stage_backend=fake)  # type: ignore[arg-type]
    return d, fake


@pytest.mark.parametrize("image", ["stub", SWACTOR_LIKE])
def test_a_lifecycle_in_swactor_order_on_the_fake_engine_with_the_real_arena(image: str) -> None:
    """spawn, initialize, rings, role, a node-written record, ExecuteStep, the egress record read back, release,
    a restart to generation 2, shutdown: the order of swactor's GpuWorkerRuntime."""
    d, fake = driver(image)
    ingress, egress = ring_layouts([1, 2])
    try:
        d.start()
        assert d.wait_for(c.WorkerRunning, 5) == c.WorkerRunning(1, 4242)
        container = fake.boxes[d.ref or ""]
        assert container.env["SWACTOR_ARENA_BYTES"] == "16384" and container.env["SWACTOR_STAGE_INDEX"] == "0"
        assert container.env["DEV"] == "CPU"
        for ring_id in (1, 2):
            d.command(worker_check.install_ring(ring_id))
        d.command(worker_check.configure_role())
        assert d.routed(w.RoleConfigured, 5) is not None
        d.write_record(ingress, ObjectRecord.of_words(object_id=10, sequence=0, words=[3]))
        d.command(w.RingReadable(ring_id=1))
        loaded = d.routed(w.ObjectLoaded, 5)
        assert (loaded.object_id, loaded.sequence, loaded.extent) == (10, 0, 4)
        d.command(worker_check.execute_step(1, loaded))
        produced = d.routed(w.ObjectProduced, 5)
        assert d.routed(w.StepCompleted, 5) is not None
        back = d.read_record(egress)
        assert (back.object_id, back.sequence, back.size) == (500, 0, produced.committed_bytes)
        d.command(w.ReleaseDeviceObject(device_handle=loaded.device_handle))
        assert d.routed(w.DeviceObjectReleased, 5).device_handle == loaded.device_handle

        since = len(d.notices)
        d.kill_container()
        failed = d.wait_for(c.WorkerFailed, 5, since)
        assert failed == c.WorkerFailed(1, c.Failure.PROCESS_EXITED, 137, "worker exited with status 137")
        d.start()
        assert d.wait_for(c.WorkerRunning, 5, since).generation == 2
        stale = w.ReleaseDeviceObject(device_handle=loaded.device_handle)
        assert d.command(stale) == [c.CommandRejected(stale, "OldGenerationHandle")]
        since = len(d.notices)
        d.feed(c.ShutdownRequested())
        assert d.wait_for(c.TerminalStopped, 5, since) == c.TerminalStopped(2)
    finally:
        d.close()
    assert fake.containers([]) == []


def test_a_driver_started_late_in_a_check_gives_its_worker_the_whole_initialization_time() -> None:
    """The trace's origin (a check's start, shared by its drivers) is not the controller's: a fresh driver made 20 s
    into a check still waits its full init timeout for WorkerReady (it killed the worker at once, which a slow
    machine showed as step 12's "a fresh worker did not start")."""
    fake = FakeWorkerEngine()
    d = WorkerDriver(
        fake,  # type: ignore[arg-type]
        "stub",
        arena_ceiling=16384,
        env={"STUB_MODE": "worker"},
        stage_backend=fake,
        init_timeout=10.0,
        started_at=time.monotonic() - 20.0,
    )
    try:
        d.start()
        started = d.wait_for((c.WorkerRunning, c.WorkerFailed), GENEROUS)
        assert isinstance(started, c.WorkerRunning), started
    finally:
        d.close()
    assert fake.containers([]) == []


def test_a_generation_the_engine_refuses_raises_and_reports_no_exit_of_its_own() -> None:
    """The refusal reaches the caller of start(); the controller hears of no process that never ran."""
    d, fake = driver(REFUSED)
    try:
        with pytest.raises(EngineError, match="refused to create"):
            d.start()
        assert d.inbox.get(0.2) is None and not [n for n in d.notices if isinstance(n, c.WorkerFailed)]
    finally:
        d.close()
    assert fake.boxes == {}


def run_check(image: str = "stub", **env: str) -> tuple[bool, list[str]]:
    fake = FakeWorkerEngine()
    lines: list[str] = []
    ok = worker_check.check(fake, image, env, lines.append, backend=fake, timeout=2.0)  # type: ignore[arg-type]
    return ok, lines


@pytest.mark.parametrize("image", ["stub", SWACTOR_LIKE])
def test_the_conformance_check_passes_on_the_stub_and_on_a_swactor_like_worker(image: str) -> None:
    ok, lines = run_check(image)
    assert ok and lines[-1] == "12/12 steps passed: conformant", "\n".join(lines)
    assert len([line for line in lines if line.startswith("PASS")]) == 12


@pytest.mark.parametrize(
    ("misbehave", "step", "reason"),
    [
        # the four habits of the old check, each done the old way round by a worker: each fails the check
        ("own-input", "4. node writes MO01 records -> loaded", "the node wrote object 10, sequence 0"),
        ("slots", "4. node writes MO01 records -> loaded", "WorkerFatal InvalidObjectHeader"),
        ("stale-on-release-only", "9. stale generation refused in ExecuteStep", "accepted a generation-1 handle"),
        ("payload-bytes", "6. egress record read back", "committed_bytes is 4, but the record read back is 44"),
        # and the rules that were always there
        ("sequence", "4. node writes MO01 records -> loaded", '"sequence":1,'),
        ("release", "7. release", "expected DeviceObjectReleased for handle 2 of generation 1, got nothing"),
        ("stale", "9. stale generation refused in ExecuteStep", "accepted a generation-1 handle"),
        ("invalid_json", "10. invalid JSON -> fatal", "expected WorkerFatal InvalidJson"),
        ("shutdown", "11. graceful shutdown -> stopped, exit 0", "the worker exited with status 3"),
        ("string-ids", "1. initialize", "backend must be an object"),
        ("earlier-wire", "1. initialize", "speaks an earlier swactor wire: it needs helper_abi_version"),
    ],
)
def test_the_conformance_check_names_the_first_failing_step(misbehave: str, step: str, reason: str) -> None:
    ok, lines = run_check(STUB_WORKER_MISBEHAVE=misbehave)
    first = next(line for line in lines if line.startswith("FAIL"))
    assert not ok and step in first and reason in first, "\n".join(lines)
    assert "NOT conformant" in lines[-1]
    assert not re.search(r"\b(WorkerFailed|ObjectLoaded|Routed)\(", "\n".join(lines)), "a Python repr in the report"


def test_a_dead_worker_ends_the_step_at_once_with_its_status_and_last_stderr_lines() -> None:
    """The old check's ConfigureRole (run_id "conformance") against a worker that reads run_id with int(), as
    swactor's does: the worker dies with a traceback; the step says so at once, never after its timeout."""
    fake = FakeWorkerEngine()
    conformance = worker_check.Conformance(fake, SWACTOR_LIKE, {}, lambda t: None, fake, timeout=GENEROUS)  # type: ignore[arg-type]
    try:
        conformance.initialize()
        since = len(conformance.d.notices)
        t0 = time.monotonic()
        conformance.d.command(w.ConfigureRole(role_id=1, config={"run_id": "conformance", "stage_index": 0}))
        with pytest.raises(worker_check.StepFailure) as failure:
            conformance._reply((w.RoleConfigured, w.RoleFailed), since)
        assert time.monotonic() - t0 < GENEROUS / 2, "the step waited for its timeout instead of the exit"
    finally:
        conformance.d.close()
    assert "the worker exited with status 1 before it answered RoleConfigured or RoleFailed" in str(failure.value)
    assert any("ValueError" in line for line in failure.value.stderr), failure.value.stderr
    result = worker_check.StepResult("configure", False, str(failure.value), 0.1, failure.value.stderr)
    assert "the worker's last stderr lines:" in result.line(2) and "| ValueError" in result.line(2)


def test_the_json_report_is_one_document() -> None:
    fake = FakeWorkerEngine()
    out: list[str] = []
    assert not worker_check.check(
        fake,
        "stub",
        {"STUB_WORKER_MISBEHAVE": "payload-bytes"},
        out.append,  # type: ignore[arg-type]
        backend=fake,
        timeout=2.0,
        as_json=True,
    )
    assert len(out) == 1
    doc = json.loads(out[0])
    assert (doc["conformant"], doc["passed"], doc["total"]) == (False, 6, 12)
    assert [s["verdict"] for s in doc["steps"]][:7] == ["PASS"] * 5 + ["FAIL", "SKIP"]
    assert doc["steps"][5]["name"] == "egress record read back: committed_bytes"


@pytest.mark.parametrize(
    ("stdout", "stderr", "marker"),
    [
        (['{"type":"RoleLoaded","role_id":1}'], [], "it answers RoleLoaded"),
        (['{"type":"StepExecuted","step_id":1}'], [], "it answers StepExecuted"),
        (['{"type":"WorkerReady","generation":1}'], [], "its WorkerReady carries no ring_helper_abi"),
        (['{"type":"TinygradImportStarted","requested_device":"CPU"}'], [], "it sends TinygradImportStarted events"),
        ([], ["KeyError: 'SWACTOR_WORKER_EVENT_SOCK'"], "it needs SWACTOR_WORKER_EVENT_SOCK"),
        ([], ["arena = mmap.mmap(int(os.environ['MVP_ARENA_FD']))"], "it needs MVP_ARENA_FD"),
        (['{"type":"WorkerReady","pid":1,"worker_generation":1,"ring_helper_abi":1,"backend":{}}'], ["boom"], None),
        (["not json", "[1]"], [], None),
    ],
)
def test_an_earlier_swactor_wire_is_recognised(stdout: list[str], stderr: list[str], marker: str | None) -> None:
    assert worker_check.earlier_wire(stdout, stderr) == marker


def golden(text: str) -> list[str]:
    """The trace lines with what differs from run to run masked: times, pids, container ids."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^ *\d+\.\d{3} ", "T ", line)
        line = re.sub(r'"pid":\d+', '"pid":P', line)
        out.append(re.sub(r"container \S+", "container C", line))
    return out


def test_the_golden_exchange_in_the_wire_doc_is_what_the_check_prints() -> None:
    block = DOCS.read_text().split("<!-- golden: worker check --trace -->\n```text\n", 1)[1].split("\n```", 1)[0]
    fake = FakeWorkerEngine()
    trace: list[str] = []
    ok = worker_check.check(
        fake,
        SWACTOR_LIKE,
        {},
        lambda line: None,
        backend=fake,
        timeout=2.0,  # type: ignore[arg-type]
        trace=trace.append,
    )
    assert ok
    assert golden("\n".join(trace)) == golden(block)
    assert any('> {"type":"ExecuteStep"' in line and '"port_id":"output","extent":4' in line for line in trace)
