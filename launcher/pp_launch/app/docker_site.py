"""One Docker engine or several, as a launch's site (app/site.py): a chain's whole life on them.

A launch (app/launch.py drives the steps): the engines reached (DOCKER_HOST's, or every --host's, checked at once),
a list of places (`EnginePlace`, `HostPlace`: what differs between one engine and another is the place's); the
stage image on each; the run's guard on each engine (adapters/guard.py), started while the launch plans and
kept from the first attempt to the last; per attempt the engines' GPU locks (app/locks.py), the plan (its
`Planner`'s: the allocator over each engine's GPUs and holdings, or the one stage a caller describes), the stages'
backend (one engine, several, or pp-gpu-node children), the GPUs watched for faults, and what was lost named.
Housekeeping on the same engines (`ps`, `down`, `gc`, `logs`, `wait`) is app/docker_runs.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Self

from pp_launch.adapters import guard, host_state, identity
from pp_launch.adapters.docker_engine import Engine
from pp_launch.adapters.guard import RunGuard
from pp_launch.adapters.multi_host import MultiHostBackend, lost_host
from pp_launch.adapters.process_backend import ProcessStageBackend
from pp_launch.adapters.runtime import Nursery, ThreadRuntime, run_all
from pp_launch.app import chain as steps
from pp_launch.app import hosts as across
from pp_launch.app.gpu_faults import GpuFaults
from pp_launch.app.locks import GpuLocks, LockSite, reserve
from pp_launch.app.places import EnginePlace, Watch, engine_of, hosts_of, reach
from pp_launch.app.planning import Allocated, EnginePlanner
from pp_launch.app.request import Hooks, Launched, LaunchRequest
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.chain.ports import StageBackend
from pp_launch.core.chain.restarts import may_restart
from pp_launch.core.chain.scope import ChainOutcome, ChainScope


class DockerSite:
    """One Docker engine, or several: a chain's engines (DOCKER_HOST's, or every --host's) as `launch()` drives
    them, what runs there at each attempt its `planner`'s. Housekeeping on the same engines is app/docker_runs.py's.
    Opened by `to_launch` (the registry's, app/sites.py); made directly only over places already reached (tests).
    `backend`: the stages' backend given (tests: an in-process one; no image, no guard), else each engine's."""

    def __init__(
        self,
        places: list[EnginePlace],
        planner: EnginePlanner | None = None,
        owns_engines: bool = True,
        backend: StageBackend | None = None,
    ) -> None:
        self._places = places  # the launch's engines, reached
        self._planner: EnginePlanner = planner or Allocated()
        self.owns_engines = owns_engines  # closed with the site
        self.backend = backend
        self.guarding: _Guarding | None = None

    @classmethod
    def to_launch(
        cls,
        request: LaunchRequest,
        dry_run: bool = False,
        strict: bool = False,
        planner: EnginePlanner | None = None,
        *,
        engine: Engine | None = None,
        backend: StageBackend | None = None,
    ) -> Self:
        """The chain's engines: every --host reached and checked at once (exit 2 naming each that does not answer),
        or DOCKER_HOST's (a dry run tolerates none: a plan needs no engine; strict: but one that runs and refuses
        this user is the error a launch would meet); or `engine`, one the caller reached (and closes). Nothing is
        started ahead of a run, and nothing stays after it. `planner`: what runs at each attempt (default: the
        chain's stages, allocated); `backend`: the stages' own (tests)."""
        if engine is not None:
            return cls([EnginePlace("", engine, engine.address)], planner, owns_engines=False, backend=backend)
        return cls(reach(request, dry_run, strict), planner, backend=backend)

    @property
    def planner(self) -> EnginePlanner:
        return self._planner

    def places(self) -> list[EnginePlace]:
        return self._places

    def close(self) -> None:
        for s in self._places if self.owns_engines else ():
            if s.engine is not None:
                s.engine.close()

    # ------------------------------------------------------------------------------------------------ a launch
    def prepare(self, request: LaunchRequest, say: Callable[[str], None]) -> None:
        """The stage image and pp-launch's guard image on every engine (built on first use on DOCKER_HOST's; never
        pulled), and the run's guards coming up while the launch plans (each costs a container's start). Nothing
        is swept: what a launcher leaves, its guard removes (adapters/guard.py). With a backend given: nothing."""
        if self.backend is not None:
            return
        across.check_image(hosts_of(self._places), request.chain.image)  # one id on every --host
        for s in self._places:
            s.prepare(request.chain, say)
        if request.gpu_node is None:
            owner = request.owner or steps.owner_label(request.detach)
            self.guarding = _Guarding(self._places, request.run_id or "", owner, request.chain.grace)

    def guards(self) -> Mapping[str, RunGuard]:
        return self.guarding.guards if self.guarding is not None else {}

    def reserve(self, request: LaunchRequest, hooks: Hooks) -> AbstractContextManager[GpuLocks]:
        """The engines' GPU locks (app/locks.py), taken when GPUs are picked (`plan`)."""
        g = self.guarding
        sites = [
            LockSite(s.lock_name, s.engine, s.engine_id, None if g is None else functools.partial(g.ref, s.name))
            for s in self._places
            if s.engine is not None
        ]
        owner, attempt = identity.current_owner().label(), request.chain.attempt
        return reserve(sites, request.run_id or "", owner, hooks.say, hooks.stop_pending, attempt)

    def place_stages(
        self, request: LaunchRequest, plan: ChainPlan, held: GpuLocks, say: Callable[[str], None]
    ) -> _Stages:
        """The run's guards taken (started before anything of the run exists on their engine) once no name of the
        plan is taken on any engine; the backend records every id it creates with its engine's guard."""
        guards: dict[str, RunGuard] = {}
        if self.guarding is not None:
            for s in self._places:
                steps.check_names_free(engine_of(s), plan, s.name or None, ThreadRuntime())
            guards = self.guarding.take()
        backend, across_hosts = self.backend, None  # a backend given (tests): one engine's, in process
        if backend is None:
            backend, across_hosts = _backend(request, plan, self._places, held, guards, self._planner.backend_options)
        return _Stages(request, plan, backend, across_hosts, guards, held, say, self._planner.watch_gpus, self._places)

    def finish(self, final: Launched | None) -> None:
        """The launcher lets go of each guard (kept from the first attempt to the last: `down` finds the run between
        them too), then of every engine."""
        try:
            if self.guarding is not None:
                self.guarding.finish(None if final is None else final.outcome)
        finally:
            self.close()

    def sweep_records(self) -> None:
        """The user's record volumes past the keep, from each engine (adapters/guard.py); none where this run
        guarded nothing (a backend given: it made no record there either)."""
        if self.guarding is None:
            return
        for s in self._places:
            if s.engine is not None:
                with contextlib.suppress(errors.PpLaunchError, OSError):
                    guard.sweep_own_records(s.engine)


# ------------------------------------------------------------------------------------------------ a launch


def _backend(
    request: LaunchRequest,
    plan: ChainPlan,
    sites: Sequence[EnginePlace],
    held: GpuLocks,
    guards: Mapping[str, RunGuard],
    options: Mapping[str, Any],
) -> tuple[StageBackend, MultiHostBackend | None]:
    """Where the stages run: DOCKER_HOST's engine, every --host's engine (that backend also returned: it knows
    which hosts were lost), or pp-gpu-node children. Each engine's backend records every id it creates with that
    engine's guard."""
    if request.gpu_node is not None:
        engine = engine_of(sites[0])
        return ProcessStageBackend(
            request.gpu_node,
            plan.run_id,
            plan.grace,
            lambda run: [c.id for c in engine.containers(labels.run_selector(run))],
        ), None
    if hosts_of(sites):  # a --host engine can be lost alone: the others torn down, it named
        backends = {s.name: guards[s.name].stage_backend() for s in sites}
        multi = MultiHostBackend(backends, expected=len(plan.stages), on_all_created=held.check_and_release)
        return multi, multi
    (site,) = sites
    one = guards[site.name].stage_backend(expected=len(plan.stages), on_all_created=held.check_and_release, **options)
    return one, None


GUARD_SETTLE = 10.0  # seconds a clean end waits for its guards to be gone (they find nothing left, and exit)


class _Stages:
    """An attempt's stages on Docker engines. Its scope watched: `pp-launch down` told to a guard stops the whole
    chain (as SIGTERM does); the hosts of a chain across hosts recorded (ps/down/gc --all-hosts); this machine's
    NVML watching the GPUs of the engine on it. At its end a detached run is handed to its guards (and only then),
    and the outcome says whether another attempt may follow: a stage failed, every guard is still up (no `down`, no
    neighbour removed one) and no engine was lost; and the GPUs that faulted (an Xid) under its stages."""

    def __init__(
        self,
        request: LaunchRequest,
        plan: ChainPlan,
        backend: StageBackend,
        across_hosts: MultiHostBackend | None,
        guards: Mapping[str, RunGuard],
        held: GpuLocks,
        say: Callable[[str], None],
        watch_gpus: bool,
        places: Sequence[EnginePlace],
    ) -> None:
        self.request, self.plan, self.backend, self.guards, self.held = request, plan, backend, guards, held
        self.across_hosts = across_hosts  # the backend, when it is across --host engines: the hosts it lost
        self.say = say
        self.faults = GpuFaults(plan, say)
        self.watches: list[Watch] = []  # this machine's NVML, or a watcher on each --host
        self.watch_gpus, self.places = watch_gpus, {s.name: s for s in places}
        self.record = host_state.RunHosts() if hosts_of(places) else None

    def watch(self, scope: ChainScope) -> None:
        for g in self.guards.values():
            g.when_down(lambda: scope.request_stop(signal.SIGTERM, "'pp-launch down' (told to the run's guard)"))
            g.when_lost(self.say, lambda why: scope.lose_place(f"{why}: the run is ended rather than left unguarded"))
        if self.record is not None:
            self.record.write(self.plan.run_id, self.plan.hosts)
        self.faults.watching(scope)
        if self.watch_gpus:
            self._watch_gpus()

    def _watch_gpus(self) -> None:
        """The GPUs of the attempt's stages watched for Xid errors where they are: this machine's NVML for the one
        engine, a watcher container on each --host engine (started in the background: bring-up never waits)."""
        by_host: dict[str, list[str]] = {}
        for s in self.plan.stages:
            by_host.setdefault(s.host, []).extend(s.gpus)
        for name, uuids in by_host.items():
            if uuids and (place := self.places.get(name)) is not None:
                w = place.watch(uuids, self.request, self.guards.get(name), self.faults, self.say)
                self.watches.extend([w] if w is not None else [])

    def end(self, outcome: ChainOutcome | None) -> tuple[ChainOutcome, bool, tuple[tuple[str, str], ...]] | None:
        backend, guards = self.backend, self.guards
        try:
            if outcome is not None:
                outcome = _stopped_by_down(outcome, guards)
                if outcome.reason == "detached":
                    for g in guards.values():
                        g.detach()  # from here on the run is its guards' (and `down`'s)
                    backend.close()  # this process lets the stages go: their readers and waits end and are joined
        finally:
            run_all([w.stop for w in self.watches], "gpu-watch-stop")
            self.held.check_and_release()
            lost = self.across_hosts is not None and bool(self.across_hosts.lost)
            clean = outcome is not None and not (outcome.orphans or lost) and outcome.reason != "detached"
            if self.record is not None and clean:
                self.record.forget(self.plan.run_id)
        if outcome is None:
            return None

        def held() -> bool:  # an engine call per guard: asked only when all else allows a restart
            return all(g.alive() for g in guards.values())

        restartable = clean and may_restart(outcome.reason, bool(outcome.orphans), lost, held)
        return _with_lost_hosts(outcome, self.plan.run_id, self.across_hosts), restartable, self.faults.seen()


class _Guarding:
    """The run's guards, started on every engine on a thread of their own while the launch plans. `take()` hands
    them over (or raises why they could not start); `finish()` lets go of them at
    the run's end."""

    def __init__(self, sites: Sequence[EnginePlace], run_id: str, owner: str, grace: float) -> None:
        self.guards: dict[str, RunGuard] = {}
        self.errors: dict[str, BaseException] = {}
        self.order = [s.name for s in sites]
        self.taken = False
        self._threads = Nursery(f"run {run_id}'s guards")
        self._each: dict[str, threading.Thread] = {}
        for s in sites:  # each engine's at once: one engine's lock waits only for that engine's guard
            args = (s, run_id, owner, grace)
            self._each[s.name] = self._threads.start(self._start, *args, name=f"guard-{s.name or 'local'}")

    def _start(self, s: EnginePlace, run_id: str, owner: str, grace: float) -> None:
        try:
            self.guards[s.name] = RunGuard.start(engine_of(s), run_id, owner, grace, s.name or None)
        except BaseException as exc:  # handed to take(), on the launch's own thread
            self.errors[s.name] = exc

    def take(self) -> dict[str, RunGuard]:
        self._threads.join(None)
        if first := next((self.errors[n] for n in self.order if n in self.errors), None):
            raise first
        self.taken = True
        return self.guards

    def ref(self, name: str) -> str:
        """The container of the guard on the engine `name`, once it runs (that one waited for): it holds that
        engine's GPU lock (app/locks.py); "" when it has none."""
        if (thread := self._each.get(name)) is None:
            return ""
        thread.join()
        if name in self.errors:
            raise self.errors[name]
        g = self.guards.get(name)
        return g.ref if g is not None else ""

    def finish(self, outcome: ChainOutcome | None) -> None:
        """The run's end, after its last attempt (idempotent): the launcher lets go of each guard. One never taken
        (the launch stopped before its run) finds nothing to tear down and goes, waited for (bounded)."""
        self._threads.join(None)
        _let_guards_go(self.guards, outcome if self.taken else None)
        self.guards.clear()


def _let_guards_go(guards: Mapping[str, RunGuard], outcome: ChainOutcome | None) -> None:
    """The launcher's end of each guard; waited for until they are gone (they find nothing left), unless the run
    is detached (the guards own it now) or something may be left (a lost engine: they tear it down, unwaited)."""
    settled = outcome is None or (outcome.reason != "detached" and not outcome.orphans)
    for g in guards.values():
        g.close(wait=GUARD_SETTLE if settled else 0.0)


def _stopped_by_down(outcome: ChainOutcome, guards: Mapping[str, RunGuard]) -> ChainOutcome:
    """A run that failed because `pp-launch down` told its guard while it came up or ran says so first: its stages
    ending is not the stages' fault. (A guard someone else ended is replaced, or the run ends saying so.)"""
    if outcome.exit_code == 0 or outcome.reason in ("signal", "place_lost"):
        return outcome
    down = next((g for g in guards.values() if g.down_heard), None)
    if down is None:
        return outcome
    return dataclasses.replace(outcome, message=f"{down.lost_message()}; {outcome.message}")


def _with_lost_hosts(outcome: ChainOutcome, run: str, backend: MultiHostBackend | None) -> ChainOutcome:
    """A host lost on the way is named, with what may be left there and the command to run when it is back."""
    if backend is None:
        return outcome  # one engine: a lost engine is the scope's to say
    said = []
    for host, why in backend.lost.items():
        left = [ref[:12] for ref in outcome.orphans if backend.where(ref) == host]
        maybe = f"containers {', '.join(left)} of run {run} may still be there" if left else "none known left"
        head = lost_host(host, str(why))
        line = (
            f"{head}: {maybe}; this run's watchdog for that host removes them if it comes back soon, else run "
            f"'pp-launch down {run} --host {host}' when it is back"
        )
        if outcome.message.startswith(head):  # the chain's end said it first (PlaceLost): completed in place
            outcome = dataclasses.replace(outcome, message=line + outcome.message[len(head) :])
        else:
            said.append(line)
    return steps.with_places_lost(outcome, said)
