"""`ps` rows: one typed row from every site, `ps --json` giving the same keys whichever site made it, and the
table the CLI renders from them."""

from __future__ import annotations

import json

from pp_launch.app import on_ray
from pp_launch.app.rows import StageRow
from pp_launch.cli import tables
from pp_launch.cli.housekeeping_cmd import PS_FIELDS
from pp_launch.core import labels

BASE = (set(PS_FIELDS) - {"host", "exit_code"}) | {"labels"}  # what every row has, whatever its site


def live(**kw: object) -> StageRow:
    fields: dict[str, object] = dict(
        run="3f2a9c1b7d00", stage=0, container="pp-3f2a9c1b7d00-0", id="0123456789ab", image="img", owner="o",
        owner_status="alive", state="running", attempt=1, age_s=5,
    )  # fmt: skip
    fields.update(kw)
    return StageRow(**fields)  # type: ignore[arg-type]


def test_every_site_gives_the_same_keys_and_json_can_carry_them() -> None:
    ended = live(state="exited", owner_status="ended", status="Exited (3)", exit_code=3, id="")
    tags = {labels.STAGE: "1", labels.ATTEMPT: "2", labels.GPUS: "GPU-a,GPU-b", labels.OWNER: "detached"}
    on_a_node = on_ray._row("3f2a9c1b7d00", "node-a", "f" * 64, "pp-3f2a9c1b7d00-1", "running", tags)
    assert set(live().as_json()) == BASE
    assert set(live(host="gpu2").as_json()) == BASE | {"host"}
    assert set(ended.as_json()) == BASE | {"status", "exit_code"}
    assert set(on_a_node.as_json()) == BASE | {"host"}
    assert (on_a_node.stage, on_a_node.attempt, on_a_node.gpus, on_a_node.id) == (1, 2, ("GPU-a", "GPU-b"), "f" * 12)
    with_nvml = live(gpus=("GPU-a",), gpu_index=(3,), gpu_memory_used_mib=(512,), gpu_utilization_pct=(None,))
    doc = json.loads(json.dumps(with_nvml.as_json()))
    assert (doc["gpus"], doc["gpu_index"], doc["gpu_utilization_pct"]) == (["GPU-a"], [3], [None])


def test_the_table_shows_attempts_once_restarted_hosts_when_asked_and_an_ended_stages_status() -> None:
    plain = tables.render_ps([live(), live(stage=1, container="pp-3f2a9c1b7d00-1", uptime_s=7, address="h:1")])
    header = plain.splitlines()[0].split()
    assert "attempt" not in header and "host" not in header
    assert "h:1" in plain and "7s" in plain and "5s old" in plain
    again = tables.render_ps([live(attempt=2, host="gpu2"), live(state="exited", status="Exited (3)")])
    header = again.splitlines()[0].split()
    assert header[:4] == ["run", "stage", "attempt", "host"] and "Exited (3)" in again
    assert tables.render_ps([live(stage=None, role="lock")]).splitlines()[1].split()[1] == "lock"
