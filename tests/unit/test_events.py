"""Typed events and stage states: every event round-trips through its JSON (docs/formats.md), and the
chain's stage states move only along their table."""

from __future__ import annotations

import json

import pytest

from pp_launch.core import events
from pp_launch.core.events import StageInput as In
from pp_launch.core.events import StageState as S

EXAMPLES: list[events.Event] = [
    events.ChainStarting(stages=4, image="pp-launch/stub-worker:latest"),
    events.StageStarted(stage=1, container="pp-abc-1", image="img:1", gpus=("GPU-1", "GPU-2")),
    events.StageStarted(stage=0, container="pp-abc-0", image="img:1", gpus=()),
    events.StageAnnounced(stage=1, node_id_hex="ab" * 32, direct="127.0.0.1:4000,[::1]:4000", elapsed_s=0.153),
    events.StageRoster(
        drive_seq=1,
        stages=(events.RosterEntry(stage_index=0, node_id_hex="ab" * 32, node_id_short="abababab"),),
    ),
    events.StageExited(stage=2, exit_code=137, reason=events.ExitReason.STOPPED),
    events.StageExited(stage=2, exit_code=None, reason=events.ExitReason.FAILED, detail="lost the engine's wait"),
    events.ChainStopping(reason=events.StopReason.SIGNAL, stages=3, grace=5.0),
    events.ChainStopped(reason=events.StopReason.SIGNAL, exit_code=130, removed=("pp-abc-0",), orphans=()),
    events.ChainStopped(
        reason=events.StopReason.COMPLETED, exit_code=0, removed=(), orphans=(), output_dropped_bytes=4096
    ),
    events.ChainRestarting(attempt=2, max=3, reason="stage 1 (pp-abc-1) exited with code 3", stage=1, backoff_s=1.0),
    events.ChainRestarting(attempt=3, max=3, reason="the stages did not announce in time"),
]


def test_every_event_type_has_an_example() -> None:
    assert {type(e) for e in EXAMPLES} == set(events.EVENTS.values())


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.NAME)
def test_every_event_round_trips_through_the_contracts_json(event: events.Event) -> None:
    doc = json.loads(json.dumps(events.to_json(event, "0123456789ab", "2026-12-02T22:00:00.000Z")))
    assert (doc["event"], doc["run"], doc["ts"]) == (event.NAME, "0123456789ab", "2026-12-02T22:00:00.000Z")
    assert events.from_json(doc) == event


def test_the_contract_field_names_stay() -> None:
    """docs/formats.md, as scripts read it (the roster's entries say stage_index; every other event says stage)."""
    names = {e.NAME: set(events.to_json(e, "r", "t")) - {"event", "run", "ts"} for e in EXAMPLES}
    assert names["stage_started"] == {"stage", "container", "image", "gpus"}
    assert names["stage_announced"] == {"stage", "node_id_hex", "direct", "elapsed_s"}
    assert names["pp_stage_roster"] == {"drive_seq", "stages"}
    assert set(events.to_json(EXAMPLES[4], "r", "t")["stages"][0]) == {"stage_index", "node_id_hex", "node_id_short"}
    assert {"stage", "exit_code", "reason"} <= names["stage_exited"]
    assert {"reason", "exit_code", "removed", "orphans"} <= names["chain_stopped"]


def test_a_stage_lives_along_its_table() -> None:
    state = None
    for inp, expected in (
        (In.CREATE, S.CREATING),
        (In.CREATED, S.CREATED),
        (In.START, S.STARTING),
        (In.ANNOUNCE, S.ANNOUNCED),
        (In.ROSTER, S.RUNNING),
        (In.STOP, S.STOPPING),
        (In.KILL, S.STOPPING),
        (In.GONE, S.GONE),
    ):
        state = events.next_state(state, inp)
        assert state is expected


EVERY_PAIR = [(state, inp) for state in (None, *S) for inp in In]
PAIR_IDS = [f"{s.value if s else 'planned'}-{i.value}" for s, i in EVERY_PAIR]


@pytest.mark.parametrize(("state", "inp"), EVERY_PAIR, ids=PAIR_IDS)
def test_every_pair_is_a_row_of_the_table_or_refused(state: S | None, inp: In) -> None:
    """Walks every (state, input): a row moves where the table says; anything else raises, naming both."""
    if (state, inp) in events.STAGE_TRANSITIONS:
        assert events.next_state(state, inp) is events.STAGE_TRANSITIONS[(state, inp)]
    else:
        with pytest.raises(events.IllegalStageTransition, match=f"cannot take '{inp.value}'"):
            events.next_state(state, inp)


@pytest.mark.parametrize(
    ("state", "inp"),
    [
        (S.GONE, In.STOP),
        (S.GONE, In.GONE),
        (None, In.ANNOUNCE),
        (S.RUNNING, In.START),
        (S.RUNNING, In.REMOVED),
        (S.CREATING, In.START),
        (S.REMOVED, In.GONE),
    ],
)
def test_a_move_the_table_lacks_is_our_bug_named_plainly(state: S | None, inp: In) -> None:
    with pytest.raises(events.IllegalStageTransition, match=f"cannot take '{inp.value}'"):
        events.next_state(state, inp)


def test_every_live_state_can_end_and_the_ends_are_final() -> None:
    for state in events.LIVE:
        ends = {events.STAGE_TRANSITIONS.get((state, In.GONE)), events.STAGE_TRANSITIONS.get((state, In.REMOVED))}
        assert ends & events.ENDED, state
    assert not [k for k in events.STAGE_TRANSITIONS if k[0] in events.ENDED]
