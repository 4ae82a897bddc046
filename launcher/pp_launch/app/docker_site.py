"""One Docker engine or several, as a site (app/site.py): a chain's whole life on them, and their housekeeping.

A launch (app/launch.py drives the steps): the engines reached (DOCKER_HOST's, or every --host's, checked at once);
the stage image on each; the run's guard on each engine (adapters/guard.py), started while the launch plans and
kept from the first attempt to the last; per attempt the engines' GPU locks (app/locks.py), each engine's GPUs and
holdings, the stages' backend (one engine, several, or pp-gpu-node children), the GPUs watched for faults, and
what was lost named. Housekeeping (app/runs.py asks): only what a running guard of the run recorded is ever
stopped (app/housekeeping.py holds the rules); a container that merely carries a run's labels is named, never
touched.
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import functools
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Self

from pp_launch.adapters import guard, host_state, identity, images, run_logs
from pp_launch.adapters.docker_engine import ContainerInfo, Engine, connect
from pp_launch.adapters.gpu_watch import GpuWatch
from pp_launch.adapters.guard import RunGuard, StageEnd
from pp_launch.adapters.guard import image_check as guard_image_check
from pp_launch.adapters.multi_host import MultiHostBackend
from pp_launch.adapters.process_backend import ProcessStageBackend
from pp_launch.adapters.runtime import Nursery, ThreadRuntime, run_all
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app import housekeeping
from pp_launch.app.gpu_faults import GpuFaults
from pp_launch.app.locks import GpuLocks, LockSite, reserve
from pp_launch.app.request import Hooks, Launched, LaunchRequest
from pp_launch.app.rows import StageRow
from pp_launch.app.site import Confirm, LogView, Voice, Where
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainPlan, StageSpec, build_plan
from pp_launch.core.chain.ports import StageBackend
from pp_launch.core.chain.restarts import may_restart
from pp_launch.core.chain.scope import ChainOutcome, ChainScope
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.lines import count, display


@dataclass(frozen=True)
class _Engine:
    """An engine a chain runs on: `name` "" is DOCKER_HOST's (no --host); `engine` None only in a dry run that
    found no engine."""

    name: str
    engine: Engine | None
    lock_name: str = ""
    engine_id: str = ""
    host: across.Host | None = None  # a --host engine, reached and checked


class DockerSite:
    """One Docker engine, or several: a chain's engines (DOCKER_HOST's, or every --host's) as `launch()` drives
    them, or the engines a housekeeping command names (--host, --all-hosts), each asked in turn, a host that does
    not answer said and skipped (the command then exits 1)."""

    backend_options: Mapping[str, Any] = {}  # for the one engine's stage backend (adapters/docker_engine.py)
    watch_gpus = True  # a stage whose GPU faults (Xid) fails

    def __init__(self, where: Where, run: str | None, voice: Voice) -> None:
        self.where, self.run, self.voice = where, run, voice
        self._engines: housekeeping.Engines | None = None
        self.places: list[_Engine] = []  # a launch's engines, reached
        self.guarding: _Guarding | None = None
        self.owns_engines = True  # closed with the site
        self.spare: guard.Spare | None = None  # the spare guard this launch took (its run id is the run's)
        self.stocks_spare = False  # at its end, a launch leaves a spare guard for its user's next run (launch.py)

    @classmethod
    def for_runs(cls, where: Where, run: str | None, voice: Voice) -> Self:
        """The engines `where` names, reached as each is asked (for --all-hosts, those recorded for `run` too)."""
        return cls(where, run, voice)

    @classmethod
    def to_launch(cls, request: LaunchRequest, dry_run: bool = False, strict: bool = False) -> Self:
        """The chain's engines: every --host reached and checked at once (exit 2 naming each that does not answer),
        or DOCKER_HOST's (a dry run tolerates none: a plan needs no engine; strict: but one that runs and refuses
        this user is the error a launch would meet)."""
        place = cls(Where(), None, Voice(lambda text: None, lambda text: None))
        place.places = _reach(request, dry_run, strict)
        return place

    @property
    def engines(self) -> housekeeping.Engines:
        if self._engines is None:
            self._engines = housekeeping.Engines(
                self.where.hosts, self.where.all_hosts, self.run, say=lambda text: self.voice.note(f"pp-launch: {text}")
            )
        return self._engines

    @property
    def reached(self) -> list[tuple[str | None, Engine]]:
        return self.engines.reached

    @property
    def several(self) -> bool:
        return self.engines.several

    def close(self) -> bool:
        for s in self.places if self.owns_engines else ():
            if s.engine is not None:
                s.engine.close()
        return self._engines is None or not self._engines.close()

    @property
    def failed(self) -> bool:
        return self.engines.failed

    def find_run(self, run: str) -> tuple[str, list[tuple[Engine, ContainerInfo]]]:
        return self.engines.find_run(run)

    def _on(self, name: str | None) -> str:
        return f" on host {name or 'local'}" if self.several else ""

    # ------------------------------------------------------------------------------------------------ a launch
    def prepare(self, request: LaunchRequest, say: Callable[[str], None]) -> None:
        """The stage image and pp-launch's guard image on every engine (built on first use on DOCKER_HOST's; never
        pulled), and the run's guards coming up while the launch plans (each costs a container's start). Nothing
        is swept: what a launcher leaves, its guard removes (adapters/guard.py)."""
        image = request.chain.image
        if request.hosts:
            across.check_image(_hosts(self.places), image)
            for s in self.places:
                guard_image_check(_engine(s), f"host {s.name}")
        else:
            steps.check_host_paths(request.chain, _local(self.places[0]))
            steps.ensure_image(_engine(self.places[0]), image, say)
        if request.gpu_node is None:
            owner = request.owner or steps.owner_label(request.detach)
            spare = self.spare if len(self.places) == 1 else None
            self.guarding = _Guarding(self.places, request.run_id or "", owner, request.chain.grace, spare)

    def guards(self) -> Mapping[str, RunGuard]:
        return self.guarding.guards if self.guarding is not None else {}

    def reserve(self, request: LaunchRequest, hooks: Hooks) -> AbstractContextManager[GpuLocks]:
        """The engines' GPU locks (app/locks.py), taken when GPUs are picked (`plan`)."""
        g = self.guarding
        sites = [
            LockSite(s.lock_name, s.engine, s.engine_id, None if g is None else functools.partial(g.ref, s.name))
            for s in self.places
            if s.engine is not None
        ]
        owner, attempt = identity.current_owner().label(), request.chain.attempt
        return reserve(sites, request.run_id or "", owner, hooks.say, hooks.stop_pending, attempt)

    def plan(self, request: LaunchRequest, environ: Mapping[str, str], held: GpuLocks | None) -> tuple[ChainPlan, str]:
        return _plan(request, self.places, environ, held)

    def place_stages(
        self, request: LaunchRequest, plan: ChainPlan, held: GpuLocks, say: Callable[[str], None]
    ) -> _Stages:
        """The run's guards taken (started before anything of the run exists on their engine) once no name of the
        plan is taken on any engine; the backend records every id it creates with its engine's guard."""
        guards: dict[str, RunGuard] = {}
        if self.guarding is not None:
            for s in self.places:
                steps.check_names_free(_engine(s), plan, s.name or None, ThreadRuntime())
            guards = self.guarding.take()
        hosts = {s.name: s.host for s in self.places if s.host is not None}
        backend = self.stage_backend(request, plan, held, guards)
        return _Stages(request, plan, backend, guards, held, say, self.watch_gpus, hosts)

    def stage_backend(
        self, request: LaunchRequest, plan: ChainPlan, held: GpuLocks, guards: Mapping[str, RunGuard]
    ) -> StageBackend:
        """Where the attempt's stages run (each engine's backend records every id it creates with its guard)."""
        return _backend(request, plan, self.places, held, guards, self.backend_options)

    def dry_plan(self, request: LaunchRequest, environ: Mapping[str, str], strict: bool) -> Launched:
        """strict (a dry run): a stage image the engine lacks is the error a launch would meet; a Compose file is
        written for wherever it will run, so it checks none."""
        if request.hosts:
            across.check_image(_hosts(self.places), request.chain.image)
        elif strict:
            steps.check_host_paths(request.chain, self.places[0].engine is None or _local(self.places[0]))
        if not request.hosts and strict and (engine := self.places[0].engine) is not None:
            image = request.chain.image
            if image != BUILTIN_IMAGE and engine.image_labels(image) is None:
                raise errors.ImageMissing(
                    f"image {image} is not present on the engine at {engine.address}, and pp-launch never pulls: a "
                    "launch would stop here. Build it or load it ('docker load -i FILE') first."
                )
        plan, note = _plan(request, self.places, environ, None)
        asked_gpus = request.gpu.mode.strip() != "none"
        warning = "no Docker engine answered: GPUs held by running containers were not checked"
        return Launched(plan, note, None, warning if asked_gpus and self.places[0].engine is None else "")

    def finish(self, final: Launched | None) -> None:
        """The launcher lets go of each guard (kept from the first attempt to the last: `down` finds the run between
        them too), then of every engine."""
        try:
            if self.guarding is not None:
                self.guarding.finish(None if final is None else final.outcome)
                if self.stocks_spare and self.guarding.taken:
                    self._stock_spare(final, self.guarding.grace)
        finally:
            self.close()

    def _stock_spare(self, final: Launched | None, grace: float) -> None:
        """A spare guard for this user's next run on this engine (adapters/guard.py): its bring-up then takes a
        running guard instead of starting one. Never on an engine this run lost; a spare that cannot be made is
        no reason to fail a run that ended."""
        (site,) = self.places
        lost = final is not None and final.outcome is not None and final.outcome.reason == "place_lost"
        if site.engine is None or lost:
            return
        with contextlib.suppress(errors.PpLaunchError, OSError):
            guard.stock_spare(site.engine, steps.owner_label(False), grace, os.environ)

    # ------------------------------------------------------------------------------------------------------ ps
    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[StageRow]:
        rows: list[StageRow] = []
        for name, engine in self.reached:
            try:
                found = None if run is None else housekeeping.find_run(engine, run)[0]
            except errors.ConfigError:
                if self.several:
                    continue  # not on this host
                raise
            gpus = housekeeping.local_inventory() if name is None else None  # NVML here: only this engine's GPUs
            where = (name or "local") if self.several else None
            rows += housekeeping.list_stages(engine, found, details=details, gpus=gpus, host=where)
        if ended_too:
            rows += ended_rows({r.run for r in rows}, run, {name for name, _ in self.reached})
            for name, engine in self.reached:  # and each run the engine keeps a record of (any user's)
                where = (name or "local") if self.several else None
                rows += recorded_rows(engine, {r.run for r in rows}, run, where)
        if run is not None and not rows and self.several:
            raise errors.ConfigError(f"no run {housekeeping.safe(run)!r} on any of these hosts")
        return rows

    # ---------------------------------------------------------------------------------------------------- down
    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        if not self.several:
            return self._down_on(self.reached[0][1], run, grace, confirm, None)[1]
        found_any, ok = False, True
        for name, engine in self.reached:
            try:
                found, done = self._down_on(engine, run, grace, confirm, name or "local")
            except errors.ConfigError as exc:
                if run is None or "no run" not in str(exc):
                    raise
                continue
            found_any, ok = found_any or found, ok and done
        if run and not found_any and ok and not self.failed:
            raise errors.ConfigError(f"no run {housekeeping.safe(run)!r} on any of these hosts")
        if run and ok and not self.failed:
            host_state.RunHosts().forget_prefix(run)
        return ok

    def _down_on(
        self, engine: Engine, run: str | None, grace: float, confirm: Confirm | None, host: str | None
    ) -> tuple[bool, bool]:
        """down on one engine: only what a running guard of the run recorded (adapters/guard.py). (whether it had
        anything to stop, whether everything went)."""
        on, say = f" on host {host}" if host else "", self.voice.note
        vouched = self._vouched(engine, run, confirm, on)
        targets, unrecorded, ghosts = self._without_ghosts(engine, vouched, on)
        if not targets and not vouched.guards:
            if ghosts:
                return True, True
            if run is not None and unrecorded:  # asked by name: nothing of it is provably pp-launch's
                say(
                    f"pp-launch: error{on}: nothing stopped: no guard of run {housekeeping.safe(run)} recorded the "
                    f"{count(len(unrecorded), 'container')} carrying its labels, so pp-launch cannot tell "
                    "they are its own (a neighbour's forged labels, or a run whose guard was removed)"
                )
                return True, False
            say(f"pp-launch: nothing to stop{on}: no run with a running guard here")
            return False, True
        names = ", ".join(sorted(c.name for c in targets)) or "none yet (still placing)"
        say(f"pp-launch: stopping {count(len(targets), 'container')}{on}: {names}")
        outcomes = housekeeping.stop_runs(engine, targets, grace, guards=vouched.guards)
        left = [ref for o in outcomes for ref in o.orphans]
        problems = [o.message for o in outcomes if o.exit_code != 0]
        if left or problems:
            by_id = {c.id: c.name for c in targets}
            still = ", ".join(by_id.get(ref, ref[:12]) for ref in left)
            tail = f"; still present: {still}" if still else ""
            say(f"pp-launch: error{on}: {'; '.join(problems)}{tail}")
            return True, False
        say(f"pp-launch: stopped and removed {count(len(targets), 'container')}{on}")
        housekeeping.forget_ended([engine])
        return True, True

    def _without_ghosts(
        self, engine: Engine, vouched: housekeeping.Vouched, on: str
    ) -> tuple[list[ContainerInfo], list[ContainerInfo], list[ContainerInfo]]:
        """What `down` found, less what a crashed engine lists but no longer has (Dead, 'No such container' by its
        id: docs/troubleshooting.md, "Nothing left behind?"), said: (ours, unrecorded, those ghosts)."""
        listed = vouched.ours + vouched.unrecorded
        ghosts = [c for c in listed if c.state == "dead" and engine.inspect(c.id) is None]
        if ghosts:
            self.voice.note(
                f"pp-launch: the engine{on} lists {count(len(ghosts), 'Dead container')} it no longer has "
                f"({', '.join(c.id[:12] for c in ghosts)}: 'No such container'), a listing left by its crash: "
                "nothing to remove; its next restart lists them no more"
            )
        keep = [c for c in vouched.ours if c not in ghosts], [c for c in vouched.unrecorded if c not in ghosts]
        return keep[0], keep[1], ghosts

    def _vouched(self, engine: Engine, run: str | None, confirm: Confirm | None, on: str) -> housekeeping.Vouched:
        """What `down` may stop on one engine (every run's, once confirmed), what it names and leaves alone said."""
        found = engine.containers(labels.run_selector()) if run is None else housekeeping.find_run(engine, run)[1]
        vouched = housekeeping.vouch(engine, found)
        targets = vouched.ours
        if run is None and (targets or vouched.guards) and confirm is not None:
            runs = sorted({c.labels.get(labels.RUN, "?") for c in targets} | {g.run for g in vouched.guards})
            of = f"{count(len(runs), 'run')} ({', '.join(runs)})"
            confirm(f"stop {count(len(targets), 'container')} of {of}, whoever owns them?")
        for c in vouched.unrecorded:
            self.voice.note(
                f"pp-launch: not touched{on}: {housekeeping.describe(c)} carries the run's labels, but no guard "
                "of the run recorded it (not made by that run, or its guard was removed); if it is yours, remove it "
                f"with: docker rm -f {c.id[:12]}"
            )
        return vouched

    # ------------------------------------------------------------------------------------------------------ gc
    def gc(self, dry_run: bool) -> bool:
        anything, ok = False, True
        for name, engine in self.reached:
            on = self._on(name)
            dead, removed = self._collect_dead(engine, on, dry_run)
            ok = ok and removed
            loose = self._name_unrecorded(engine, name, on)
            stale = self._sweep_records(engine, on, dry_run)
            spare = self._end_spare(engine, on, dry_run)
            replaced = self._drop_replaced(engine, on, dry_run)
            anything = anything or dead or loose or stale or spare or replaced
        if not dry_run:
            housekeeping.forget_ended([e for _, e in self.reached])
        if not anything:
            self.voice.note("nothing to collect")
        return ok

    def _collect_dead(self, engine: Engine, on: str, dry_run: bool) -> tuple[bool, bool]:
        """The containers of runs whose guard and launcher are gone, removed: (whether any, whether all went)."""
        dead = housekeeping.left_by_the_dead(engine)
        for c in dead:
            self.voice.answer(
                f"{'would remove' if dry_run else 'removing'} {housekeeping.describe(c)}{on}: its run's "
                "guard and launcher are gone"
            )
        ok = True
        if dead and not dry_run:
            outcomes = housekeeping.stop_runs(engine, dead, 1.0, reason="launcher gone")
            for ref in (r for o in outcomes for r in o.orphans):
                self.voice.note(f"pp-launch: error: could not remove {ref[:12]}{on}")
                ok = False
        return bool(dead), ok

    def _name_unrecorded(self, engine: Engine, name: str | None, on: str) -> bool:
        """Containers with our labels that no guard of their run recorded: named with how to remove them, never
        touched; whether any."""
        loose = housekeeping.unrecorded(engine)
        for c in loose:
            why = "no guard of its run recorded it (not made by that run, or its guard was removed)"
            to = f" -H {name}" if "://" in (name or "") else f" --context {name}" if name else ""
            rm = f"docker{to} rm -f {c.id[:12]}"
            self.voice.answer(
                f"not touched{on}: {housekeeping.describe(c)}: {why}; if it is yours, remove it with: {rm}"
            )
        return bool(loose)

    def _end_spare(self, engine: Engine, on: str, dry_run: bool) -> bool:
        """This user's spare guard on this engine, made ahead for their next run (docs/chain.md, "The spare
        guard"), ended; whether there was one."""
        if not (host_state.default_dir() / "spares").is_dir():
            return False  # a look never makes the state directory
        spares, key = host_state.Spares(), guard.spare_key(os.environ)
        try:
            kept = spares.peek(key)
        except errors.PpLaunchError:
            return False
        if not kept or kept.get("engine") != engine.identity()[0]:
            return False
        what = f"this user's spare guard {kept.get('guard', '')[:12]}{on} (started ahead for their next run)"
        self.voice.answer(f"{'would end' if dry_run else 'ending'} {what}")
        taken = None if dry_run else spares.take(key)
        if taken:
            guard.drop_spare(engine, taken)
        return True

    def _drop_replaced(self, engine: Engine, on: str, dry_run: bool) -> bool:
        """pp-launch's images that a rebuild replaced while a container still used them, removed now that nothing
        does (recorded in this user's state at the rebuild); whether there were any."""
        done = images.drop_replaced(engine, dry_run)
        if not done:
            return False
        words = {"gone": "removed", "in use": "kept (a container still uses it)", "tagged": "left (tagged again since)"}
        for image_id, what in done.items():
            said = words.get(what, what)
            self.voice.answer(f"{said}: pp-launch's replaced image {image_id.removeprefix('sha256:')[:12]}{on}")
        return True

    def _sweep_records(self, engine: Engine, on: str, dry_run: bool) -> bool:
        """The record volumes of runs that are gone, once older than the keep (PP_LAUNCH_RECORD_KEEP); whether any."""
        keep = guard.record_keep()
        stale = guard.stale_records(engine, keep)
        for v in stale:
            self.voice.answer(
                f"{'would remove' if dry_run else 'removing'} the record of run "
                f"{housekeeping.safe(v.labels.get(labels.RUN, '?'))}{on}: the run is gone, its record older than "
                f"{keep:g} s ({guard.RECORD_KEEP_ENV})"
            )
            if not dry_run and engine.remove_volume(v.name):  # False: a container mounted it meanwhile: it stays
                with contextlib.suppress(errors.PpLaunchError):
                    host_state.RunRecords().forget(v.name)
        return bool(stale)

    # ---------------------------------------------------------------------------------------------------- logs
    def logs(self, run: str, view: LogView) -> None:
        try:
            name, found = self.find_run(run)
        except errors.ConfigError:
            if view.follow or not _print_kept(run, view, self.voice):
                raise
            return
        found = [(e, c) for e, c in found if housekeeping.is_stage(c)]  # not its lock or guard
        if view.stages:
            found = [(e, c) for e, c in found if labels.ascii_int(c.labels.get(labels.STAGE, "")) in view.stages]
            if not found:
                raise errors.ConfigError(f"run {name} has no stage {', '.join(map(str, view.stages))}")
        shown, last = _replay(found, view)
        if shown:
            self.voice.answer("\n".join(shown))  # one answer: a long log is not written line by line
        if view.follow:  # then each stage's new lines as they come, from where its replay ended
            _follow(found, view, self.voice, last)

    # ---------------------------------------------------------------------------------------------------- wait
    def wait(self, run: str, until: str, timeout: float | None) -> int:
        try:
            name, every = self.find_run(run)
        except errors.ConfigError:
            if until != "exit":
                raise
            if kept := _kept_ends(run):
                name, codes = kept  # the run is over: its ends as its launcher kept them (this user's)
            elif recorded := self._recorded_ends(run):
                name, codes = recorded  # or as its guards recorded them on the engine (any user's run)
            else:
                raise
            for k, (container, code) in sorted(codes.items()):
                self.voice.answer(f"stage {k} {container} exited {'with an unknown code' if code is None else code}")
            return 0 if all(code is not None for _, code in codes.values()) else errors.EXIT_FAILURE
        found = [(e, c) for e, c in every if housekeeping.is_stage(c)]  # not its lock or guard
        deadline = None if timeout is None else time.monotonic() + timeout
        if until == "announced":
            _wait_announced(name, found, deadline, self.voice)
            return 0
        ended = {}
        for engine in {id(e): e for e, _ in every}.values():
            live = guard.records(engine, name)
            seen = [c for e, c in every if e is engine]
            held = live or guard.dead_records(engine, name, live=set(), seen=seen)  # its guard gone: its record
            ended.update({r.id: r for g in held for r in g.ends})
        return _wait_exit(name, found, deadline, self.voice, ended)

    def _recorded_ends(self, run: str) -> tuple[str, dict[int, tuple[str, int | None]]] | None:
        """An ended run's stages and exit codes from its record volumes (every engine looked at); None when no
        engine has a record of exactly one run by that id or prefix; PpLaunchError (exit 1: cannot tell) when its
        record holds no end."""
        found: dict[str, list[guard.GuardRecord]] = {}
        for _, engine in self.reached:
            for r in guard.dead_records(engine, live=set()):
                if run and r.run.startswith(run):
                    found.setdefault(r.run, []).append(r)
        if len(found) != 1:
            return None
        ((name, recs),) = found.items()
        codes = {
            k: (end.name, end.exit_code)
            for r in recs
            for end in sorted(r.ends, key=lambda e: e.at)  # a later attempt's end after an earlier one's
            if (k := labels.ascii_int(end.stage)) is not None
        }
        if not codes:
            raise errors.PpLaunchError(
                f"run {name} is over, and its record on the engine holds no stage's end: its guard was gone before "
                "its stages ended (someone removed it), so their exit codes cannot be told"
            )
        return name, codes


def _prefix(c: ContainerInfo) -> str:
    return f"[stage {display(c.labels.get(labels.STAGE, '?').encode())}] "


Seen = dict[str, tuple[str, int]]  # a container's last replayed line: its time (instant()) and how many had that time


def _replay(found: list[tuple[Engine, ContainerInfo]], view: LogView) -> tuple[list[str], Seen]:
    """Every stage's lines so far (its last `tail`), merged in the order the engine timed them; and where each
    stage's replay ended, so that a follow goes on from there."""
    rows: list[tuple[str, str, bytes]] = []
    last: Seen = {}
    for engine, c in found:
        for line in engine.log_lines(c.id, since=view.since, tail=view.tail, timestamps=True):
            stamp, _, text = line.partition(b" ")
            at = instant(stamp.decode("ascii", "replace"))
            rows.append((at, _prefix(c), line if view.timestamps else text))
            before = last.get(c.id)
            last[c.id] = (at, before[1] + 1 if before is not None and before[0] == at else 1)
    shown = [head + display(line) for _, head, line in sorted(rows, key=lambda row: row[0])]  # stable sort
    return shown, last


def _unix(at: str) -> int:
    """instant()'s time as the whole Unix second it falls in (the engine's `since`)."""
    try:
        return calendar.timegm(time.strptime(at.partition(".")[0], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0


def _follow(found: list[tuple[Engine, ContainerInfo]], view: LogView, voice: Voice, last: Seen) -> None:
    """Every stage's lines as they come after its replay, until each stage is gone; interrupted (Ctrl-C), every
    stream is closed and every pump joined before the interruption goes on."""
    lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=10000)
    closers: list[Any] = []  # each stream's close, once open: an interrupted follow ends every pump by them

    def pump(engine: Engine, c: ContainerInfo) -> None:
        seen = last.get(c.id)
        # from the second the replay's last line fell in, skipping what was shown; nothing shown: what the view
        # asked for (lines that came since the replay are within its tail)
        since, tail = (_unix(seen[0]), None) if seen is not None else (view.since, view.tail)
        again = 0  # lines of the replay's last instant met again
        try:
            for line in engine.log_lines(
                c.id, follow=True, since=since, tail=tail, timestamps=True, opened=closers.append
            ):
                stamp, _, text = line.partition(b" ")
                if seen is not None:
                    at = instant(stamp.decode("ascii", "replace"))
                    if at < seen[0] or (at == seen[0] and again < seen[1]):
                        again += at == seen[0]
                        continue
                lines.put((_prefix(c), line if view.timestamps else text))
        finally:
            lines.put(None)

    nursery = Nursery("logs -f")
    pumps = [nursery.start(pump, e, c, name=f"logs-{c.name}") for e, c in found]
    try:
        running = len(found)
        while running:
            item = lines.get()
            if item is None:
                running -= 1
                continue
            voice.answer(item[0] + display(item[1]))
    finally:  # every stage ended, or Ctrl-C: each stream closed, the queue drained until each pump ended, joined
        end_pumps(pumps, closers, lines)
        nursery.join(0.0)  # each pump joined by end_pumps; one that is not (30 s) is reported


def end_pumps(pumps: list[threading.Thread], closers: list[Any], lines: queue.Queue[Any]) -> None:
    """Close every log stream (a pump still opening one closes it as soon as it is open) and take what the pumps
    still put, until each has ended; then join them: none is left behind, interrupted or not."""
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in pumps) and time.monotonic() < deadline:
        for close in list(closers):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(queue.Empty):
            lines.get(timeout=0.05)
    for t in pumps:
        t.join(max(0.0, deadline - time.monotonic()))


def instant(stamp: str) -> str:
    """An RFC 3339 time (the engine's, or ours) in a form that sorts as time does: the fraction to 9 digits (Go
    drops trailing zeros)."""
    whole, dot, rest = stamp.rstrip("Z").partition(".")
    return f"{whole}.{(rest if dot else '').ljust(9, '0')[:9]}"


def _print_kept(prefix: str, view: LogView, voice: Voice) -> bool:
    """A run the engine no longer has, from what its launcher kept; False when nothing was kept for it."""
    kept = run_logs.kept_runs(view.log_dir)
    matches = [r for r in kept if r.startswith(prefix)]
    if len(matches) != 1:
        if len(matches) > 1:
            raise errors.ConfigError(f"run {housekeeping.safe(prefix)!r} is ambiguous: {', '.join(matches)}")
        return False
    lines = [k for k in run_logs.read(matches[0], view.log_dir) if not view.stages or k.stage in view.stages]
    by_stage: dict[int, list[run_logs.KeptLine]] = {}
    for k in lines:
        by_stage.setdefault(k.stage, []).append(k)
    tail, shown = view.tail, []
    for stage in sorted(by_stage):
        shown += by_stage[stage] if tail is None else by_stage[stage][len(by_stage[stage]) - tail :] if tail else []
    said = [  # in time order, as the engine's are
        f"[stage {k.stage}] " + (f"{k.time} " if view.timestamps else "") + display(k.text.encode())
        for k in sorted(shown, key=lambda k: instant(k.time))
    ]
    if said:
        voice.answer("\n".join(said))
    return True


def ended_rows(present: set[str], run: str | None, asked: set[str | None]) -> list[StageRow]:
    """A row per stage of each run whose output this user keeps, that no engine here lists and no launcher
    keeps writing: it ended (`ps -a`). Only the runs of the engines asked (`asked`: host names, None for the
    engine DOCKER_HOST or DOCKER_CONTEXT names), as their launchers kept where they ran."""
    now, rows = time.time(), []
    for ended, stages, last in sorted(run_logs.ended(), key=lambda e: -e[2]):  # newest first, as docker ps -a
        if ended in present or (run is not None and not ended.startswith(run)):
            continue
        if not _ran_on(run_logs.place(ended), asked):
            continue
        kept = run_logs.facts(ended)
        for k in sorted(set(stages) | set(kept)):
            fact = kept.get(k, run_logs.StageFacts(k))
            status = "Exited (?)" if fact.exit_code is None else f"Exited ({fact.exit_code})"
            rows.append(
                StageRow(
                    run=ended,
                    stage=k,
                    container=fact.container,
                    id="",
                    image=fact.image,
                    owner="-",
                    owner_status="ended",
                    state="exited",
                    status=status,
                    exit_code=fact.exit_code,
                    age_s=max(0, int(now - last)),
                )
            )
    return rows


def recorded_rows(engine: Engine, present: set[str], run: str | None, host: str | None) -> list[StageRow]:
    """A row per recorded stage end of each run that the engine keeps a record of (its guards' record volume,
    whoever launched it) and that nothing here shows yet: the run is over (`ps -a`), newest first."""
    now, rows = time.time(), list[StageRow]()
    recs = [r for r in guard.dead_records(engine, live=set()) if r.run not in present and r.ends]
    for r in sorted(recs, key=lambda r: -max(e.at for e in r.ends)):
        if run is not None and not r.run.startswith(run):
            continue
        for end in sorted(r.ends, key=lambda e: (labels.ascii_int(e.stage) or 0, e.at)):
            code = end.exit_code
            rows.append(
                StageRow(
                    run=r.run,
                    stage=labels.ascii_int(end.stage),
                    container=end.name,
                    id=end.id[:12],
                    image="-",
                    owner="-",
                    owner_status="ended",
                    state="exited",
                    status=("Exited (?)" if code is None else f"Exited ({code})") + (" (OOM)" if end.oom else ""),
                    exit_code=code,
                    age_s=max(0, int(now - end.at)) if end.at else None,
                    host=host,
                )
            )
    return rows


def _ran_on(place: dict[str, Any] | None, asked: set[str | None]) -> bool:
    """Whether a kept run ran on one of the engines asked (a run that kept no place: shown, as before)."""
    if place is None:
        return True
    if place.get("ray"):
        return False  # a Ray cluster's: `ps --ray` shows those
    hosts = place.get("hosts") or []
    if hosts:
        return bool(set(hosts) & asked)
    default = run_logs.default_engine()
    return None in asked and all(place.get(k) == v for k, v in default.items())


def stage_name(c: ContainerInfo) -> str:
    """A stage as `wait` names it: its index, and its attempt once its run was restarted (--max-restarts)."""
    attempt = labels.ascii_int(c.labels.get(labels.ATTEMPT, ""))
    again = f" (attempt {attempt})" if attempt is not None and attempt > 1 else ""
    return display(c.labels.get(labels.STAGE, "?").encode()) + again


def _wait_announced(run: str, found: list[tuple[Engine, ContainerInfo]], deadline: float | None, voice: Voice) -> None:
    addresses: dict[str, str] = {}
    while True:
        for engine, c in found:
            if c.id in addresses:
                continue
            if engine.inspect(c.id) is None:
                raise errors.PpLaunchError(f"run {run}: stage {stage_name(c)} ({c.name}) ended before it announced")
            addr = housekeeping.announced(engine, c.id)
            if addr is not None:
                addresses[c.id] = addr
                voice.answer(f"stage {stage_name(c)} {c.name} {addr}")
        if len(addresses) == len(found):
            return
        if deadline is not None and time.monotonic() > deadline:
            missing = ", ".join(stage_name(c) for _, c in found if c.id not in addresses)
            raise errors.PpLaunchError(f"run {run}: stages {missing} did not announce within the timeout")
        time.sleep(0.25)


def _kept_ends(run: str) -> tuple[str, dict[int, tuple[str, int | None]]] | None:
    """An ended run's stages and their exit codes, as its launcher kept them here; None when none were kept."""
    matches = [r for r in run_logs.kept_runs() if r.startswith(run)] if run else []
    if len(matches) != 1:
        return None
    facts = run_logs.facts(matches[0])
    if not facts:
        return None
    return matches[0], {k: (f.container, f.exit_code) for k, f in facts.items()}


def _wait_exit(
    run: str,
    found: list[tuple[Engine, ContainerInfo]],
    deadline: float | None,
    voice: Voice,
    ended: Mapping[str, StageEnd] | None = None,
) -> int:
    """Every stage's exit code, as docker wait gives them: the ones still there waited for, the ones gone already
    from the run's guard's record (it saw every end on the engine). 0 once every code is known (docker wait's
    habit, whatever the codes are), 1 when one cannot be told."""
    for end in sorted((ended or {}).values(), key=lambda e: (e.stage, e.at)):
        if end.id not in {c.id for _, c in found}:
            said = "with an unknown code" if end.exit_code is None else str(end.exit_code)
            voice.answer(f"stage {end.stage} {end.name} exited {said}{' (out of memory)' if end.oom else ''}")
    codes: dict[str, int | None] = {}

    def one(engine: Engine, c: ContainerInfo) -> None:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        kept = c.labels.get(labels.OWNER, "").startswith(labels.OWNER_COMPOSE_PREFIX)  # compose keeps its stages
        with contextlib.suppress(errors.PpLaunchError):
            codes[c.id] = engine.wait_removed(c.id, left, "not-running" if kept else "removed")

    with Nursery(f"wait {run}") as waits:  # every wait joined: each ends by the engine's answer or its deadline
        for e, c in found:
            waits.start(one, e, c, name=f"wait-{c.name}")
    worst = 0
    for _, c in found:
        if c.id not in codes:
            raise errors.PpLaunchError(f"run {run}: stage {stage_name(c)} ({c.name}) still runs after the timeout")
        code = codes[c.id]
        seen = (ended or {}).get(c.id)
        if code is None and seen is not None:
            code = seen.exit_code  # gone while we asked: the guard saw its end
        voice.answer(f"stage {stage_name(c)} {c.name} exited {'with an unknown code' if code is None else code}")
        if code is None:
            worst = errors.EXIT_FAILURE
    return worst


# ------------------------------------------------------------------------------------------------ a launch
def _reach(request: LaunchRequest, dry_run: bool, strict: bool = False) -> list[_Engine]:
    """The engines: every --host reached and checked at once (exit 2 naming each that does not answer), or
    DOCKER_HOST's (a dry run tolerates none: a plan needs no engine; strict: but one that runs and refuses this
    user is the error a launch would meet)."""
    if request.hosts:
        return [_Engine(h.name, h.engine, h.name, h.engine_id, h) for h in across.connect_all(request.hosts)]
    if dry_run:
        try:
            return [_Engine("", connect(timeout=5))]
        except errors.EngineUnavailable as exc:
            if strict and "permission denied" in str(exc):
                raise
            return [_Engine("", None)]
    engine = connect()
    return [_Engine("", engine, engine.address)]  # one engine: no lock order to keep, no identity to ask


def _hosts(sites: Sequence[_Engine]) -> list[across.Host]:
    return [s.host for s in sites if s.host is not None]


def _local(site: _Engine) -> bool:
    """The engine runs on this machine (its unix socket): a host path of a stage is a path here."""
    return site.engine is not None and site.engine.url.startswith("unix://")


def _engine(site: _Engine) -> Engine:
    assert site.engine is not None  # only a dry run goes without one
    return site.engine


def _plan(
    request: LaunchRequest,
    sites: Sequence[_Engine],
    environ: Mapping[str, str],
    locks: GpuLocks | None,
) -> tuple[ChainPlan, str]:
    """Each engine's GPUs and holdings, the engines' GPU locks taken before their labels are read (when GPUs are
    picked; released once every stage exists), each stage's host and GPUs, the plan. The request's run id and
    owner are set (app/launch.py)."""
    gpu, run_id, owner = request.gpu, request.run_id or "", request.owner or ""
    host_gpus = _host_gpus(request, sites, environ)
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
    launcher = steps.launcher_label(owner)
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
        frozenset(s.name for s in sites if s.engine is not None and not _local(s)),
    )
    return plan, selection.note


def _host_gpus(
    request: LaunchRequest, sites: Sequence[_Engine], environ: Mapping[str, str]
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
    run_id, owner = request.run_id or "", request.owner or ""
    return across.host_gpus(
        reached, request.chain.image, gpu.attach, run_id, owner, overrides, every, request.chain.attempt
    )


def _locks_needed(mode: str, inventories: list[GpuInventory]) -> bool:
    """The engines' GPU locks matter only when GPUs are picked from what others hold (not none, not all)."""
    return mode.strip() not in ("none", "all") and any(inv.gpus for inv in inventories)


def _backend(
    request: LaunchRequest,
    plan: ChainPlan,
    sites: Sequence[_Engine],
    held: GpuLocks,
    guards: Mapping[str, RunGuard],
    options: Mapping[str, Any],
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
        return guards[""].stage_backend(expected=len(plan.stages), on_all_created=held.check_and_release, **options)
    backends = {s.name: guards[s.name].stage_backend() for s in sites}
    return MultiHostBackend(backends, expected=len(plan.stages), on_all_created=held.check_and_release)


GUARD_SETTLE = 10.0  # seconds a clean end waits for its guards to be gone (they find nothing left, and exit)


class Described(DockerSite):
    """A Docker engine running, at each attempt, the one stage its caller describes (`describe(attempt)`): the
    testing kit's StageContainer, the worker driver's generations. Its GPUs are the caller's own choice."""

    watch_gpus = False

    def __init__(self, describe: Callable[[int], StageSpec], engine: Engine | None = None) -> None:
        """On `engine` (reached and closed by the caller), or DOCKER_HOST's (reached at the launch)."""
        super().__init__(Where(), None, Voice(lambda text: None, lambda text: None))
        self.describe = describe
        if engine is not None:
            self.places, self.owns_engines = [_Engine("", engine, engine.address)], False

    def reach(self, request: LaunchRequest) -> Self:
        """DOCKER_HOST's engine, reached for the launch (unless the caller gave one)."""
        if not self.places:
            self.places = _reach(request, False, False)
        return self

    def plan(self, request: LaunchRequest, environ: Mapping[str, str], held: GpuLocks | None) -> tuple[ChainPlan, str]:
        spec = self.describe(request.chain.attempt)
        return ChainPlan(run_id=request.run_id or "", stages=(spec,), grace=request.chain.grace), ""


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
        guards: Mapping[str, RunGuard],
        held: GpuLocks,
        say: Callable[[str], None],
        watch_gpus: bool = True,
        hosts: Mapping[str, across.Host] | None = None,
    ) -> None:
        self.request, self.plan, self.backend, self.guards, self.held = request, plan, backend, guards, held
        self.say = say
        self.faults = GpuFaults(plan, say)
        self.watches: list[GpuWatch | across.HostGpuWatch] = []  # this machine's NVML, or a watcher on each --host
        self.watch_gpus, self.hosts = watch_gpus, hosts or {}
        self.record = host_state.RunHosts() if request.hosts else None

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
        request, say, on_xid = self.request, self.say, self.faults.on_xid
        run = (self.plan.run_id, request.owner or "", self.plan.attempt)
        for name, uuids in by_host.items():
            if not uuids:
                continue
            if not request.hosts:
                self.watches.append(GpuWatch(uuids, on_xid).start())
            elif (host := self.hosts.get(name)) is not None and (g := self.guards.get(name)) is not None:
                image, attach = request.chain.image, request.gpu.attach
                self.watches.append(across.HostGpuWatch(host, uuids, run, image, attach, g.own, on_xid, say).start())

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
            lost = isinstance(backend, MultiHostBackend) and bool(backend.lost)
            clean = outcome is not None and not (outcome.orphans or lost) and outcome.reason != "detached"
            if self.record is not None and clean:
                self.record.forget(self.plan.run_id)
        if outcome is None:
            return None

        def held() -> bool:  # an engine call per guard: asked only when all else allows a restart
            return all(g.alive() for g in guards.values())

        restartable = clean and may_restart(outcome.reason, bool(outcome.orphans), lost, held)
        return _with_lost_hosts(outcome, self.plan.run_id, backend), restartable, self.faults.seen()


class _Guarding:
    """The run's guards, started on every engine on a thread of their own while the launch plans (or the spare
    guard taken, on one engine). `take()` hands them over (or raises why they could not start); `finish()` lets go
    of them at the run's end."""

    def __init__(
        self, sites: Sequence[_Engine], run_id: str, owner: str, grace: float, spare: guard.Spare | None = None
    ) -> None:
        self.guards: dict[str, RunGuard] = {}
        self.errors: dict[str, BaseException] = {}
        self.order = [s.name for s in sites]
        self.taken = False
        self.grace = grace
        self._threads = Nursery(f"run {run_id}'s guards")
        self._each: dict[str, threading.Thread] = {}
        for s in sites:  # each engine's at once: one engine's lock waits only for that engine's guard
            args = (s, run_id, owner, grace, spare)
            self._each[s.name] = self._threads.start(self._start, *args, name=f"guard-{s.name or 'local'}")

    def _start(self, s: _Engine, run_id: str, owner: str, grace: float, spare: guard.Spare | None) -> None:
        try:
            self.guards[s.name] = RunGuard.start(_engine(s), run_id, owner, grace, s.name or None, spare=spare)
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
