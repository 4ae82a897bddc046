"""What a chain reports (docs/formats.md), typed: frozen, keyword-only events shared by the scope, the reporters and
`--json`, and the stage states with their transition table. Pure.

`to_json(event, run, ts)` is the contract's JSON object; `from_json(doc)` reads one back (a test round-trips
every event). The states are drawn the way h11 draws its connection states: a table (state, input) -> next
state; a move the table does not have is our bug and raises IllegalStageTransition naming both.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from pp_launch.core.errors import PpLaunchError


class Event:
    NAME: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        """The event's fields as JSON values (tuples as lists, enums as their values, unset optionals left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            out[f.name] = _plain(value)
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


class StopReason(enum.Enum):
    """Why a chain ended (`chain_stopped.reason`)."""

    COMPLETED = "completed"
    STAGE_FAILED = "stage_failed"
    SIGNAL = "signal"
    DETACHED = "detached"
    ERROR = "error"
    PLACE_LOST = "place_lost"  # the run lost something it cannot go on without (its guard), said in the message
    DOWN = "down"  # adopted and stopped by `pp-launch down`
    LAUNCHER_GONE = "launcher gone"  # adopted and stopped by the watchdog


class ExitReason(enum.Enum):
    """Why a stage ended (`stage_exited.reason`)."""

    EXITED = "exited"  # exit 0 after announcing
    FAILED = "failed"  # a non-zero exit
    DIED_EARLY = "died_early"  # exit 0 before announcing
    STOPPED = "stopped"  # while the chain was stopping


@dataclass(frozen=True, kw_only=True)
class ChainStarting(Event):
    NAME = "chain_starting"
    stages: int
    image: str


@dataclass(frozen=True, kw_only=True)
class StageStarted(Event):
    NAME = "stage_started"
    stage: int
    container: str
    image: str
    gpus: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class StageAnnounced(Event):
    NAME = "stage_announced"
    stage: int
    node_id_hex: str
    direct: str
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class RosterEntry:
    stage_index: int
    node_id_hex: str
    node_id_short: str


@dataclass(frozen=True, kw_only=True)
class StageRoster(Event):
    NAME = "pp_stage_roster"
    drive_seq: int
    stages: tuple[RosterEntry, ...]


@dataclass(frozen=True, kw_only=True)
class StageExited(Event):
    NAME = "stage_exited"
    stage: int
    exit_code: int | None
    reason: ExitReason
    detail: str | None = None


@dataclass(frozen=True, kw_only=True)
class ChainStopping(Event):
    """Ours, beyond the contract's minimum: the teardown begins (why, how many stages, the grace)."""

    NAME = "chain_stopping"
    reason: StopReason
    stages: int
    grace: float


@dataclass(frozen=True, kw_only=True)
class ChainStopped(Event):
    NAME = "chain_stopped"
    reason: StopReason
    exit_code: int
    removed: tuple[str, ...]
    orphans: tuple[str, ...]
    output_dropped_bytes: int | None = None
    output_dropped_lines: int | None = None
    message: str | None = None  # why it stopped, in words, when a stage failed or an error ended it


@dataclass(frozen=True, kw_only=True)
class ChainRestarting(Event):
    """An attempt failed and the run restarts (`--max-restarts`): the attempt that comes next, the most there can
    be, why the last one failed, the stage that failed (absent: not one stage), the backoff before it."""

    NAME = "chain_restarting"
    attempt: int
    max: int
    reason: str
    stage: int | None = None
    backoff_s: float = 0.0


EVENTS: dict[str, type[Event]] = {
    c.NAME: c
    for c in (
        ChainStarting, StageStarted, StageAnnounced, StageRoster, StageExited, ChainStopping, ChainStopped,
        ChainRestarting,
    )
}  # fmt: skip


def to_json(event: Event, run: str, ts: str) -> dict[str, Any]:
    """docs/formats.md: `{"event": NAME, "ts": RFC3339, "run": RUN_ID, ...fields}`."""
    return {"event": event.NAME, "ts": ts, "run": run, **event.fields()}


def from_json(doc: dict[str, Any]) -> Event:
    cls = EVENTS[doc["event"]]
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in doc:
            continue
        value = doc[f.name]
        if f.name == "reason" and cls is not ChainRestarting:  # a restart's reason is words
            value = ExitReason(value) if cls is StageExited else StopReason(value)
        elif f.name == "stages" and cls is StageRoster:
            value = tuple(RosterEntry(**entry) for entry in value)
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


# ------------------------------------------------------------------------------------------- stage states
class StageState(enum.Enum):
    CREATING = "creating"  # its create was asked for (a container of ours exists only once the engine says so)
    CREATED = "created"  # the engine made it; not started
    STARTING = "starting"  # started; its announcement is awaited
    ANNOUNCED = "announced"
    RUNNING = "running"  # every stage announced (or adopted running)
    STOPPING = "stopping"
    GONE = "gone"  # it ran, and the engine confirmed it exited and was removed
    REMOVED = "removed"  # never started: removed by force, or never made


class StageInput(enum.Enum):
    CREATE = "create"  # its creation is asked for
    CREATED = "created"  # the engine returned its id
    START = "start"  # the engine started it
    ANNOUNCE = "announce"  # its valid announcement arrived
    ROSTER = "roster"  # every stage announced
    STOP = "stop"  # SIGTERM, the grace begins
    KILL = "kill"  # the grace is over: SIGKILL
    GONE = "gone"  # the engine confirmed it gone (exited and removed)
    REMOVED = "removed"  # never started, removed by force (or never created)
    ADOPT_RUNNING = "adopt running"  # `down` or the watchdog found it running
    ADOPT_STOPPED = "adopt stopped"  # found, not running


S, In = StageState, StageInput
STARTED = frozenset({S.STARTING, S.ANNOUNCED, S.RUNNING, S.STOPPING})  # it runs (as far as we know)
ENDED = frozenset({S.GONE, S.REMOVED})
LIVE = (S.CREATING, S.CREATED, *sorted(STARTED, key=list(S).index))  # every state that is not an end
STAGE_TRANSITIONS: dict[tuple[StageState | None, StageInput], StageState] = {
    (None, In.CREATE): S.CREATING,
    (S.CREATING, In.CREATED): S.CREATED,
    (S.CREATED, In.START): S.STARTING,
    (S.STARTING, In.ANNOUNCE): S.ANNOUNCED,
    (S.ANNOUNCED, In.ROSTER): S.RUNNING,
    (None, In.ADOPT_RUNNING): S.RUNNING,
    (None, In.ADOPT_STOPPED): S.CREATED,
    **{(s, In.STOP): S.STOPPING for s in (S.STARTING, S.ANNOUNCED, S.RUNNING)},
    (S.STOPPING, In.KILL): S.STOPPING,
    **{(s, In.GONE): S.GONE for s in (S.CREATED, *STARTED)},  # CREATED: a start that failed after its wait began
    (S.CREATING, In.REMOVED): S.REMOVED,  # its create failed: nothing of ours was made
    (S.CREATED, In.REMOVED): S.REMOVED,  # never started, removed by force
}


class IllegalStageTransition(PpLaunchError):
    """Our side's fault: the chain moved a stage in a way its table does not allow."""

    def __init__(self, state: StageState | None, inp: StageInput) -> None:
        super().__init__(f"a stage cannot take {inp.value!r} in state {state.value if state else 'planned'}")


def next_state(state: StageState | None, inp: StageInput) -> StageState:
    """The state a stage moves to, from the table alone; IllegalStageTransition (nothing moved) otherwise."""
    try:
        return STAGE_TRANSITIONS[(state, inp)]
    except KeyError:
        raise IllegalStageTransition(state, inp) from None
