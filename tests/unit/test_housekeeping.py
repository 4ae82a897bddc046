"""`ps` over a fake engine: each container's row, whose it is (judged only where it can be), escaped text."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import time

import pytest

from pp_launch.adapters import guard, identity
from pp_launch.adapters.docker_engine import ContainerInfo, VolumeInfo
from pp_launch.app import housekeeping
from pp_launch.cli import tables
from pp_launch.core import labels

HOST = socket.gethostname()
DEAD = 2**22 + 17  # above the default pid_max: no process has it
GUARD_IMAGE_ID = "sha256:" + "9" * 64


class FakeEngine:
    """The engine's answers at the I/O boundary: containers by label, inspect, a container's log lines, image ids."""

    def __init__(
        self, *containers: ContainerInfo, logs: dict[str, list[str]] | None = None, images: dict[str, str] | None = None
    ) -> None:
        self.items = list(containers)
        self.logs = logs or {}
        self.images = images or {}  # container id -> its image id (a guard's is GUARD_IMAGE_ID)
        self.records: dict[str, tuple[dict[str, str], list[str]]] = {}  # record volumes: name -> (labels, lines)
        self.helpers: list[list[str]] = []  # each helper container's argv
        self.copies: list[tuple[str, str]] = []  # each file read out of a container

    def volumes(self, label_filters: list[str]) -> list[VolumeInfo]:
        def match(lab: dict[str, str], f: str) -> bool:
            key, _, value = f.partition("=")
            return key in lab and (not value or lab[key] == value)

        return [
            VolumeInfo(name, lab, int(time.time()))
            for name, (lab, _) in self.records.items()
            if all(match(lab, f) for f in label_filters)
        ]

    def read_file(self, ref: str, path: str) -> bytes | None:
        """`docker cp` of a container's file: the record it mounts, where a stage sees it."""
        self.copies.append((ref, path))
        mounted = next(c.record for c in self.items if c.id == ref)
        if not mounted or path != "/run/pp-launch-record/log":
            return None
        return "".join(f"{line}\n" for line in self.records[mounted][1]).encode()

    def run_helper(self, image: str, argv: list[str], *_: object, binds: dict[str, str]) -> tuple[int, bytes, bytes]:
        """As the reading helper's shell loop would print each mounted record."""
        self.helpers.append(argv)
        out = "".join(
            f"=== {argv[-1]} {inside.rsplit('/', 1)[1]}\n" + "".join(f"{line}\n" for line in self.records[name][1])
            for name, inside in sorted(binds.items(), key=lambda item: item[1])
        )
        return 0, out.encode(), b""

    def containers(self, label_filters: list[str]) -> list[ContainerInfo]:
        def match(c: ContainerInfo, f: str) -> bool:  # as the engine filters: `key` or `key=value`
            key, _, value = f.partition("=")
            return key in c.labels and (not value or c.labels[key] == value)

        return [c for c in self.items if all(match(c, f) for f in label_filters)]

    def image_id(self, name: str) -> str | None:
        return GUARD_IMAGE_ID

    def inspect(self, ref: str) -> dict[str, object] | None:
        return {"Image": self.images.get(ref, "sha256:other")}

    def log_lines(self, ref: str) -> list[bytes]:
        return [line.encode() for line in self.logs.get(ref, [])]


def box(name: str, run: str, stage: str, owner: str, gpus: str = "") -> ContainerInfo:
    lab = {labels.RUN: run, labels.STAGE: stage, labels.OWNER: owner, labels.GPUS: gpus}
    ref = hashlib.sha256(name.encode()).hexdigest()  # 64 hex digits, as the engine's ids
    return ContainerInfo(id=ref, name=name, image="img", state="running", created=int(time.time()) - 5, labels=lab)


def record_of(run: str) -> str:
    """The run's record volume, which its guard keeps and its stages mount."""
    return f"pp-launch-record-{run}-0a0b0c0d"


def guarded(*containers: ContainerInfo, forged: tuple[ContainerInfo, ...] = (), detached: bool = False) -> FakeEngine:
    """An engine where each run of `containers` has its guard, which recorded them; `forged` carry the same
    labels but no guard recorded them (and one of them calls itself a guard, from another image)."""
    runs = sorted({c.labels[labels.RUN] for c in containers})
    containers = tuple(dataclasses.replace(c, record=record_of(c.labels[labels.RUN])) for c in containers)
    guards = [dataclasses.replace(box(f"guard-{r}", r, labels.STAGE_GUARD, "x"), keeps=record_of(r)) for r in runs]
    logs = {
        g.id: [f"owned {c.id}" for c in containers if c.labels[labels.RUN] == g.labels[labels.RUN]]
        + (["detached"] if detached else [])
        for g in guards
    }
    return FakeEngine(*containers, *guards, *forged, logs=logs, images={g.id: GUARD_IMAGE_ID for g in guards})


def test_rows_say_whose_each_container_is_and_what_no_guard_vouches_for() -> None:
    me = identity.current_owner()
    dead = labels.Owner(HOST, DEAD, "1", me.pidns, me.boot).label()
    elsewhere = labels.Owner(HOST, DEAD, "1", "1", me.boot).label()
    forged_guard = box("fake-guard", "bbbbbbbbbbbb", labels.STAGE_GUARD, dead)
    engine = guarded(
        box("a-1", "aaaaaaaaaaaa", "1", me.label(), "GPU-1,GPU-2"),
        box("a-0", "aaaaaaaaaaaa", "0", me.label()),
        box("b-0", "bbbbbbbbbbbb", "0", dead),
        box("c-0", "cccccccccccc", "0", elsewhere),
        box("d-0", "dddddddddddd", "0", labels.OWNER_DETACHED),
        box("f-0", "ffffffffffff", "²", f"{HOST}:²:1"),
        forged=(
            box("forged", "aaaaaaaaaaaa", "2", me.label()),  # someone else's, carrying run a's labels
            forged_guard,
            box("lock", "iiiiiiiiiiii", labels.STAGE_LOCK, me.label()),
        ),
    )
    engine.logs[forged_guard.id] = ["owned " + "z" * 64]
    rows = housekeeping.list_stages(engine)  # type: ignore[arg-type]
    status = {r.container: (r.stage, r.owner_status) for r in rows}
    unrecorded = "unrecorded"
    assert status == {
        "a-0": (0, "alive"),
        "a-1": (1, "alive"),
        "b-0": (0, "gone"),
        "c-0": (0, "other-pidns"),
        "d-0": (0, "detached"),
        "f-0": (None, "unknown"),
        "forged": (2, unrecorded),
        "fake-guard": (None, unrecorded),  # another image: no guard of ours, whatever its labels say
        "lock": (None, "alive"),
    }
    assert not any(r.container.startswith("guard-") for r in rows)  # a run's guard is no row of its own
    order = [r.container for r in rows]
    assert order.index("a-1") == order.index("a-0") + 1  # by run, then stage
    assert next(r for r in rows if r.container == "a-1").gpus == ("GPU-1", "GPU-2")
    assert {c.name for c in housekeeping.unrecorded(engine)} == {"forged", "fake-guard"}  # type: ignore[arg-type]
    vouched = housekeeping.vouch(engine, engine.containers([f"{labels.RUN}=aaaaaaaaaaaa"]))  # type: ignore[arg-type]
    assert sorted(c.name for c in vouched.ours) == ["a-0", "a-1"]  # what `down` acts on: never the forged one
    table = tables.render_ps(rows)
    assert "iiiiiiiiiiii  lock" in table  # a launch placing its stages: it holds the engine's GPU lock


def test_a_guard_look_alike_is_never_a_runs_guard_only_one_a_launcher_recorded_is() -> None:
    """A neighbour's container of the guard's image with the run's labels, even mounting a record volume under the
    run's record name, is not the run's guard: `down` never signals it (it is not among `guards`), it is named as
    unrecorded. The real guard is vouched by the record the run's stages mount, or, with no stage yet (a run still
    placing), by this user's own record of the run's creates."""
    me = identity.current_owner().label()
    run = "aaaaaaaaaaaa"
    engine = guarded(box("a-0", run, "0", me))
    real = next(c for c in engine.items if c.name == f"guard-{run}")
    forged = dataclasses.replace(
        box("look-alike", run, labels.STAGE_GUARD, me), keeps=f"pp-launch-record-{run}-deadbeef"
    )
    engine.items.append(forged)
    engine.images[forged.id] = GUARD_IMAGE_ID
    engine.logs[forged.id] = [f"owned {c.id}" for c in engine.items]  # it claims everything
    found = engine.containers([f"{labels.RUN}={run}"])
    vouched = housekeeping.vouch(engine, found, mine={})  # type: ignore[arg-type]
    assert [g.id for g in vouched.guards] == [real.id]
    assert [c.name for c in vouched.unrecorded] == ["look-alike"] and [c.name for c in vouched.ours] == ["a-0"]
    placing = [c for c in found if c.name != "a-0"]  # no stage yet: only the launcher's own record vouches
    assert housekeeping.vouch(engine, placing, mine={}).guards == ()  # type: ignore[arg-type]
    mine = {run: {real.id}}
    assert [g.id for g in housekeeping.vouch(engine, placing, mine=mine).guards] == [real.id]  # type: ignore[arg-type]


def test_a_run_whose_guard_is_gone_is_vouched_by_its_record_volume_for_what_mounts_it() -> None:
    """No running guard: the run's record volume names its stages; a container is the run's only when the record
    names it and it mounts that very volume. A neighbour's container with the run's labels, mounting nothing, and
    a record naming a container that does not mount it, vouch for nothing."""
    run, other = "rrrrrrrrrrrr", "oooooooooooo"
    volume = guard.record_volume(run, "0a0b0c0d")
    mounts = {"volumes": (volume,)}
    s0 = dataclasses.replace(box("r-0", run, "0", labels.OWNER_DETACHED), **mounts)
    s1 = dataclasses.replace(box("r-1", run, "1", labels.OWNER_DETACHED), **mounts)
    forged = box("forged", run, "2", labels.OWNER_DETACHED)  # the run's labels, not its volume
    elsewhere = dataclasses.replace(box("o-0", other, "0", labels.OWNER_DETACHED), **mounts)  # another run's labels
    engine = FakeEngine(s0, s1, forged, elsewhere)
    named = [f"owned {c.id}" for c in (s0, s1, forged, elsewhere)]
    engine.records[volume] = (guard.record_labels(run, labels.OWNER_DETACHED), [*named, "detached"])
    rows = housekeeping.list_stages(engine)  # type: ignore[arg-type]
    status = {r.container: r.owner_status for r in rows}
    assert status == {"r-0": "guard-gone", "r-1": "guard-gone", "forged": "unrecorded", "o-0": "unrecorded"}
    vouched = housekeeping.vouch(engine, engine.containers([labels.RUN]), mine={})  # type: ignore[arg-type]
    assert sorted(c.name for c in vouched.ours) == ["r-0", "r-1"]
    assert [r.run for r in vouched.guardless] == [run] and vouched.guardless[0].detached
    assert len(engine.helpers) == 2  # one helper read every record needed, once per look
    table = tables.render_ps(rows)
    assert "its guard is gone: 'pp-launch down RUN' ends it" in table


def test_a_record_a_listed_stage_mounts_is_read_from_that_stage_without_a_helper() -> None:
    """Where a listed stage mounts the record at the stage's place for it, the record is copied out of that stage
    (`docker cp`); a container mounting it elsewhere (a neighbour could put any file at that path) is never read."""
    run = "kkkkkkkkkkkk"
    volume = guard.record_volume(run, "01020304")
    elsewhere = dataclasses.replace(
        box("k-9", run, "9", labels.OWNER_DETACHED), volumes=(volume,)
    )  # mounted, not there
    s0 = dataclasses.replace(box("k-0", run, "0", labels.OWNER_DETACHED), volumes=(volume,), record=volume)
    engine = FakeEngine(elsewhere, s0)
    engine.records[volume] = (guard.record_labels(run, labels.OWNER_DETACHED), [f"owned {s0.id}", "detached"])
    vouched = housekeeping.vouch(engine, engine.containers([labels.RUN]), mine={})  # type: ignore[arg-type]
    assert [c.name for c in vouched.ours] == ["k-0"] and [c.name for c in vouched.unrecorded] == ["k-9"]
    assert engine.copies == [(s0.id, "/run/pp-launch-record/log")] and engine.helpers == []


def test_a_dead_container_mounting_its_runs_record_is_the_runs_and_a_dead_lookalike_is_not() -> None:
    """A crashed engine can leave a create it never answered Dead: with the run's label and the run's record mounted,
    it is the run's (down and gc remove it); Dead with the labels alone, or running with the record, it is not."""
    run = "dddddddddddd"
    volume = guard.record_volume(run, "0f0f0f0f")
    left = dataclasses.replace(box("?", run, labels.STAGE_GUARD, "x"), state="dead", volumes=(volume,))
    lookalike = dataclasses.replace(box("fake", run, "0", "x"), state="dead")
    alive = dataclasses.replace(box("live", run, "1", "x"), volumes=(volume,))
    other = dataclasses.replace(box("o", "eeeeeeeeeeee", "0", "x"), state="dead", volumes=(volume,))  # another run's
    engine = FakeEngine(left, lookalike, alive, other)
    vouched = housekeeping.vouch(engine, engine.containers([labels.RUN]), mine={})  # type: ignore[arg-type]
    assert [c.name for c in vouched.ours] == ["?"]
    assert sorted(c.name for c in vouched.unrecorded) == ["fake", "live", "o"]


def test_a_record_whose_guard_runs_is_read_from_the_guard_not_the_volume() -> None:
    me = identity.current_owner().label()
    engine = guarded(box("g-0", "gggggggggggg", "0", me))
    engine.records[guard.record_volume("gggggggggggg", "0a0b0c0d")] = (guard.record_labels("gggggggggggg", me), [])
    housekeeping.vouch(engine, engine.containers([labels.RUN]), mine={})  # type: ignore[arg-type]
    assert engine.helpers == []


def test_a_live_lock_is_never_among_what_down_acts_on() -> None:
    me = identity.current_owner().label()
    engine = guarded(box("s-0", "ssssssssssss", "0", me), forged=(box("lock", "ssssssssssss", labels.STAGE_LOCK, me),))
    vouched = housekeeping.vouch(engine, engine.containers([labels.RUN]))  # type: ignore[arg-type]
    assert [c.name for c in vouched.ours] == ["s-0"] and vouched.unrecorded == ()


def test_the_table_escapes_what_labels_carry() -> None:
    engine = FakeEngine(box("x-0", "r\x1b[2J", "0", "h\x07:1:1"))
    text = tables.render_ps(housekeeping.list_stages(engine))  # type: ignore[arg-type]
    assert "\x1b" not in text and "\x07" not in text and "r\\x1b[2J" in text


def test_no_containers_says_so() -> None:
    assert tables.render_ps([]) == "no pp-launch containers"


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


def test_hosts_that_do_not_answer_are_each_said_and_the_command_goes_on() -> None:
    """Housekeeping reaches its hosts at once, as a launch does; unlike a launch it goes on without one that does not
    answer: each is said ("error: ..."), in the order named, and the command then exits 1 (`failed`)."""
    closed = []
    for _ in range(2):  # two ports with nothing listening: refused at once
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        closed.append(f"tcp://127.0.0.1:{s.getsockname()[1]}")
        s.close()
    said: list[str] = []
    engines = housekeeping.Engines(tuple(closed), False, None, said.append)
    assert engines.reached == [] and engines.failed
    assert [line.split(":")[0] for line in said] == ["error", "error"]
    assert [closed.index(next(c for c in closed if c.rsplit(":", 1)[1] in line)) for line in said] == [0, 1]
    assert engines.close() is True


def test_a_run_still_placing_is_found_by_its_id_but_not_named_as_a_run() -> None:
    """A run whose guard alone is up (still placing) carries a run id but has no stage yet: `ps` does not list it,
    and neither does the message for a run that is not there; `down` of its id still reaches it."""
    from pp_launch.core import errors

    runs, shown = {"aaaa11112222", "5pare0000000"}, {"aaaa11112222"}
    assert housekeeping.resolve_run("5pare", runs, shown) == "5pare0000000"
    with pytest.raises(errors.ConfigError) as exc:
        housekeeping.resolve_run("typo", runs, shown)
    assert str(exc.value) == "no run 'typo' here; runs: aaaa11112222 ('pp-launch ps' lists them)"
    with pytest.raises(errors.ConfigError, match="runs: none"):
        housekeeping.resolve_run("typo", {"5pare0000000"}, set())


def test_down_says_the_runs_it_stopped_and_those_still_placing() -> None:
    """`down --all` over a run with stages and a run still placing (its guard alone): both counted, the placing one
    named, not "stopped and removed N containers" alone."""
    from pp_launch.adapters.guard import GuardRecord
    from pp_launch.app.docker_runs import _down_words

    stages = [
        ContainerInfo(f"id{k}", f"pp-aaa-{k}", "img", "running", 0, {"pp-launch.run": "aaa", "pp-launch.stage": str(k)})
        for k in range(2)
    ]
    guards = (GuardRecord("g1", "aaa", ("id0", "id1"), False), GuardRecord("g2", "bbb", (), False))
    stopping, stopped = _down_words(stages, guards, "")
    assert stopping == "stopping 2 containers: pp-aaa-0, pp-aaa-1; and 1 run still placing, through its guard: bbb"
    assert stopped == "stopped and removed 2 containers of 1 run; stopped 1 run still placing (bbb)"
    only_placing = _down_words([], guards[1:], " on host h")
    assert only_placing == (
        "stopping 0 containers on host h: none yet (still placing)",
        "stopped and removed 0 containers on host h; stopped 1 run still placing (bbb)",
    )
