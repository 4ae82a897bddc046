"""The sweep: containers whose owner is gone (`pp-launch gc`, and every chain and pp-gpu-node before it
starts anything). Only containers with our labels; only owners that are processes on this host and no
longer run. `detached`, `compose:…` and other hosts' owners are never touched."""

from __future__ import annotations

from . import labels
from .docker_engine import ContainerInfo, Engine


def orphans(engine: Engine) -> list[ContainerInfo]:
    return [c for c in engine.containers([labels.RUN]) if labels.owner_is_gone(c.labels.get(labels.OWNER, ""))]


def gc(engine: Engine) -> list[ContainerInfo]:
    """Remove every container of a dead local owner; return them."""
    found = orphans(engine)
    for c in found:
        engine.remove(c.id)
    return found
