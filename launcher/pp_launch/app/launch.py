"""The chain use case: one request, one call, for every way in.

`pp-launch chain`, `pp-launch compose`, `pp_launch.testing.Chain` and programs that embed pp-launch build a
`LaunchRequest` (which checks every rule between its options when it is made) and call `launch()` (or
`plan_launch()` for a dry run). One engine is the one-host case of many: the same planning, GPU selection,
reservation, run and teardown serve a chain on DOCKER_HOST and a chain across `--host` engines; only the backend
differs (one engine, several engines, or `pp-gpu-node` children).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pp_launch.adapters import host_state, identity
from pp_launch.adapters.docker_engine import Engine, connect
from pp_launch.adapters.gpu_watch import GpuWatch
from pp_launch.adapters.guard import RunGuard
from pp_launch.adapters.guard import image_check as guard_image_check
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.adapters.multi_host import MultiHostBackend
from pp_launch.adapters.process_backend import ProcessStageBackend
from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.app import attempts
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app.locks import GpuLocks, LockSite, reserve
from pp_launch.app.request import GpuOptions as GpuOptions
from pp_launch.app.request import Hooks as Hooks
from pp_launch.app.request import Launched as Launched
from pp_launch.app.request import LaunchRequest as LaunchRequest
from pp_launch.app.request import Stoppable as Stoppable
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainPlan, build_plan
from pp_launch.core.chain.ports import StageBackend
from pp_launch.core.chain.scope import ChainOutcome, ChainScope, Reporter
from pp_launch.core.gpu import xid
from pp_launch.core.gpu.inventory import GpuInventory


@dataclass(frozen=True)
class _Site:
    """An engine the chain runs on: `name` "" is DOCKER_HOST's (no --host); `engine` None only in a dry run that
    found no engine."""

    name: str
    engine: Engine | None
    lock_name: str = ""
    engine_id: str = ""
    host: across.Host | None = None  # a --host engine, reached and checked


def launch(request: LaunchRequest, hooks: Hooks | None = None, environ: Mapping[str, str] | None = None) -> Launched:
    """Run the chain to its end (or, detached, until it is up), restarting it as `--max-restarts` allows. Errors found
    before anything starts raise (exit 2 for configuration); everything after is in the outcome, and nothing is
    left behind either way."""
    environ = os.environ if environ is None else environ
    hooks = hooks or Hooks()
    request = dataclasses.replace(request, run_id=request.run_id or identity.new_run_id())
    if request.ray is not None:
        from pp_launch.app import on_ray

        return attempts.run(request, hooks, lambda r, h: on_ray.launch(r, h, environ), {})
    sites = _reach(request, dry_run=False)
    guarding: _Guarding | None = None
    final: Launched | None = None
    try:
        _prepare(request, sites, hooks.say)
        owner = request.owner or steps.owner_label(request.detach)
        if request.gpu_node is None:  # the guards come up while the launch plans: each costs a container's start
            guarding = _Guarding(sites, request.run_id or "", owner, request.chain.grace)
        once = functools.partial(_attempt, sites=sites, environ=environ, owner=owner, guarding=guarding)
        final = attempts.run(request, hooks, once, guarding.guards if guarding is not None else {})
        return final
    finally:
        if guarding is not None:  # kept from the first attempt to the last: `down` finds the run between them too
            guarding.finish(None if final is None else final.outcome)
        _close(sites)


def _attempt(
    request: LaunchRequest,
    hooks: Hooks,
    *,
    sites: Sequence[_Site],
    environ: Mapping[str, str],
    owner: str,
    guarding: _Guarding | None,
) -> Launched:
    """One attempt of the run: the GPUs picked under the engines' locks, the plan, the chain to its end."""
    run_id = request.run_id or ""
    lock_sites = [LockSite(s.lock_name, s.engine, s.engine_id) for s in sites if s.engine is not None]
    owner_now, attempt = identity.current_owner().label(), request.chain.attempt
    with reserve(lock_sites, run_id, owner_now, hooks.say, hooks.stop_pending, attempt) as locks:
        plan, note = _plan(request, sites, environ, owner, run_id, locks)
        if request.chain.attempt == 1:
            steps.say_plan(plan, note, hooks.say)
        if (held := hooks.stop_pending()) is not None:
            raise errors.Interrupted(held)  # stopped while planning: nothing was started
        locks.check()  # the lock still runs: no one else can be placing on these GPUs
        reporter = hooks.reporter(plan)  # the run's one reporter, its output kept beside it (app/attempts.py)
        outcome, restartable, faults = _run(
            request, plan, sites, reporter, hooks.on_scope, locks.check_and_release, guarding, hooks.say
        )
    return Launched(plan, note, outcome, restartable=restartable, faults=faults)


def plan_launch(request: LaunchRequest, environ: Mapping[str, str] | None = None, dry_run: bool = True) -> Launched:
    """The plan only (a dry run, or a Compose file): nothing is started, locked or swept. Without --host an
    absent engine is no error (the GPUs its containers hold are then not checked: `warning`). dry_run: what a
    launch would fail on before starting anything fails here too (an engine that refuses this user, a stage image
    it lacks); a Compose file is written for wherever it will run, so it checks neither."""
    environ = os.environ if environ is None else environ
    if request.ray is not None:
        from pp_launch.app import on_ray

        return on_ray.plan(request, environ)
    sites = _reach(request, dry_run=True, strict=dry_run)
    try:
        if request.hosts:
            across.check_image(_hosts(sites), request.chain.image)
        elif dry_run and (engine := sites[0].engine) is not None:
            image = request.chain.image
            if image != BUILTIN_IMAGE and engine.image_labels(image) is None:
                raise errors.ImageMissing(
                    f"image {image} is not present on the engine at {engine.address}, and pp-launch never pulls: a "
                    "launch would stop here. Build it or load it ('docker load -i FILE') first."
                )
        run_id, owner = request.run_id or identity.new_run_id(), request.owner or steps.owner_label(request.detach)
        plan, note = _plan(request, sites, environ, owner, run_id, None)
    finally:
        _close(sites)
    asked_gpus = request.gpu.mode.strip() != "none"
    warning = "no Docker engine answered: GPUs held by running containers were not checked"
    return Launched(plan, note, None, warning if asked_gpus and sites[0].engine is None else "")


# ------------------------------------------------------------------------------------------------ the steps
def _reach(request: LaunchRequest, dry_run: bool, strict: bool = False) -> list[_Site]:
    """The engines: every --host reached and checked at once (exit 2 naming each that does not answer), or
    DOCKER_HOST's (a dry run tolerates none: a plan needs no engine; strict: but one that runs and refuses this
    user is the error a launch would meet)."""
    if request.hosts:
        return [_Site(h.name, h.engine, h.name, h.engine_id, h) for h in across.connect_all(request.hosts)]
    if dry_run:
        try:
            return [_Site("", connect(timeout=5))]
        except errors.EngineUnavailable as exc:
            if strict and "permission denied" in str(exc):
                raise
            return [_Site("", None)]
    engine = connect()
    return [_Site("", engine, engine.address)]  # one engine: no lock order to keep, no identity to ask


def _hosts(sites: Sequence[_Site]) -> list[across.Host]:
    return [s.host for s in sites if s.host is not None]


def _close(sites: Sequence[_Site]) -> None:
    for s in sites:
        if s.engine is not None:
            s.engine.close()


def _prepare(request: LaunchRequest, sites: Sequence[_Site], say: Callable[[str], None]) -> None:
    """The stage image and pp-launch's guard image on every engine (built on first use on DOCKER_HOST's; never
    pulled). Nothing is swept: what a launcher leaves, its guard removes (adapters/guard.py)."""
    image = request.chain.image
    if request.hosts:
        across.check_image(_hosts(sites), image)
        for s in sites:
            guard_image_check(_engine(s), f"host {s.name}")
    else:
        steps.ensure_image(_engine(sites[0]), image, say)


def _engine(site: _Site) -> Engine:
    assert site.engine is not None  # only a dry run goes without one
    return site.engine


def _plan(
    request: LaunchRequest,
    sites: Sequence[_Site],
    environ: Mapping[str, str],
    owner: str,
    run_id: str,
    locks: GpuLocks | None,
) -> tuple[ChainPlan, str]:
    """Each engine's GPUs and holdings, the engines' GPU locks taken before their labels are read (when GPUs are
    picked; released once every stage exists), each stage's host and GPUs, the plan."""
    gpu = request.gpu
    host_gpus = _host_gpus(request, sites, environ, owner, run_id)
    if locks is not None and _locks_needed(gpu.mode, [h.inventory for h in host_gpus]):
        locks.acquire()
    stage_hosts, selection = gpu_select.select(
        mode=gpu.mode,
        stages=request.chain.stages,
        per_stage=gpu.per_stage,
        attach=gpu.attach,
        hosts_gpus=host_gpus,
        environ=environ,
        placement=request.placement,
        stages_per_host=request.stages_per_host,
        allow_shared=gpu.allow_shared,
        min_free_mib=gpu.min_free_mib,
        allow_unhealthy=gpu.allow_unhealthy,
        avoid=request.avoid_gpus,
    )
    launcher = identity.current_owner().label() if owner == labels.OWNER_DETACHED else ""
    plan = build_plan(
        request.chain,
        environ,
        owner,
        selection.stage_gpus,
        selection.device_requests,
        run_id,
        selection.hop_levels,
        selection.cost,
        tuple(stage_hosts) if request.hosts else (),
        launcher,
    )
    return plan, selection.note


def _host_gpus(
    request: LaunchRequest, sites: Sequence[_Site], environ: Mapping[str, str], owner: str, run_id: str
) -> list[gpu_select.HostGpus]:
    """DOCKER_HOST's engine: this machine's NVML (or the inventory file). Each --host: its inventory file, or
    its probe (a short-lived container on that engine; all at once)."""
    gpu = request.gpu
    if gpu.mode.strip() == "none":
        return [gpu_select.HostGpus(s.name, GpuInventory(), list) for s in sites]
    if not request.hosts:
        engine = sites[0].engine
        held = (lambda: across.live_gpu_labels(engine)) if engine is not None else list
        path = gpu.inventory_path or environ.get(gpu_select.INVENTORY_ENV) or None
        return [gpu_select.HostGpus("", gpu_select.load_inventory(path), held)]
    reached = _hosts(sites)
    every = gpu.inventory_path or environ.get(gpu_select.INVENTORY_ENV) or None
    overrides = dict(gpu.host_inventories)
    return across.host_gpus(
        reached, request.chain.image, gpu.attach, run_id, owner, overrides, every, request.chain.attempt
    )


def _locks_needed(mode: str, inventories: list[GpuInventory]) -> bool:
    """The engines' GPU locks matter only when GPUs are picked from what others hold (not none, not all)."""
    return mode.strip() not in ("none", "all") and any(inv.gpus for inv in inventories)


def _backend(
    request: LaunchRequest,
    plan: ChainPlan,
    sites: Sequence[_Site],
    release: Callable[[], None],
    guards: Mapping[str, RunGuard],
) -> StageBackend:
    """Where the stages run: DOCKER_HOST's engine, every --host's engine, or pp-gpu-node children. Each engine's
    backend records every id it creates with that engine's guard."""
    if request.gpu_node is not None:
        engine = _engine(sites[0])
        return ProcessStageBackend(
            request.gpu_node,
            plan.run_id,
            plan.grace,
            lambda run: [c.id for c in engine.containers(labels.run_selector(run))],
        )
    if not request.hosts:
        return guards[""].stage_backend(expected=len(plan.stages), on_all_created=release)
    backends = {s.name: guards[s.name].stage_backend() for s in sites}
    return MultiHostBackend(backends, expected=len(plan.stages), on_all_created=release)


GUARD_SETTLE = 10.0  # seconds a clean end waits for its guards to be gone (they find nothing left, and exit)


def _run(
    request: LaunchRequest,
    plan: ChainPlan,
    sites: Sequence[_Site],
    reporter: Reporter,
    on_scope: Callable[[Stoppable], None],
    release: Callable[[], None],
    guarding: _Guarding | None,
    say: Callable[[str], None],
) -> tuple[ChainOutcome, bool, tuple[tuple[str, str], ...]]:
    """One scope over every engine; on each engine the run's guard (adapters/guard.py), started before anything
    of the run exists there, records every container created there and tears it down if this process dies; the
    hosts of a chain across hosts recorded (ps/down/gc --all-hosts). A detached run is handed to its guards once
    it is up, and only then. Also whether another attempt may follow: a stage failed, every guard is still up (no
    `down`, no neighbour removed one) and no engine was lost; and the GPUs that faulted (an Xid) under its stages."""
    guards: dict[str, RunGuard] = {}
    faults = _GpuFaults(plan, say)
    outcome: ChainOutcome | None = None
    backend: StageBackend | None = None
    record = host_state.RunHosts() if request.hosts else None
    try:
        if guarding is not None:
            for s in sites:
                steps.check_names_free(_engine(s), plan, s.name or None, ThreadRuntime())
            guards = guarding.take()
        backend = _backend(request, plan, sites, release, guards)
        scope = ChainScope(plan, backend, QueueInbox(), reporter, ThreadRuntime(), detach=request.detach)
        on_scope(scope)
        for g in guards.values():  # `pp-launch down` told a guard to stop: the whole chain stops, as on SIGTERM
            g.when_down(lambda: scope.request_stop(signal.SIGTERM, "'pp-launch down' (told to the run's guard)"))
        if record is not None:
            record.write(plan.run_id, plan.hosts)
        if not request.hosts:  # this machine's NVML watches the GPUs of the engine on it
            faults.start(scope)
        outcome = _stopped_by_down(scope.run(), guards)
        if outcome.reason == "detached":
            for g in guards.values():
                g.detach()  # from here on the run is its guards' (and `down`'s)
            backend.close()  # this process lets the stages go: their readers and waits end and are joined
    finally:
        faults.stop()
        release()
        lost = isinstance(backend, MultiHostBackend) and bool(backend.lost)
        clean = outcome is not None and not (outcome.orphans or lost) and outcome.reason != "detached"
        if record is not None and clean:
            record.forget(plan.run_id)
    assert outcome is not None and backend is not None  # scope.run() returned, or its exception went up
    restartable = outcome.reason == "stage_failed" and clean and all(g.alive() for g in guards.values())
    return _with_lost_hosts(outcome, plan.run_id, backend), restartable, tuple(faults.faults.items())


class _GpuFaults:
    """The run's GPUs watched for Xid errors while its stages run (adapters/gpu_watch.py): a fatal one fails every
    stage on that GPU, naming it, and the run's next attempt passes the GPU over; any other is said."""

    def __init__(self, plan: ChainPlan, say: Callable[[str], None]) -> None:
        self.plan, self.say = plan, say
        self.faults: dict[str, str] = {}  # UUID -> what it reported
        self.watch: GpuWatch | None = None
        self.scope: ChainScope | None = None

    def start(self, scope: ChainScope) -> None:
        uuids = [u for s in self.plan.stages for u in s.gpus]
        if uuids:
            self.scope = scope
            self.watch = GpuWatch(uuids, self._on_xid).start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def _on_xid(self, uuid: str, index: int, code: int) -> None:
        stages = [s for s in self.plan.stages if uuid in s.gpus]
        gpu = f"GPU {index} ({uuid})" if index >= 0 else uuid
        which = ", ".join(f"stage {s.index} ({s.where()})" for s in stages) or "no stage of this run"
        if not xid.fails_stage(code):
            self.say(f"warning: {gpu}, under {which}, reported {xid.describe(code)}; the stage runs on")
            return
        self.faults[uuid] = f"{gpu} reported {xid.describe(code)} on attempt {self.plan.attempt}"
        assert self.scope is not None
        for s in stages:
            self.scope.fail_stage(
                s.index,
                f"stage {s.index} ({s.where()}) failed: its {gpu} reported "
                f"{xid.describe(code)}; that GPU is not used again in this run",
            )


class _Guarding:
    """The run's guards, started on every engine on a thread of their own while the launch plans. `take()` hands
    them over (or raises why they could not start); `finish()` lets go of them at the run's end."""

    def __init__(self, sites: Sequence[_Site], run_id: str, owner: str, grace: float) -> None:
        self.guards: dict[str, RunGuard] = {}
        self.error: BaseException | None = None
        self.taken = False
        self._thread = threading.Thread(target=self._start, args=(sites, run_id, owner, grace), name="guards")
        self._thread.start()

    def _start(self, sites: Sequence[_Site], run_id: str, owner: str, grace: float) -> None:
        try:
            for s in sites:
                self.guards[s.name] = RunGuard.start(_engine(s), run_id, owner, grace, s.name or None)
        except BaseException as exc:  # handed to take(), on the launch's own thread
            self.error = exc

    def take(self) -> dict[str, RunGuard]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        self.taken = True
        return self.guards

    def finish(self, outcome: ChainOutcome | None) -> None:
        """The run's end, after its last attempt (idempotent): the launcher lets go of each guard. One never taken
        (the launch stopped before its run) finds nothing to tear down and goes, waited for (bounded)."""
        self._thread.join()
        _let_guards_go(self.guards, outcome if self.taken else None)
        self.guards.clear()


def _let_guards_go(guards: Mapping[str, RunGuard], outcome: ChainOutcome | None) -> None:
    """The launcher's end of each guard; waited for until they are gone (they find nothing left), unless the run
    is detached (the guards own it now) or something may be left (a lost engine: they tear it down, unwaited)."""
    settled = outcome is None or (outcome.reason != "detached" and not outcome.orphans)
    for g in guards.values():
        g.close(wait=GUARD_SETTLE if settled else 0.0)


def _stopped_by_down(outcome: ChainOutcome, guards: Mapping[str, RunGuard]) -> ChainOutcome:
    """A run that failed because its guard went (`pp-launch down` while it came up or ran, or a neighbour removed
    it) says so first: its stages ending is not the stages' fault."""
    if outcome.exit_code == 0 or outcome.reason == "signal":
        return outcome
    gone = next((g for g in guards.values() if not g.alive()), None)
    if gone is None:
        return outcome
    return dataclasses.replace(outcome, message=f"{gone.lost_message()}; {outcome.message}")


def _with_lost_hosts(outcome: ChainOutcome, run: str, backend: StageBackend) -> ChainOutcome:
    """A host lost on the way is named, with what may be left there and the command to run when it is back."""
    if not isinstance(backend, MultiHostBackend):
        return outcome  # one engine: a lost engine is the scope's to say
    said = []
    for host, why in backend.lost.items():
        left = [ref[:12] for ref in outcome.orphans if backend.where(ref) == host]
        maybe = f"containers {', '.join(left)} of run {run} may still be there" if left else "none known left"
        said.append(
            f"host {host} could not be reached ({why}): {maybe}; this run's watchdog for that host removes them "
            f"if it comes back soon, else run 'pp-launch down {run} --host {host}' when it is back"
        )
    return steps.with_places_lost(outcome, said)
