"""Housekeeping: `ps` (what exists and whose it is), `gc` (what no guard vouches for, named), `down`."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pp_launch.adapters import guard, host_state, identity
from pp_launch.adapters.docker_engine import ContainerInfo, DockerStageBackend, Engine, connect, engine_time
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.adapters.runtime import ThreadRuntime, map_all
from pp_launch.app.locks import LOCK_NAME
from pp_launch.app.rows import StageRow
from pp_launch.core import errors, hosts, labels
from pp_launch.core.announce import AnnouncementError, parse_line
from pp_launch.core.chain.scope import ChainOutcome, ChainScope, Found, QuietReporter
from pp_launch.core.gpu.inventory import Gpu, GpuInventory
from pp_launch.core.lines import display


@dataclass(frozen=True)
class Vouched:
    """Containers carrying pp-launch labels, split by what vouches for them: the record of a running guard of
    their own run (adapters/guard.py), or, for a Compose project, Compose's own project label. Only `ours` is
    ever signalled or removed; `unrecorded` (a forged label, a container whose guard was removed) never is."""

    ours: tuple[ContainerInfo, ...]
    unrecorded: tuple[ContainerInfo, ...]
    guards: tuple[guard.GuardRecord, ...]
    guardless: tuple[guard.GuardRecord, ...] = ()  # runs whose guard is gone, vouched by their record volume


def vouch(engine: Engine, found: list[ContainerInfo], mine: dict[str, set[str]] | None = None) -> Vouched:
    """mine: this user's own record of the ids its runs created (host_state.RunIds), by run; None reads it.
    A run no running guard holds (someone removed it) is vouched by its record volume, for any user: a container
    there is the run's when the record names its id and it mounts that very volume (which no one can add to a
    container after its create)."""
    runs = {c.labels.get(labels.RUN, "") for c in found}
    mine = recorded_here() if mine is None else mine
    kept = {(c.labels.get(labels.RUN, ""), c.record) for c in found if c.record}
    recs = tuple(r for r in guard.records(engine, among=runs) if _made_by_a_launcher(r, mine, kept))
    live = {r.run for r in recs}
    lost = tuple(guard.dead_records(engine, among=runs - live, live=live, seen=found)) if runs - live else ()
    owned = _owned(recs, mine)
    by_volume = {(ref, r.volume): r.run for r in lost for ref in r.owned}
    skip = {r.id for r in recs}
    ours: list[ContainerInfo] = []
    other: list[ContainerInfo] = []
    for c in found:
        if c.id in skip or c.labels.get(labels.STAGE, "") == labels.STAGE_LOCK:
            continue  # a run's guard goes by itself once its run is down; a live GPU lock is never touched
        (ours if _vouched_for(c, owned, by_volume) else other).append(c)
    return Vouched(tuple(ours), tuple(other), recs, lost)


def _made_by_a_launcher(rec: guard.GuardRecord, mine: Mapping[str, set[str]], kept: set[tuple[str, str]]) -> bool:
    """A running guard is its run's only by an id a launcher of the run recorded: this user's own record of the
    run's creates, or the run's record, which the guard keeps and the run's stages mount (no one can add a mount
    to a container after its create). A look-alike (the guard's image and the run's labels) is neither: never
    signalled, waited on or removed, but named (docs/chain.md, "Ours by id only")."""
    return rec.id in mine.get(rec.run, ()) or (rec.run, rec.keeps) in kept


def _owned(recs: tuple[guard.GuardRecord, ...], mine: dict[str, set[str]]) -> dict[str, str]:
    """Container id -> run: what the running guards recorded, and this user's own record of its runs' creates."""
    owned = {ref: r.run for r in recs for ref in r.owned}
    for run, refs in mine.items():
        owned.update(dict.fromkeys(refs, run))
    return owned


def _vouched_for(c: ContainerInfo, owned: Mapping[str, str], by_volume: Mapping[tuple[str, str], str]) -> bool:
    """The container is its run's: recorded as its, a Compose service of pp-launch's, in the record volume of its
    run (whose guard is gone), or left Dead by a crashed engine with that record mounted."""
    its = c.labels.get(labels.RUN)
    return (
        owned.get(c.id) == its
        or _compose_service(c)
        or any(by_volume.get((c.id, v)) == its for v in c.volumes)
        or _left_dead(c)
    )


def _left_dead(c: ContainerInfo) -> bool:
    """A container a crashed engine left Dead (it can never run again) that carries a run's label and mounts that
    run's record: made by the run as the engine died (its create never answered, so its id is in no record).
    Removing it touches nothing that runs; a container that merely carries the labels is never one."""
    run = c.labels.get(labels.RUN, "")
    return c.state == "dead" and any(guard.is_record_of(v, run) for v in c.volumes)


def _compose_service(c: ContainerInfo) -> bool:
    """A service of a pp-launch Compose project: Compose created it, and Compose's project label names it."""
    owner = c.labels.get(labels.OWNER, "")
    project = owner.removeprefix(labels.OWNER_COMPOSE_PREFIX)
    return owner.startswith(labels.OWNER_COMPOSE_PREFIX) and c.labels.get(COMPOSE_PROJECT) == project


COMPOSE_PROJECT = "com.docker.compose.project"


def recorded_here() -> dict[str, set[str]]:
    """The ids this user's runs created, by run; nothing when the state directory cannot be read (or there is none:
    a look never makes one)."""
    if not host_state.default_dir().is_dir():
        return {}
    try:
        return host_state.RunIds().every()
    except errors.PpLaunchError:
        return {}


def left_by_the_dead(engine: Engine) -> list[ContainerInfo]:
    """What `gc` removes: containers of a run (by id: this user's own record of them, or the run's record volume,
    whoever launched it) that no running guard of their run holds, and that either no longer run (Dead or exited
    after an engine crash), belong to a launcher judged gone here, or to a detached run (whose guard was the only
    one to end it). A detached run with its guard is its guard's or `down`'s, never gc's."""
    every = engine.containers(labels.run_selector())
    vouched = vouch(engine, every)
    guarded = {r.run for r in vouched.guards}
    detached = {r.run for r in vouched.guardless if r.detached}
    out = []
    for c in vouched.ours:
        run = c.labels.get(labels.RUN, "")
        if run in guarded or _compose_service(c):
            continue
        owner = c.labels.get(labels.OWNER, "")
        if (
            c.state not in ("running", "paused", "restarting")
            or run in detached  # a detached run whose guard is gone: no one else will ever end it
            or (owner != labels.OWNER_DETACHED and identity.owner_is_gone(owner))
        ):
            out.append(c)
    return out


def forget_ended(engines: list[Engine]) -> None:
    """Drop this user's record of each run none of whose containers is left on these engines, and no guard."""
    mine = recorded_here()
    if not mine:
        return
    left = {c.id for e in engines for c in e.containers(labels.run_selector())}
    guarded = {run for e in engines for run in guard.guarded_runs(e)}
    for run, refs in mine.items():
        if run not in guarded and not (refs & left):
            with contextlib.suppress(errors.PpLaunchError):
                host_state.RunIds().forget(run)


def unrecorded(engine: Engine) -> list[ContainerInfo]:
    """What `gc` names and never touches: containers with pp-launch labels that no guard of their run records."""
    return list(vouch(engine, engine.containers(labels.run_selector())).unrecorded)


def describe(c: ContainerInfo) -> str:
    """A container as a message names it, with everything from its labels escaped for the terminal."""
    name = c.name if c.name and c.name != "?" else f"(unnamed, id {c.id[:12]})"
    return f"{safe(name)} (run {safe(c.labels.get(labels.RUN, '?'))}, owner {safe(c.labels.get(labels.OWNER, '?'))})"


def safe(text: str) -> str:
    return display(text.encode("utf-8", "surrogateescape"))


def resolve_run(wanted: str, runs: set[str], shown: set[str] | None = None) -> str:
    """A run id, or a unique prefix of one, among the runs the engine has; ConfigError (exit 2) naming the runs
    there are otherwise (`shown`: those `ps` lists, when not all of them: a guard alone is no run yet)."""
    if wanted in runs:
        return wanted
    matches = sorted(r for r in runs if r.startswith(wanted)) if wanted else []
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(safe(r) for r in sorted(runs if shown is None else shown)) or "none"
    if matches:
        raise errors.ConfigError(f"run {safe(wanted)!r} is ambiguous: {', '.join(matches)}")
    raise errors.ConfigError(f"no run {safe(wanted)!r} here; runs: {known} ('pp-launch ps' lists them)")


def is_stage(c: ContainerInfo) -> bool:
    """A stage container (a number for its stage label), not a run's GPU lock or guard."""
    return labels.ascii_int(c.labels.get(labels.STAGE, "")) is not None


def _with_stages(found: list[ContainerInfo]) -> set[str]:
    """The runs among `found` that have a stage: those `ps` lists (a guard alone, still placing, is no run yet)."""
    return {c.labels.get(labels.RUN, "") for c in found if is_stage(c)}


def find_run(engine: Engine, wanted: str) -> tuple[str, list[ContainerInfo]]:
    """The run a user named (its id or a unique prefix) and its containers in stage order; ConfigError otherwise."""
    every = engine.containers(labels.run_selector())
    run = resolve_run(wanted, {c.labels.get(labels.RUN, "") for c in every}, _with_stages(every))
    mine = [c for c in every if c.labels.get(labels.RUN) == run]
    mine.sort(key=lambda c: labels.ascii_int(c.labels.get(labels.STAGE, "")) or 0)
    return run, mine


def stop_runs(
    engine: Engine,
    targets: list[ContainerInfo],
    grace: float,
    reason: str = "down",
    kill_wait: float = 15.0,
    guards: tuple[guard.GuardRecord, ...] = (),
) -> list[ChainOutcome]:
    """The chain's own teardown for containers their guards vouch for (`pp-launch down`): each run's guards told
    to stop first (SIGUSR1: nothing more is recorded, their launcher stops), each run adopted by a scope,
    every run at once; SIGTERM, one shared grace, SIGKILL through the engine, removal by id, confirmed by the
    engine; then the guards gone."""
    for g in guards:
        engine.signal(g.id, signal.SIGUSR1)  # the guard's own "down" (an engine that stops sends SIGTERM)
    try:
        return _stop_runs(engine, targets, grace, reason, kill_wait)
    finally:
        for g in guards:
            with contextlib.suppress(errors.PpLaunchError):
                engine.wait_removed(g.id, timeout=grace + kill_wait)


def _stop_runs(
    engine: Engine, targets: list[ContainerInfo], grace: float, reason: str, kill_wait: float
) -> list[ChainOutcome]:
    runs: dict[str, list[ContainerInfo]] = {}
    for c in targets:
        runs.setdefault(c.labels.get(labels.RUN, ""), []).append(c)

    def stop(run: str, found: list[ContainerInfo]) -> ChainOutcome:
        backend = DockerStageBackend(engine)
        adopted = [Found(c.id, c.name, c.state == "running") for c in found]
        inbox = QueueInbox()
        quiet, runtime = QuietReporter(), ThreadRuntime()
        scope = ChainScope.adopt(run, adopted, backend, inbox, quiet, grace, runtime, kill_wait=kill_wait)
        return scope.stop(reason)

    if not runs:
        return []
    return map_all(lambda item: stop(*item), list(runs.items()), "down", max_workers=8)


def local_inventory() -> GpuInventory | None:
    """This machine's GPUs as NVML tells them (`ps` shows their memory and use); None without NVML."""
    from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory

    try:
        return read_inventory()
    except NvmlUnavailable:
        return None


# `owner_status` is one of these words (ps --json, --filter, --format); the table says what each means
OWNER_STATUS_SAID = {
    "alive": "alive",
    "gone": "gone",
    "detached": "detached",
    "compose": "compose",
    "ended": "ended",
    "unknown": "unknown: not ours to judge",
    "other-host": "owner on another host: not judged",
    "other-boot": "owner from another boot: not judged",
    "other-pidns": "owner in another PID namespace: not judged",
    "unrecorded": "unrecorded: no guard of its run made it (never touched)",
    "guard-gone": "its guard is gone: 'pp-launch down RUN' ends it",
}


def owner_status(owner: str) -> str:
    """What a stage's owner label says of its launcher, as one of OWNER_STATUS_SAID's words."""
    if owner == labels.OWNER_DETACHED:
        return "detached"
    if owner.startswith(labels.OWNER_COMPOSE_PREFIX):
        return "compose"
    parsed = labels.Owner.parse(owner)
    if parsed is None:
        return "unknown"
    if (why := identity.judge_here(parsed)) is not None:
        return why
    return "alive" if identity.is_alive(parsed) else "gone"


ANNOUNCE_SCAN_LINES = 2000  # an announcement comes early; a stage that floods without one is not read to its end


def announced(engine: Engine, ref: str) -> str | None:
    """The addresses a running stage announced (its first valid PP_GPU_NODE_ADDR line), from its logs; None when
    there is none, or its logs cannot be read (a container the engine is removing: listed a moment ago)."""
    try:
        return _announced(engine, ref)
    except errors.EngineLost:
        raise
    except errors.EngineError:
        return None


def _announced(engine: Engine, ref: str) -> str | None:
    for n, line in enumerate(engine.log_lines(ref)):
        if n >= ANNOUNCE_SCAN_LINES:
            return None
        try:
            found = parse_line(line.decode("utf-8", "backslashreplace"))
        except AnnouncementError:
            return None  # a malformed announcement: the stage was failed for it
        if found is not None:
            return found.direct
    return None


def list_stages(
    engine: Engine,
    run: str | None = None,
    details: bool = False,
    gpus: GpuInventory | None = None,
    host: str | None = None,
    faults: Callable[[guard.GuardRecord], None] = lambda record: None,
) -> list[StageRow]:
    """Every stage container of every run (or of `run`). details: also each running stage's announced address
    and uptime (a look at each container); gpus: each GPU's index, memory and utilisation from that inventory;
    faults: told each run's guard that could not append to its record (read with the rest, once)."""
    now = time.time()
    by_uuid = {g.uuid: g for g in (gpus.gpus if gpus is not None else ())}
    found = engine.containers(labels.run_selector(run) if run else labels.run_selector())
    vouched = vouch(engine, found)
    for record in vouched.guards:
        if record.fault:
            faults(record)
    guarded = {r.id for r in vouched.guards}
    loose = {c.id for c in vouched.unrecorded}
    guardless = {r.run for r in vouched.guardless}
    rows: list[StageRow] = []
    for c in found:
        lock = c.id in guarded and c.name == LOCK_NAME  # a run's guard holding the engine's GPU lock (app/locks.py)
        if c.id in guarded and not lock:
            continue  # a run's guard is its machinery, as a hand-over was: `down` ends it with its run
        owner = c.labels.get(labels.OWNER, "")
        status = owner_status(owner)
        if c.id in loose:
            status = "unrecorded"
        elif c.labels.get(labels.RUN, "") in guardless:
            status = "guard-gone"
        row = _stage_row(engine, c, status, by_uuid, now, host, details and c.state == "running")
        rows.append(dataclasses.replace(row, role="lock") if lock else row)
    return sorted(rows, key=StageRow.order)


def _stage_row(
    engine: Engine,
    c: ContainerInfo,
    status: str,
    by_uuid: Mapping[str, Gpu],
    now: float,
    host: str | None,
    look: bool,
) -> StageRow:
    """One container's `ps` row; look: its announced address and uptime too (a look at the container)."""
    stage = c.labels.get(labels.STAGE, "")
    uuids = tuple(g for g in c.labels.get(labels.GPUS, "").split(",") if g)
    held = [by_uuid[u] for u in uuids if u in by_uuid]
    started = engine_time(((engine.inspect(c.id) or {}).get("State") or {}).get("StartedAt") or "") if look else 0
    return StageRow(
        run=c.labels.get(labels.RUN, ""),
        stage=labels.ascii_int(stage),
        attempt=labels.ascii_int(c.labels.get(labels.ATTEMPT, "")),
        role={labels.STAGE_LOCK: "lock", labels.STAGE_WATCH: "watch"}.get(stage, "stage"),
        container=c.name,
        id=c.id[:12],
        image=c.image,
        gpus=uuids,
        owner=c.labels.get(labels.OWNER, ""),
        owner_status=status,
        state=c.state,
        age_s=max(0, int(now - c.created)),
        labels=dict(c.labels),
        host=host,
        uptime_s=max(0, int(now - started)) if started else None,
        address=announced(engine, c.id) if look else None,
        gpu_index=tuple(g.index for g in held),
        gpu_memory_used_mib=tuple(g.memory_used_mib for g in held),
        gpu_utilization_pct=tuple(g.utilization_gpu_pct for g in held),
    )


def _reach(name: str) -> Engine | errors.PpLaunchError:
    try:
        return connect(host=name)
    except errors.PpLaunchError as exc:
        return exc


class Engines:
    """The engines a housekeeping command looks at: the one engine (no --host), the named hosts, or with
    --all-hosts the hosts recorded for the runs started here (and RUN's own, from its labels), reached at once. A
    host that does not answer is told to `say` ("error: ..."), `failed` is set, and the command goes on with the
    others (a launch refuses instead: app/hosts.py, `connect_all`)."""

    def __init__(self, names: tuple[str, ...], all_hosts: bool, run: str | None, say: Callable[[str], None]) -> None:
        wanted = list(hosts.parse_hosts(names))
        self.failed = False
        self.reached: list[tuple[str | None, Engine]] = []
        if all_hosts:
            record = host_state.RunHosts(warn=lambda text: say(f"warning: {text}"))
            self.reached.append((None, connect()))
            recorded = record.of_prefix(run) if run else record.every()
            labelled = self._labelled_hosts(run) if run else ()
            wanted += [h for h in (*recorded, *labelled) if h not in wanted]
        elif not wanted:
            self.reached.append((None, connect()))
        for name, got in zip(wanted, map_all(_reach, wanted, "host-connect"), strict=True):  # all at once, as a launch
            if isinstance(got, Engine):
                self.reached.append((name, got))
            else:
                self.failed = True
                say(f"error: {got}")
        self.several = len(self.reached) > 1 or any(name for name, _ in self.reached)

    def _labelled_hosts(self, run: str) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for _, engine in self.reached:
            for c in engine.containers(labels.run_selector()):
                if c.labels.get(labels.RUN, "").startswith(run):
                    found.update(dict.fromkeys(h for h in c.labels.get(labels.HOSTS, "").split(",") if h))
        return tuple(found)

    def close(self) -> bool:
        """Every connection closed; whether a host failed on the way (the command then exits 1)."""
        for _, engine in self.reached:
            engine.close()
        return self.failed

    def find_run(self, run_id: str) -> tuple[str, list[tuple[Engine, ContainerInfo]]]:
        """The run (id or unique prefix) on every engine looked at, each container with its engine, in stage
        order. ConfigError when no engine has it, as on one engine."""
        if not self.several:
            engine = self.reached[0][1]
            run, found = find_run(engine, run_id)
            return run, [(engine, c) for c in found]
        runs: set[str] = set()
        every: list[tuple[Engine, ContainerInfo]] = []
        for _, engine in self.reached:
            for c in engine.containers(labels.run_selector()):
                runs.add(c.labels.get(labels.RUN, ""))
                every.append((engine, c))
        run = resolve_run(run_id, runs, _with_stages([c for _, c in every]))
        mine = [(e, c) for e, c in every if c.labels.get(labels.RUN) == run]
        mine.sort(key=lambda item: labels.ascii_int(item[1].labels.get(labels.STAGE, "")) or 0)
        return run, mine


def run_ids(timeout: float) -> set[str]:
    """The run ids the engine's labels name (shell completion); EngineUnavailable when it does not answer."""
    engine = connect(timeout=timeout)
    try:
        return {c.labels.get(labels.RUN, "") for c in engine.containers(labels.run_selector())} - {""}
    finally:
        engine.close()
