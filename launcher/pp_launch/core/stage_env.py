"""The stage environment (docs/formats.md): every name defined once, and how each stage's env is built."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from pp_launch.core.announce import AnnouncementError, StageAnnouncement, escape

STAGE = "STAGE"
NUM_STAGES = "NUM_STAGES"
PEER_NODE_ID = "PEER_NODE_ID"
PEER_DIRECT = "PEER_DIRECT"
FIRST_PEER_NODE_ID = "FIRST_PEER_NODE_ID"
FIRST_PEER_DIRECT = "FIRST_PEER_DIRECT"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NO_GPU = "void"
LIFELINE = "PP_LIFELINE"  # tells a stage entry that understands it that stdin is the launcher's lifeline
ATTEMPT = "PP_ATTEMPT"  # which attempt of its run the stage belongs to: 1, then 2... after a restart

# pp-gpu-node (docs/pp-gpu-node.md) and `chain --gpu-node`, which runs it as a child per stage
FORWARD_ENV = "PP_FORWARD_ENV"  # comma-separated names of further variables to forward
PARENT_LIFELINE = "PP_PARENT_LIFELINE"  # set for `chain --gpu-node` children: stdin is the launcher's lifeline
RUN_ENV = "PP_LAUNCH_RUN"  # set by `chain --gpu-node`: the child's container joins the chain's run

SEED_ADDR = "SEED_ADDR"  # the seed node's 64-hex id: swactor's pp-worker exits 2 without it
SEED_DIRECT = "SEED_DIRECT"
SEED_RELAY = "SEED_RELAY"

FORWARDED = (
    SEED_ADDR,
    SEED_DIRECT,
    SEED_RELAY,
    "MAX_TOKENS",
    "MODEL",
    "WORKER_CMD",
    "WORKER_SCRIPT",
    "PYTHON",
    "CUDA",
    "PP_STAGE_SECRET",
    "PP_WORKER_STUB",
    "PP_BOOT_DELAY_STAGE",
    "PP_BOOT_DELAY_SECS",
    "PP_FLEET_SINK",
    "PP_STAGE_DASHBOARD",
    "PP_STAGE_DASHBOARD_PORT_BASE",
)
FORWARDED_PREFIX = "SWACTOR_DIAG_"

# Where a stage is in the chain, and what it learns of its peers: the launcher sets these.
POSITION = (STAGE, NUM_STAGES)
HANDOFF = (PEER_NODE_ID, PEER_DIRECT, FIRST_PEER_NODE_ID, FIRST_PEER_DIRECT)

# The old docker-gpu-node.sh's own additions to the stage environment (pp-gpu-node forwards them too).
NODE_FORWARDED = (*POSITION, *HANDOFF, "WORKER_SCRIPT")

# Set by the launcher alone: a user value would break the hand-off or the GPU pinning.
RESERVED = frozenset({*POSITION, *HANDOFF, NVIDIA_VISIBLE_DEVICES, ATTEMPT})


def forwarded(environ: Mapping[str, str], extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The launcher's variables that every stage receives when they are set."""
    names = [*FORWARDED, *sorted(n for n in environ if n.startswith(FORWARDED_PREFIX)), *extra]
    return {name: environ[name] for name in names if name in environ}


def peer_env(prev: StageAnnouncement, first: StageAnnouncement) -> dict[str, str]:
    """Stage k >= 1: stage k-1's announcement, and stage 0's (the feedback edge last -> first)."""
    return {
        PEER_NODE_ID: prev.node_id_hex,
        PEER_DIRECT: prev.direct,
        FIRST_PEER_NODE_ID: first.node_id_hex,
        FIRST_PEER_DIRECT: first.direct,
    }


def peer_placeholders(stage: int) -> dict[str, str]:
    """What a dry run shows for values only known once the earlier stages announce."""
    prev, first = f"<from stage {stage - 1}>", "<from stage 0>"
    return {PEER_NODE_ID: prev, PEER_DIRECT: prev, FIRST_PEER_NODE_ID: first, FIRST_PEER_DIRECT: first}


def parse_assignment(text: str) -> tuple[str, str]:
    """NAME=VALUE, NAME a valid variable name; ValueError with a message otherwise."""
    name, sep, value = text.partition("=")
    if not sep or not name or not (name[0].isalpha() or name[0] == "_") or not name.replace("_", "a").isalnum():
        raise ValueError(f"{text!r} is not NAME=VALUE")
    if not name.isascii():
        raise ValueError(f"{name!r} is not an ASCII variable name")
    if name in RESERVED:
        raise ValueError(f"{name} is set by pp-launch itself and cannot be overridden")
    if "\0" in value:  # a process's environment cannot hold one: the engine would refuse the create
        raise ValueError(f"{name}'s value holds a NUL byte, which no environment can carry")
    return name, value


def parse_env_file(text: str, source: str, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """An --env-file, as docker reads one: `NAME=VALUE` per line, the value taken as it is (no quotes removed, no
    expansion); a bare `NAME` passes the caller's own value through (left out when unset); blank lines and lines
    starting with `#` are skipped. ValueError naming `source` and the line otherwise."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            name = line.rstrip()
            if name not in environ:
                if not name.replace("_", "a").isalnum():
                    raise ValueError(f"{source}, line {number}: {name!r} is not NAME=VALUE")
                continue
            line = f"{name}={environ[name]}"
        try:
            out.append(parse_assignment(line))
        except ValueError as exc:
            raise ValueError(f"{source}, line {number}: {exc}") from None
    return tuple(out)


def seed_env(addr: str | None, direct: str | None, relay: str | None) -> dict[str, str]:
    """SEED_ADDR / SEED_DIRECT / SEED_RELAY for every stage, checked as swactor's pp-worker would need them:
    the seed's node id is 64 hex digits, its direct addresses follow the announcement grammar (docs/formats.md),
    its relay is an http(s) URL. ValueError naming the variable otherwise."""
    env: dict[str, str] = {}
    if addr is not None:
        addr = addr.strip()
        if len(addr) != 64 or not all(ch in "0123456789abcdefABCDEF" for ch in addr):
            raise ValueError(f"{SEED_ADDR} {escape(addr)} is not the seed's node id (64 hex digits)")
        env[SEED_ADDR] = addr.lower()
    if direct is not None:
        try:
            StageAnnouncement("0" * 64, direct.strip())
        except AnnouncementError:
            raise ValueError(f"{SEED_DIRECT} {escape(direct)} is not host:port[,host:port...]") from None
        env[SEED_DIRECT] = direct.strip()
    if relay is not None:
        parts = urlsplit(relay.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or any(ch.isspace() for ch in relay.strip()):
            raise ValueError(f"{SEED_RELAY} {escape(relay)} is not an http(s) URL")
        env[SEED_RELAY] = relay.strip()
    return env
