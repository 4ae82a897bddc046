"""The live view on a (fake) terminal: states styled, never shown as markup; stage lines whole at any width;
Ctrl-C says what happens next."""

from __future__ import annotations

import io

import pytest
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
    err = io.StringIO()
    plain = PlainReporter("r1", 0, out=io.StringIO(), err=err)
    plain.record = "pp-launch-record-r1-…"  # a run on Docker engines keeps its record: the final line names it
    plain.event(events.ChainStopped(reason=events.StopReason.COMPLETED, exit_code=0, removed=("a", "b"), orphans=()))
    assert err.getvalue() == (
        "pp-launch: chain stopped (completed), 2 containers removed; nothing left behind but its record "
        "(pp-launch-record-r1-…, for 'wait' and 'ps -a')\n"
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bring_up_shows_what_each_stage_waits_for_and_for_how_long_against_its_timeout() -> None:
    console, out = terminal(width=120)
    clock = Clock()
    live = LiveReporter("r1", 2, console=console, addr_timeout=60.0, handoff="env", clock=clock)
    live.event(events.StageStarted(stage=0, container="c0", image="i", gpus=()))
    live.event(events.StageStarted(stage=1, container="c1", image="i", gpus=()))
    clock.now += 7.4
    live.live.refresh()
    text = out.getvalue()
    assert "7 s / 60 s" in text and "its announcement" in text and "stage 0's address" in text
    assert "0/2 stages announced" in text
    live.event(events.StageAnnounced(stage=0, node_id_hex="ab" * 32, direct="127.0.0.1:4000", elapsed_s=7.4))
    live.stage_state(0, events.StageState.ANNOUNCED)
    live.live.refresh()
    assert "1/2 stages announced" in out.getvalue()
    live.close()


def test_the_last_frame_keeps_the_addresses_and_the_result_comes_after_it() -> None:
    console, out = terminal(width=120)
    live = LiveReporter("r1", 1, console=console, addr_timeout=60.0)
    live.event(events.StageStarted(stage=0, container="c0", image="i", gpus=()))
    live.event(events.StageAnnounced(stage=0, node_id_hex="ab" * 32, direct="127.0.0.1:4000", elapsed_s=0.1))
    live.stage_state(0, events.StageState.GONE, "exit 0")
    live.event(events.ChainStopped(reason=events.StopReason.COMPLETED, exit_code=0, removed=("c0",), orphans=()))
    live.close()
    text = out.getvalue()
    last_table = text.rfind("pp-launch run r1")
    result = text.rfind("pp-launch: chain stopped (")
    assert 0 <= last_table < result, text
    assert "127.0.0.1:4000" in text[last_table:result]  # the address is still there when it is gone


def test_the_gpu_watch_frame_shows_each_gpus_bars_and_its_holder() -> None:
    from pathlib import Path

    from pp_launch.adapters import inventory_file
    from pp_launch.cli.tables import _bar, render_watch

    inv = inventory_file.load(Path(__file__).parent.parent / "data" / "pcie-2socket-4gpu.json")
    console, out = terminal(width=140)
    console.print(render_watch(inv, {inv.gpus[1].uuid: "run abc stage 2"}))
    text = out.getvalue()
    assert "run abc stage 2" in text and "1536/46068" in text
    assert _bar(0.5, 10) == "█████░░░░░" and _bar(None, 4) == "·?··" and _bar(2.0, 3) == "███"


def test_one_of_anything_is_counted_in_the_singular() -> None:
    err = io.StringIO()
    plain = PlainReporter("r1", 0, out=io.StringIO(), err=err)
    plain.event(events.ChainStopping(reason=events.StopReason.SIGNAL, stages=1, grace=5.0))
    assert err.getvalue().startswith("pp-launch: stopping 1 stage (grace 5 s)")


def test_after_ctrl_c_no_stage_waits_and_each_address_shows_once() -> None:
    """Stage 1 never announced, then Ctrl-C: once it is stopping or gone it waits for nothing; stage 0's address is
    in its column, and its detail says only the rest ("in 0.05 s")."""
    console, out = terminal(width=140)
    live = LiveReporter("r1", 2, console=console, addr_timeout=60.0, handoff="env", clock=Clock())
    for k in (0, 1):
        live.event(events.StageStarted(stage=k, container=f"c{k}", image="i", gpus=()))
    live.event(events.StageAnnounced(stage=0, node_id_hex="ab" * 32, direct="127.0.0.1:4000", elapsed_s=0.05))
    live.stage_state(0, events.StageState.ANNOUNCED, "127.0.0.1:4000 in 0.05 s")
    live.stage_state(1, events.StageState.STOPPING)
    live.stage_state(1, events.StageState.GONE, "exit 130")
    live.live.refresh()
    frame = out.getvalue()[out.getvalue().rfind("pp-launch run r1") :]
    assert "its announcement" not in frame and "stage 0's address" not in frame, frame
    assert frame.count("127.0.0.1:4000") == 1 and "in 0.05 s" in frame, frame
    live.close()


def test_a_restart_starts_a_fresh_table_titled_with_the_attempt_and_says_the_last_one_first() -> None:
    console, out = terminal(width=120)
    live = LiveReporter("r1", 2, console=console)
    live.event(events.StageAnnounced(stage=0, node_id_hex="ab" * 32, direct="127.0.0.1:4000", elapsed_s=0.1))
    live.stage_state(0, events.StageState.GONE, "exit 3")
    live.event(
        events.ChainStopped(
            reason=events.StopReason.STAGE_FAILED,
            exit_code=1,
            removed=("a", "b"),
            orphans=(),
            message="stage 0 (a) exited with code 3",
        )
    )
    live.event(events.ChainRestarting(attempt=2, max=3, reason="stage 0 (a) exited with code 3", stage=0))
    assert live.rows == {0: ["waiting", ""], 1: ["waiting", ""]} and live.addresses == {}
    said_before_attempt_2 = out.getvalue()
    assert "chain stopped (a stage failed), 2 containers removed" in said_before_attempt_2  # not held to the end
    live.close()
    assert "pp-launch run r1, attempt 2 of 3" in out.getvalue()


def test_attach_shows_only_those_stages_lines_and_every_word_of_pp_launch() -> None:
    out, err = io.StringIO(), io.StringIO()
    plain = PlainReporter("r1", 0, out=out, err=err)
    plain.attach = frozenset({1})
    for k in range(3):
        plain.stage_line(k, "stdout", f"line of {k}")
    plain.event(events.ChainStopped(reason=events.StopReason.COMPLETED, exit_code=0, removed=("a",), orphans=()))
    assert out.getvalue() == "[stage 1] line of 1\n" and "chain stopped (completed)" in err.getvalue()


def test_attach_names_a_stage_the_chain_has() -> None:
    from click.testing import CliRunner

    from pp_launch.cli.main import load_all, main

    load_all()
    result = CliRunner().invoke(main, ["chain", "--stages", "2", "--gpus", "none", "--attach", "2"])
    assert result.exit_code == 2 and "--attach 2: the chain has stages 0-1" in result.output


@pytest.mark.parametrize("stages", [32, 64])
def test_the_live_table_shows_what_is_awaited_first_and_fits_an_80x24_terminal(stages: int) -> None:
    """Every stage but one announced, one stopped: the frame fits 24 lines, the summary is on top and names the
    awaited stage, the stopped and the awaited rows are shown, the announced that do not fit are one counted line."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, height=24, color_system=None, highlight=False)
    live = LiveReporter("r1", stages, console=console, addr_timeout=60.0, handoff="stdin", clock=Clock())
    awaited, stopped = stages - 7, 3
    for k in range(stages):
        live.event(events.StageStarted(stage=k, container=f"c{k}", image="i", gpus=()))
        if k not in (awaited, stopped):
            live.event(events.StageAnnounced(stage=k, node_id_hex="ab" * 32, direct=f"127.0.0.1:{4000 + k}",
                                             elapsed_s=0.1))  # fmt: skip
            live.stage_state(k, events.StageState.ANNOUNCED)
    live.stage_state(stopped, events.StageState.STOPPING)
    live.live.stop()
    out.truncate(0)
    out.seek(0)
    console.print(live._table())
    frame = [line for line in out.getvalue().splitlines() if line.strip()]
    assert len(frame) <= 24, "\n".join(frame)
    assert frame[0].startswith(f"{stages - 2}/{stages} stages announced; waiting for stage {awaited}"), frame[0]
    cells = [[c.strip() for c in line.split("│")[1:3]] for line in frame if line.startswith("│")]
    assert cells[:2] == [[str(stopped), "stopping"], [str(awaited), "starting"]], cells  # the failed, the awaited
    assert "more stages (" in frame[-1] and frame[-1].endswith("announced"), frame[-1]
