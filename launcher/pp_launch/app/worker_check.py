"""`pp-launch worker check IMAGE`: the worker-control conformance sequence, one line per step.

The check drives a real container of IMAGE exactly as swactor's node drives a worker (docs/worker-wire.md): it writes
each ingress `MO01` record at the ingress ring's `data_offset` before `RingReadable`, reads the step's output
record back from the egress ring's `data_offset`, sends integer config fields, and probes a stale handle where
it is used, as an `ExecuteStep` input. It asks nothing of a worker that swactor's own worker does not do.

Every wait ends at once when the worker dies or sends `WorkerFatal`: the step then names the exit status or the
fatal reason and shows the worker's last stderr lines. A step that cannot run because an earlier one failed is
reported as skipped (and counts as a failure); nothing waits twice for one failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pp_launch.adapters.docker_engine import Engine
from pp_launch.app.worker_driver import WorkerDriver
from pp_launch.core.errors import PpLaunchError
from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c
from pp_launch.core.worker import record

ROLE = 1
RUN_ID = 77
INGRESS, EGRESS = 1, 2
OUTPUT_OBJECT = 500
INIT_TIMEOUT = 10.0  # swactor's initialization_timeout_ms
STEP_TIMEOUT = 10.0
EOF_TIMEOUT = 10.0
LAYOUTS = {layout.ring_id: layout for layout in record.ring_layouts((INGRESS, EGRESS))}
PORTS = {INGRESS: ("input", "ingress"), EGRESS: ("output", "egress")}
EARLIER_TYPES = ("RoleLoaded", "StepExecuted")
EARLIER_NAMES = ("helper_abi_version", "MVP_ARENA_FD", "SWACTOR_WORKER_EVENT_SOCK")


class StepFailure(PpLaunchError):
    """A conformance step's verdict: caught by the sequence, reported as FAIL with this message."""

    def __init__(self, message: str, stderr: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.stderr = list(stderr)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailure(message)


@dataclass
class StepResult:
    name: str
    ok: bool
    detail: str
    seconds: float
    stderr: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else ("SKIP" if self.detail.startswith("skipped") else "FAIL")

    def line(self, number: int) -> str:
        text = f"{self.verdict}  {number:2d}. {self.name}: {self.detail} ({self.seconds:.2f} s)"
        if self.stderr:
            text += "\n      the worker's last stderr lines:" + "".join(f"\n      | {s}" for s in self.stderr)
        return text

    def to_json(self, number: int) -> dict[str, Any]:
        return {
            "number": number,
            "name": self.name,
            "verdict": self.verdict,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
            "stderr": self.stderr,
        }


def show(message: Any) -> str:
    """A wire message as the JSON line it was; never a Python repr."""
    if isinstance(message, w.Message):
        return w.encode(message).decode().strip()
    return "nothing" if message is None else type(message).__name__


def earlier_wire(stdout: Iterable[str], stderr: Iterable[str]) -> str | None:
    """What marks a worker that speaks an earlier swactor wire (docs/worker-wire.md's last point), or None."""
    for line in stdout:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        kind = doc.get("type")
        if kind in EARLIER_TYPES:
            return f"it answers {kind}"
        if "helper_abi_version" in doc:
            return "it sends helper_abi_version"
        if kind == "WorkerReady" and "ring_helper_abi" not in doc:
            return "its WorkerReady carries no ring_helper_abi"
        if isinstance(kind, str) and kind.startswith("Tinygrad"):
            return f"it sends {kind} events"
    for line in stderr:
        for name in EARLIER_NAMES:
            if name in line:
                return f"it needs {name}"
    return None


def install_ring(ring_id: int) -> w.InstallRing:
    port, direction = PORTS[ring_id]
    return w.InstallRing(
        ring_id=ring_id,
        edge_id=100 + ring_id,
        port_id=port,
        direction=direction,  # type: ignore[arg-type]
        layout=LAYOUTS[ring_id].to_wire(),
        object_spec=record.object_spec(),
    )


def configure_role() -> w.ConfigureRole:
    return w.ConfigureRole(
        role_id=ROLE,
        config={
            "run_id": RUN_ID,
            "stage_index": 0,
            "layer_start": 0,
            "layer_end_exclusive": 2,
            "model_id": "pp-launch-conformance",
            "gguf_source": "none://pp-launch-conformance",
        },
    )


def execute_step(step_id: int, loaded: w.ObjectLoaded, sequence: int = 0) -> w.ExecuteStep:
    port, _ = PORTS[INGRESS]
    out_port, _ = PORTS[EGRESS]
    return w.ExecuteStep(
        role_id=ROLE,
        step_id=step_id,
        inputs=[
            w.InputBinding(
                port_id=port, object_id=loaded.object_id, sequence=loaded.sequence, device_handle=loaded.device_handle
            )
        ],
        outputs=[
            w.OutputBinding(
                port_id=out_port, ring_id=EGRESS, object_id=OUTPUT_OBJECT, sequence=sequence, extent=4, flags=1
            )
        ],
        runtime={"final_stage": True},
        release_inputs_after=False,
    )


class Conformance:
    def __init__(
        self,
        engine: Engine,
        image: str,
        env: Mapping[str, str],
        log: Callable[[str], None],
        backend: Any = None,
        timeout: float = STEP_TIMEOUT,
        init_timeout: float = INIT_TIMEOUT,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        """backend: where the worker containers run (None: the engine's); tests pass an in-process fake."""
        self.engine, self.image, self.env, self.log = engine, image, {"STUB_MODE": "worker", **env}, log
        self.backend, self.timeout, self.init_timeout, self.trace = backend, timeout, init_timeout, trace
        self.started_at = time.monotonic()
        self.d = self._driver()
        self.loaded: list[w.ObjectLoaded] = []
        self.produced: w.ObjectProduced | None = None

    def _driver(self) -> WorkerDriver:
        return WorkerDriver(
            self.engine,
            self.image,
            arena_ceiling=record.ARENA_BYTES,
            env=self.env,
            log=self.log,
            stage_backend=self.backend,
            trace=self.trace,
            init_timeout=self.init_timeout,
            started_at=self.started_at,
        )

    def _mark(self) -> int:
        return len(self.d.notices)

    # ------------------------------------------------------------------------------------------ waiting
    def _reply(self, kind: type | tuple[type, ...], since: int, timeout: float | None = None) -> Any:
        """The first event of `kind` after `since`; a dead or fatal worker ends the wait at once, a StepFailure
        naming its exit status or fatal reason with its last stderr lines."""

        def found() -> Any:
            for n in self.d.notices[since:]:
                if isinstance(n, c.Routed) and isinstance(n.event, kind):
                    return n.event
                if isinstance(n, c.WorkerFailed):
                    return n
            return None

        self.d.pump(lambda: found() is not None, self.timeout if timeout is None else timeout)
        got = found()
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(got, c.WorkerFailed) and c.WorkerFailed not in kinds:
            names = " or ".join(k.__name__ for k in kinds)
            raise self._failure(got, since, f"before it answered {names}")
        return got

    def _failure(self, failed: c.WorkerFailed, since: int, when: str) -> StepFailure:
        return StepFailure(f"{self._why(failed, since)} {when}", self.d.stderr_tail)

    def _why(self, failed: c.WorkerFailed, since: int) -> str:
        fatal = next(
            (n.event for n in self.d.notices[since:] if isinstance(n, c.Routed) and isinstance(n.event, w.WorkerFatal)),
            None,
        )
        status = "" if failed.exit_status is None else f", exit status {failed.exit_status}"
        if fatal is not None:
            extra = ", ".join(
                f"{k}={json.dumps(v, separators=(',', ':'))}"
                for k, v in fatal.details.items()
                if k not in ("pid", "worker_generation")
            )
            return f"the worker sent WorkerFatal {fatal.reason}" + (f" ({extra})" if extra else "") + status
        if failed.reason is c.Failure.PROCESS_EXITED:
            return f"the worker exited with status {failed.exit_status}"
        if failed.reason is c.Failure.INITIALIZATION_TIMEOUT:
            return f"no WorkerReady within {self.init_timeout:g} s (--init-timeout){status}"
        return f"{failed.detail}{status}"

    def _running(self, generation: int) -> str:
        """A worker of `generation` running: started here, unless one is running already (a test driving the
        steps in its own order, pp_launch.testing.WorkerUnderTest)."""
        if self.d.ctl.pid is not None and self.d.ctl.state is c.State.RUNNING:
            return f"already running, generation {self.d.ctl.generation}, pid {self.d.ctl.pid}"
        since = self._mark()
        self.d.start()
        ready = self.d.wait_for((c.WorkerRunning, c.WorkerFailed), self.init_timeout + self.timeout, since=since)
        if isinstance(ready, c.WorkerRunning) and ready.generation == generation:
            return f"WorkerReady, generation {generation}, pid {ready.pid}"
        if isinstance(ready, c.WorkerFailed):
            earlier = earlier_wire(self.d.stdout_tail, self.d.stderr_tail)
            if earlier is not None:
                raise StepFailure(
                    f"speaks an earlier swactor wire: {earlier}; this check speaks docs/worker-wire.md "
                    "(required_ring_helper_abi, SWACTOR_ARENA_FD, 40-byte MO01 records)",
                    self.d.stderr_tail,
                )
            raise self._failure(ready, since, f"before it was ready as generation {generation}")
        raise StepFailure(f"no WorkerReady for generation {generation}")

    def _rings(self) -> None:
        since = self._mark()
        for ring_id in (INGRESS, EGRESS):
            self.d.command(install_ring(ring_id))
        for ring_id in (INGRESS, EGRESS):
            ev = self._reply(w.RingInstalled, since)
            expect(ev is not None, f"no RingInstalled for ring {ring_id}")
            port, _ = PORTS[ring_id]
            expect(
                (ev.ring_id, ev.edge_id, ev.port_id) == (ring_id, 100 + ring_id, port),
                f"expected RingInstalled for ring {ring_id}, edge {100 + ring_id}, port {port!r}, got {show(ev)}",
            )
            since = self._after(w.RingInstalled, since)

    def _after(self, kind: type, since: int) -> int:
        """The position just past the first routed `kind` at or after `since` (to wait for the next one)."""
        for i in range(since, len(self.d.notices)):
            n = self.d.notices[i]
            if isinstance(n, c.Routed) and isinstance(n.event, kind):
                return i + 1
        return len(self.d.notices)

    def _configure(self) -> None:
        since = self._mark()
        self.d.command(configure_role())
        ev = self._reply((w.RoleConfigured, w.RoleFailed), since)
        expect(
            isinstance(ev, w.RoleConfigured) and ev.role_id == ROLE,
            f"expected RoleConfigured for role {ROLE}, got {show(ev)}",
        )

    # ------------------------------------------------------------------------------------------ steps
    def initialize(self) -> str:
        return self._running(1)

    def configure(self) -> str:
        self._configure()
        return f"RoleConfigured for role {ROLE} (run_id {RUN_ID}, stage 0, layers 0..2, integers)"

    def install(self) -> str:
        self._rings()
        return f"RingInstalled for ingress ring {INGRESS} (port input) and egress ring {EGRESS} (port output)"

    def readable(self) -> str:
        layout = LAYOUTS[INGRESS]
        for sequence in (0, 1):
            written = record.ObjectRecord.of_words(10 + sequence, sequence, [sequence + 1])
            self.d.write_record(layout, written)
            since = self._mark()
            self.d.command(w.RingReadable(ring_id=INGRESS))
            ev = self._reply(w.ObjectLoaded, since)
            expect(ev is not None, f"no ObjectLoaded after RingReadable for the record of sequence {sequence}")
            got = (ev.ring_id, ev.edge_id, ev.port_id, ev.object_id, ev.sequence, ev.extent)
            want = (INGRESS, 100 + INGRESS, "input", written.object_id, sequence, written.extent)
            expect(
                got == want,
                f"the node wrote object {written.object_id}, sequence {sequence}, extent "
                f"{written.extent} at data_offset {layout.data_offset} of ring {INGRESS}; "
                f"the worker answered {show(ev)}",
            )
            expect(ev.device_handle.worker_generation == 1, f"a device handle of another generation: {show(ev)}")
            self.loaded.append(ev)
        return f"the node's records (sequences 0, 1, each at data_offset {layout.data_offset}) loaded from ring 1"

    def execute(self) -> str:
        since = self._mark()
        self.d.command(execute_step(1, self.loaded[0]))
        done = self._reply((w.StepCompleted, w.StepFailed), since)
        produced = next(
            (
                n.event
                for n in self.d.notices[since:]
                if isinstance(n, c.Routed) and isinstance(n.event, w.ObjectProduced)
            ),
            None,
        )
        expect(isinstance(done, w.StepCompleted), f"expected StepCompleted, got {show(done)}")
        expect(
            produced is not None
            and (produced.ring_id, produced.object_id, produced.sequence) == (EGRESS, OUTPUT_OBJECT, 0),
            f"expected ObjectProduced of object {OUTPUT_OBJECT} on ring {EGRESS} with sequence 0, got {show(produced)}",
        )
        order = [type(n.event) for n in self.d.notices[since:] if isinstance(n, c.Routed)]
        expect(order.index(w.ObjectProduced) < order.index(w.StepCompleted), "StepCompleted came before ObjectProduced")
        self.produced = produced
        return f"ObjectProduced on ring {EGRESS} (object {OUTPUT_OBJECT}, sequence 0), then StepCompleted"

    def egress(self) -> str:
        assert self.produced is not None
        layout = LAYOUTS[EGRESS]
        try:
            got = self.d.read_record(layout)
        except record.RecordError as exc:
            where = f"data_offset {layout.data_offset} of ring {EGRESS}"
            raise StepFailure(f"no valid output record at {where}: {exc}") from None
        expect(
            (got.object_id, got.sequence) == (OUTPUT_OBJECT, 0),
            f"the record at data_offset {layout.data_offset} of ring {EGRESS} is object {got.object_id}, "
            f"sequence {got.sequence}; expected object {OUTPUT_OBJECT}, sequence 0",
        )
        spec = record.object_spec()
        expect(
            0 < got.extent <= spec["max_extent"] and got.extent % spec["alignment"] == 0,
            f"the output's extent is {got.extent}; the ring takes 1 to {spec['max_extent']} bytes "
            f"in multiples of {spec['alignment']}",
        )
        committed = self.produced.committed_bytes
        expect(
            committed == got.size,
            f"committed_bytes is {committed}, but the record read back is {got.size} bytes "
            f"({record.HEADER_LEN}-byte header + {got.extent}): committed_bytes is the whole record"
            + (" (it counted the payload alone)" if committed == got.extent else ""),
        )
        return f"read back object {OUTPUT_OBJECT} from ring {EGRESS}: {got.size} bytes = committed_bytes"

    def release(self) -> str:
        since = self._mark()
        handle = self.loaded[1].device_handle
        self.d.command(w.ReleaseDeviceObject(device_handle=handle))
        ev = self._reply((w.DeviceObjectReleased, w.ReleaseFailed), since)
        expect(
            isinstance(ev, w.DeviceObjectReleased) and ev.device_handle == handle,
            f"expected DeviceObjectReleased for handle {handle.id} of generation {handle.worker_generation}, "
            f"got {show(ev)}",
        )
        return "DeviceObjectReleased"

    def uninstall(self) -> str:
        since = self._mark()
        self.d.command(w.UninstallRing(ring_id=INGRESS, reason="Reconfigure"))
        ev = self._reply(w.RingQuiesced, since)
        expect(ev is not None and ev.ring_id == INGRESS, f"expected RingQuiesced for ring {INGRESS}, got {show(ev)}")
        return f"RingQuiesced for ring {INGRESS}"

    def stale_after_restart(self) -> str:
        since = self._mark()
        self.d.kill_container()
        failed = self.d.wait_for(c.WorkerFailed, self.timeout, since)
        expect(
            failed is not None and failed.exit_status == 137,
            "expected the killed worker to end with status 137, got "
            + (self._why(failed, since) if failed else "nothing"),
        )
        faulted = [n.ring_id for n in self.d.notices[since:] if isinstance(n, c.RingFaulted)]
        expect(faulted == [EGRESS], f"expected ring {EGRESS} faulted, got {faulted}")
        self._running(2)
        self._configure()
        self._rings()
        stale = execute_step(2, self.loaded[0])
        rejected = self.d.command(stale)
        expect(rejected == [c.CommandRejected(stale, "OldGenerationHandle")], "the controller sent a stale command")
        since = self._mark()
        self.d.write_raw(w.encode(stale))  # straight to the worker: it must refuse a handle of generation 1
        got = self._reply((w.StepCompleted, w.StepFailed, c.WorkerFailed), since)
        if isinstance(got, c.WorkerFailed):
            why = self._why(got, since)
            expect("OldGenerationHandle" in why, f"{why} (expected WorkerFatal OldGenerationHandle)")
            return (
                "after kill (status 137, ring 2 faulted) and restart as generation 2: a generation-1 "
                "handle as an ExecuteStep input ends in WorkerFatal OldGenerationHandle"
            )
        raise StepFailure(
            f"the worker accepted a generation-1 handle as an ExecuteStep input in generation 2 "
            f"(it answered {show(got)}; expected WorkerFatal OldGenerationHandle)"
        )

    def invalid_json(self) -> str:
        self._running(3)
        since = self._mark()
        self.d.write_raw(b'{"type": "RingReadable", "ring_id": \n')
        failed = self._reply(c.WorkerFailed, since)
        why = self._why(failed, since) if failed else "nothing"
        expect(
            failed is not None and "InvalidJson" in why and failed.exit_status == 1,
            f"expected WorkerFatal InvalidJson and exit 1, got {why}",
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
        expect(
            stopped is not None,
            "no WorkerStopped after ShutdownWorker" + (f" ({self._why(failed, since)})" if failed else ""),
        )
        expect(
            stop is not None and failed is None,
            f"expected exit 0 after WorkerStopped, got {self._why(failed, since) if failed else 'nothing'}",
        )
        return "WorkerStopped, exit 0"

    def end_of_stdin(self) -> str:
        d = self._driver()
        try:
            d.start()
            started = d.wait_for((c.WorkerRunning, c.WorkerFailed), self.init_timeout + self.timeout)
            expect(isinstance(started, c.WorkerRunning), "a fresh worker did not start")
            since = len(d.notices)
            t0 = time.monotonic()
            d.close_stdin()
            failed = d.wait_for(c.WorkerFailed, EOF_TIMEOUT, since)
            expect(
                failed is not None and failed.exit_status == 0,
                f"still running {EOF_TIMEOUT:g} s after end of stdin"
                if failed is None
                else f"exit status {failed.exit_status} after end of stdin, expected 0",
            )
            return f"exit 0, {time.monotonic() - t0:.2f} s after end of stdin"
        finally:
            d.close()

    STEPS: tuple[tuple[str, str], ...] = (
        ("initialize", "initialize"),
        ("configure (integer config fields)", "configure"),
        ("install ingress and egress rings", "install"),
        ("node writes MO01 records -> loaded", "readable"),
        ("execute -> produced + completed", "execute"),
        ("egress record read back: committed_bytes", "egress"),
        ("release", "release"),
        ("uninstall -> quiesced", "uninstall"),
        ("stale generation refused in ExecuteStep after a restart", "stale_after_restart"),
        ("invalid JSON -> fatal", "invalid_json"),
        ("graceful shutdown -> stopped, exit 0", "shutdown"),
        ("end of stdin -> exit", "end_of_stdin"),
    )

    def run(self, say: Callable[[int, StepResult], None]) -> list[StepResult]:
        results: list[StepResult] = []
        broken = False
        try:
            for number, (name, method) in enumerate(self.STEPS, 1):
                t0 = time.monotonic()
                independent = method == "end_of_stdin" and results[0].ok
                if broken and not independent:
                    result = StepResult(name, False, "skipped: an earlier step failed", 0.0)
                else:
                    try:
                        result = StepResult(name, True, getattr(self, method)(), time.monotonic() - t0)
                    except StepFailure as exc:
                        result = StepResult(name, False, str(exc), time.monotonic() - t0, exc.stderr)
                        broken = True
                results.append(result)
                say(number, result)
        finally:
            self.d.close()
        return results


def report(image: str, results: list[StepResult]) -> dict[str, Any]:
    """The check's report as one JSON document (`worker check --json`)."""
    passed = sum(r.ok for r in results)
    return {
        "image": image,
        "conformant": passed == len(results),
        "passed": passed,
        "total": len(results),
        "steps": [r.to_json(n) for n, r in enumerate(results, 1)],
    }


def check_here(image: str, env: Mapping[str, str], say: Callable[[str], None], **options: Any) -> bool:
    """`pp-launch worker check`: on DOCKER_HOST's engine, the image there (the built-in one built if missing), then
    every step (`check`'s options: log, timeout, init_timeout, trace, as_json); `say` hears the image's build too."""
    from pp_launch.adapters.docker_engine import connect
    from pp_launch.app import chain as steps

    engine = connect()
    try:
        steps.ensure_image(engine, image, options.pop("building", say))
        return check(engine, image, env, say, **options)
    finally:
        engine.close()


def check(
    engine: Engine,
    image: str,
    env: Mapping[str, str],
    say: Callable[[str], None],
    log: Callable[[str], None] = lambda text: None,
    backend: Any = None,
    timeout: float = STEP_TIMEOUT,
    init_timeout: float = INIT_TIMEOUT,
    trace: Callable[[str], None] | None = None,
    as_json: bool = False,
) -> bool:
    """Run every step; say a line per step and a verdict (or, `as_json`, one JSON document at the end)."""
    conformance = Conformance(engine, image, env, log, backend, timeout, init_timeout, trace)
    results = conformance.run((lambda n, r: None) if as_json else (lambda n, r: say(r.line(n))))
    doc = report(image, results)
    if as_json:
        say(json.dumps(doc))
    else:
        verdict = "conformant" if doc["conformant"] else "NOT conformant"
        say(f"{doc['passed']}/{doc['total']} steps passed: {verdict}")
    return bool(doc["conformant"])
