"""The worker driver and the conformance check without Docker: the built-in stub worker's own code runs
in-process behind a fake engine (tests/unit/fake_worker.py), sharing the driver's real arena file."""

from __future__ import annotations

import pytest

from pp_launch.adapters.worker_driver import WorkerDriver
from pp_launch.app import worker_check
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c

from .fake_worker import FakeWorkerEngine


def driver(**env: str) -> tuple[WorkerDriver, FakeWorkerEngine]:
    fake = FakeWorkerEngine()
    d = WorkerDriver(fake, "stub", env={"STUB_MODE": "worker", **env}, stage_backend=fake)  # type: ignore[arg-type]
    return d, fake


def ring(ring_id: int, direction: str) -> w.InstallRing:
    return w.InstallRing(
        ring_id=ring_id, edge_id=10 + ring_id, port_id="p", direction=direction,  # type: ignore[arg-type]
        layout={}, object_spec={"max_extent": 32, "alignment": 8},
    )  # fmt: skip


def test_a_lifecycle_on_the_fake_engine_with_the_real_arena() -> None:
    d, fake = driver()
    try:
        d.start()
        running = d.wait_for(c.WorkerRunning, 5)
        assert running == c.WorkerRunning(1, 4242)
        container = fake.boxes[d.ref or ""]
        assert container.env["SWACTOR_ARENA_BYTES"] == str(d.arena_ceiling)  # the seed's ArenaEnv
        assert container.spec.entrypoint is not None and container.spec.command is not None
        assert container.spec.command[-1].endswith("pp_stub.py")  # the image's own entrypoint, under the arena entry
        for r, direction in ((1, "ingress"), (2, "egress")):
            d.command(ring(r, direction))
        d.command(w.RingReadable(ring_id=1))
        loaded = d.routed(w.ObjectLoaded, 5)
        assert (loaded.ring_id, loaded.sequence, loaded.extent) == (1, 0, 32)
        assert d.arena is not None and (loaded.object_id, 0, 32) in {r[1:] for r in d.arena.records()}

        since = len(d.notices)
        d.kill_container()
        failed = d.wait_for(c.WorkerFailed, 5, since)
        assert failed == c.WorkerFailed(1, c.Failure.PROCESS_EXITED, 137, "worker exited with status 137")
        faulted = [n for n in d.notices[since:] if isinstance(n, c.RingFaulted)]
        assert faulted == [c.RingFaulted(1, 1), c.RingFaulted(2, 1)]

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


def test_a_worker_that_breaks_the_wire_is_killed_and_reported() -> None:
    d, _ = driver(STUB_WORKER_MISBEHAVE="string-ids")
    try:
        d.start()
        failed = d.wait_for(c.WorkerFailed, 5)
        assert failed.reason is c.Failure.PROTOCOL_FAULT and "backend must be an object" in failed.detail
    finally:
        d.close()


def run_check(**env: str) -> tuple[bool, list[str]]:
    fake = FakeWorkerEngine()
    lines: list[str] = []
    ok = worker_check.check(fake, "stub", env, lines.append, backend=fake, timeout=1.0)  # type: ignore[arg-type]
    return ok, lines


def test_the_conformance_check_passes_on_the_stub_worker() -> None:
    ok, lines = run_check()
    assert ok and lines[-1] == "12/12 steps passed: conformant", "\n".join(lines)


@pytest.mark.parametrize(
    ("misbehave", "step", "reason"),
    [
        ("sequence", "4. readable -> loaded", "ObjectLoaded sequence 1, expected 0"),
        ("release", "7. release", "expected DeviceObjectReleased"),
        ("stale", "9. stale generation rejected after a restart", "accepted a generation-1 handle"),
        ("invalid_json", "10. invalid JSON -> fatal", "expected WorkerFatal InvalidJson"),
        ("shutdown", "11. graceful shutdown -> stopped, exit 0", "expected exit 0 after WorkerStopped"),
        ("string-ids", "1. initialize", "backend must be an object"),
    ],
)
def test_the_conformance_check_names_the_first_failing_step(misbehave: str, step: str, reason: str) -> None:
    ok, lines = run_check(STUB_WORKER_MISBEHAVE=misbehave)
    first = next(line for line in lines if line.startswith("FAIL"))
    assert not ok and step in first and reason in first, "\n".join(lines)
    assert "NOT conformant" in lines[-1]
