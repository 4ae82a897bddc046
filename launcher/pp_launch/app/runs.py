"""The runs that exist, wherever they run: `ps`, `down`, `gc`, `logs` and `wait` as use cases (docs/architecture.md).

A command names where to look (`Where`: this engine, some Docker hosts, every host of this machine's runs, or a Ray
cluster); `site()` opens the place that answers for it, a `Site`, and each use case asks the site alone:
- `DockerRuns`: one Docker engine or several (app/docker_runs.py; app/housekeeping.py holds the rules: only what a
  running guard of the run recorded is ever stopped; a container that merely carries the run's labels is named,
  never touched);
- `RaySite`: the detached runs on a Ray cluster, as their node agents answer for them (app/on_ray.py).
The same sites run launches (app/launch.py); app/site.py is the port both halves share.
What a use case finds comes back as data (rows, exit codes); what it says while it works goes to its `Voice`: the
command's answer on one side, notes and errors on the other. Nothing here prints, or knows the terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pp_launch.app.rows import StageRow
from pp_launch.app.site import Confirm as Confirm
from pp_launch.app.site import Housekeeping as Site
from pp_launch.app.site import LogView as LogView
from pp_launch.app.site import Voice as Voice
from pp_launch.app.site import Where as Where
from pp_launch.core import errors


def ray_log() -> tuple[int, str]:
    """Where Ray's own driver lines are set aside (without -v): an open file of this user's state, and its path."""
    from pp_launch.adapters import host_state

    fd, path = host_state.ray_log()
    return fd, str(path)


def site(where: Where, run: str | None, voice: Voice) -> Site:
    """The place `where` names, opened (for --all-hosts, the hosts recorded for `run` too)."""
    from pp_launch.app import sites

    return sites.for_housekeeping(where, run, voice)


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
) -> tuple[list[StageRow], bool]:
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
