"""The fields a chain fills in a stage's command arguments and `--env` values (docs/chain.md, "A command, as docker
run's"): `{stage}` (its index), `{stages}` (how many), and `{first_peer}` (stage 0's first announced host:port;
empty on stage 0, which is the first peer). `{stage}` and `{stages}` are known when the chain is planned;
`{first_peer}` once stage 0 announced: the launcher fills it at create (`--bring-up in-turn`), or the hand-off
entry does when it gets its peers (`--handoff env`). Any other `{...}` is left as written (a command may carry
braces of its own: a JSON value, a Python f-string).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

STAGE = "{stage}"
STAGES = "{stages}"
FIRST_PEER = "{first_peer}"


def fill(text: str, values: Mapping[str, str]) -> str:
    """`text` with each field of `values` (`{name}` -> value) replaced; the rest left as written."""
    for field, value in values.items():
        text = text.replace(field, value)
    return text


def planned(stage: int, stages: int) -> dict[str, str]:
    """The fields known when the chain is planned."""
    return {STAGE: str(stage), STAGES: str(stages)}


def first_peer(direct: str | None) -> dict[str, str]:
    """`{first_peer}` from stage 0's announced addresses (`host:port[,host:port...]`): the first one; stage 0 itself
    has none (None: empty)."""
    return {FIRST_PEER: (direct or "").split(",")[0]}


def wants_first_peer(texts: Iterable[str]) -> bool:
    return any(FIRST_PEER in t for t in texts)
