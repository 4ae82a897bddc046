"""Housekeeping: `ps` (what exists and whose it is), `gc` and the sweep (what dead owners left), `down`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters import bringup
from pp_launch.adapters.docker_engine import ContainerInfo, DockerStageBackend, Engine
from pp_launch.core import errors, labels
from pp_launch.core.chain.ports import QueueInbox
from pp_launch.core.chain.scope import ChainOutcome, ChainScope, Found, QuietReporter
from pp_launch.core.errors import EngineError
from pp_launch.core.lines import display


def owner_of(c: ContainerInfo) -> str:
    """Whose the container is: its owner label, or for a detached run still coming up, its launcher."""
    owner = c.labels.get(labels.OWNER, "")
    if owner == labels.OWNER_DETACHED:
        return bringup.owner(c.labels.get(labels.RUN, "")) or owner
    return owner


def orphans(engine: Engine) -> list[ContainerInfo]:
    return [c for c in engine.containers(labels.run_selector()) if labels.owner_is_gone(owner_of(c))]


@dataclass(frozen=True)
class Collected:
    removed: tuple[ContainerInfo, ...]  # the engine confirmed each gone
    failed: tuple[tuple[ContainerInfo, str], ...]  # still there, and why


def gc(engine: Engine) -> Collected:
    """Remove every container of a dead owner that can be judged from here. Only what the engine confirms gone
    counts as removed; what it could not remove is reported with the reason."""
    removed, failed = [], []
    found = orphans(engine)
    for c in found:
        reason = ""
        try:
            engine.remove(c.id)
        except EngineError as exc:
            reason = str(exc)
        left = engine.inspect(c.id)
        if left is None:
            removed.append(c)
        else:
            state = str((left.get("State") or {}).get("Status", "?"))
            failed.append((c, reason or f"the engine still has it (state {state})"))
    for run in {c.labels.get(labels.RUN, "") for c in found} - {c.labels.get(labels.RUN, "") for c, _ in failed}:
        if bringup.RUN_ID.fullmatch(run):
            bringup.complete(run)  # a detached run that never came up: its record goes with it
    return Collected(tuple(removed), tuple(failed))


def describe(c: ContainerInfo) -> str:
    """A container as a message names it, with everything from its labels escaped for the terminal."""
    name = c.name if c.name and c.name != "?" else f"(unnamed, id {c.id[:12]})"
    return (
        f"{safe(name)} (run {safe(c.labels.get(labels.RUN, '?'))}, owner {safe(c.labels.get(labels.OWNER, '?'))})"
    )


def safe(text: str) -> str:
    return display(text.encode("utf-8", "surrogateescape"))


def resolve_run(wanted: str, runs: set[str]) -> str:
    """A run id, or a unique prefix of one, among the runs the engine has; ConfigError (exit 2) naming the runs
    there are otherwise."""
    if wanted in runs:
        return wanted
    matches = sorted(r for r in runs if r.startswith(wanted)) if wanted else []
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(safe(r) for r in sorted(runs)) or "none"
    if matches:
        raise errors.ConfigError(f"run {safe(wanted)!r} is ambiguous: {', '.join(matches)}")
    raise errors.ConfigError(f"no run {safe(wanted)!r} here; runs: {known} ('pp-launch ps' lists them)")


def stop_runs(
    engine: Engine, targets: list[ContainerInfo], grace: float, reason: str = "down", kill_wait: float = 15.0
) -> list[ChainOutcome]:
    """The chain's own teardown for containers found by label (`pp-launch down`, the watchdog): each run adopted
    by a scope, every run at once; SIGTERM, one shared grace, SIGKILL through the engine, removal by id,
    confirmed by the engine."""
    runs: dict[str, list[ContainerInfo]] = {}
    for c in targets:
        runs.setdefault(c.labels.get(labels.RUN, ""), []).append(c)

    def stop(run: str, found: list[ContainerInfo]) -> ChainOutcome:
        backend = DockerStageBackend(engine)
        adopted = [Found(c.id, c.name, c.state == "running") for c in found]
        inbox = QueueInbox()
        scope = ChainScope.adopt(run, adopted, backend, inbox, QuietReporter(), grace, kill_wait=kill_wait)
        return scope.stop(reason)

    with ThreadPoolExecutor(max_workers=max(1, min(len(runs), 8)), thread_name_prefix="down") as pool:
        return list(pool.map(lambda item: stop(*item), runs.items()))


def owner_status(owner: str) -> str:
    if owner == labels.OWNER_DETACHED:
        return "detached"
    if owner.startswith(labels.OWNER_COMPOSE_PREFIX):
        return "compose"
    parsed = labels.Owner.parse(owner)
    if parsed is None:
        return "unknown: not ours to judge"
    if (why := parsed.judge_here()) is not None:
        return why
    return "alive" if parsed.is_alive() else "gone"


def list_stages(engine: Engine) -> list[dict[str, Any]]:
    now = time.time()
    rows = []
    for c in engine.containers(labels.run_selector()):
        owner = c.labels.get(labels.OWNER, "")
        stage = c.labels.get(labels.STAGE, "")
        rows.append(
            {
                "run": c.labels.get(labels.RUN, ""),
                "stage": labels.ascii_int(stage),
                "container": c.name,
                "image": c.image,
                "gpus": [g for g in c.labels.get(labels.GPUS, "").split(",") if g],
                "owner": owner,
                "owner_status": owner_status(owner_of(c)),  # a detached run coming up: its launcher's
                "state": c.state,
                "age_s": max(0, int(now - c.created)),
            }
        )
    return sorted(rows, key=lambda r: (r["run"], r["stage"] if r["stage"] is not None else -1))


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no pp-launch containers"
    header = ("run", "stage", "container", "image", "gpus", "owner", "owner is", "state", "age")
    table = [header] + [
        (
            r["run"],
            str(r["stage"]),
            r["container"],
            r["image"],
            ",".join(g[:12] for g in r["gpus"]) or "-",
            r["owner"],
            r["owner_status"],
            r["state"],
            f"{r['age_s']}s",
        )
        for r in rows
    ]
    table = [tuple(display(cell.encode("utf-8", "surrogateescape")) for cell in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
