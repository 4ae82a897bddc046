"""app/launch.py: one pipeline drives any site (app/site.py). A fake site stands where Docker engines or a Ray
cluster would; its stages run on the fake backend. What is checked: the steps come in one order, whatever the
site; every step that was begun is ended, however the attempt ends; restarts reserve again on the same site."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from pp_launch.app import launch
from pp_launch.app.launch import Hooks, Launched, LaunchRequest
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainPlan, ChainRequest, build_plan
from pp_launch.core.chain.scope import ChainOutcome, ChainScope

from .fakes import FakeBackend, StageScript


class Held:
    def __init__(self, steps: list[str], lost: bool = False) -> None:
        self.steps, self.lost = steps, lost

    def check(self) -> None:
        self.steps.append("check")
        if self.lost:
            raise errors.LockLost("the GPU lock was removed by another client")

    def check_and_release(self) -> None:
        self.steps.append("release")

    def made(self) -> list[str]:
        return ["the run's guard on here"]


class Staged:
    def __init__(self, site: FakeSite, backend: FakeBackend) -> None:
        self.site, self.backend = site, backend

    def watch(self, scope: ChainScope) -> None:
        self.site.steps.append("watch")

    def end(self, outcome: ChainOutcome | None) -> tuple[ChainOutcome, bool, tuple[tuple[str, str], ...]] | None:
        self.site.steps.append(f"end:{outcome.reason if outcome else None}")
        if outcome is None:
            return None
        told = ChainOutcome(outcome.exit_code, outcome.reason, outcome.message + " (as the site tells it)")
        return told, self.site.restartable.pop(0) if self.site.restartable else False, ()


class FakePlanner:
    """The pipeline's planning over the fake site's places, recorded in the site's steps."""

    backend_options: Mapping[str, Any] = {}
    watch_gpus = False

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def prepare(self, request: LaunchRequest, places: Sequence[str], say: Callable[[str], None]) -> None:
        self.steps.append(f"plan-prepare:{','.join(places)}")

    def plan(
        self, request: LaunchRequest, places: Sequence[str], environ: Mapping[str, str], held: Any
    ) -> tuple[ChainPlan, str]:
        self.steps.append("plan")
        n = request.chain.stages
        assert request.run_id and request.owner  # named before any step
        plan = build_plan(request.chain, environ, request.owner, [()] * n, [()] * n, request.run_id)
        return plan, "a note"

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[str], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        self.steps.append("dry_plan")
        return Launched(self.plan(request, places, environ, None)[0])


class FakeSite:
    """Every step recorded, in order; scripts for each attempt's stages."""

    def __init__(
        self,
        scripts: dict[int, StageScript],
        lost: bool = False,
        restartable: list[bool] | None = None,
    ):
        self.steps: list[str] = []
        self.scripts, self.lost = scripts, lost
        self.restartable = list(restartable or [])
        self.finished: list[Launched | None] = []
        self.planner = FakePlanner(self.steps)
        self.swept: list[int] = []

    def places(self) -> list[str]:
        return ["here"]

    def prepare(self, request: LaunchRequest, say: Callable[[str], None]) -> None:
        self.steps.append("prepare")

    def guards(self) -> Mapping[str, Any]:
        return {}

    @contextlib.contextmanager
    def reserve(self, request: LaunchRequest, hooks: Hooks) -> Iterator[Held]:
        self.steps.append(f"reserve:{request.chain.attempt}")
        try:
            yield Held(self.steps, self.lost)
        finally:
            self.steps.append("unreserve")

    def place_stages(self, request: LaunchRequest, plan: ChainPlan, held: Any, say: Callable[[str], None]) -> Staged:
        self.steps.append("place")
        return Staged(self, FakeBackend(scripts=self.scripts))

    def sweep_records(self) -> None:
        self.swept.append(len(self.steps))  # where in the steps (not one of them: the order above is the run's)

    def finish(self, final: Launched | None) -> None:
        self.steps.append("finish")
        self.finished.append(final)


def request(stages: int = 2, **options: Any) -> LaunchRequest:
    return LaunchRequest(chain=ChainRequest(stages=stages, addr_timeout=5.0, grace=1.0), **options)


def on(site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    monkeypatch.setattr(launch, "_site", lambda request, dry_run, strict=False: site)
    return site


DONE = {k: StageScript(exit_code_on_start=0) for k in range(2)}  # every stage announces, then exits 0


def test_a_launch_takes_the_steps_in_one_order_and_the_outcome_is_the_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    site = on(FakeSite(DONE), monkeypatch)
    said: list[str] = []
    done = launch.launch(request(), Hooks(say=said.append), environ={})
    assert site.steps == ["plan-prepare:here", "prepare", "reserve:1", "plan", "check", "place", "watch",
                          "end:completed", "unreserve", "finish"]  # fmt: skip
    assert done.outcome is not None and done.outcome.exit_code == 0
    assert done.outcome.message.endswith("(as the site tells it)") and done.note == "a note"
    assert site.finished == [done] and any("a note" in line for line in said)


def test_a_scope_that_raises_still_ends_its_stages_unreserves_and_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    site = on(FakeSite(DONE), monkeypatch)

    def boom(self: ChainScope) -> ChainOutcome:
        raise RuntimeError("a bug in the scope")

    monkeypatch.setattr(ChainScope, "run", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        launch.launch(request(), environ={})
    assert site.steps[-4:] == ["watch", "end:None", "unreserve", "finish"] and site.finished == [None]


def test_a_stop_while_planning_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    site = on(FakeSite(DONE), monkeypatch)
    with pytest.raises(errors.Interrupted) as stopped:
        launch.launch(request(), Hooks(stop_pending=lambda: signal.SIGTERM), environ={})
    assert "place" not in site.steps and site.steps[-2:] == ["unreserve", "finish"]
    said = str(stopped.value)  # what the attempt had started, in the hold's words; the run it stopped
    assert said.startswith("stopped by signal 15 while placing run ") and stopped.value.run_id in said, said
    assert said.endswith("before any stage was created: the run's guard on here was removed; nothing else was touched")


def test_what_is_held_taken_away_before_placing_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    site = on(FakeSite(DONE, lost=True), monkeypatch)
    with pytest.raises(errors.LockLost):
        launch.launch(request(), environ={})
    assert site.steps == ["plan-prepare:here", "prepare", "reserve:1", "plan", "check", "unreserve", "finish"]


def test_a_restart_reserves_and_plans_again_on_the_same_site(monkeypatch: pytest.MonkeyPatch) -> None:
    failing = {0: StageScript(exit_code_on_start=3), 1: StageScript(exit_code_on_start=0)}
    site = on(FakeSite(failing, restartable=[True, False]), monkeypatch)
    done = launch.launch(request(max_restarts=1, restart_backoff=0.0), environ={})
    assert done.outcome is not None and done.outcome.exit_code == errors.EXIT_FAILURE
    assert [s for s in site.steps if s.startswith(("prepare", "reserve", "finish"))] == [
        "prepare", "reserve:1", "reserve:2", "finish"
    ]  # fmt: skip


def test_a_dry_run_plans_on_the_site_and_finishes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    site = on(FakeSite(DONE), monkeypatch)
    planned = launch.plan_launch(request(3), environ={})
    assert len(planned.plan.stages) == 3 and site.steps == ["dry_plan", "plan", "finish"]
    assert site.swept == []  # a dry run changes nothing


def test_a_runs_end_sweeps_the_users_old_records_only_when_it_left_nothing_and_lost_no_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Completed, or a stage failed (nothing left): swept once, before the site is let go of. A place lost, or
    something left behind, or an error: the site is asked nothing more."""
    site = on(FakeSite(DONE), monkeypatch)
    launch.launch(request(), environ={})
    assert site.swept == [len(site.steps) - 1] and site.steps[-1] == "finish"
    site = on(FakeSite({0: StageScript(exit_code_on_start=3), 1: StageScript(exit_code_on_start=0)}), monkeypatch)
    assert launch.launch(request(), environ={}).outcome.exit_code == errors.EXIT_FAILURE  # type: ignore[union-attr]
    assert len(site.swept) == 1
    for reason, orphans in (("place_lost", ()), ("completed", ("c" * 64,))):
        site = on(FakeSite(DONE), monkeypatch)
        told = ChainOutcome(1, reason, "as the site tells it", orphans=orphans)
        monkeypatch.setattr(Staged, "end", lambda self, outcome, told=told: (told, False, ()))
        launch.launch(request(), environ={})
        assert site.swept == [] and site.steps[-1] == "finish", reason
    site = on(FakeSite(DONE, lost=True), monkeypatch)
    with pytest.raises(errors.LockLost):
        launch.launch(request(), environ={})
    assert site.swept == []


def test_an_interrupt_while_a_foreground_stage_comes_up_stops_its_run_there_and_joins_it() -> None:
    """Ctrl-C while a StageContainer (or a worker generation) is still planning: its run is told to stop, stops
    before anything is started (as a chain does: stop_pending after planning), and its thread is gone when the
    interrupt goes up."""
    planning, stopped = threading.Event(), []

    def go(hooks: Hooks) -> Launched:
        planning.set()
        deadline = time.monotonic() + 10
        while hooks.stop_pending() is None and time.monotonic() < deadline:  # planning: it asks when it is done
            time.sleep(0.01)
        stopped.append(hooks.stop_pending())
        raise errors.Interrupted(signal.SIGTERM)

    interrupter = threading.Thread(target=lambda: planning.wait(10) and os.kill(os.getpid(), signal.SIGINT))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as Python has it (a CLI test may not)
    try:
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            launch.Foreground(go, lambda stream, data: None, lambda run: None, "pp-test-foreground")
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, before)
    assert stopped == [signal.SIGTERM]
    assert not [t for t in threading.enumerate() if t.name == "pp-test-foreground"]


def test_a_background_run_settles_on_its_event_times_out_without_it_and_stops_joined() -> None:
    """Background (the kit's Chain, StageContainer, the worker driver's generations): `settled()` is true once an
    event settles it, false when its wait ran out or the run ended first; `stop()` reaches the run and joins it."""
    seen: list[object] = []
    release = threading.Event()

    def go(hooks: Hooks) -> Launched:
        reporter = hooks.reporter(None)  # type: ignore[arg-type]
        reporter.event("planning")
        release.wait(10)
        reporter.event("up")
        while hooks.stop_pending() is None:
            release.wait(0.01)
        raise errors.Interrupted(signal.SIGTERM)

    class Seen:
        def event(self, event: object) -> None:
            seen.append(event)

    run = launch.Background(go, Seen(), lambda event: event == "up", "pp-test-background")
    assert run.settled(0.05) is False and not run.ended.is_set()  # still planning: not up, and its wait ran out
    release.set()
    assert run.settled(10) is True and seen == ["planning", "up"]
    run.stop("the test")
    assert run.ended.is_set() and isinstance(run.error, errors.Interrupted)
    assert not [t for t in threading.enumerate() if t.name == "pp-test-background"]

    ended = launch.Background(lambda hooks: (_ for _ in ()).throw(errors.ConfigError("no")), Seen(), bool, "pp-t2")
    assert ended.settled(10) is False and isinstance(ended.error, errors.ConfigError)  # it ended first
    assert ended.join(10)
