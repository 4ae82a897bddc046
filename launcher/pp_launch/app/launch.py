"""The chain use case: one request, one pipeline, for every way in and every site.

`pp-launch chain`, `pp-launch compose`, `pp_launch.testing.Chain` and programs that embed pp-launch build a
`LaunchRequest` (which checks every rule between its options when it is made) and call `launch()` (or
`plan_launch()` for a dry run). The request names its site (app/site.py): DOCKER_HOST's engine, every `--host`'s
engines (app/docker_site.py), or a Ray cluster (app/on_ray.py). Whichever it is, the same steps run in the same
order: the site reached and prepared; then each attempt (app/attempts.py: `--max-restarts`) reserves, plans (the
site's planner over the site's places: app/planning.py), says the plan, starts its stages under one chain scope,
and ends them; finally the site is let go of. Nothing here knows what kind of site it drives.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pp_launch.adapters import identity, local
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.adapters.runtime import Nursery, ThreadRuntime
from pp_launch.app import attempts
from pp_launch.app import chain as steps
from pp_launch.app.request import GpuOptions as GpuOptions
from pp_launch.app.request import Hooks as Hooks
from pp_launch.app.request import Launched as Launched
from pp_launch.app.request import LaunchRequest as LaunchRequest
from pp_launch.app.request import Stoppable as Stoppable
from pp_launch.app.site import AnySite
from pp_launch.core import errors, events
from pp_launch.core.chain.scope import ChainOutcome, ChainScope, QuietReporter
from pp_launch.core.container import CACHE_DIR_ENV, MODEL_CACHE_DIR_ENV

DOWN_HEARD_WITHIN = 1.0  # s: how long a lost GPU lock waits for the run's guard to say it was told `down`


def launch(
    request: LaunchRequest,
    hooks: Hooks | None = None,
    environ: Mapping[str, str] | None = None,
    place: AnySite | None = None,
) -> Launched:
    """Run the chain to its end (or, detached, until it is up), restarting it as `--max-restarts` allows. Errors found
    before anything starts raise (exit 2 for configuration); everything after is in the outcome, and nothing is
    left behind either way. place: the site, reached (default: the one the request names); pp-gpu-node and the
    testing kit bring their own (app/node.py, testing/kit.py)."""
    hooks = hooks or Hooks()
    site = place or _site(request, dry_run=False)
    run = Run(request, site, hooks, environ)
    final: Launched | None = None
    try:
        final = attempts.run(run.request, hooks, run.attempt, run.place.guards())
        return final
    except errors.LockLost as exc:
        raise _downed(exc, run) from None
    finally:
        run.finish(final)


class Run:
    """A run on a site, its attempts started one at a time: by `launch()` as `--max-restarts` allows
    (app/attempts.py), or by a caller whose own logic decides when the next one starts (the worker driver's
    generations, as the worker's controller asks: app/worker_driver.py). Made, the site is prepared (on Docker
    engines the run's guards start, kept from the first attempt to the last); `finish()` lets go of it."""

    def __init__(
        self, request: LaunchRequest, place: AnySite, hooks: Hooks, environ: Mapping[str, str] | None = None
    ) -> None:
        self.request, self.place = _named(request), place
        self.environ = launch_environ(os.environ if environ is None else environ)
        try:
            place.planner.prepare(self.request, place.places(), hooks.say)  # what the planner's stages need first
            place.prepare(self.request, hooks.say)
        except BaseException:
            place.finish(None)
            raise

    def attempt(self, request: LaunchRequest, hooks: Hooks) -> Launched:
        """One attempt of the run (`request` is the run's, its attempt number set): reserved, planned, its stages
        run under one scope to their end."""
        return _attempt(request, hooks, place=self.place, environ=self.environ)

    def finish(self, final: Launched | None) -> None:
        """The site let go of; first, when the run ended with nothing left and no place lost, the user's records
        there past the keep swept (the site's records: engines' volumes, a Ray cluster's actors)."""
        try:
            outcome = None if final is None else final.outcome
            if outcome is not None and outcome.reason != "place_lost" and not outcome.orphans:
                self.place.sweep_records()
        finally:
            self.place.finish(final)


def _attempt(request: LaunchRequest, hooks: Hooks, *, place: AnySite, environ: Mapping[str, str]) -> Launched:
    """One attempt of the run, on any site: reserved, planned, its stages run under one scope to their end."""
    with place.reserve(request, hooks) as held:
        try:
            plan, note = place.planner.plan(request, place.places(), environ, held)
            if request.chain.attempt == 1:
                steps.say_plan(plan, note, hooks.say)
            if (signum := hooks.stop_pending()) is not None:
                raise errors.Interrupted(signum)  # stopped while planning: no stage was created
        except errors.Interrupted as exc:
            raise _stopped_placing(exc, request, held.made()) from None
        held.check()  # what is held still holds: no one else can be placing on these GPUs
        reporter = hooks.reporter(plan)  # the run's one reporter, its output kept beside it (app/attempts.py)
        staged = place.place_stages(request, plan, held, hooks.say)
        outcome: ChainOutcome | None = None
        try:
            scope = ChainScope(
                plan,
                staged.backend,
                QueueInbox(),
                reporter,
                ThreadRuntime(),
                detach=request.detach,
                kill_wait=request.kill_wait,
                passthrough=hooks.passthrough,
            )
            hooks.on_scope(scope)
            staged.watch(scope)
            outcome = scope.run()
        finally:
            ended = staged.end(outcome)
    assert ended is not None  # scope.run() returned, or its exception went up
    told, restartable, faults = ended
    return Launched(plan, note, told, restartable=restartable, faults=faults)


def _downed(exc: errors.LockLost, run: Run) -> errors.PpLaunchError:
    """A GPU lock lost while placing because `pp-launch down` told the run's guard (which held it) to stop: said as
    that stop, not as another client's removal (the guard's `down` line may come a moment after the lock went)."""
    guards = list(run.place.guards().values())
    deadline = time.monotonic() + DOWN_HEARD_WITHIN
    while guards and not any(g.down_heard for g in guards) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not any(g.down_heard for g in guards):
        return exc
    run_id = run.request.run_id or ""
    return errors.Interrupted(
        signal.SIGTERM,
        f"stopped by 'pp-launch down' (told to the run's guard) while placing run {run_id}, before any stage was "
        "created: its guard and GPU lock went with it; nothing else was touched",
        run_id,
        reason="down",
    )


def _stopped_placing(exc: errors.Interrupted, request: LaunchRequest, made: list[str]) -> errors.Interrupted:
    """A signal while the attempt was placed, in words that say what it had started (removed by the time they are
    read: the hold is let go as the attempt ends, the guards as the run does)."""
    run, attempt = request.run_id or "", request.chain.attempt
    which = f"run {run}" + (f" (attempt {attempt})" if attempt > 1 else "")
    started = f"{', '.join(made)} {'was' if len(made) == 1 else 'were'} removed" if made else "nothing was started"
    return errors.Interrupted(
        exc.signum, f"stopped by signal {exc.signum} while placing {which}, before any stage was created: {started}; "
        "nothing else was touched", run
    )  # fmt: skip


class Background:
    """A run on a thread of its own: the one type behind the testing kit's Chain and StageContainer and each
    generation of the worker driver. `go(hooks)` runs it (launch(), or an attempt of a Run); its events go to
    `reporter`, its foreground stage's output to `passthrough` (when it has one). `settled()` waits until an event
    for which `settles(event)` holds (its container started; its roster) or its end. When it ends, `on_end(self)` is
    called on that thread; `stop()` asks its scope to stop (the chain's one teardown) and joins the thread. After
    it: `done` (the run's result) or `error`."""

    def __init__(
        self,
        go: Callable[[Hooks], Launched],
        reporter: Any,
        settles: Callable[[events.Event], bool],
        name: str,
        on_end: Callable[[Background], None] = lambda run: None,
        passthrough: Callable[[str, bytes], None] | None = None,
    ) -> None:
        self.on_end = on_end
        self.scope: ChainScope | None = None
        self.done: Launched | None = None
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self.is_settled = False  # an event settled it (else it ended first, or has not yet)
        self._settled = threading.Event()  # it settled, or it ended first
        self._stop: str | None = None  # who asked it to stop, once someone did
        hooks = Hooks(
            reporter=lambda plan: _Settling(reporter, settles, self._settle),
            on_scope=self._on_scope,
            stop_pending=lambda: signal.SIGTERM if self._stop is not None else None,
            passthrough=passthrough,
        )
        self._threads = Nursery(name)
        try:
            self._threads.start(self._run, go, hooks, name=name, daemon=False)
        except BaseException:  # Ctrl-C while its thread starts (Thread.start waits for it): it stops, joined
            self.stop("an interrupt while it started")
            raise

    def settled(self, timeout: float | None = None) -> bool:
        """Waits (in slices: Ctrl-C reaches the caller) until it settled or ended, at most `timeout` seconds;
        whether it settled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._settled.is_set():
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                break
            self._settled.wait(left)
        return self.is_settled

    def _settle(self) -> None:
        self.is_settled = True
        self._settled.set()

    def _on_scope(self, scope: Stoppable) -> None:
        assert isinstance(scope, ChainScope)
        self.scope = scope
        if self._stop is not None:  # asked before its scope existed
            scope.request_stop(signal.SIGTERM, self._stop)

    def _run(self, go: Callable[[Hooks], Launched], hooks: Hooks) -> None:
        try:
            self.done = go(hooks)
        except BaseException as exc:  # handed to the caller, on its own thread
            self.error = exc
        self._ended()
        self.ended.set()
        self._settled.set()
        self.on_end(self)

    def _ended(self) -> None:
        """What a kind of run sets at its end, before it is said ended."""

    def join(self, timeout: float | None = None) -> bool:
        """Waits until it ended, at most `timeout` seconds; whether it did."""
        self._threads.join(timeout)
        return self.ended.is_set()

    def stop(self, by: str) -> None:
        """SIGTERM through the chain's one teardown (asked before the scope exists, the run stops there: nothing
        is started), and the thread joined."""
        self._stop = by
        if self.scope is not None:
            self.scope.request_stop(signal.SIGTERM, by)
        self._threads.join(None)  # the chain's teardown is bounded (the grace, then the kill wait)


class Foreground(Background):
    """A run of one stage in the foreground (the testing kit's StageContainer, each generation of the worker
    driver): its output passed to `passthrough`. Made, the stage's container runs (`ref`, its `scope` and `backend`);
    the run's own error is raised if it ended first. After it: `exit_code` too (the stage's own; None when the
    engine could not say)."""

    def __init__(
        self,
        go: Callable[[Hooks], Launched],
        passthrough: Callable[[str, bytes], None],
        on_end: Callable[[Foreground], None],
        name: str,
    ) -> None:
        self.ref = ""
        self.exit_code: int | None = None
        started = lambda event: isinstance(event, events.StageStarted)  # noqa: E731
        super().__init__(go, QuietReporter(), started, name, on_end, passthrough)  # type: ignore[arg-type]
        try:
            self.settled()
        except BaseException:  # Ctrl-C while it comes up: it stops, as a chain does, before this goes up
            self.stop("an interrupt while it started")
            raise
        if not self.is_settled:  # it ended before its container ran: the run's own error
            self.join(None)
            raise self.error or errors.PpLaunchError(f"{name} ended before its container started")
        assert self.scope is not None
        self.ref = self.scope.stages[0].ref or ""

    @property
    def started(self) -> bool:
        """Its container ran (else the run ended before: `error` says why)."""
        return self.is_settled

    @property
    def backend(self) -> Any:
        """The stage's backend (which writes to its container's stdin)."""
        assert self.scope is not None
        return self.scope.backend

    def _ended(self) -> None:
        self.exit_code = self.scope.stages[0].exit_code if self.scope is not None else None


class _Settling:
    """The run's reporter, passed every call, and told when an event settles the run (Background)."""

    def __init__(self, inner: Any, settles: Callable[[events.Event], bool], settle: Callable[[], None]) -> None:
        self.inner, self.settles, self.settle = inner, settles, settle

    def event(self, event: events.Event) -> None:
        self.inner.event(event)
        if self.settles(event):
            self.settle()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def plan_launch(request: LaunchRequest, environ: Mapping[str, str] | None = None, dry_run: bool = True) -> Launched:
    """The plan only (a dry run, or a Compose file): nothing is started, locked or swept. Without --host an
    absent engine is no error (the GPUs its containers hold are then not checked: `warning`). dry_run: what a
    launch would fail on before starting anything fails here too (an engine that refuses this user, a stage image
    it lacks); a Compose file is written for wherever it will run, so it checks neither."""
    environ = launch_environ(os.environ if environ is None else environ)
    request = _named(request)
    place = _site(request, dry_run=True, strict=dry_run)
    try:
        return place.planner.dry_plan(request, place.places(), environ, strict=dry_run)
    finally:
        place.finish(None)


def launch_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment as a plan reads it: HOME known, the cache folders (PP_CACHE_DIR,
    PP_MODEL_CACHE_DIR) absolute, taken from where the launcher runs."""
    env = dict(environ)
    env.setdefault("HOME", os.path.expanduser("~"))
    for name in (CACHE_DIR_ENV, MODEL_CACHE_DIR_ENV):
        if env.get(name):
            env[name] = os.path.abspath(env[name])
    return env


def _named(request: LaunchRequest) -> LaunchRequest:
    """The request with its run id (a new one) and its containers' owner (this process, or a detached run's); with
    --rendezvous torch, its MASTER_PORT (a port free on this machine, unless --env names one; on Ray, stage 0's
    node picks it: app/planning.py)."""
    run_id = request.run_id or identity.new_run_id()
    chain = request.chain
    if chain.rendezvous == "torch" and request.ray is None and not any(name == "MASTER_PORT" for name, _ in chain.env):
        chain = dataclasses.replace(chain, env=(*chain.env, ("MASTER_PORT", str(local.free_port()))))
    owner = request.owner or steps.owner_label(request.detach)
    return dataclasses.replace(request, chain=chain, run_id=run_id, owner=owner)


def _site(request: LaunchRequest, dry_run: bool, strict: bool = False) -> AnySite:
    """The site the request names, reached."""
    from pp_launch.app import sites

    return sites.for_launch(request, dry_run, strict)
