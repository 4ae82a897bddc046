"""A run's record as its guards write it (their log, and the run's record volume): read strictly, each line once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from pp_launch.adapters import guard, host_state
from pp_launch.adapters.docker_engine import VolumeInfo, engine_time

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_record_read_back_keeps_what_was_owned_and_each_end_once() -> None:
    lines = [
        f"owned {A}",
        f"owned {B}",
        f"owned {A}",  # a guard put in another's place says it again
        "detached",
        f"oom {B}",
        f"ended {A} 0 1 3 1765000000 run-0",
        f"ended {A} 0 1 3 1765000000 run-0",
        f"ended {B} 1 1 137 1765000001 run 1 with spaces",
        f"ended {C} 2 1 0 1765000002 not-owned",  # never owned: not the run's
        "owned short",
        "ended x",
        "torn down",
    ]
    record = guard.read_record("", "r1", [line.encode() for line in lines], "pp-launch-record-r1")
    assert record.owned == (A, B)
    assert record.detached and record.over and record.volume == "pp-launch-record-r1"
    assert [(e.id, e.stage, e.exit_code, e.at, e.name, e.oom) for e in record.ends] == [
        (A, "0", 3, 1765000000, "run-0", False),
        (B, "1", 137, 1765000001, "run 1 with spaces", True),
    ]


def test_a_record_with_nothing_in_it_is_an_empty_record() -> None:
    record = guard.read_record("", "r2", [])
    assert (record.owned, record.ends, record.detached, record.over) == ((), (), False, False)


def test_an_uppercase_or_short_id_is_not_owned() -> None:
    record = guard.read_record("", "r3", [f"owned {A.upper()}".encode(), f"owned {A[:63]}".encode()])
    assert record.owned == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2026-12-06T04:47:07Z", 1796532427.0),
        ("2026-12-06T04:47:07.250000000Z", 1796532427.25),  # the engine's nanoseconds
        ("2026-12-06T05:47:07.123456+01:00", 1796532427.123456),  # an offset
        ("2026-12-06T03:17:07.5-01:30", 1796532427.5),
        ("2026-12-06T04:47:07.75", 1796532427.75),  # no zone (as `logs` keeps an instant): UTC
        ("0001-01-01T00:00:00Z", 0.0),  # a container never started
        ("yesterday", 0.0),
        ("", 0.0),
    ],
)
def test_the_engines_times_read_in_utc_and_with_an_offset(text: str, seconds: float) -> None:
    assert engine_time(text) == pytest.approx(seconds, abs=1e-6)


def test_a_record_volume_is_named_for_its_run_and_labelled_as_a_record() -> None:
    assert guard.record_volume("0123abcd", "00ff00ff") == "pp-launch-record-0123abcd-00ff00ff"
    assert guard.is_record_of("pp-launch-record-0123abcd-00ff00ff", "0123abcd")
    for name in ("pp-launch-record-0123abcd", "pp-launch-record-0123abcd-00FF00FF", "pp-launch-record-0123abcd-0",
                 "pp-launch-record-0123abce-00ff00ff", "x-pp-launch-record-0123abcd-00ff00ff"):  # fmt: skip
        assert not guard.is_record_of(name, "0123abcd"), name
    assert not guard.is_record_of("pp-launch-record--00ff00ff", "")
    made = guard.record_labels("0123abcd", "detached")
    assert made["pp-launch.run"] == "0123abcd" and made["pp-launch.stage"] == "record"
    assert made["pp-launch.owner"] == "detached" and made["pp-launch.launcher"]


class _Records:
    """An engine with a run's record volume (this user's) and a neighbour's under the run's record name, as
    directories; its helper runs the reader's own script with `sh` over them (at /records/N there)."""

    OWN, FORGED = "pp-launch-record-r1-0a0b0c0d", "pp-launch-record-r1-ffffffff"
    address = "unix:///var/run/docker.sock"

    def __init__(self, root: Path, files: dict[str, dict[str, str]]) -> None:
        self.root, self.files, self.binds = root, files, {}

    def volumes(self, selector: list[str]) -> list[VolumeInfo]:
        runs = {n: n.removeprefix("pp-launch-record-").rsplit("-", 1)[0] for n in self.files}
        return [VolumeInfo(n, {"pp-launch.run": run, "pp-launch.stage": "record"}, 0) for n, run in runs.items()]

    def image_id(self, image: str) -> str:
        return "sha256:" + "e" * 64

    def run_helper(self, image: str, argv: list[str], *args: object, **kwargs: object) -> tuple[int, bytes, bytes]:
        self.binds = dict(kwargs["binds"])  # type: ignore[call-overload]
        for name, inside in self.binds.items():
            at = self.root / inside.lstrip("/")
            at.mkdir(parents=True)
            for file, text in self.files.get(name, {}).items():
                (at / file).write_text(text)
        script = argv[2].replace("/records/", f"{self.root}/records/")
        done = subprocess.run([*argv[:2], script, *argv[3:]], capture_output=True, check=False)
        return done.returncode, done.stdout, done.stderr


def test_a_detached_runs_kept_lines_come_from_its_own_record_only_oldest_file_first(tmp_path: Path) -> None:
    own = {
        "log": "owned " + A + "\ndetached\n",
        "stage-1.log.1": "2026-12-07T09:00:00.1Z stdout older\n",
        "stage-0.log": "2026-12-07T09:00:01.2Z stderr a\n2026-12-07T09:00:02.3Z stdout b c\n",
        "stage-1.log": "2026-12-07T09:00:03Z stdout newer\n=== 0123456789abcdef stage-0.log\nx stdout guessed\n",
    }
    forged = {"stage-0.log": "2026-12-07T09:00:09Z stdout FORGED\n"}
    engine = _Records(tmp_path, {_Records.OWN: own, _Records.FORGED: forged})
    kept = guard.kept_lines(engine, "r1", {engine.OWN})  # type: ignore[arg-type]
    assert list(engine.binds) == [engine.OWN]  # the neighbour's volume is never read
    assert kept == {
        0: [b"2026-12-07T09:00:01.2Z stderr a", b"2026-12-07T09:00:02.3Z stdout b c"],
        1: [
            b"2026-12-07T09:00:00.1Z stdout older",
            b"2026-12-07T09:00:03Z stdout newer",
            b"=== 0123456789abcdef stage-0.log",  # a line of the record's own: it opens no part (the token is not it)
            b"x stdout guessed",
        ],
    }
    assert guard.kept_lines(engine, "r1", set()) == {}  # type: ignore[arg-type]  # none of this user's: no helper


def test_a_records_own_lines_cannot_pass_for_another_records(tmp_path: Path) -> None:
    """Records are read together in one helper, each part opened by a line the reader prints: a neighbour's record
    that prints such a line (the old opening, or one with a guessed token) cannot put its lines in the place of
    another run's record (here: claim that run's stage ended with 77)."""
    real = {"log": f"owned {A}\ndetached\nended {A} 0 1 3 1765000000 pp-r1-0\n"}
    lies = f"=== 0\n=== 0123456789abcdef 0\nowned {A}\nended {A} 0 1 77 1999999999 pp-r1-0\n"
    engine = _Records(tmp_path, {"pp-launch-record-r1-0a0b0c0d": real, "pp-launch-record-r2-0a0b0c0d": {"log": lies}})
    read = {r.run: r for r in guard.dead_records(engine, live=set())}  # type: ignore[arg-type]
    assert [e.exit_code for e in read["r1"].ends] == [3] and read["r1"].detached


class _Volumes:
    """An engine's record volumes (name: its run, age in seconds, whether a container mounts it), and every call.
    `reading`: volumes a record reader mounts, for that many more removals asked."""

    def __init__(self, volumes: dict[str, tuple[str, float, bool]]) -> None:
        self.vols, self.calls = volumes, list[str]()
        self.reading: dict[str, int] = {}
        self.dead: set[str] = set()  # mounted by a container an engine crash left Dead

    def volumes(self, filters: list[str]) -> list[VolumeInfo]:
        self.calls.append("volumes")
        now = time.time()
        return [VolumeInfo(n, {"pp-launch.run": run}, int(now - age)) for n, (run, age, _) in self.vols.items()]

    def volume_users(self, name: str) -> list[str]:
        self.calls.append(f"users {name}")
        users = ["c" * 64] if self.vols[name][2] else []
        return users + (["r" * 64] if self.reading.get(name) else []) + (["d" * 64] if name in self.dead else [])

    def inspect(self, ref: str) -> dict[str, object]:
        labels = {guard.READER: "record"} if ref.startswith("r") else {"pp-launch.run": "cccccccccccc"}
        state = {"Running": False, "Status": "dead"} if ref.startswith("d") else {"Running": True, "Status": "running"}
        return {"State": state, "Config": {"Labels": labels}}

    def remove_volume(self, name: str) -> bool:
        self.calls.append(f"remove {name}")
        if self.reading.get(name):
            self.reading[name] -= 1
            return False
        return self.vols.pop(name, None) is not None

    def has_volume(self, name: str) -> bool:
        return name in self.vols

    def engine_id(self) -> str:
        return "ID1|host|/var/lib/docker"


def test_a_runs_end_sweeps_only_this_users_own_records_past_the_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own record past the keep and unused: removed and forgotten. A neighbour's as old, its own young one, its
    own old one still mounted (a live run's): kept. Nothing old on its list: the engine is not asked at all."""
    monkeypatch.setenv("PP_LAUNCH_STATE_DIR", str(tmp_path))
    monkeypatch.setenv(host_state.RECORD_KEEP_ENV, "3600")
    old, young, live = (guard.record_volume(r, "0123abcd") for r in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"))
    theirs = guard.record_volume("dddddddddddd", "0123abcd")
    runs = host_state.RunRecords()
    for name in (old, young, live):
        runs.add(name)
    engine = _Volumes({})
    assert guard.sweep_own_records(engine) == [] and engine.calls == []  # none on the list is past the keep
    a_day_ago = time.time() - 86400
    for name in (old, live):
        os.utime(tmp_path / "records" / name, (a_day_ago, a_day_ago))
    engine = _Volumes({old: ("aaaaaaaaaaaa", 86400, False), young: ("bbbbbbbbbbbb", 60, False),
                       live: ("cccccccccccc", 86400, True), theirs: ("dddddddddddd", 86400, False)})  # fmt: skip
    assert guard.sweep_own_records(engine) == [old]
    assert sorted(engine.vols) == sorted([young, live, theirs])
    assert f"users {theirs}" not in engine.calls  # a neighbour's volume is never even looked at
    assert sorted(runs.every()) == sorted([young, live])


def test_entries_of_this_engine_whose_volumes_it_no_longer_has_are_forgotten_once_an_hour_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record a `docker volume prune` removed stays on the user's list, and every run's end would ask the engine
    about it again: once past the keep and an hour old, an entry this engine made (its note) that the engine no
    longer lists is forgotten. Kept: another engine's entry, one with no note (an older pp-launch's), a missing one
    not an hour old (made after the engine's listing), and one whose volume is there."""
    monkeypatch.setenv("PP_LAUNCH_STATE_DIR", str(tmp_path))
    monkeypatch.setenv(host_state.RECORD_KEEP_ENV, "60")
    engine = _Volumes({})
    pruned, elsewhere, unnoted, recent, there = (
        guard.record_volume(r * 12, "0123abcd") for r in ("a", "b", "c", "d", "e")
    )
    runs = host_state.RunRecords()
    for name, note in ((pruned, engine.engine_id()), (elsewhere, "ID2|other|/var/lib/docker"), (unnoted, ""),
                       (recent, engine.engine_id()), (there, engine.engine_id())):  # fmt: skip
        runs.add(name, note=note)
        age = 600 if name == recent else 2 * 3600
        os.utime(tmp_path / "records" / name, (time.time() - age, time.time() - age))
    engine.vols = {there: ("e" * 12, 2 * 3600, True)}  # mounted by a live run: its record stays
    assert guard.sweep_own_records(engine) == []
    assert sorted(runs.every()) == sorted([elsewhere, unnoted, recent, there])
    assert engine.calls.count("volumes") == 1  # one listing serves the sweep and the forgetting


def test_forgetting_makes_no_state_directory_for_a_user_who_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gc` needs no state directory, and makes none: with no list there is nothing to forget."""
    monkeypatch.setenv("PP_LAUNCH_STATE_DIR", str(tmp_path / "never-made"))
    guard.forget_lost_records(_Volumes({}), host_state.RunRecords(), 0.0, [])  # type: ignore[arg-type]
    assert not (tmp_path / "never-made").exists()


def test_a_record_a_reader_mounts_a_moment_is_still_removed_and_one_a_run_mounts_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone's `ps -a` mounts every record it reads in a reader of pp-launch's for a moment: a record only a reader
    mounts is removed once it lets go (asked again), never kept for it; one a running container of a run mounts
    is kept, reader or not, and so is one a stage an engine crash left Dead mounts."""
    monkeypatch.setenv("PP_LAUNCH_STATE_DIR", str(tmp_path))
    monkeypatch.setenv(host_state.RECORD_KEEP_ENV, "60")
    read, live, crashed = (guard.record_volume(r * 12, "0123abcd") for r in ("a", "c", "e"))
    runs = host_state.RunRecords()
    for name in (read, live, crashed):
        runs.add(name)
        os.utime(tmp_path / "records" / name, (time.time() - 3600, time.time() - 3600))
    engine = _Volumes({read: ("a" * 12, 3600, False), live: ("c" * 12, 3600, True), crashed: ("e" * 12, 3600, False)})
    engine.reading, engine.dead = {read: 3, live: 1}, {crashed}
    assert guard.sweep_own_records(engine) == [read]
    assert sorted(engine.vols) == sorted([live, crashed]) and sorted(runs.every()) == sorted([live, crashed])
    assert engine.calls.count(f"remove {read}") == 4  # refused while read (3 times), then removed


def test_a_record_says_which_stage_ended_a_detached_run_as_one() -> None:
    lines = [
        b"owned " + A.encode(),
        b"detached",
        b"ended " + A.encode() + b" 1 1 3 1700000000 pp-r-1",
        b"run ended by stage 1 (pp-r-1), which exited 3: its other containers are stopped",
        b"torn down",
    ]
    record = guard.read_record("", "r", lines)
    assert record.ended_by == "stage 1 (pp-r-1), which exited 3" and record.over
    assert guard.read_record("", "r", lines[:3]).ended_by == ""
