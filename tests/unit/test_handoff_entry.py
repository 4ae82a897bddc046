"""The hand-off entry (core/chain/handoff.py) as /bin/sh runs it: it exports the peers and the variables it is told
to fill, fills {first_peer} in the command's arguments, and execs the command."""

from __future__ import annotations

import subprocess

from pp_launch.core.announce import StageAnnouncement
from pp_launch.core.chain import handoff

SHOW = 'printf "%s|" "$@"; echo; echo "M=$MASTER E=${EVIL-unset} F=${FIRST_PEER_DIRECT-unset}"'


def entry(lines: bytes, env: dict[str, str], *args: str) -> list[str]:
    argv = ["sh", "-c", handoff.ENTRY, "pp-handoff", "sh", "-c", SHOW, "x", *args]
    done = subprocess.run(argv, input=lines, capture_output=True, env={"PATH": "/usr/bin:/bin", **env}, check=True)
    return done.stdout.decode().splitlines()


def test_the_entry_fills_first_peer_in_the_arguments_and_only_the_variables_it_was_told() -> None:
    prev = StageAnnouncement(node_id_hex="ab" * 32, direct="127.0.0.1:5000")
    first = StageAnnouncement(node_id_hex="cd" * 32, direct="127.0.0.1:4000,10.0.0.1:4000")
    lines = handoff.env_lines(prev, first, {"MASTER": "at 127.0.0.1:4000", "EVIL": "x"})
    env = {handoff.FILLS_ENV: "MASTER", handoff.ARGS_ENV: "1", "MASTER": "at {first_peer}"}
    assert entry(lines, env, "--a={first_peer}", "{first_peer}{first_peer}", "{x}") == [
        "--a=127.0.0.1:4000|127.0.0.1:4000127.0.0.1:4000|{x}|",
        "M=at 127.0.0.1:4000 E=unset F=127.0.0.1:4000,10.0.0.1:4000",
    ]
    stage0 = entry(handoff.env_lines(None, None), {handoff.ARGS_ENV: "1"}, "--a={first_peer}")
    assert stage0 == ["--a=|", "M= E=unset F=unset"]  # stage 0 is the first peer: empty
    untouched = entry(handoff.env_lines(None, None), {}, "--a={first_peer}")
    assert untouched[0] == "--a={first_peer}|"  # no field asked for: the arguments as they are
