"""The sweep: containers whose owner is gone (`pp-launch gc`, and every chain and pp-gpu-node before it
starts anything). Only containers with our labels; only owners that are processes on this host and no
longer run. `detached`, `compose:…` and other hosts' owners are never touched."""

from __future__ import annotations

from dataclasses import dataclass

from . import bringup, labels
from .docker_engine import ContainerInfo, Engine
from .errors import EngineError
from .lines import display


def owner_of(c: ContainerInfo) -> str:
    """Whose the container is: its owner label, or for a detached run still coming up, its launcher."""
    owner = c.labels.get(labels.OWNER, "")
    if owner == labels.OWNER_DETACHED:
        return bringup.owner(c.labels.get(labels.RUN, "")) or owner
    return owner


def orphans(engine: Engine) -> list[ContainerInfo]:
    return [c for c in engine.containers([labels.RUN]) if labels.owner_is_gone(owner_of(c))]


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
