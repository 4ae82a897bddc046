"""On the real engine: a flood of output never costs a stage its last lines, and what the bound
drops while stopping is counted and said."""

from __future__ import annotations

import signal

import pytest

from ..helpers import Launcher, run_containers, wait_until

pytestmark = pytest.mark.docker
FLOOD = ("--stage-env", "1:STUB_FLOOD=lines")
HOLD_LINES = ("stub[1/2] holding; stop me with a signal", "stub[1/2] stopping on request")  # STUB_MODE=hold's own


def test_a_stage_that_floods_then_exits_has_its_result_shown_last_and_nothing_dropped(engine, stub_image) -> None:
    """Before: a completed chain tore down with lines still waiting and dropped them silently (its result among
    them), and an exit waited at most 5 s for its stage's last lines to be read."""
    launcher = Launcher(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--json",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "0:STUB_EXIT_AFTER=2",
        *FLOOD,
        "--stage-env",
        "1:STUB_FLOOD_LINES=300000",
        "--stage-env",
        "1:STUB_FLOOD_EXIT=1",
    )
    assert launcher.wait(300) == 0, launcher.stderr_text()[-2000:]
    stage1 = [line for line in launcher.stderr_lines if line.startswith("[stage 1] ")]
    assert stage1[-1] == "[stage 1] PP_FLOOD_DONE lines=300000"
    assert stage1.count("[stage 1] ") == 300000  # every empty line shown, none dropped
    (stopped,) = launcher.events_named("chain_stopped")
    assert "output_dropped_lines" not in stopped and stopped["reason"] == "completed"


WIDTH = 80  # a line's characters: as a log's. An engine keeps at most 1 MB of a stage's output that was not read
# yet (a million empty lines), and only for 2 s after the stage's exit: a flood of empty lines can outrun any reader


@pytest.mark.full  # a flood
def test_output_dropped_while_stopping_a_flood_is_counted_and_said(engine, stub_image) -> None:
    """Stage 1 floods lines, faster than the launcher shows them, until its stop. Every line it wrote is
    either shown or counted as dropped, exactly (the stage says how many it wrote, as its last line), each byte of
    the dropped ones counted, and the count said; each stage's last lines are shown, those it printed while it
    stopped too. Before: every line read once the teardown began was thrown away, uncounted (under load, nothing
    was counted at all), and a stage's last lines with them."""
    launcher = Launcher(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--json",
        "--env",
        "STUB_MODE=hold",
        *FLOOD,
        "--stage-env",
        "1:STUB_FLOOD_LINES=50000000",
        "--stage-env",
        f"1:STUB_FLOOD_WIDTH={WIDTH}",
    )
    assert wait_until(lambda: sum(line.startswith("[stage 1] ") for line in launcher.stderr_lines) > 20000, 120)
    launcher.signal(signal.SIGINT)
    assert launcher.wait(60) == 130, launcher.stderr_text()[-2000:]
    (stopped,) = launcher.events_named("chain_stopped")
    dropped, size = stopped.get("output_dropped_lines", 0), stopped.get("output_dropped_bytes", 0)
    shown = launcher.stderr_lines
    (wrote,) = [int(line.rsplit("=", 1)[1]) for line in shown if line.startswith("[stage 1] PP_FLOOD_STOPPED lines=")]
    # only stage 1's lines are many: its flood's and its own few, printed amid the flood
    unseen = [len(line) for line in HOLD_LINES if f"[stage 1] {line}" not in shown]
    flood_dropped = wrote - shown.count(f"[stage 1] {'y' * WIDTH}")
    assert (dropped, size) == (flood_dropped + len(unseen), flood_dropped * WIDTH + sum(unseen)), (wrote, unseen)
    said = f"{dropped} lines ({size} bytes) of stage output dropped while stopping (each stage's last 20 lines kept)"
    assert dropped > 0 and said in launcher.stderr_text()
    assert "[stage 0] stub[0/2] stopping on request" in shown  # the other stage's line while it stopped
    assert run_containers(engine, stopped["run"]) == []
