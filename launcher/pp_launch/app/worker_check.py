"""`pp-launch worker check IMAGE`: the worker-control conformance sequence, one line per step.

Every step drives a real container of IMAGE through the controller and checks what comes back. A step
that cannot run because an earlier one failed is reported as skipped (and counts as a failure).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters.docker_engine import Engine
from pp_launch.adapters.worker_driver import WorkerDriver
from pp_launch.core.errors import PpLaunchError
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c

ROLE = 7
EXTENT = 256
TIMEOUT = 15.0
REFUSAL = 5.0  # a refusal (fatal) is immediate: waiting longer only delays the verdict


class StepFailure(PpLaunchError):
    """A conformance step's verdict: caught by the sequence, reported as FAIL with this message."""

    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailure(message)


@dataclass
class StepResult:
    name: str
    ok: bool
    detail: str
    seconds: float

    def line(self, number: int) -> str:
        verdict = "PASS" if self.ok else ("SKIP" if self.detail.startswith("skipped") else "FAIL")
        return f"{verdict}  {number:2d}. {self.name}: {self.detail} ({self.seconds:.2f} s)"


def ring(ring_id: int, direction: str, slot: int) -> w.InstallRing:
    capacity = 4 * (40 + EXTENT)
    return w.InstallRing(
        ring_id=ring_id,
        edge_id=100 + ring_id,
        port_id="in" if direction == "ingress" else "out",
        direction=direction,  # type: ignore[arg-type]
        layout={"data_offset": slot * capacity, "data_capacity": capacity},
        object_spec={"max_extent": EXTENT, "alignment": 64},
    )


class Conformance:
    def __init__(
        self,
        engine: Engine,
        image: str,
        env: Mapping[str, str],
        log: Callable[[str], None],
        backend: Any = None,
        timeout: float = TIMEOUT,
        refusal: float = REFUSAL,
    ) -> None:
        """backend: where the worker containers run (None: the engine's); tests pass an in-process fake."""
        self.engine, self.image, self.env, self.log = engine, image, {"STUB_MODE": "worker", **env}, log
        self.backend, self.timeout, self.refusal = backend, timeout, refusal
        self.d = self._driver()
        self.loaded: list[w.ObjectLoaded] = []

    def _driver(self) -> WorkerDriver:
        return WorkerDriver(self.engine, self.image, env=self.env, log=self.log, stage_backend=self.backend)

    def _mark(self) -> int:
        return len(self.d.notices)

    def _running(self, generation: int) -> str:
        """A worker of `generation` running: started here, unless one is running already (a test driving the
        steps in its own order, pp_launch.testing.WorkerUnderTest)."""
        if self.d.ctl.pid is not None and self.d.ctl.state is c.State.RUNNING:
            return f"already running, generation {self.d.ctl.generation}, pid {self.d.ctl.pid}"
        since = self._mark()
        self.d.start()
        ready = self.d.wait_for((c.WorkerRunning, c.WorkerFailed), self.timeout, since=since)
        failed = ready if isinstance(ready, c.WorkerFailed) else None
        expect(
            isinstance(ready, c.WorkerRunning) and ready.generation == generation,
            f"no WorkerReady for generation {generation}" + (f" ({failed.detail})" if failed else ""),
        )
        return f"WorkerReady, generation {generation}, pid {ready.pid}"

    def _failed(self, since: int, timeout: float) -> c.WorkerFailed | None:
        failed: c.WorkerFailed | None = self.d.wait_for(c.WorkerFailed, timeout, since)
        return failed

    # ------------------------------------------------------------------------------------------ steps
    def initialize(self) -> str:
        return self._running(1)

    def configure(self) -> str:
        since = self._mark()
        self.d.command(w.ConfigureRole(role_id=ROLE, config={"run_id": "conformance", "stage_index": 0}))
        ev = self.d.routed((w.RoleConfigured, w.RoleFailed), self.timeout, since)
        expect(isinstance(ev, w.RoleConfigured) and ev.role_id == ROLE, f"expected RoleConfigured, got {ev!r}")
        return f"RoleConfigured for role {ROLE}"

    def install(self) -> str:
        since = self._mark()
        for ring_id, direction in ((1, "ingress"), (2, "egress")):
            self.d.command(ring(ring_id, direction, ring_id - 1))
        ok = self.d.pump(lambda: len(self._installed(since)) == 2, self.timeout)
        expect(ok, f"RingInstalled for rings {sorted(self._installed(since))} only, expected [1, 2]")
        return "RingInstalled for ingress ring 1 and egress ring 2"

    def _installed(self, since: int) -> set[int]:
        return {
            n.event.ring_id
            for n in self.d.notices[since:]
            if isinstance(n, c.Routed) and isinstance(n.event, w.RingInstalled)
        }

    def readable(self) -> str:
        for expected in (0, 1):
            since = self._mark()
            self.d.command(w.RingReadable(ring_id=1))
            ev = self.d.routed(w.ObjectLoaded, self.timeout, since)
            expect(ev is not None, "no ObjectLoaded after RingReadable")
            expect(ev.ring_id == 1 and ev.extent == EXTENT, f"ObjectLoaded for ring {ev.ring_id}, extent {ev.extent}")
            expect(ev.sequence == expected, f"ObjectLoaded sequence {ev.sequence}, expected {expected} (from 0, +1)")
            expect(ev.device_handle.worker_generation == 1, "device handle of another generation")
            self.loaded.append(ev)
        return "ObjectLoaded sequences 0, 1 on ring 1"

    def arena(self) -> str:
        arena = self.d.arena
        expect(arena is not None, "no arena was shared with the worker")
        assert arena is not None
        records = {(oid, seq) for _, oid, seq, _ in arena.records()}
        wanted = {(ev.object_id, ev.sequence) for ev in self.loaded}
        expect(
            wanted <= records,
            f"the MO01 records of objects {sorted(wanted - records)} are not in the arena "
            "(the worker must write its ring records into the memory file SWACTOR_ARENA_FD names)",
        )
        return f"{len(wanted)} MO01 records seen from the host in the shared arena"

    def execute(self) -> str:
        since = self._mark()
        first = self.loaded[0]
        self.d.command(
            w.ExecuteStep(
                role_id=ROLE,
                step_id=1,
                inputs=[w.InputBinding(device_handle=first.device_handle, object_id=first.object_id, sequence=0)],
                outputs=[w.OutputBinding(ring_id=2, object_id=500, sequence=0, flags=0)],
                runtime={"final_stage": True},
                release_inputs_after=False,
            )
        )
        done = self.d.routed((w.StepCompleted, w.StepFailed), self.timeout, since)
        produced = self.d.routed(w.ObjectProduced, 0, since)
        expect(isinstance(done, w.StepCompleted), f"expected StepCompleted, got {done!r}")
        expect(
            produced is not None and (produced.ring_id, produced.object_id, produced.sequence) == (2, 500, 0),
            f"expected ObjectProduced of object 500 on ring 2 with sequence 0, got {produced!r}",
        )
        order = [type(n.event) for n in self.d.notices[since:] if isinstance(n, c.Routed)]
        expect(order.index(w.ObjectProduced) < order.index(w.StepCompleted), "StepCompleted came before ObjectProduced")
        return f"ObjectProduced on ring 2 (sequence 0, {produced.committed_bytes} bytes), then StepCompleted"

    def release(self) -> str:
        since = self._mark()
        handle = self.loaded[1].device_handle
        self.d.command(w.ReleaseDeviceObject(device_handle=handle))
        ev = self.d.routed((w.DeviceObjectReleased, w.ReleaseFailed), self.timeout, since)
        expect(
            isinstance(ev, w.DeviceObjectReleased) and ev.device_handle == handle,
            f"expected DeviceObjectReleased for {handle}, got {ev!r}",
        )
        return "DeviceObjectReleased"

    def uninstall(self) -> str:
        since = self._mark()
        self.d.command(w.UninstallRing(ring_id=1, reason="Reconfigure"))
        ev = self.d.routed(w.RingQuiesced, self.timeout, since)
        expect(ev is not None and ev.ring_id == 1, "no RingQuiesced for ring 1")
        return "RingQuiesced for ring 1"

    def stale_after_restart(self) -> str:
        since = self._mark()
        self.d.kill_container()
        failed = self._failed(since, self.timeout)
        expect(failed is not None and failed.exit_status == 137, f"expected a failure with status 137, got {failed!r}")
        faulted = [n.ring_id for n in self.d.notices[since:] if isinstance(n, c.RingFaulted)]
        expect(faulted == [2], f"expected ring 2 faulted, got {faulted}")
        self._running(2)
        stale = w.ReleaseDeviceObject(device_handle=self.loaded[0].device_handle)
        rejected = self.d.command(stale)
        expect(rejected == [c.CommandRejected(stale, "OldGenerationHandle")], "the controller sent a stale command")
        since = self._mark()
        self.d.write_raw(w.encode(stale))  # straight to the worker: it must refuse a handle of generation 1
        failed = self._failed(since, self.refusal)
        expect(
            failed is not None and "OldGenerationHandle" in failed.detail,
            f"the worker accepted a generation-1 handle in generation 2 ({failed!r})",
        )
        return "after kill (status 137, ring 2 faulted) and restart as generation 2: stale handle refused"

    def invalid_json(self) -> str:
        self._running(3)
        since = self._mark()
        self.d.write_raw(b'{"type": "RingReadable", "ring_id": \n')
        failed = self._failed(since, self.refusal)
        expect(
            failed is not None and "InvalidJson" in failed.detail and failed.exit_status == 1,
            f"expected WorkerFatal InvalidJson and exit 1, got {failed!r}",
        )
        return "WorkerFatal InvalidJson, exit 1"

    def shutdown(self) -> str:
        self._running(4)
        since = self._mark()
        self.d.feed(c.ShutdownRequested())
        self.d.wait_for((c.TerminalStopped, c.WorkerFailed), self.timeout, since)  # whichever comes: the verdict
        stop = self.d.wait_for(c.TerminalStopped, 0, since)
        stopped = self.d.wait_for(c.WorkerStoppedNotice, 0, since)
        failed = self.d.wait_for(c.WorkerFailed, 0, since)
        expect(stopped is not None, "no WorkerStopped after ShutdownWorker")
        expect(stop is not None and failed is None, f"expected exit 0 after WorkerStopped, got {failed!r}")
        return "WorkerStopped, exit 0"

    def end_of_stdin(self) -> str:
        d = self._driver()
        try:
            d.start()
            started = d.wait_for((c.WorkerRunning, c.WorkerFailed), self.timeout)
            expect(isinstance(started, c.WorkerRunning), f"a fresh worker did not start ({started!r})")
            since = len(d.notices)
            t0 = time.monotonic()
            d.close_stdin()
            failed = d.wait_for(c.WorkerFailed, 10.0, since)
            expect(
                failed is not None and failed.exit_status == 0, f"still running 10 s after end of stdin ({failed!r})"
            )
            return f"exit 0, {time.monotonic() - t0:.2f} s after end of stdin"
        finally:
            d.close()

    STEPS: tuple[tuple[str, str], ...] = (
        ("initialize", "initialize"),
        ("configure", "configure"),
        ("install ingress and egress rings", "install"),
        ("readable -> loaded", "readable"),
        ("arena shared: records seen from the host", "arena"),
        ("execute -> produced + completed", "execute"),
        ("release", "release"),
        ("uninstall -> quiesced", "uninstall"),
        ("stale generation rejected after a restart", "stale_after_restart"),
        ("invalid JSON -> fatal", "invalid_json"),
        ("graceful shutdown -> stopped, exit 0", "shutdown"),
        ("end of stdin -> exit", "end_of_stdin"),
    )

    def run(self, say: Callable[[str], None]) -> list[StepResult]:
        results: list[StepResult] = []
        broken = False
        try:
            for number, (name, method) in enumerate(self.STEPS, 1):
                t0 = time.monotonic()
                if broken and method != "end_of_stdin":
                    result = StepResult(name, False, "skipped: an earlier step failed", 0.0)
                else:
                    try:
                        result = StepResult(name, True, getattr(self, method)(), time.monotonic() - t0)
                    except StepFailure as exc:
                        result = StepResult(name, False, str(exc), time.monotonic() - t0)
                        broken = True
                results.append(result)
                say(result.line(number))
        finally:
            self.d.close()
        return results


def check(
    engine: Engine,
    image: str,
    env: Mapping[str, str],
    say: Callable[[str], None],
    log: Callable[[str], None] = lambda text: None,
    backend: Any = None,
    timeout: float = TIMEOUT,
) -> bool:
    results = Conformance(engine, image, env, log, backend, timeout, min(REFUSAL, timeout)).run(say)
    passed = sum(r.ok for r in results)
    say(f"{passed}/{len(results)} steps passed: {'conformant' if passed == len(results) else 'NOT conformant'}")
    return passed == len(results)
