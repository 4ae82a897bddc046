from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pp_launch.core.lines import Line, LineSplitter, display


def test_lines_split_across_chunks() -> None:
    s = LineSplitter(100)
    assert list(s.feed(b"ab")) == []
    assert list(s.feed(b"c\nde\n\nf")) == [Line(b"abc"), Line(b"de"), Line(b"")]
    assert list(s.close()) == [Line(b"f")]


def test_over_long_line_comes_out_in_bounded_pieces_and_nothing_is_lost() -> None:
    s = LineSplitter(4)
    out = list(s.feed(b"0123456789\nxy\n"))
    assert out == [
        Line(b"0123", complete=False),
        Line(b"4567", continued=True, complete=False),
        Line(b"89", continued=True),
        Line(b"xy"),
    ]


@given(st.lists(st.binary(max_size=50), max_size=20), st.integers(min_value=1, max_value=16))
def test_pieces_reassemble_to_the_input_and_stay_bounded(chunks: list[bytes], limit: int) -> None:
    s = LineSplitter(limit)
    pieces = [line for chunk in chunks for line in s.feed(chunk)] + list(s.close())
    assert all(len(p.data) <= limit for p in pieces)
    rebuilt = b"".join(p.data + (b"\n" if p.complete else b"") for p in pieces)
    data = b"".join(chunks)
    assert rebuilt == data or rebuilt == data + b"\n"


def test_display_escapes_control_characters_and_bad_utf8() -> None:
    assert display(b"plain\ttext") == "plain\ttext"
    assert display(b"\x1b[31mred") == "\\x1b[31mred"
    assert display(b"\xff\xfeok") == "\\xff\\xfeok"
    assert display("héllo".encode()) == "héllo"
