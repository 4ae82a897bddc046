"""`pp-launch uninstall`: everything of this user's that pp-launch made, removed before the package goes
(docs/getting-started.md, "Uninstall"): on each engine named, the record volumes this user's runs made and
pp-launch's images; then this user's private state. A run of this user that still lives on an engine stops it first
(nothing is removed: `pp-launch down RUN` ends it); what another user's run still uses is kept and said.

What it finds comes back as data (`Removal`, one per thing) for the CLI to say; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pp_launch.adapters import guard, host_state
from pp_launch.adapters.docker_engine import Engine
from pp_launch.adapters.images import BASE_IMAGE
from pp_launch.app import housekeeping
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import BUILTIN_IMAGE, GUARD_IMAGE

EXAMPLE_IMAGES = ("pp-launch-example/torch-pipeline:latest",)  # examples/*/build.sh's, built on the base
IMAGES = (*EXAMPLE_IMAGES, BUILTIN_IMAGE, GUARD_IMAGE, BASE_IMAGE)  # what `pp-launch images build` makes, and the
# examples' (the base last: the others are built on it)


@dataclass(frozen=True)
class Removal:
    """One thing of pp-launch's: what it is, its name, where it lies, and what became of it ("removed", "would
    remove", or "kept: WHY")."""

    kind: str  # "record", "image", "state"
    name: str
    where: str
    done: str


def uninstall(names: tuple[str, ...], dry_run: bool, say: Callable[[str], None]) -> list[Removal]:
    """On each engine `names` names (none: DOCKER_HOST's), then this user's state (PP_LAUNCH_STATE_DIR's, or the
    usual one)."""
    engines = housekeeping.Engines(names, False, None, say=say)
    try:
        if engines.failed:
            raise errors.EngineUnavailable("an engine named did not answer: nothing was removed")
        for name, engine in engines.reached:
            _refuse_live_runs(engine, name)
        done = [r for name, engine in engines.reached for r in _on_engine(engine, dry_run)]
    finally:
        engines.close()
    return [*done, _state(dry_run)]


def _refuse_live_runs(engine: Engine, name: str | None) -> None:
    """A run this user launched that still has a container on the engine: ended first, by the user."""
    mine = housekeeping.recorded_here()
    ids = {ref: run for run, refs in mine.items() for ref in refs}
    live = sorted({ids[c.id] for c in engine.containers(labels.run_selector()) if c.id in ids})
    if live:
        on = f" --host {name}" if name else ""
        raise errors.UsageError(
            f"run{'s' if len(live) > 1 else ''} {', '.join(live)} of yours still "
            f"{'have' if len(live) > 1 else 'has'} containers on the engine at {engine.address}: end "
            f"{'them' if len(live) > 1 else 'it'} first ('pp-launch down {' '.join(live)}{on}'); nothing was removed"
        )


def _on_engine(engine: Engine, dry_run: bool) -> list[Removal]:
    """This user's records there (only the ones its own runs made: a neighbour's are never touched), then the
    images, each kept when a container still uses it."""
    out: list[Removal] = []
    mine = set(host_state.RunRecords().every()) if host_state.RunRecords().listed() else set()
    for v in guard.record_volumes(engine):
        if v.name not in mine:
            continue
        if dry_run:
            out.append(Removal("record", v.name, engine.address, "would remove"))
        elif guard.release_record(engine, v.name, 5.0, ended_keeps=False):
            host_state.RunRecords().forget(v.name)
            out.append(Removal("record", v.name, engine.address, "removed"))
        else:
            out.append(Removal("record", v.name, engine.address, "kept: a container still mounts it"))
    for image in IMAGES:
        if engine.image_id(image) is None:
            continue
        if dry_run:
            out.append(Removal("image", image, engine.address, "would remove"))
        elif engine.untag_image(image):
            out.append(Removal("image", image, engine.address, "removed"))
        else:
            out.append(Removal("image", image, engine.address, "kept: a container (another user's run?) uses it"))
    return out


def _state(dry_run: bool) -> Removal:
    """This user's private state directory (run logs, the ids and records its runs made, hosts of its chains)."""
    path, done = host_state.remove_all(dry_run)
    return Removal("state", path, "this machine", done)
