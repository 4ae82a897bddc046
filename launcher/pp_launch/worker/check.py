"""`pp-launch worker check IMAGE`: the worker-control conformance sequence, one line per step.

Every step drives a real container of IMAGE through the controller and checks what comes back. A step
that cannot run because an earlier one failed is reported as skipped (and counts as a failure).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..docker_engine import Engine
from . import codec as w
from . import controller as c
from .driver import WorkerDriver

ROLE = "conformance"
TIMEOUT = 15.0
REFUSAL = 5.0  # a refusal (fatal) is immediate: waiting longer only delays the verdict


class StepFailure(Exception):
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


class Conformance:
    def __init__(self, engine: Engine, image: str, env: Mapping[str, str], log: Callable[[str], None]) -> None:
        self.engine, self.image, self.env, self.log = engine, image, {"STUB_MODE": "worker", **env}, log
        self.d = WorkerDriver(engine, image, env=self.env, log=log)
        self.handles: dict[str, w.DeviceHandle] = {}

    def _mark(self) -> int:
        return len(self.d.notices)

    def _running(self, generation: int) -> str:
        since = self._mark()
        if generation == 1:
            self.d.feed(c.StartRequested())
        else:
            self.d.feed(c.RestartRequested())
        ready = self.d.wait_for((c.WorkerRunning, c.WorkerFailed), TIMEOUT, since=since)
        failed = ready if isinstance(ready, c.WorkerFailed) else None
        expect(
            isinstance(ready, c.WorkerRunning) and ready.generation == generation,
            f"no WorkerReady for generation {generation}" + (f" ({failed.reason})" if failed else ""),
        )
        return f"WorkerReady, generation {generation}, pid {ready.pid}"

    # ------------------------------------------------------------------------------------------ steps
    def initialize(self) -> str:
        return self._running(1)

    def configure(self) -> str:
        since = self._mark()
        self.d.command(w.ConfigureRole(role_id=ROLE, config={"layers": [0, 1]}))
        ev = self.d.routed(w.RoleConfigured, TIMEOUT, since) or self.d.routed(w.RoleFailed, 0, since)
        expect(isinstance(ev, w.RoleConfigured) and ev.role_id == ROLE, f"expected RoleConfigured, got {ev!r}")
        return "RoleConfigured"

    def install(self) -> str:
        since = self._mark()
        for ring_id, direction, port in ((1, "ingress", "in"), (2, "egress", "out")):
            self.d.command(
                w.InstallRing(
                    ring_id=ring_id,
                    edge_id=f"edge{ring_id}",
                    port_id=port,
                    direction=direction,  # type: ignore[arg-type]
                    layout={"slots": 4},
                    object_spec={"extent": 256},
                )
            )
        ok = self.d.pump(lambda: len(self._installed(since)) == 2, TIMEOUT)
        expect(ok, f"RingInstalled for rings {sorted(self._installed(since))} only, expected [1, 2]")
        return "RingInstalled for ingress ring 1 and egress ring 2"

    def _installed(self, since: int) -> set[int]:
        return {
            n.event.ring_id
            for n in self.d.notices[since:]
            if isinstance(n, c.Routed) and isinstance(n.event, w.RingInstalled)
        }

    def readable(self) -> str:
        loaded = []
        for expected in (0, 1):
            since = self._mark()
            self.d.command(w.RingReadable(ring_id=1))
            ev = self.d.routed(w.ObjectLoaded, TIMEOUT, since)
            expect(ev is not None, "no ObjectLoaded after RingReadable")
            expect(ev.ring_id == 1 and ev.extent == 256, f"ObjectLoaded for ring {ev.ring_id}, extent {ev.extent}")
            expect(ev.sequence == expected, f"ObjectLoaded sequence {ev.sequence}, expected {expected} (from 0, +1)")
            expect(ev.device_handle.worker_generation == 1, "device handle of another generation")
            loaded.append(ev)
        self.handles["loaded"] = loaded[0].device_handle
        return "ObjectLoaded sequences 0, 1 on ring 1"

    def execute(self) -> str:
        since = self._mark()
        self.d.command(
            w.ExecuteStep(
                role_id=ROLE,
                step_id=1,
                inputs=[self.handles["loaded"]],
                outputs=[2],
                runtime={},
                release_inputs_after=False,
            )
        )
        done = self.d.routed(w.StepCompleted, TIMEOUT, since) or self.d.routed(w.StepFailed, 0, since)
        produced = self.d.routed(w.ObjectProduced, 0, since)
        expect(isinstance(done, w.StepCompleted), f"expected StepCompleted, got {done!r}")
        expect(
            produced is not None and produced.ring_id == 2 and produced.sequence == 0,
            f"expected ObjectProduced on ring 2 with sequence 0, got {produced!r}",
        )
        order = [type(n.event) for n in self.d.notices[since:] if isinstance(n, c.Routed)]
        expect(order.index(w.ObjectProduced) < order.index(w.StepCompleted), "StepCompleted came before ObjectProduced")
        self.handles["produced"] = produced.device_handle
        return "ObjectProduced on ring 2 (sequence 0), then StepCompleted"

    def release(self) -> str:
        since = self._mark()
        self.d.command(w.ReleaseDeviceObject(device_handle=self.handles["produced"]))
        ev = self.d.routed(w.DeviceObjectReleased, TIMEOUT, since) or self.d.routed(w.ReleaseFailed, 0, since)
        expect(
            isinstance(ev, w.DeviceObjectReleased) and ev.device_handle == self.handles["produced"],
            f"expected DeviceObjectReleased for {self.handles['produced']}, got {ev!r}",
        )
        return "DeviceObjectReleased"

    def uninstall(self) -> str:
        since = self._mark()
        self.d.command(w.UninstallRing(ring_id=1, reason="conformance"))
        ev = self.d.wait_for(c.RingQuiesced, TIMEOUT, since)
        expect(ev is not None and ev.ring_id == 1, "no RingQuiesced for ring 1")
        return "RingQuiesced for ring 1"

    def stale_after_restart(self) -> str:
        since = self._mark()
        self.d.kill_container()
        failed = self.d.wait_for(c.WorkerFailed, TIMEOUT, since)
        expect(failed is not None and failed.exit_status == 137, f"expected a failure with status 137, got {failed!r}")
        faulted = [n.ring_id for n in self.d.notices[since:] if isinstance(n, c.RingFaulted)]
        expect(faulted == [2], f"expected ring 2 faulted, got {faulted}")
        self._running(2)
        stale = w.ReleaseDeviceObject(device_handle=self.handles["loaded"])
        rejected = self.d.command(stale)
        expect(rejected == [c.CommandRejected(stale, "OldGeneration")], "the controller sent a stale command")
        since = self._mark()
        self.d.write_raw(w.encode(stale))  # straight to the worker: it must refuse a handle of generation 1
        failed = self.d.wait_for(c.WorkerFailed, REFUSAL, since)
        expect(
            failed is not None and "OldGenerationHandle" in failed.reason,
            f"the worker accepted a generation-1 handle in generation 2 ({failed!r})",
        )
        return "after kill (status 137, ring 2 faulted) and restart as generation 2: stale handle refused"

    def invalid_json(self) -> str:
        self._running(3)
        since = self._mark()
        self.d.write_raw(b'{"type": "RingReadable", "ring_id": \n')
        failed = self.d.wait_for(c.WorkerFailed, REFUSAL, since)
        expect(
            failed is not None and "InvalidJson" in failed.reason and failed.exit_status == 1,
            f"expected WorkerFatal InvalidJson and exit 1, got {failed!r}",
        )
        return "WorkerFatal InvalidJson, exit 1"

    def shutdown(self) -> str:
        self._running(4)
        since = self._mark()
        self.d.feed(c.ShutdownRequested())
        stop = self.d.wait_for(c.TerminalStop, TIMEOUT, since)
        stopped = self.d.wait_for(c.WorkerStopped, 0, since)
        failed = self.d.wait_for(c.WorkerFailed, 0, since)
        expect(stopped is not None, "no WorkerStopped after ShutdownWorker")
        expect(stop is not None and failed is None, f"expected exit 0 after WorkerStopped, got {failed!r}")
        return "WorkerStopped, exit 0"

    def end_of_stdin(self) -> str:
        d = WorkerDriver(self.engine, self.image, env=self.env, log=self.log)
        try:
            d.feed(c.StartRequested())
            expect(d.wait_for(c.WorkerRunning, TIMEOUT) is not None, "a fresh worker did not start")
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
) -> bool:
    results = Conformance(engine, image, env, log).run(say)
    passed = sum(r.ok for r in results)
    say(f"{passed}/{len(results)} steps passed: {'conformant' if passed == len(results) else 'NOT conformant'}")
    return passed == len(results)
