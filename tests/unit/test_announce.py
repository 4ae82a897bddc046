"""The announcement grammar (docs/formats.md), with property-based fuzzing."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp_launch.core.announce import PREFIX, AnnouncementError, StageAnnouncement, parse_line

NODE = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "direct",
    [
        "127.0.0.1:1",
        "127.0.0.1:65535",
        "[::1]:8080",
        "[fe80::1%eth0]:1".replace("%eth0", ""),
        "node-3.cluster.local:5000",
        "localhost:9000,127.0.0.1:9001,[::1]:9002",
    ],
)
def test_valid_lines(direct: str) -> None:
    a = parse_line(f"  {PREFIX} {NODE} {direct}\r\n")
    assert a == StageAnnouncement(NODE, direct)
    assert a is not None and a.node_id_short == NODE[:8]


@pytest.mark.parametrize("line", ["", "hello", "pp_gpu_node_addr x y", " PP_GPU_NODE", "# PP_GPU_NODE_ADDR"])
def test_lines_without_the_prefix_are_not_announcements(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        f"{PREFIX}",
        f"{PREFIX} {NODE}",
        f"{PREFIX} {NODE} 127.0.0.1:1 extra",
        f"{PREFIX}  {NODE} 127.0.0.1:1",  # two spaces
        f"{PREFIX}\t{NODE}\t127.0.0.1:1",
        f"{PREFIX} {NODE.upper()} 127.0.0.1:1",  # uppercase hex
        f"{PREFIX} {NODE[:-1]} 127.0.0.1:1",  # 63 digits
        f"{PREFIX} {NODE}0 127.0.0.1:1",  # 65 digits
        f"{PREFIX} {NODE[:-1]}g 127.0.0.1:1",  # near-miss: not hex
        f"{PREFIX} {NODE} 127.0.0.1:0",
        f"{PREFIX} {NODE} 127.0.0.1:65536",
        f"{PREFIX} {NODE} 127.0.0.1",
        f"{PREFIX} {NODE} 256.0.0.1:80",
        f"{PREFIX} {NODE} ::1:80",  # IPv6 must be bracketed
        f"{PREFIX} {NODE} [::1:80",
        f"{PREFIX} {NODE} 127.0.0.1:80,",
        f"{PREFIX} {NODE} 127.0.0.1:80;rm",
        f"{PREFIX} {NODE} $(id):80",
        f"{PREFIX} {NODE} `id`:80",
        f"{PREFIX} {NODE} a\x00b:80",
        f"{PREFIX} {NODE} -bad-.host:80",
        f"{PREFIX}X {NODE} 127.0.0.1:80",
    ],
)
def test_prefix_lines_that_break_the_grammar_are_errors(line: str) -> None:
    with pytest.raises(AnnouncementError) as exc:
        parse_line(line)
    assert "malformed announcement" in str(exc.value)


def test_error_message_is_shell_escaped_with_control_characters_visible() -> None:
    with pytest.raises(AnnouncementError) as exc:
        parse_line(f"{PREFIX} {NODE} x:1;$(rm -rf /)\x1b[31m")
    msg = str(exc.value)
    assert "\x1b" not in msg and "\\x1b" in msg
    assert "'PP_GPU_NODE_ADDR " in msg  # quoted as one shell word


HOST_CHARS = string.ascii_letters + string.digits + ".-:[],;$`'\"\\ \t\x00\x1b\n%/"


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_and_any_result_is_valid(data: bytes) -> None:
    line = (PREFIX.encode() + b" " + data).decode("utf-8", "backslashreplace")
    try:
        a = parse_line(line)
    except AnnouncementError:
        return
    assert a is not None
    StageAnnouncement(a.node_id_hex, a.direct)  # re-validates


@settings(max_examples=500)
@given(st.text(alphabet=HOST_CHARS, max_size=80), st.integers(min_value=-5, max_value=70000))
def test_accepted_direct_values_hold_no_space_control_or_shell_characters(host: str, port: int) -> None:
    try:
        a = parse_line(f"{PREFIX} {NODE} {host}:{port}")
    except AnnouncementError:
        return
    assert a is not None
    assert not set(a.direct) & set(" \t\n\x00\x1b;$`'\"\\/%")
    assert all(1 <= int(item.rpartition(":")[2]) <= 65535 for item in a.direct.split(","))


@settings(max_examples=300)
@given(st.text(alphabet="0123456789abcdefABCDEFgx ", min_size=60, max_size=68))
def test_near_miss_node_ids(node: str) -> None:
    line = f"{PREFIX} {node} 127.0.0.1:80"
    valid = len(node) == 64 and all(c in "0123456789abcdef" for c in node)
    if valid:
        assert parse_line(line) == StageAnnouncement(node, "127.0.0.1:80")
    else:
        with pytest.raises(AnnouncementError):
            parse_line(line)


def test_a_very_long_line_is_rejected_quickly() -> None:
    with pytest.raises(AnnouncementError):
        parse_line(f"{PREFIX} {NODE} " + "a" * 1_000_000 + ":80")


# Valid lines, generated from the grammar of docs/formats.md: each must parse, to exactly the values it was made of.
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ipv6 = st.ip_addresses(v=6).map(lambda a: f"[{a}]")
label = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?", fullmatch=True)
dns = st.lists(label, min_size=1, max_size=4).map(".".join).filter(lambda h: not h.replace(".", "").isdigit())
hostport = st.tuples(st.one_of(ipv4, ipv6, dns), st.integers(1, 65535)).map(lambda hp: f"{hp[0]}:{hp[1]}")
direct = st.lists(hostport, min_size=1, max_size=5).map(",".join)
space = st.sampled_from(["", " ", "\t", "  \t", "\r"])


@given(hex64, direct, space, space)
def test_every_valid_line_parses_to_the_values_it_was_made_of(node: str, addrs: str, before: str, after: str) -> None:
    parsed = parse_line(f"{before.replace(chr(13), '')}PP_GPU_NODE_ADDR {node} {addrs}{after}")
    assert parsed is not None
    assert (parsed.node_id_hex, parsed.direct, parsed.node_id_short) == (node, addrs, node[:8])
