"""The hand-off of a chain brought up in parallel: every container is created and started at once;
what a stage learns from the stages before it reaches it later, on the stdin that is already its lifeline.

`env` (the default; swactor's contract): stage k >= 1 runs under ENTRY (stage 0 has no peers and runs its own
command, as every stage of a --rendezvous run does), a POSIX sh entry that reads
`NAME=value` lines of the hand-off (PEER_*/FIRST_PEER_* only, values already validated by the launcher) up to
DONE, exports them and execs the image's own entrypoint and command: the worker starts with exactly the
environment a sequential start gives it. If stdin ends first (the launcher is gone), it exits 1; a signal
while it waits ends it as any signal ends sh. tini stays PID 1; after the exec the worker is sh's successor.

`stdin` (opt-in, for workers that take their peers late): the worker starts at once with PP_HANDOFF=stdin and
no PEER_*; once the peers are known, stage k >= 1 reads these two lines on stdin (docs/formats.md grammar for
<node_id> and <direct>):

    PP_PEER <node_id> <direct>          stage k-1's announcement
    PP_FIRST_PEER <node_id> <direct>    stage 0's announcement
"""

from __future__ import annotations

from collections.abc import Mapping

from pp_launch.core import stage_env
from pp_launch.core.announce import StageAnnouncement

MODE_ENV = "PP_HANDOFF"  # set to "stdin" in the stage's environment in stdin mode
DONE = "PP_HANDOFF_DONE"
PEER = "PP_PEER"
FIRST_PEER = "PP_FIRST_PEER"

FILLS_ENV = "PP_HANDOFF_FILLS"  # the variables whose values carry {first_peer}: the hand-off sends them filled
ARGS_ENV = "PP_HANDOFF_ARGS"  # 1: the command's arguments carry {first_peer}, filled here from FIRST_PEER_DIRECT

ENTRY = f"""\
ok=
while IFS= read -r line; do
  case $line in
    {DONE}) ok=1; break ;;
    PEER_NODE_ID=*|PEER_DIRECT=*|FIRST_PEER_NODE_ID=*|FIRST_PEER_DIRECT=*) export "$line" ;;
    *=*) case " ${{{FILLS_ENV}-}} " in *" ${{line%%=*}} "*) export "$line" ;; esac ;;
  esac
done
if [ -z "$ok" ]; then
  echo "pp-handoff: stdin ended before the hand-off (the launcher is gone): not starting" >&2
  exit 1
fi
if [ -n "${{{ARGS_ENV}-}}" ]; then
  peer=${{FIRST_PEER_DIRECT%%,*}}
  for a do
    shift
    while :; do
      case $a in
        *"{{first_peer}}"*) a="${{a%%"{{first_peer}}"*}}$peer${{a#*"{{first_peer}}"}}" ;;
        *) break ;;
      esac
    done
    set -- "$@" "$a"
  done
fi
exec "$@"
"""
ENTRYPOINT = ("/bin/sh", "-c", ENTRY, "pp-handoff")


def env_lines(
    prev: StageAnnouncement | None, first: StageAnnouncement | None, filled: Mapping[str, str] | None = None
) -> bytes:
    """What stage k's entry reads in `env` mode: its PEER_*/FIRST_PEER_* (none for stage 0), the variables whose
    `{first_peer}` is filled now (`filled`: their names are in the stage's FILLS_ENV), then DONE. A value with a
    line break cannot be one line: it is left as it was planned."""
    lines = []
    if prev is not None and first is not None:
        lines = [f"{k}={v}" for k, v in stage_env.peer_env(prev, first).items()]
    lines += [f"{k}={v}" for k, v in (filled or {}).items() if "\n" not in v and "\r" not in v]
    return "".join(f"{line}\n" for line in [*lines, DONE]).encode()


def peer_lines(prev: StageAnnouncement, first: StageAnnouncement) -> bytes:
    """What a stage k >= 1 reads in `stdin` mode."""
    return f"{PEER} {prev.node_id_hex} {prev.direct}\n{FIRST_PEER} {first.node_id_hex} {first.direct}\n".encode()


def wrapped_command(entrypoint: list[str] | None, command: list[str] | None) -> list[str]:
    """The argv the entry execs: the image's (or the user's) entrypoint, then the command, as the engine
    would have run them."""
    return [*(entrypoint or []), *(command or [])]
