"""One Docker engine or several as housekeeping sees them (app/site.py's `Housekeeping`): what `ps`, `down`, `gc`,
`logs` and `wait` ask of the engines a command names (this one, every --host, or --all-hosts: the hosts recorded for
this machine's runs), each asked in turn, a host that does not answer said and skipped (the command then exits 1).

Only what a running guard of the run recorded is ever stopped (app/housekeeping.py holds the rules); a container
that merely carries a run's labels is named, never touched; an ended run's stages and exit codes come from its
launcher's state or, for any user, from its record on the engine (adapters/guard.py). A launch on the same engines
is app/docker_site.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pp_launch.adapters import guard, host_state, run_logs
from pp_launch.adapters.docker_engine import RECORD_INSIDE, ContainerInfo, Engine, engine_time
from pp_launch.adapters.guard import StageEnd
from pp_launch.adapters.runtime import Nursery
from pp_launch.app import housekeeping
from pp_launch.app.rows import StageRow
from pp_launch.app.site import Confirm, LogView, Voice, Where
from pp_launch.core import errors, labels
from pp_launch.core.lines import count, display
from pp_launch.core.stage_env import NUM_STAGES


class DockerRuns:
    """The engines `where` names, reached as each is asked (for --all-hosts, those recorded for `run` too)."""

    def __init__(self, where: Where, run: str | None, voice: Voice) -> None:
        self.where, self.run, self.voice = where, run, voice
        self._engines: housekeeping.Engines | None = None

    @classmethod
    def for_runs(cls, where: Where, run: str | None, voice: Voice) -> DockerRuns:
        return cls(where, run, voice)

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
        return self._engines is None or not self._engines.close()

    @property
    def failed(self) -> bool:
        return self.engines.failed

    def find_run(self, run: str) -> tuple[str, list[tuple[Engine, ContainerInfo]]]:
        return self.engines.find_run(run)

    def _on(self, name: str | None) -> str:
        return f" on host {name or 'local'}" if self.several else ""

    # ------------------------------------------------------------------------------------------------------ ps
    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[StageRow]:
        rows: list[StageRow] = []
        missing: errors.ConfigError | None = None
        for name, engine in self.reached:
            try:
                found = None if run is None else housekeeping.find_run(engine, run)[0]
            except errors.ConfigError as exc:
                if not (self.several or ended_too):
                    raise
                missing = exc  # not on this host, or (-a) a run that ended
                continue
            gpus = housekeeping.local_inventory() if name is None else None  # NVML here: only this engine's GPUs
            where = (name or "local") if self.several else None
            rows += housekeeping.list_stages(
                engine, found, details=details, gpus=gpus, host=where, faults=self._say_record_fault
            )
        if ended_too:
            rows += self._ended({r.run for r in rows}, run)
        if run is not None and not rows:
            if self.several:
                raise errors.ConfigError(f"no run {housekeeping.safe(run)!r} on any of these hosts")
            if missing is not None:
                raise missing
        return rows

    def _ended(self, live: set[str], run: str | None) -> list[StageRow]:
        """The ended runs (`ps -a`): this user's, as their launchers kept them, then every other run the engines keep
        a record of (any user's); a code a launcher could not keep is the record's."""
        recorded, own, mine = [], _own_records(), []
        for name, engine in self.reached:
            recs, where = guard.dead_records(engine, live=set()), (name or "local") if self.several else None
            recorded += recorded_rows(recs, live, run, where)
            mine += recorded_rows([r for r in recs if r.volume in own], live, run, where)  # never a neighbour's
        kept = ended_rows(live, run, {name for name, _ in self.reached})
        return with_recorded_codes(kept, mine) + [r for r in recorded if r.run not in {k.run for k in kept}]

    # ---------------------------------------------------------------------------------------------------- down
    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        if not self.several:
            try:
                return self._down_on(self.reached[0][1], run, grace, confirm, None)[1]
            except errors.ConfigError:
                if run is None or (over := self._ended_codes(run)) is None:
                    raise
                self.voice.note(
                    f"pp-launch: run {over[0]} has ended: nothing of it is left to stop ('pp-launch wait "
                    f"{over[0]}' gives its stages' exit codes, 'pp-launch ps -a' lists them)"
                )
                return True
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
        stopping, stopped = _down_words(targets, vouched.guards, on)
        say(f"pp-launch: {stopping}")
        outcomes = housekeeping.stop_runs(engine, targets, grace, guards=vouched.guards)
        left = [ref for o in outcomes for ref in o.orphans]
        problems = [o.message for o in outcomes if o.exit_code != 0]
        if left or problems:
            by_id = {c.id: c.name for c in targets}
            still = ", ".join(by_id.get(ref, ref[:12]) for ref in left)
            tail = f"; still present: {still}" if still else ""
            say(f"pp-launch: error{on}: {'; '.join(problems)}{tail}")
            return True, False
        say(f"pp-launch: {stopped}")
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
            anything = anything or dead or loose or stale
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

    def _sweep_records(self, engine: Engine, on: str, dry_run: bool) -> bool:
        """The record volumes of runs that are gone, once older than the keep (PP_LAUNCH_RECORD_KEEP); whether any."""
        keep, count = host_state.record_keep(), host_state.record_count()
        listed = guard.record_volumes(engine)
        past: set[str] = set()
        if host_state.RunRecords().listed():
            with contextlib.suppress(errors.PpLaunchError):
                past = set(host_state.RunRecords().past(keep, count))  # this user's own beyond the newest `count`
        aged = {v.name for v in listed if time.time() - v.created >= keep}
        stale = guard.stale_records(engine, 0.0, listed, only=aged | past)
        for v in stale:
            why = (
                f"its record older than {keep:g} s ({host_state.RECORD_KEEP_ENV})"
                if v.name in aged
                else f"this user keeps the newest {count} records ({host_state.RECORD_COUNT_ENV})"
            )
            self.voice.answer(
                f"{'would remove' if dry_run else 'removing'} the record of run "
                f"{housekeeping.safe(v.labels.get(labels.RUN, '?'))}{on}: the run is gone, {why}"
            )
            if not dry_run and guard.release_record(engine, v.name, 5.0):  # False: a container mounted it meanwhile
                with contextlib.suppress(errors.PpLaunchError):
                    host_state.RunRecords().forget(v.name)
        if not dry_run:
            with contextlib.suppress(errors.PpLaunchError):
                guard.forget_lost_records(engine, host_state.RunRecords(), keep, listed)
        return bool(stale)

    # ---------------------------------------------------------------------------------------------------- logs
    def _say_record_faults(self, engine: Engine, run: str | None) -> None:
        """A live run whose guard could not append to its record: said, so that nobody trusts a silent record."""
        with contextlib.suppress(errors.PpLaunchError):
            for r in guard.records(engine, run):
                if r.fault:
                    self._say_record_fault(r)

    def _say_record_fault(self, r: guard.GuardRecord) -> None:
        self.voice.note(
            f"pp-launch: warning: run {r.run}'s record is incomplete ({r.fault}): once it ends, 'wait', 'ps -a' "
            "and 'logs' cannot tell how its stages ended"
        )

    def logs(self, run: str, view: LogView) -> None:
        try:
            name, found = self.find_run(run)
        except errors.ConfigError:
            if view.follow or not _print_kept(run, view, self.voice, self._kept_by_guards):
                self._not_kept_here(run)
                raise
            return
        for engine in {id(e): e for e, _ in found}.values():
            self._say_record_faults(engine, name)
        found = [(e, c) for e, c in found if housekeeping.is_stage(c)]  # not its lock or guard
        gone = _gone_stages(found)
        if view.stages:
            found = [(e, c) for e, c in found if labels.ascii_int(c.labels.get(labels.STAGE, "")) in view.stages]
            gone = {k: lines for k, lines in gone.items() if k in view.stages}
            if not found and not gone:
                raise errors.ConfigError(f"run {name} has no stage {', '.join(map(str, view.stages))}")
        shown, last = _replay(found, view, gone)
        if shown:
            self.voice.answer("\n".join(shown))  # one answer: a long log is not written line by line
        if view.follow:  # then each stage's new lines as they come, from where its replay ended
            _follow(found, view, self.voice, last)

    def _not_kept_here(self, run: str) -> None:
        """An ended run whose lines this user does not keep, but that an engine keeps a record of (another user's
        run, or one whose launcher's state was cleared): said as that, with what can still be told of it."""
        try:
            ended = self._recorded_ends(run)
        except errors.PpLaunchError:  # a record without ends, an engine that failed: the plain message
            return
        if ended is not None:
            name = housekeeping.safe(ended[0])
            raise errors.ConfigError(
                f"run {name} has ended, and its lines are not kept for this user: pp-launch keeps them for the user "
                "who launched it (in their state, and in the run's record, read for that user alone); "
                f"'pp-launch wait {name}' and 'pp-launch ps -a' tell its stages' exit codes"
            )

    def _kept_by_guards(self, run: str) -> dict[int, list[run_logs.KeptLine]]:
        """Each stage's lines as a detached run's guards kept them in its record after its launcher left (only this
        user's own records), on every engine looked at; {} when there are none."""
        own = {v for v in _own_records() if guard.is_record_of(v, run)}
        out: dict[int, list[run_logs.KeptLine]] = {}
        for _, engine in self.reached if own else ():
            with contextlib.suppress(errors.PpLaunchError):  # an engine that fails: the launcher's lines still
                for k, lines in guard.kept_lines(engine, run, own).items():
                    out.setdefault(k, []).extend(_parsed(k, lines))
        return out

    # ---------------------------------------------------------------------------------------------------- wait
    def wait(self, run: str, until: str, timeout: float | None) -> int:
        try:
            name, every = self.find_run(run)
        except errors.ConfigError:
            if until != "exit" or (over := self._ended_codes(run)) is None:
                raise
            name, codes = over
            for k, (container, code) in sorted(codes.items()):
                self.voice.answer(f"stage {k} {container} exited {'with an unknown code' if code is None else code}")
            self._say_ended_by(name)
            return 0 if all(code is not None for _, code in codes.values()) else errors.EXIT_FAILURE
        found = [(e, c) for e, c in every if housekeeping.is_stage(c)]  # not its lock or guard
        for engine in {id(e): e for e, _ in every}.values():
            self._say_record_faults(engine, name)
        deadline = None if timeout is None else time.monotonic() + timeout
        if until == "announced":
            return _wait_announced(name, found, deadline, self.voice, lambda: _recorded_ends(name, every))
        code = _wait_exit(name, found, deadline, self.voice, _recorded_ends(name, every))
        self._say_ended_by(name)
        return code

    def _say_ended_by(self, run: str) -> None:
        """A detached run its guard ended as one (a stage ended): which stage, and how, from the run's record."""
        for _, engine in self.reached:
            with contextlib.suppress(errors.PpLaunchError):
                for r in guard.dead_records(engine, run=run, live=set()):
                    if r.run == run and r.ended_by:
                        self.voice.note(f"pp-launch: run {run} was ended as one by {r.ended_by}")
                        return

    def _ended_codes(self, run: str) -> tuple[str, dict[int, tuple[str, int | None]]] | None:
        """An ended run's stages and codes: as its launcher kept them (this user's), each code it could not keep (it
        left first: a detached run) the record's; else as its guards recorded them on the engine (any user's run)."""
        kept = _kept_ends(run)
        if kept is None:
            return self._recorded_ends(run)
        name, codes = kept
        if None in (code for _, code in codes.values()):
            with contextlib.suppress(errors.PpLaunchError):
                _, recorded = self._recorded_ends(name, only=_own_records()) or (name, {})
                codes.update({k: end for k, end in recorded.items() if end[1] is not None})
        return name, codes

    def _recorded_ends(
        self, run: str, only: set[str] | None = None
    ) -> tuple[str, dict[int, tuple[str, int | None]]] | None:
        """An ended run's stages and exit codes from its record volumes (every engine looked at; `only`: these
        volumes); None when no engine has a record of exactly one run by that id or prefix; PpLaunchError (exit 1:
        cannot tell) when its record holds no end."""
        found: dict[str, list[guard.GuardRecord]] = {}
        for _, engine in self.reached:
            for r in guard.dead_records(engine, live=set()):
                if run and r.run.startswith(run) and (only is None or r.volume in only):
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


def _gone_stages(found: list[tuple[Engine, ContainerInfo]]) -> dict[int, list[run_logs.KeptLine]]:
    """A detached run's stages that are gone while others run (one crashed): their lines as the run's guard kept
    them in its record, read where a stage that is still there on the same engine mounts it (`docker cp`: no helper
    to start). Only a record this user's runs made (a neighbour can make a volume under a run's record name)."""
    own = _own_records()
    out: dict[int, list[run_logs.KeptLine]] = {}
    there = {labels.ascii_int(c.labels.get(labels.STAGE, "")) for _, c in found}
    readers = {id(e): (e, c) for e, c in found if c.labels.get(labels.OWNER) == labels.OWNER_DETACHED and c.record}
    if not own or not readers:
        return out
    stages = _num_stages(*next(iter(readers.values())))
    if stages and there >= set(range(stages)):
        return out  # every stage is there: the engine has their lines
    for engine, c in readers.values():
        if c.record not in own:
            continue
        with contextlib.suppress(errors.PpLaunchError):  # not read: the stages that are there still are
            files = engine.read_files(c.id, RECORD_INSIDE, limit=64 * 1024 * 1024)
            kept = guard.stage_files((name, data.splitlines()) for name, data in files.items())
            out.update({k: _parsed(k, lines) for k, lines in kept.items() if k not in there})
    return out


def _parsed(stage: int, lines: list[bytes]) -> list[run_logs.KeptLine]:
    return [run_logs.parse(stage, raw.decode("utf-8", "replace")) for raw in lines]


def _num_stages(engine: Engine, c: ContainerInfo) -> int:
    """The run's number of stages, as its stage's environment says (NUM_STAGES); 0 when it does not say."""
    env = ((engine.inspect(c.id) or {}).get("Config") or {}).get("Env") or []
    told = [v.removeprefix(f"{NUM_STAGES}=") for v in env if isinstance(v, str) and v.startswith(f"{NUM_STAGES}=")]
    return labels.ascii_int(told[0]) or 0 if told else 0


def _kept_rows(gone: Mapping[int, list[run_logs.KeptLine]], view: LogView) -> list[tuple[str, str, bytes]]:
    """Kept lines as _replay's rows: since `since`, each stage's last `tail`."""
    rows = []
    for k, kept in gone.items():
        lines = [line for line in kept if view.since is None or int(engine_time(line.time)) >= view.since]
        for line in lines if view.tail is None else lines[len(lines) - view.tail :] if view.tail else []:
            text = f"{line.time} {line.text}" if view.timestamps else line.text
            rows.append((instant(line.time), f"[stage {k}] ", text.encode()))
    return rows


def _replay(
    found: list[tuple[Engine, ContainerInfo]], view: LogView, gone: Mapping[int, list[run_logs.KeptLine]]
) -> tuple[list[str], Seen]:
    """Every stage's lines so far (its last `tail`), with the kept lines of the stages that are `gone`, merged in
    the order the engine timed them; and where each stage's replay ended, so that a follow goes on from there."""
    rows: list[tuple[str, str, bytes]] = _kept_rows(gone, view)
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


def _follow(found: list[tuple[Engine, ContainerInfo]], view: LogView, voice: Voice, last: Seen) -> None:
    """Every stage's lines as they come after its replay, until each stage is gone; interrupted (Ctrl-C), every
    stream is closed and every pump joined before the interruption goes on."""
    lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=10000)
    closers: list[Any] = []  # each stream's close, once open: an interrupted follow ends every pump by them

    def pump(engine: Engine, c: ContainerInfo) -> None:
        seen = last.get(c.id)
        # from the second the replay's last line fell in, skipping what was shown; nothing shown: what the view
        # asked for (lines that came since the replay are within its tail)
        since, tail = (int(engine_time(seen[0])), None) if seen is not None else (view.since, view.tail)
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


def _print_kept(
    prefix: str, view: LogView, voice: Voice, by_guards: Callable[[str], dict[int, list[run_logs.KeptLine]]]
) -> bool:
    """A run the engine no longer has, from what its launcher kept, each stage's lines as its guard kept them in
    the run's record instead where it did (a detached run: its launcher left at the hand-over, before any stage's
    end; the record is not looked at when the launcher kept every stage's end); False when nothing was kept."""
    kept = run_logs.kept_runs(view.log_dir)
    matches = [r for r in kept if r.startswith(prefix)]
    if len(matches) != 1:
        if len(matches) > 1:
            raise errors.ConfigError(f"run {housekeeping.safe(prefix)!r} is ambiguous: {', '.join(matches)}")
        return False
    lines = [k for k in _kept_of(matches[0], view, by_guards) if not view.stages or k.stage in view.stages]
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


def _kept_of(
    run: str, view: LogView, by_guards: Callable[[str], dict[int, list[run_logs.KeptLine]]]
) -> list[run_logs.KeptLine]:
    """An ended run's kept lines: each stage's from the run's record where its guard kept them, else from what its
    launcher kept. The record is looked at only when the launcher left before a stage's end (detached)."""
    ends = run_logs.facts(run, view.log_dir).values()
    recorded = by_guards(run) if any(f.exit_code is None for f in ends) else {}
    every = [k for k in run_logs.read(run, view.log_dir) if k.stage not in recorded]
    return every + [k for ks in recorded.values() for k in ks]


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
            row = StageRow.exited(ended, k, fact.container, "", fact.exit_code, now - last, image=fact.image)
            rows.append(dataclasses.replace(row, state="created", status="Not started") if fact.refused else row)
    return rows


def with_recorded_codes(kept: list[StageRow], recorded: list[StageRow]) -> list[StageRow]:
    """The rows this user's launchers kept, each code they could not keep (the launcher left before its stage ended:
    a detached run) taken from the engine's record of the same run and stage, its last end there; and each
    container's id, which a launcher keeps no copy of, from the record's end of that very container."""
    ends = {(r.run, r.stage): r for r in recorded if r.exit_code is not None}
    ids = {(r.run, r.stage, r.container): r.id for r in recorded if r.id}
    out = []
    for row in kept:
        if row.exit_code is None and (end := ends.get((row.run, row.stage))) is not None:
            row = dataclasses.replace(row, status=end.status, exit_code=end.exit_code)
        if not row.id and (ref := ids.get((row.run, row.stage, row.container))):
            row = dataclasses.replace(row, id=ref)
        out.append(row)
    return out


def _own_records() -> set[str]:
    """The record volumes this user's runs made (their private state): the only ones that may tell this user's own
    runs' codes, since a neighbour can make a volume under a run's record name (none when the state cannot be read)."""
    with contextlib.suppress(errors.PpLaunchError):
        return set(host_state.RunRecords().every())
    return set()


def recorded_rows(
    records: list[guard.GuardRecord], present: set[str], run: str | None, host: str | None
) -> list[StageRow]:
    """A row per recorded stage end of each run that an engine keeps a record of (`records`: its guards' record
    volumes, whoever launched it) and that nothing here shows yet: the run is over (`ps -a`), newest first."""
    now, rows = time.time(), list[StageRow]()
    recs = [r for r in records if r.run not in present and r.ends]
    for r in sorted(recs, key=lambda r: -max(e.at for e in r.ends)):
        if run is not None and not r.run.startswith(run):
            continue
        for end in sorted(r.ends, key=lambda e: (labels.ascii_int(e.stage) or 0, e.at)):
            age = now - end.at if end.at else None
            stage = labels.ascii_int(end.stage)
            rows.append(StageRow.exited(r.run, stage, end.name, end.id[:12], end.exit_code, age, host, oom=end.oom))
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


def _recorded_ends(run: str, every: list[tuple[Engine, ContainerInfo]]) -> dict[str, StageEnd]:
    """Every end of a stage of `run` its guards recorded (by container id), on each engine it has containers on: from
    the live guard's output, or its record once the guard is gone. Only stages' (a --host's GPU watcher is not one)."""
    ended: dict[str, StageEnd] = {}
    for engine in {id(e): e for e, _ in every}.values():
        live = guard.records(engine, run)
        seen = [c for e, c in every if e is engine]
        held = live or guard.dead_records(engine, run, live=set(), seen=seen)  # its guard gone: its record
        ended.update({r.id: r for g in held for r in g.ends if labels.ascii_int(r.stage) is not None})
    return ended


def _wait_announced(
    run: str,
    found: list[tuple[Engine, ContainerInfo]],
    deadline: float | None,
    voice: Voice,
    recorded: Callable[[], Mapping[str, StageEnd]],
) -> int:
    """Each stage's addresses once it announced (`stage K <container> <addresses>`); 0 once every stage of the run
    did. A stage that ended first (before this wait looked, or while it waited: the run's guard recorded its end) is
    said on stderr with its code, and the answer is 1: the run can no longer be all up."""
    here = {c.id for _, c in found}
    gone = {e.id: e for e in _ended_stages(recorded(), found)}
    addresses: dict[str, str] = {}
    while True:
        for engine, c in found:
            if c.id in addresses or c.id in gone:
                continue
            if engine.inspect(c.id) is None:
                end = recorded().get(c.id)
                if end is None:
                    raise errors.PpLaunchError(
                        f"run {run}: stage {stage_name(c)} ({c.name}) is gone before its address could be read"
                    )
                gone[c.id] = end
                continue
            addr = housekeeping.announced(engine, c.id)
            if addr is not None:
                addresses[c.id] = addr
                voice.answer(f"stage {stage_name(c)} {c.name} {addr}")
        if len(addresses) + len(gone.keys() & here) == len(found):
            return _said_gone(run, list(gone.values()), voice)
        if deadline is not None and time.monotonic() > deadline:
            missing = ", ".join(stage_name(c) for _, c in found if c.id not in addresses and c.id not in gone)
            raise errors.PpLaunchError(f"run {run}: stages {missing} did not announce within the timeout")
        time.sleep(0.25)


def _ended_stages(ends: Mapping[str, StageEnd], found: list[tuple[Engine, ContainerInfo]]) -> list[StageEnd]:
    """The last recorded end of each stage none of whose containers is still there (an earlier attempt's end, of a
    stage restarted since, is not one)."""
    there = {c.labels.get(labels.STAGE, "") for _, c in found}
    last: dict[str, StageEnd] = {}
    for end in ends.values():
        prior = last.get(end.stage)
        if end.stage not in there and (prior is None or (end.attempt, end.at) >= (prior.attempt, prior.at)):
            last[end.stage] = end
    return list(last.values())


def _said_gone(run: str, gone: list[StageEnd], voice: Voice) -> int:
    """Each stage that ended before every stage announced, said on stderr with its code; 1 when there is one."""
    for end in sorted(gone, key=lambda e: (labels.ascii_int(e.stage) or 0, e.stage)):
        said = "with an unknown code" if end.exit_code is None else str(end.exit_code)
        voice.note(
            f"pp-launch: run {run}: stage {end.stage} ({end.name}) has ended: exited {said}"
            f"{' (out of memory)' if end.oom else ''}; 'pp-launch wait {run}' gives every stage's code"
        )
    return errors.EXIT_FAILURE if gone else 0


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


def _down_words(targets: list[ContainerInfo], guards: tuple[guard.GuardRecord, ...], on: str) -> tuple[str, str]:
    """What `down` says it is stopping, and what it stopped: the containers, of how many runs, and the runs still
    placing (a guard and no stage yet), stopped through their guards."""
    names = ", ".join(sorted(c.name for c in targets)) or "none yet (still placing)"
    staged = {c.labels.get(labels.RUN, "") for c in targets}
    placing = sorted({g.run for g in guards} - staged)
    told = f"; and {count(len(placing), 'run')} still placing, through its guard: {', '.join(placing)}"
    stopping = f"stopping {count(len(targets), 'container')}{on}: {names}" + (told if placing and targets else "")
    runs = f" of {count(len(staged), 'run')}" if targets else ""
    placed = f"; stopped {count(len(placing), 'run')} still placing ({', '.join(placing)})" if placing else ""
    return stopping, f"stopped and removed {count(len(targets), 'container')}{runs}{on}{placed}"
