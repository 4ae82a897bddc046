"""The guard's keeping of a detached run's stage lines (images/guard/pp_guard.py), read from the engine's log frames
as its follow stream brings them: any cut of the stream gives the same lines, an unfinished frame none."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "images" / "guard" / "pp_guard.py"


@pytest.fixture(scope="module")
def pp_guard(monkeypatch_module: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch_module.setattr(sys, "argv", ["pp_guard.py"])  # serve's imports (the session imports none)
    spec = importlib.util.spec_from_file_location("pp_guard_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


class Response:
    """A follow stream that brings at most `cut` bytes a read."""

    def __init__(self, data: bytes, cut: int) -> None:
        self.data, self.cut = data, cut

    def read(self) -> bytes:
        out, self.data = self.data[: self.cut], self.data[self.cut :]
        return out


STREAM = (
    frame(1, b"2026-12-07T09:00:00.1Z PP_GPU_NODE_ADDR a 127.0.0.1:1\n")
    + frame(2, b"2026-12-07T09:00:00.2Z stub stop signal: exiting\n")
    + frame(1, b"2026-12-07T09:00:00.3Z one\n2026-12-07T09:00:00.4Z two  spaced\n")
)
KEPT = (
    b"2026-12-07T09:00:00.1Z stdout PP_GPU_NODE_ADDR a 127.0.0.1:1\n"
    b"2026-12-07T09:00:00.2Z stderr stub stop signal: exiting\n"
    b"2026-12-07T09:00:00.3Z stdout one\n"
    b"2026-12-07T09:00:00.4Z stdout two  spaced\n"
)


@pytest.mark.parametrize("cut", [1, 5, 8, 9, 61, 4096])
def test_each_frame_is_kept_as_time_stream_text_however_the_stream_is_cut(pp_guard: ModuleType, cut: int) -> None:
    assert b"".join(pp_guard.frames(Response(STREAM, cut).read)) == KEPT


def test_a_frame_the_stream_ends_in_is_not_kept_half(pp_guard: ModuleType) -> None:
    cut_short = STREAM + frame(1, b"2026-12-07T09:00:00.5Z never whole\n")[:-5]
    assert b"".join(pp_guard.frames(Response(cut_short, 4096).read)) == KEPT


def test_a_record_that_cannot_be_appended_to_is_said_once_to_the_log_and_the_launcher(
    pp_guard: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """/dev/full: every append fails with "No space left on device", as a record on a full disk does. The guard's
    start refuses (the launch's error, nothing started); later, the first failure is said in the log (what `ps`,
    `wait` and `logs` read) and to the launcher's session, once."""
    told: list[str] = []
    monkeypatch.setattr(pp_guard, "RECORD", "/dev/full")
    monkeypatch.setattr(pp_guard, "FAULTS", [])
    monkeypatch.setattr(pp_guard, "TELL", [told.append])
    assert "No space left on device" in pp_guard.append_record("a line")
    pp_guard.say("owned " + "a" * 64)
    pp_guard.say("owned " + "b" * 64)
    log = capsys.readouterr().err.splitlines()
    faults = [line for line in log if line.startswith("record-fault: ")]
    assert len(faults) == 1 and "No space left on device" in faults[0], log
    assert told == [f"record-fault {faults[0].removeprefix('record-fault: ')}"]


def test_a_guards_record_fault_is_read_back_from_its_log() -> None:
    from pp_launch.adapters import guard

    lines = [b"owned " + b"a" * 64, b"record-fault: cannot append to the run's record /record/log: No space left"]
    assert guard.read_record("g", "r", lines).fault == "cannot append to the run's record /record/log: No space left"
    assert guard.read_record("g", "r", lines[:1]).fault == ""
