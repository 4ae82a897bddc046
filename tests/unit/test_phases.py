"""core/chain/phases: the table that decides a chain's course, walked row by row.

The expected rows are written out below as a reader would state the rules; every row of the table is compared with
them, and the rules that must hold across rows (exit codes, what may end a chain, what nothing leaves) are checked
on every row. How the scope follows the table is tested in test_scope.py and the integration tests: the scope has
no other way to end a chain."""

from __future__ import annotations

import itertools

import pytest

from pp_launch.core import errors
from pp_launch.core.chain import phases
from pp_launch.core.chain.phases import OWN, SIGNAL, Happening, Phase, Row
from pp_launch.core.events import ExitReason, StopReason

H, P, X = Happening, Phase, ExitReason
FAIL, OK = errors.EXIT_FAILURE, errors.EXIT_OK

# (phase, happening) -> (then, ends, exit code, stage's exit); rows not listed: the phase stays, nothing else
UP_OR_RUNNING = {
    H.STOP: (P.STOPPING, "signal", SIGNAL, None),
    H.GPU_FAULT: (P.STOPPING, "stage_failed", FAIL, None),
    H.PLACE_LOST: (P.STOPPING, "place_lost", FAIL, None),
    H.EXIT_FAILED: (P.STOPPING, "stage_failed", FAIL, X.FAILED),
    H.EXIT_EARLY: (P.STOPPING, "stage_failed", FAIL, X.DIED_EARLY),
    H.NOT_STARTED: (P.STOPPING, "stage_failed", FAIL, None),
    H.NOT_STARTED_FIRST: (P.STOPPING, "stage_failed", OWN, None),
    H.BAD_ANNOUNCEMENT: (P.STOPPING, "stage_failed", FAIL, None),
    H.NOT_ANNOUNCED: (P.STOPPING, "stage_failed", FAIL, None),
    H.ALL_ANNOUNCED: (P.RUNNING, None, None, None),
    H.ALL_ANNOUNCED_DETACH: (P.DETACHED, "detached", OK, None),
    H.ALL_EXITED: (P.STOPPING, "completed", OK, None),
    H.TAKEN_DOWN: (P.STOPPING, None, OK, None),
    H.BUG: (P.STOPPING, "error", FAIL, None),
    H.TORN_DOWN: (P.ENDED, None, None, None),
    H.TORN_DOWN_UNCLEAN: (P.ENDED, None, FAIL, None),
    H.STARTED_FOREGROUND: (P.RUNNING, None, None, None),
    H.EXIT_FOREGROUND: (P.STOPPING, "completed", OWN, X.EXITED),  # the foreground stage's own code
    H.STOP_FOREGROUND: (P.STOPPING, "signal", SIGNAL, None),
    H.NOT_STARTED_FOREGROUND: (P.STOPPING, "error", OWN, None),  # the engine's refusal, raised with its own code
}
STOPPING = {
    H.STOP: (P.HURRYING, None, None, None),
    H.EXIT_FAILED: (None, None, None, X.STOPPED),
    H.EXIT_EARLY: (None, None, None, X.STOPPED),
    H.EXIT_DONE: (None, None, None, X.STOPPED),
    H.EXIT_FOREGROUND: (None, None, None, X.STOPPED),
    H.TORN_DOWN: (P.ENDED, None, None, None),
    H.TORN_DOWN_UNCLEAN: (P.ENDED, None, FAIL, None),
}
EXPECTED: dict[tuple[Phase, Happening], tuple[Phase | None, str | None, int | None, ExitReason | None]] = {
    **{(P.STARTING, h): row for h, row in UP_OR_RUNNING.items()},
    (P.STARTING, H.EXIT_DONE): (None, None, None, X.EXITED),
    **{(P.RUNNING, h): row for h, row in UP_OR_RUNNING.items()},
    (P.RUNNING, H.EXIT_DONE): (None, None, None, X.EXITED),
    **{(P.STOPPING, h): row for h, row in STOPPING.items()},
    **{(P.HURRYING, h): row for h, row in STOPPING.items()},
}
# a later stop while stopping is passed on to a foreground stage (as docker run does), and hurries nothing
FORWARDED = {(P.STOPPING, H.STOP_FOREGROUND), (P.HURRYING, H.STOP_FOREGROUND)}
ROWS = list(itertools.product(Phase, Happening))


def expected(phase: Phase, happening: Happening) -> Row:
    then, ends, code, stage = EXPECTED.get((phase, happening), (None, None, None, None))
    return Row(then or phase, ends, code, stage, forward=(phase, happening) in FORWARDED)


@pytest.mark.parametrize(("phase", "happening"), ROWS, ids=[f"{p.value}:{h.name}" for p, h in ROWS])
def test_each_row_is_the_rule_as_written(phase: Phase, happening: Happening) -> None:
    assert phases.decide(phase, happening) == expected(phase, happening)


def test_every_phase_and_happening_has_a_row_and_no_row_is_extra() -> None:
    assert set(phases.TABLE) == set(ROWS)


@pytest.mark.parametrize(("phase", "happening"), ROWS, ids=[f"{p.value}:{h.name}" for p, h in ROWS])
def test_the_rules_across_rows(phase: Phase, happening: Happening) -> None:
    row = phases.decide(phase, happening)
    if row.ends is not None:
        StopReason(row.ends)  # a reason chain_stopped can carry
        assert row.exit_code is not None, "a row that ends the chain says its exit code"
        if row.exit_code == OWN:
            assert happening in (H.NOT_STARTED_FIRST, H.NOT_STARTED_FOREGROUND, H.EXIT_FOREGROUND), (
                "an error's own code, or the stage's own"
            )
        else:
            assert (row.exit_code == OK) == (row.ends in ("completed", "detached")), (
                "0 only for a chain that did its work"
            )
        assert (row.exit_code == SIGNAL) == (happening in (H.STOP, H.STOP_FOREGROUND)), "128+N only for a stop"
        assert phase in (P.STARTING, P.RUNNING), "only a chain that is up or coming up can end"
    if phase in (P.ENDED, P.DETACHED):
        assert row == Row(phase), "nothing leaves an ended or detached chain, nothing changes there"
    if phase in (P.STOPPING, P.HURRYING):
        assert row.ends is None and row.then in (P.STOPPING, P.HURRYING, P.ENDED)
        assert row.exit_code in (None, FAIL), "stopping only ever makes the exit code 1 (something was left)"
    assert row.forward == (happening is H.STOP_FOREGROUND and phase in (P.STOPPING, P.HURRYING))
    if happening in (H.EXIT_FAILED, H.EXIT_EARLY, H.EXIT_DONE, H.EXIT_FOREGROUND) and phase not in (
        P.ENDED,
        P.DETACHED,
    ):
        assert row.stage is not None, "a stage's exit is always named"
    else:
        assert row.stage is None


def test_exit_codes_are_made_concrete() -> None:
    assert phases.exit_code(SIGNAL, signum=2) == 130 and phases.exit_code(SIGNAL, signum=15) == 143
    assert phases.exit_code(OWN, own=errors.EXIT_USAGE) == errors.EXIT_USAGE
    assert phases.exit_code(OWN) == FAIL and phases.exit_code(FAIL) == FAIL and phases.exit_code(OK) == OK


def test_a_chain_walked_from_start_to_end_through_the_table() -> None:
    """The course of a chain that comes up, runs, is stopped twice and tears down cleanly, as the scope asks."""
    phase, code = P.STARTING, None
    course = [H.EXIT_DONE, H.ALL_ANNOUNCED, H.EXIT_DONE, H.STOP, H.EXIT_FAILED, H.STOP, H.TORN_DOWN]
    seen = []
    for happening in course:
        row = phases.decide(phase, happening)
        phase, code = row.then, code if row.exit_code is None else row.exit_code
        seen.append(phase)
    assert seen == [P.STARTING, P.RUNNING, P.RUNNING, P.STOPPING, P.STOPPING, P.HURRYING, P.ENDED]
    assert phases.exit_code(code, signum=15) == 143  # the stop's, kept through a clean teardown


def rendered() -> str:
    """The table as docs/chain.md shows it: starting/running and stopping/hurrying merged where their rows agree."""

    def code(c: int | None) -> str:
        return {SIGNAL: "128+N", OWN: "the error's (or stage's) own", None: "unchanged"}.get(c, str(c))  # type: ignore[call-overload]

    def cells(phase: Phase, row: Row) -> tuple[str, ...]:
        then = "(stays)" if row.then is phase else row.then.value
        then += "; the signal passed on to the stage" if row.forward else ""
        return then, row.ends or "-", code(row.exit_code), row.stage.value if row.stage else "-"

    out = [
        "| phase | what happened | then | the chain ends | exit code | a stage's exit is |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in ((P.STARTING, P.RUNNING), (P.STOPPING, P.HURRYING)):
        for h in Happening:
            ra, rb = phases.decide(a, h), phases.decide(b, h)
            if cells(a, ra) == cells(b, rb) and ra != Row(a):
                out.append(f"| {a.value}, {b.value} | {h.value} | " + " | ".join(cells(a, ra)) + " |")
                continue
            out += [
                f"| {p.value} | {h.value} | " + " | ".join(cells(p, r)) + " |"
                for p, r in ((a, ra), (b, rb))
                if r != Row(p)
            ]
    return "\n".join(out)


def test_the_docs_show_the_table_as_it_is() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "chain.md").read_text()
    assert rendered() in doc, "docs/chain.md, 'How a chain ends': render the table again from core/chain/phases.py"
