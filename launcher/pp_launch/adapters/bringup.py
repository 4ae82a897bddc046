"""The hand-over of a `--detach` run: until it is fully up it is its launcher's, like any foreground chain
(watchdog, stdin lifeline, sweep); then, at one atomic moment, it becomes a run only `down` ends.

Labels cannot change after a container is created, so the hand-over is not a relabelling. A detached run's
containers carry the owner `detached` from the start, and while the run is coming up a record in the host's
state directory, `bringing-up/<run>`, names the launcher that owns it. The watchdog and the sweep treat a
`detached` run with such a record exactly as a run of that launcher: its death removes the run. The
hand-over is the unlinking of the record (one rename-free unlink: atomic). Before it, nothing has handed the
run over; after it, nothing of the launcher's ownership is left. Light on purpose: the watchdog imports it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

RUN_ID = re.compile(r"[0-9a-f]{12}")


def _dir() -> Path:
    path = Path(os.environ.get("PP_LAUNCH_STATE_DIR", "/tmp/pp-launch-state")) / "bringing-up"
    path.mkdir(parents=True, exist_ok=True)
    return path


def begin(run_id: str, owner: str) -> None:
    """Before the run's first container: the launcher `owner` owns the run until `complete`."""
    path = _dir() / run_id
    tmp = path.with_suffix(".tmp")
    tmp.write_text(owner)
    tmp.replace(path)


def complete(run_id: str) -> None:
    """The hand-over (or the end of a run that never got there): the launcher owns the run no longer."""
    with contextlib.suppress(FileNotFoundError):
        (_dir() / run_id).unlink()


def owner(run_id: str) -> str | None:
    """The launcher that still owns a detached run coming up; None once handed over (or never detached)."""
    if not RUN_ID.fullmatch(run_id):  # a label value never becomes a path unless it is one of our run ids
        return None
    try:
        return (_dir() / run_id).read_text()
    except OSError:
        return None
