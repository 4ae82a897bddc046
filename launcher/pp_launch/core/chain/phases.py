"""The chain's phase, and the table that decides its course (docs/chain.md, "How a chain ends").

`ChainScope` (core/chain/scope.py) finds what happened and does what the row for (its phase, that happening)
says: the next phase, whether and why the chain ends, the exit code, and what a stage's exit is called. Nothing
else decides: the exit code a chain ends with is the last one a row gave, never changed afterwards. Pure; a test
walks every row (tests/unit/test_phases.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pp_launch.core import errors
from pp_launch.core.events import ExitReason


class Phase(Enum):
    STARTING = "starting"  # stages being created, started, handed their peers
    RUNNING = "running"  # every stage announced: supervised until each exits
    DETACHED = "detached"  # up and handed over to the run's guards: this scope is done
    STOPPING = "stopping"  # the one teardown runs; each stage gets its grace
    HURRYING = "hurrying"  # a second stop while stopping: no more waiting for graceful exits
    ENDED = "ended"  # the teardown is over


class Happening(Enum):
    STOP = "a stop was asked (a signal, or down through the guard)"
    GPU_FAULT = "a stage's GPU had a critical Xid"
    PLACE_LOST = "something the run cannot go on without was lost (its guard, and no new one; an engine; a Ray node)"
    EXIT_FAILED = "a stage exited non-zero (or its exit code is unknown)"
    EXIT_EARLY = "a stage exited 0 before announcing its address"
    EXIT_DONE = "a stage exited 0 after announcing"
    NOT_STARTED = "a stage could not be created, started or handed its peers"
    NOT_STARTED_FIRST = "the first failure to start, before any stage of the chain started"
    BAD_ANNOUNCEMENT = "a stage's announcement was rejected (malformed, too long, or a node id twice)"
    NOT_ANNOUNCED = "a stage did not announce within --addr-timeout"
    ALL_ANNOUNCED = "every stage announced: the roster is out"
    ALL_ANNOUNCED_DETACH = "every stage announced, and the run detaches"
    ALL_EXITED = "every stage exited 0"
    TAKEN_DOWN = "an adopted run is taken down (pp-launch down, the watchdog)"
    BUG = "an exception in pp-launch itself"
    TORN_DOWN = "the teardown ended and the engine has nothing of the run left"
    TORN_DOWN_UNCLEAN = "the teardown ended with containers left or errors"
    # one stage in the foreground (pp-gpu-node, as `docker run` is): no address awaited, output passed through
    STARTED_FOREGROUND = "the foreground stage started: nothing to await"
    EXIT_FOREGROUND = "the foreground stage exited (its exit code known)"
    STOP_FOREGROUND = "a stop was asked of a foreground stage"
    NOT_STARTED_FOREGROUND = "the engine refused the foreground stage's create or start (raised, as docker run says)"


SIGNAL = -1  # the exit code is 128 + the number of the signal that asked to stop
OWN = -2  # the exit code is the error's own (2 for a configuration error, else 1), or a foreground stage's


@dataclass(frozen=True)
class Row:
    then: Phase
    ends: str | None = None  # the chain ends, for this reason (events.StopReason); None: it goes on
    exit_code: int | None = None  # the exit code from here on (SIGNAL, OWN); None: as it was
    stage: ExitReason | None = None  # what a stage's exit is called (for the EXIT_* happenings)
    forward: bool = False  # the stop's signal is passed on to every running stage at once (as docker run does)


H, P = Happening, Phase
_FAIL = errors.EXIT_FAILURE
_EXITS = (H.EXIT_FAILED, H.EXIT_EARLY, H.EXIT_DONE, H.EXIT_FOREGROUND)


def _bringing_up_or_running(phase: Phase) -> dict[Happening, Row]:
    """What ends a chain that is up or coming up, and what it goes on through."""
    return {
        H.STOP: Row(P.STOPPING, "signal", SIGNAL),
        H.GPU_FAULT: Row(P.STOPPING, "stage_failed", _FAIL),
        H.PLACE_LOST: Row(P.STOPPING, "place_lost", _FAIL),
        H.EXIT_FAILED: Row(P.STOPPING, "stage_failed", _FAIL, ExitReason.FAILED),
        H.EXIT_EARLY: Row(P.STOPPING, "stage_failed", _FAIL, ExitReason.DIED_EARLY),
        H.EXIT_DONE: Row(phase, stage=ExitReason.EXITED),
        H.NOT_STARTED: Row(P.STOPPING, "stage_failed", _FAIL),
        H.NOT_STARTED_FIRST: Row(P.STOPPING, "stage_failed", OWN),
        H.BAD_ANNOUNCEMENT: Row(P.STOPPING, "stage_failed", _FAIL),
        H.NOT_ANNOUNCED: Row(P.STOPPING, "stage_failed", _FAIL),
        H.ALL_ANNOUNCED: Row(P.RUNNING),
        H.ALL_ANNOUNCED_DETACH: Row(P.DETACHED, "detached", errors.EXIT_OK),
        H.ALL_EXITED: Row(P.STOPPING, "completed", errors.EXIT_OK),
        H.TAKEN_DOWN: Row(P.STOPPING, exit_code=errors.EXIT_OK),  # the reason is the caller's: down, launcher gone
        H.BUG: Row(P.STOPPING, "error", _FAIL),
        H.STARTED_FOREGROUND: Row(P.RUNNING),
        H.EXIT_FOREGROUND: Row(P.STOPPING, "completed", OWN, ExitReason.EXITED),
        H.STOP_FOREGROUND: Row(P.STOPPING, "signal", SIGNAL),
        H.NOT_STARTED_FOREGROUND: Row(P.STOPPING, "error", OWN),
    }


def _stopping(phase: Phase) -> dict[Happening, Row]:
    """While the teardown runs, nothing changes the chain's end: exits are the stops it asked for, a second stop
    hurries it (a foreground stage's is passed on to it instead), and how it ends only makes the exit code 1 when
    something is left (never 0, never 128+N)."""
    rows = {h: Row(phase) for h in Happening}
    rows |= {h: Row(phase, stage=ExitReason.STOPPED) for h in _EXITS}
    rows[H.STOP] = Row(P.HURRYING)
    rows[H.STOP_FOREGROUND] = Row(phase, forward=True)
    rows[H.TORN_DOWN] = Row(P.ENDED)
    rows[H.TORN_DOWN_UNCLEAN] = Row(P.ENDED, exit_code=_FAIL)
    return rows


TABLE: dict[tuple[Phase, Happening], Row] = {
    **{(P.STARTING, h): row for h, row in _bringing_up_or_running(P.STARTING).items()},
    **{(P.RUNNING, h): row for h, row in _bringing_up_or_running(P.RUNNING).items()},
    **{(P.STOPPING, h): row for h, row in _stopping(P.STOPPING).items()},
    **{(P.HURRYING, h): row for h, row in _stopping(P.HURRYING).items()},
    # a detached scope is done: what it still hears is not its to act on; an ended one hears nothing
    **{(P.DETACHED, h): Row(P.DETACHED) for h in Happening},
    **{(P.ENDED, h): Row(P.ENDED) for h in Happening},
}
# the teardown is what ends a chain that was up or coming up too (a bug, `down` of an adopted run)
for _phase in (P.STARTING, P.RUNNING):
    TABLE[(_phase, H.TORN_DOWN)] = Row(P.ENDED)
    TABLE[(_phase, H.TORN_DOWN_UNCLEAN)] = Row(P.ENDED, exit_code=_FAIL)


def decide(phase: Phase, happening: Happening) -> Row:
    return TABLE[(phase, happening)]


def exit_code(row_code: int, signum: int | None = None, own: int | None = None) -> int:
    """A row's exit code as a number: SIGNAL and OWN made concrete."""
    if row_code == SIGNAL:
        return errors.exit_code_for_signal(signum or 15)
    if row_code == OWN:
        return own if own is not None else errors.EXIT_FAILURE
    return row_code
