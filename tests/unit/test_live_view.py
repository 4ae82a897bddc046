"""The live view on a (fake) terminal: states styled, never shown as markup; stage lines whole at any width;
Ctrl-C says what happens next."""

from __future__ import annotations

import io

from rich.console import Console

from pp_launch.cli.report import LiveReporter, PlainReporter
from pp_launch.core import events


def terminal(width: int = 40) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width, color_system="standard", highlight=False), out


def test_states_are_styled_not_printed_as_markup() -> None:
    console, out = terminal(width=100)
    live = LiveReporter("r1", 2, console=console)
    live.stage_state(0, events.StageState.RUNNING, "127.0.0.1:4000 in 0.15 s")
    live.stage_state(1, events.StageState.STOPPING, "[red]not markup[/]")
    live.close()
    text = out.getvalue()
    assert "[green]" not in text and "[magenta]" not in text  # the states' styles were not printed as markup
    assert "\x1b[32m" in text  # green, as a style
    assert "[red]not markup[/]" in text  # a stage's own text is shown as it is


def test_long_stage_lines_pass_through_whole() -> None:
    console, out = terminal(width=40)
    live = LiveReporter("r1", 1, console=console)
    line = "PP_GPU_NODE_ADDR " + "ab" * 32 + " 127.0.0.1:4000,127.0.0.1:4001"
    live.stage_line(0, "stdout", line)
    live.close()
    assert f"[stage 0] {line}" in out.getvalue()  # one piece, not broken at 40 columns


def test_ctrl_c_says_what_happens_next_and_each_stage_going() -> None:
    err = io.StringIO()
    plain = PlainReporter("r1", 0, out=io.StringIO(), err=err)
    plain.event(events.ChainStopping(reason=events.StopReason.SIGNAL, stages=3, grace=5.0))
    plain.event(events.StageExited(stage=1, exit_code=143, reason=events.ExitReason.STOPPED))
    assert err.getvalue() == (
        "pp-launch: stopping 3 stages (grace 5 s); Ctrl-C again to kill now\npp-launch: stage 1 gone (exit 143)\n"
    )


def test_the_summary_says_what_happened_in_words_and_counts_right() -> None:
    err = io.StringIO()
    plain = PlainReporter("r1", 0, out=io.StringIO(), err=err)
    plain.event(events.ChainStopped(reason=events.StopReason.STAGE_FAILED, exit_code=1, removed=("a",), orphans=()))
    assert err.getvalue() == "pp-launch: chain stopped (a stage failed), 1 container removed; nothing left behind\n"
