"""The hand-over of a `--detach` run: until it is fully up it is its launcher's, like any foreground chain
(watchdog, stdin lifeline, sweep); then, at one atomic moment, it becomes a run only `down` ends.

Everything is on the engine, nothing in a state directory: a run's containers are found and judged by their labels
alone, state or no state. A detached run's containers carry the owner `detached` and, in `pp-launch.launcher`,
the launcher that brings it up. The hand-over is the creation of one more container of the run, never started,
whose stage label is `handed-over` (a create is atomic). Before it exists, the watchdog, `gc` and the sweep treat
the run exactly as a run of its launcher: the launcher's death removes it. After, the run is `down`'s alone.
"""

from __future__ import annotations

from pp_launch.adapters.docker_engine import ContainerInfo, Engine
from pp_launch.core import labels


def marker_labels(run_id: str) -> dict[str, str]:
    return {labels.RUN: run_id, labels.STAGE: labels.STAGE_HANDED_OVER, labels.OWNER: labels.OWNER_DETACHED,
            labels.GPUS: ""}  # fmt: skip


def hand_over(engine: Engine, run_id: str, image: str) -> None:
    """The hand-over on one engine: from now on only `down` ends the run there."""
    engine.create_placeholder(None, image, marker_labels(run_id))


def is_marker(c: ContainerInfo) -> bool:
    return c.labels.get(labels.STAGE) == labels.STAGE_HANDED_OVER


def handed_over_runs(found: list[ContainerInfo]) -> set[str]:
    """The runs, among these containers, whose hand-over marker is there."""
    return {c.labels.get(labels.RUN, "") for c in found if is_marker(c)}


def handed_over(engine: Engine, run_id: str) -> bool:
    return bool(handed_over_runs(engine.containers(labels.run_selector(run_id))))


def owner_of(c: ContainerInfo, handed: set[str]) -> str:
    """Whose the container is: its owner label, or for a detached run not yet handed over, its launcher."""
    owner = c.labels.get(labels.OWNER, "")
    if owner == labels.OWNER_DETACHED and c.labels.get(labels.RUN, "") not in handed:
        return c.labels.get(labels.LAUNCHER, "") or owner
    return owner
