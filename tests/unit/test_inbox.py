"""The real inbox: bounded output, and control events that never wait behind it."""

from __future__ import annotations

import threading

from pp_launch.adapters.inbox import LINE_COST, QueueInbox
from pp_launch.core.chain.ports import TAIL_LINES, StageGone, StageOutput, StopRequested


def line(i: int) -> StageOutput:
    return StageOutput(0, "stdout", b"x" * 100 + str(i).encode())


def test_a_stop_request_overtakes_waiting_output() -> None:
    inbox = QueueInbox()
    for i in range(50):
        inbox.put(line(i))
    inbox.put(StopRequested(2))
    assert inbox.get(0) == StopRequested(2)
    assert inbox.get(0) == line(0)  # the output is still all there, in order


def test_exits_keep_their_place_until_stopping_then_overtake() -> None:
    inbox = QueueInbox()
    inbox.put(line(0))
    inbox.put(StageGone(0, 0))
    assert inbox.get(0) == line(0)  # a stage's last lines come before its exit
    inbox.put(line(1))
    inbox.stop_holding_back()
    inbox.put(StageGone(1, 143))
    assert inbox.get(0) == StageGone(1, 143)  # once stopping, an exit overtakes waiting output
    assert inbox.get(0) == StageGone(0, 0)  # queued before stopping: kept its place
    assert inbox.get(0) == line(1)


def blocked_put(inbox: QueueInbox, event: StageOutput) -> tuple[threading.Event, threading.Thread]:
    """A reader putting one more line from its own thread; the event is set once the put returned."""
    done = threading.Event()
    t = threading.Thread(target=lambda: (inbox.put(event), done.set()))
    t.start()
    return done, t


def drain(inbox: QueueInbox) -> list[object]:
    got = []
    while (event := inbox.get(0)) is not None:
        got.append(event)
    return got


def test_a_full_inbox_holds_the_reader_back_until_stopping_then_keeps_its_last_lines() -> None:
    inbox = QueueInbox(max_output=2000)
    for i in range(8):
        inbox.put(line(i))  # 8 x (101 + LINE_COST) bytes: past the bound
    done, t = blocked_put(inbox, line(99))
    assert not done.wait(0.3)  # held back, as a pipe would hold the stage back
    inbox.stop_holding_back()
    t.join(5)
    assert done.is_set() and inbox.dropped_lines == inbox.dropped_bytes == 0  # set aside, not dropped
    assert drain(inbox) == [line(i) for i in range(8)] + [line(99)]  # the kept line last, after its elders


def test_empty_lines_count_against_the_bound_so_memory_stays_bounded() -> None:
    """Before: the bound counted payload bytes alone, and a million empty lines grew the launcher by 180 MB."""
    inbox = QueueInbox(max_output=10 * LINE_COST)
    for _ in range(11):
        inbox.put(StageOutput(0, "stdout", b""))
    done, t = blocked_put(inbox, StageOutput(0, "stdout", b""))
    assert not done.wait(0.3)
    inbox.stop_holding_back()
    t.join(5)


def test_the_bound_is_in_lines_too() -> None:
    inbox = QueueInbox(max_output=1 << 30, max_lines=5)
    for i in range(5):
        inbox.put(line(i))
    done, t = blocked_put(inbox, line(5))
    assert not done.wait(0.3)
    inbox.get(0)  # the consumer catches up: room for one more
    t.join(5)
    assert done.is_set()


def test_while_stopping_each_stage_keeps_its_last_lines_and_the_rest_is_counted() -> None:
    inbox = QueueInbox(max_output=1 << 30, max_lines=3)
    for i in range(3):
        inbox.put(line(i))
    inbox.stop_holding_back()
    flood = [StageOutput(1, "stdout", f"flood {i}".encode()) for i in range(TAIL_LINES + 30)]
    for event in flood:
        inbox.put(event)  # never blocks once stopping
    inbox.put(StageOutput(1, "stdout", b"PP_RESULT the answer"))
    assert inbox.dropped_lines == 31
    assert inbox.dropped_bytes == sum(len(e.data) for e in flood[:31])
    got = drain(inbox)
    assert got[:3] == [line(i) for i in range(3)]
    assert got[3:] == [*flood[31:], StageOutput(1, "stdout", b"PP_RESULT the answer")]  # the result is kept, last


def test_get_times_out_with_none() -> None:
    assert QueueInbox().get(0.01) is None
