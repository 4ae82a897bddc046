"""`pp-launch ps`: what pp-launch containers exist, and whether their owner is still there."""

from __future__ import annotations

import time
from typing import Any

from . import labels, sweep
from .docker_engine import Engine
from .lines import display


def owner_status(owner: str) -> str:
    if owner == labels.OWNER_DETACHED:
        return "detached"
    if owner.startswith(labels.OWNER_COMPOSE_PREFIX):
        return "compose"
    parsed = labels.Owner.parse(owner)
    if parsed is None:
        return "unknown: not ours to judge"
    if (why := parsed.judge_here()) is not None:
        return why
    return "alive" if parsed.is_alive() else "gone"


def list_stages(engine: Engine) -> list[dict[str, Any]]:
    now = time.time()
    rows = []
    for c in engine.containers([labels.RUN]):
        owner = c.labels.get(labels.OWNER, "")
        stage = c.labels.get(labels.STAGE, "")
        rows.append(
            {
                "run": c.labels.get(labels.RUN, ""),
                "stage": labels.ascii_int(stage),
                "container": c.name,
                "image": c.image,
                "gpus": [g for g in c.labels.get(labels.GPUS, "").split(",") if g],
                "owner": owner,
                "owner_status": owner_status(sweep.owner_of(c)),  # a detached run coming up: its launcher's
                "state": c.state,
                "age_s": max(0, int(now - c.created)),
            }
        )
    return sorted(rows, key=lambda r: (r["run"], r["stage"] if r["stage"] is not None else -1))


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no pp-launch containers"
    header = ("run", "stage", "container", "image", "gpus", "owner", "owner is", "state", "age")
    table = [header] + [
        (
            r["run"],
            str(r["stage"]),
            r["container"],
            r["image"],
            ",".join(g[:12] for g in r["gpus"]) or "-",
            r["owner"],
            r["owner_status"],
            r["state"],
            f"{r['age_s']}s",
        )
        for r in rows
    ]
    table = [tuple(display(cell.encode("utf-8", "surrogateescape")) for cell in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
