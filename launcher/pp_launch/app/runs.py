"""The runs that exist, wherever they run: `ps`, `down`, `gc`, `logs` and `wait` as use cases (docs/architecture.md).

A command names where to look (`Where`: this engine, some Docker hosts, every host of this machine's runs, or a Ray
cluster); `site()` opens the place that answers for it, a `Site`, and each use case asks the site alone:
- `DockerSite`: one Docker engine or several (app/housekeeping.py holds the rules: only what a running guard of the
  run recorded is ever stopped; a container that merely carries the run's labels is named, never touched);
- `RaySite`: the detached runs on a Ray cluster, as their node agents answer for them (app/on_ray.py).
What a use case finds comes back as data (rows, exit codes); what it says while it works goes to its `Voice`: the
command's answer on one side, notes and errors on the other. Nothing here prints, or knows the terminal.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pp_launch.adapters import host_state, run_logs
from pp_launch.adapters.docker_engine import ContainerInfo, Engine
from pp_launch.app import housekeeping
from pp_launch.core import errors, labels
from pp_launch.core.lines import count, display


@dataclass(frozen=True)
class Voice:
    """Where a use case speaks: `answer` takes the command's own lines (stdout; one call may carry several),
    `note` its notes and errors (stderr)."""

    answer: Callable[[str], None]
    note: Callable[[str], None]


@dataclass(frozen=True)
class Where:
    """Where a command looks: `hosts` (Docker engines by name, none: this one), `all_hosts` (this engine and every
    host recorded for this machine's runs, or for the run named), or `ray` (a Ray cluster's address). `quiet_ray`:
    called before the first Ray call (Ray's own code writes to this process's stderr)."""

    hosts: tuple[str, ...] = ()
    all_hosts: bool = False
    ray: str | None = None
    quiet_ray: Callable[[], object] = field(default=lambda: None, compare=False)


@dataclass(frozen=True)
class LogView:
    """Which of a run's lines `logs` shows: stages (none: all), since (a Unix time), tail (each stage's last N),
    timestamps (each line with its time), follow (until every stage is gone), log_dir (where they were kept)."""

    stages: tuple[int, ...] = ()
    since: int | None = None
    tail: int | None = None
    timestamps: bool = False
    follow: bool = False
    log_dir: str | None = None


Confirm = Callable[[str], None]  # asked "stop N containers of M runs (...), whoever owns them?"; raises to refuse


class Site(Protocol):
    """One kind of place runs live on, as the housekeeping use cases ask it."""

    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[dict[str, Any]]:
        """A row per stage (and lock) of every run, or of `run`; details: addresses and uptimes too."""
        ...

    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        """Stop `run` (None: every run, after `confirm`); False when something stays or failed."""
        ...

    def gc(self, dry_run: bool) -> bool:
        """Remove (or name) what runs left behind that nothing else will; False when something failed."""
        ...

    def logs(self, run: str, view: LogView) -> None: ...

    def wait(self, run: str, until: str, timeout: float | None) -> int:
        """Until every stage announced ("announced") or is gone ("exit"); the exit code."""
        ...

    def close(self) -> bool:
        """Every connection closed; False when a place did not answer on the way (the command exits 1)."""
        ...


def site(where: Where, run: str | None, voice: Voice) -> Site:
    """The place `where` names, opened (for --all-hosts, the hosts recorded for `run` too)."""
    if where.ray is not None:
        return RaySite(where, voice)
    return DockerSite(where, run, voice)


Opener = Callable[[Where, "str | None", Voice], Site]  # how a use case opens its site: `site`, or a test's own


def _each(
    where: Where, run: str | None, voice: Voice, act: Callable[[Site], Any], opener: Opener | None = None
) -> tuple[Any, bool]:
    """`act` on the site, closed whatever happens; (what it gave, whether every place answered)."""
    place = (opener or site)(where, run, voice)
    try:
        got = act(place)
    finally:
        answered = place.close()
    return got, answered


def stages(
    where: Where, run: str | None, details: bool, ended_too: bool, voice: Voice, opener: Opener | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """`ps`: the rows, and whether every place answered."""
    return _each(where, run, voice, lambda s: s.stages(run, details, ended_too), opener)


def down(
    where: Where,
    runs: Sequence[str],
    grace: float,
    confirm: Confirm | None,
    voice: Voice,
    opener: Opener | None = None,
) -> bool:
    """`down RUN...` (none: every run, after `confirm`): each run stopped in turn, every one tried even when one
    fails (a lone run's error is raised as it is). False when any failed."""
    ok = True
    for run in runs or (None,):

        def act(place: Site, run: str | None = run) -> bool:
            return place.down(run, grace, confirm)

        try:
            done, answered = _each(where, run, voice, act, opener)
        except errors.PpLaunchError as exc:
            if len(runs) <= 1:
                raise
            voice.note(f"pp-launch: error: {exc}")
            done, answered = False, True
        ok = ok and bool(done) and answered
    return ok


def gc(where: Where, dry_run: bool, voice: Voice, opener: Opener | None = None) -> bool:
    done, answered = _each(where, None, voice, lambda s: s.gc(dry_run), opener)
    return bool(done) and answered


def logs(where: Where, run: str, view: LogView, voice: Voice, opener: Opener | None = None) -> bool:
    _, answered = _each(where, run, voice, lambda s: s.logs(run, view), opener)
    return answered


def wait(where: Where, run: str, until: str, timeout: float | None, voice: Voice, opener: Opener | None = None) -> int:
    """The exit code: the wait's own, at least 1 when a place did not answer."""
    code, answered = _each(where, run, voice, lambda s: s.wait(run, until, timeout), opener)
    return int(code) if answered else max(int(code), errors.EXIT_FAILURE)


# -------------------------------------------------------------------------------------------------- Docker engines
class DockerSite:
    """One Docker engine, or several (--host, --all-hosts): each asked in turn, a host that does not answer said
    and skipped (the command then exits 1)."""

    def __init__(self, where: Where, run: str | None, voice: Voice) -> None:
        self.engines = housekeeping.Engines(
            where.hosts, where.all_hosts, run, say=lambda text: voice.note(f"pp-launch: {text}")
        )
        self.reached, self.several, self.voice = self.engines.reached, self.engines.several, voice

    def close(self) -> bool:
        return not self.engines.close()

    @property
    def failed(self) -> bool:
        return self.engines.failed

    def find_run(self, run: str) -> tuple[str, list[tuple[Engine, ContainerInfo]]]:
        return self.engines.find_run(run)

    def _on(self, name: str | None) -> str:
        return f" on host {name or 'local'}" if self.several else ""

    # ------------------------------------------------------------------------------------------------------ ps
    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
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
            rows += ended_rows({r["run"] for r in rows}, run)
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
        found = engine.containers(labels.run_selector()) if run is None else housekeeping.find_run(engine, run)[1]
        vouched = housekeeping.vouch(engine, found)
        targets = list(vouched.ours)
        if run is None and (targets or vouched.guards) and confirm is not None:
            runs = sorted({c.labels.get(labels.RUN, "?") for c in targets} | {g.run for g in vouched.guards})
            confirm(
                f"stop {count(len(targets), 'container')} of {len(runs)} runs ({', '.join(runs)}), whoever owns them?"
            )
        for c in vouched.unrecorded:
            say(
                f"pp-launch: not touched{on}: {housekeeping.describe(c)} carries the run's labels, but no guard "
                "of the run recorded it (not made by that run, or its guard was removed)"
            )
        if not targets and not vouched.guards:
            say(f"pp-launch: nothing to stop{on} (no pp-launch run that a guard vouches for)")
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

    # ------------------------------------------------------------------------------------------------------ gc
    def gc(self, dry_run: bool) -> bool:
        anything, ok = False, True
        for name, engine in self.reached:
            on = self._on(name)
            dead = housekeeping.left_by_the_dead(engine)
            for c in dead:
                self.voice.answer(
                    f"{'would remove' if dry_run else 'removing'} {housekeeping.describe(c)}{on}: its run's "
                    "guard and launcher are gone"
                )
            if dead and not dry_run:
                outcomes = housekeeping.stop_runs(engine, dead, 1.0, reason="launcher gone")
                for ref in (r for o in outcomes for r in o.orphans):
                    self.voice.note(f"pp-launch: error: could not remove {ref[:12]}{on}")
                    ok = False
            loose = housekeeping.unrecorded(engine)
            for c in loose:
                why = "no guard of its run recorded it (not made by that run, or its guard was removed)"
                self.voice.answer(
                    f"not touched{on}: {housekeeping.describe(c)}: {why}; remove it yourself if it is yours"
                )
            anything = anything or bool(dead) or bool(loose)
        if not dry_run:
            housekeeping.forget_ended([e for _, e in self.reached])
        if not anything:
            self.voice.note("nothing to collect")
        return ok

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
        if view.follow:
            _follow(found, view, self.voice)
            return
        rows = []  # every stage's lines (its last `tail`), merged in the order the engine timed them
        for engine, c in found:
            for line in engine.log_lines(c.id, since=view.since, tail=view.tail, timestamps=True):
                stamp, _, text = line.partition(b" ")
                rows.append((instant(stamp.decode("ascii", "replace")), _prefix(c), line if view.timestamps else text))
        shown = [head + display(line) for _, head, line in sorted(rows, key=lambda row: row[0])]  # stable sort
        if shown:
            self.voice.answer("\n".join(shown))  # one answer: a long log is not written line by line

    # ---------------------------------------------------------------------------------------------------- wait
    def wait(self, run: str, until: str, timeout: float | None) -> int:
        name, every = self.find_run(run)
        found = [(e, c) for e, c in every if housekeeping.is_stage(c)]  # not its lock or guard
        deadline = None if timeout is None else time.monotonic() + timeout
        if until == "announced":
            _wait_announced(name, found, deadline, self.voice)
            return 0
        return _wait_exit(name, found, deadline, self.voice)


def _prefix(c: ContainerInfo) -> str:
    return f"[stage {display(c.labels.get(labels.STAGE, '?').encode())}] "


def _follow(found: list[tuple[Engine, ContainerInfo]], view: LogView, voice: Voice) -> None:
    """Every stage's lines as they come, until each stage is gone; interrupted (Ctrl-C), every stream is closed and
    every pump joined before the interruption goes on."""
    lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=10000)
    closers: list[Any] = []  # each stream's close, once open: an interrupted follow ends every pump by them

    def pump(engine: Engine, c: ContainerInfo) -> None:
        try:
            for line in engine.log_lines(
                c.id, follow=True, since=view.since, tail=view.tail, timestamps=view.timestamps, opened=closers.append
            ):
                lines.put((_prefix(c), line))
        finally:
            lines.put(None)

    pumps = [threading.Thread(target=pump, args=(e, c), daemon=True, name=f"logs-{c.name}") for e, c in found]
    for t in pumps:
        t.start()
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


def ended_rows(present: set[str], run: str | None) -> list[dict[str, Any]]:
    """A row per stage of each run whose output this user keeps, that no engine here lists and no launcher
    keeps writing: it ended (`ps -a`)."""
    now, rows = time.time(), []
    for ended, stages, last in run_logs.ended():
        if ended in present or (run is not None and not ended.startswith(run)):
            continue
        for k in stages:
            rows.append(
                {
                    "run": ended,
                    "stage": k,
                    "role": "stage",
                    "container": "-",
                    "id": "",
                    "image": "-",
                    "gpus": [],
                    "owner": "-",
                    "owner_status": "ended: output kept ('pp-launch logs RUN')",
                    "state": "ended",
                    "age_s": max(0, int(now - last)),
                    "address": None,
                    "uptime_s": None,
                }
            )
    return rows


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


def _wait_exit(run: str, found: list[tuple[Engine, ContainerInfo]], deadline: float | None, voice: Voice) -> int:
    codes: dict[str, int | None] = {}

    def one(engine: Engine, c: ContainerInfo) -> None:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        kept = c.labels.get(labels.OWNER, "").startswith(labels.OWNER_COMPOSE_PREFIX)  # compose keeps its stages
        with contextlib.suppress(errors.PpLaunchError):
            codes[c.id] = engine.wait_removed(c.id, left, "not-running" if kept else "removed")

    threads = [threading.Thread(target=one, args=(e, c), daemon=True) for e, c in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worst = 0
    for _, c in found:
        if c.id not in codes:
            raise errors.PpLaunchError(f"run {run}: stage {stage_name(c)} ({c.name}) still runs after the timeout")
        code = codes[c.id]
        voice.answer(f"stage {stage_name(c)} {c.name} exited {'with an unknown code' if code is None else code}")
        if code != 0 and worst == 0:
            worst = errors.EXIT_FAILURE
    return worst


# ------------------------------------------------------------------------------------------------------ Ray
class RaySite:
    """The detached runs on a Ray cluster, as their node agents answer for them (app/on_ray.py connects for each
    question). A foreground chain on Ray is its launcher's alone: it is not listed here."""

    def __init__(self, where: Where, voice: Voice) -> None:
        assert where.ray is not None
        self.address, self.voice = where.ray, voice
        where.quiet_ray()

    def close(self) -> bool:
        return True

    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[dict[str, Any]]:
        from pp_launch.app import on_ray

        return on_ray.runs(self.address, run)

    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        from pp_launch.app import on_ray

        if run is None:
            raise errors.UsageError("name the runs to stop on a Ray cluster ('pp-launch ps --ray ADDRESS -q')")
        run_id, removed = on_ray.down(self.address, run, grace)
        self.voice.note(
            f"pp-launch: run {run_id} on the Ray cluster: {count(len(removed), 'container')} removed, its "
            "actors and GPUs released"
        )
        return True

    def gc(self, dry_run: bool) -> bool:
        from pp_launch.app import on_ray

        said = on_ray.gc(self.address, dry_run)
        for line in said:
            self.voice.answer(f"{'would release' if dry_run else 'released'} {line}")
        if not said:
            self.voice.note("nothing to collect")
        return True

    def logs(self, run: str, view: LogView) -> None:
        """Each stage's last lines as its node's agent kept them (up to 2000 a stage); with follow, then each new
        line until every stage is gone (timestamps and since are the engines' alone)."""
        from pp_launch.app import on_ray

        def show(lines: list[tuple[int, str, str]]) -> None:
            for stage, stream, text in lines:
                if not view.stages or stage in view.stages:
                    (self.voice.note if stream == "stderr" else self.voice.answer)(f"[stage {stage}] {text}")

        _, lines = on_ray.logs(self.address, run, view.tail or 0, show if view.follow else None)
        show(lines)

    def wait(self, run: str, until: str, timeout: float | None) -> int:
        """A detached run on Ray is up once every stage announced, so "announced" holds at once; "exit" waits for
        every container to be gone and says each stage's exit code as its node's agent saw it."""
        from pp_launch.app import on_ray

        if until == "announced":
            name, _, _ = on_ray.wait_gone(self.address, run, 0.0)
            self.voice.answer(f"run {name}: up (a detached run on Ray is handed over once every stage announced)")
            return 0
        name, left, exits = on_ray.wait_gone(self.address, run, timeout)
        if left:
            self.voice.note(f"pp-launch: error: run {name}: {count(left, 'container')} still there after {timeout:g} s")
            return errors.EXIT_FAILURE
        for stage, (container, code) in exits.items():
            self.voice.answer(f"stage {stage} {container} exited {'with an unknown code' if code is None else code}")
        self.voice.answer(f"run {name}: every stage is gone ('pp-launch gc --ray' releases its GPUs)")
        return errors.EXIT_FAILURE if any(code != 0 for _, code in exits.values()) else 0
