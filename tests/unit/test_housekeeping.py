"""`ps` over a fake engine: each container's row, whose it is (judged only where it can be), escaped text."""

from __future__ import annotations

import socket
import time

import pytest

from pp_launch.adapters import bringup, identity
from pp_launch.adapters.docker_engine import ContainerInfo
from pp_launch.app import housekeeping
from pp_launch.core import labels

HOST = socket.gethostname()
DEAD = 2**22 + 17  # above the default pid_max: no process has it


class FakeEngine:
    def __init__(self, *containers: ContainerInfo) -> None:
        self.items = list(containers)

    def containers(self, label_filters: list[str]) -> list[ContainerInfo]:
        def match(c: ContainerInfo, f: str) -> bool:  # as the engine filters: `key` or `key=value`
            key, _, value = f.partition("=")
            return key in c.labels and (not value or c.labels[key] == value)

        return [c for c in self.items if all(match(c, f) for f in label_filters)]


def box(name: str, run: str, stage: str, owner: str, gpus: str = "", launcher: str = "") -> ContainerInfo:
    lab = {labels.RUN: run, labels.STAGE: stage, labels.OWNER: owner, labels.GPUS: gpus}
    if launcher:
        lab[labels.LAUNCHER] = launcher
    return ContainerInfo(id=name * 4, name=name, image="img", state="running", created=int(time.time()) - 5, labels=lab)


def marker(run: str) -> ContainerInfo:
    return ContainerInfo(id=run * 4, name="m", image="img", state="created", created=0,
                         labels=bringup.marker_labels(run))  # fmt: skip


def test_rows_say_whose_each_container_is() -> None:
    me = identity.current_owner()
    dead = labels.Owner(HOST, DEAD, "1", me.pidns, me.boot).label()
    elsewhere = labels.Owner(HOST, DEAD, "1", "1", me.boot).label()
    engine = FakeEngine(
        box("a-1", "aaaaaaaaaaaa", "1", me.label(), "GPU-1,GPU-2"),
        box("a-0", "aaaaaaaaaaaa", "0", me.label()),
        box("b-0", "bbbbbbbbbbbb", "0", dead),
        box("c-0", "cccccccccccc", "0", elsewhere),
        box("d-0", "dddddddddddd", "0", labels.OWNER_DETACHED, launcher=dead),  # handed over: down's alone
        marker("dddddddddddd"),
        box("e-0", "0123456789ab", "0", labels.OWNER_DETACHED, launcher=dead),  # its launcher died while it came up
        box("f-0", "ffffffffffff", "²", f"{HOST}:²:1"),
        box("g-0", "gggggggggggg", "0", "compose:proj"),
        box("h-0", "hhhhhhhhhhhh", "0", labels.OWNER_DETACHED, launcher=me.label()),  # coming up, launcher alive
        box("lock", "iiiiiiiiiiii", labels.STAGE_LOCK, me.label()),
    )
    rows = housekeeping.list_stages(engine)  # type: ignore[arg-type]
    status = {r["container"]: (r["stage"], r["owner_status"]) for r in rows}
    assert status == {
        "a-0": (0, "alive"),
        "a-1": (1, "alive"),
        "b-0": (0, "gone"),
        "c-0": (0, "owner in another PID namespace: not judged"),
        "d-0": (0, "detached"),
        "e-0": (0, "gone"),
        "f-0": (None, "unknown: not ours to judge"),
        "g-0": (0, "compose"),
        "h-0": (0, "alive"),
        "lock": (None, "alive"),
    }
    assert "m" not in status  # a hand-over marker is not a stage
    order = [r["container"] for r in rows]
    assert order.index("a-1") == order.index("a-0") + 1  # by run, then stage
    assert next(r for r in rows if r["container"] == "a-1")["gpus"] == ["GPU-1", "GPU-2"]
    assert {c.name for c in housekeeping.orphans(engine)} == {"b-0", "e-0"}  # type: ignore[arg-type]
    table = housekeeping.render(rows)
    assert "iiiiiiiiiiii  lock" in table  # a launch placing its stages: it holds the engine's GPU lock


def test_the_table_escapes_what_labels_carry() -> None:
    engine = FakeEngine(box("x-0", "r\x1b[2J", "0", "h\x07:1:1"))
    text = housekeeping.render(housekeeping.list_stages(engine))  # type: ignore[arg-type]
    assert "\x1b" not in text and "\x07" not in text and "r\\x1b[2J" in text


def test_no_containers_says_so() -> None:
    assert housekeeping.render([]) == "no pp-launch containers"


@pytest.mark.parametrize(
    ("wanted", "result"),
    [("aaaa11112222", "aaaa11112222"), ("aaaa1", "aaaa11112222"), ("b", "bbbb00000000")],
)
def test_a_run_is_named_by_its_id_or_a_unique_prefix(wanted: str, result: str) -> None:
    assert housekeeping.resolve_run(wanted, {"aaaa11112222", "aaaa99990000", "bbbb00000000"}) == result


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        ("aaaa", "run 'aaaa' is ambiguous: aaaa11112222, aaaa99990000"),
        ("typo", "no run 'typo' here; runs: aaaa11112222, aaaa99990000 ('pp-launch ps' lists them)"),
    ],
)
def test_an_unknown_or_ambiguous_run_is_exit_2_naming_the_runs(wanted: str, message: str) -> None:
    from pp_launch.core import errors

    with pytest.raises(errors.ConfigError) as exc:
        housekeeping.resolve_run(wanted, {"aaaa11112222", "aaaa99990000"})
    assert str(exc.value) == message and exc.value.exit_code == 2


def test_a_hand_over_marker_left_by_a_run_that_ended_is_collected_not_one_whose_run_lives() -> None:
    me = identity.current_owner().label()
    live = box("l-0", "llllllllllll", "0", labels.OWNER_DETACHED, launcher=me)
    engine = FakeEngine(live, marker("llllllllllll"), marker("eeeeeeeeeeee"))
    assert [c.labels[labels.RUN] for c in housekeeping.orphans(engine)] == ["eeeeeeeeeeee"]  # type: ignore[arg-type]
    assert housekeeping.ended_markers(engine, "llllllllllll") == []  # type: ignore[arg-type]
