"""The real inbox: bounded output, and control events that never wait behind it."""

from __future__ import annotations

import threading

from pp_launch.core.chain.ports import QueueInbox, StageGone, StageOutput, StopRequested


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


def test_a_full_inbox_holds_the_reader_back_until_stopping_then_drops() -> None:
    inbox = QueueInbox(max_output=1000)
    for i in range(10):
        inbox.put(line(i))  # 1 KiB and more: the bound is reached
    blocked = threading.Event()
    done = threading.Event()

    def reader() -> None:
        blocked.set()
        inbox.put(line(99))
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    assert blocked.wait(5)
    assert not done.wait(0.3)  # held back, as a pipe would hold the stage back
    inbox.stop_holding_back()
    t.join(5)
    assert done.is_set() and inbox.dropped_bytes == len(line(99).data)
    got = []
    while (event := inbox.get(0)) is not None:
        got.append(event)
    assert got == [line(i) for i in range(10)]


def test_get_times_out_with_none() -> None:
    assert QueueInbox().get(0.01) is None
