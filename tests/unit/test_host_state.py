"""This user's state directory: private or refused, never following a link, faults in one line."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from pp_launch.adapters import host_state
from pp_launch.core import errors


def test_the_default_is_per_user_and_made_private(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    assert host_state.default_dir(env) == tmp_path / "home" / ".local" / "state" / "pp-launch"
    assert host_state.default_dir({**env, "XDG_STATE_HOME": "/x"}) == Path("/x/pp-launch")
    assert host_state.default_dir({**env, "PP_LAUNCH_STATE_DIR": "/y"}) == Path("/y")
    with host_state.state(host_state.default_dir(env)) as d:
        assert (os.stat(d.path).st_mode & 0o777) == 0o700


def test_a_symbolic_link_in_place_of_the_directory_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "system"
    target.mkdir(mode=0o755)
    link = tmp_path / "state"
    link.symlink_to(target)
    with pytest.raises(errors.StateUnsafe, match="is a symbolic link or not a directory"):
        host_state.StateDir.open(link)
    assert (target.stat().st_mode & 0o7777) == 0o755 and list(target.iterdir()) == []


def test_a_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(errors.StateUnsafe, match=r"writable by other users \(mode 1777\)") as exc:
        host_state.StateDir.open(shared)
    assert "PP_LAUNCH_STATE_DIR" in str(exc.value)


def test_a_file_planted_as_a_link_is_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only")
    with host_state.state(tmp_path / "s") as d:
        hosts = d.sub("hosts")
        os.symlink(secret, "r.json", dir_fd=hosts.fd)
        assert hosts.read("r.json") is None
        hosts.write("r.json", b"{}")  # replaces the link itself, never writes through it
        hosts.close()
    assert secret.read_text() == "root only"
    assert not (tmp_path / "s" / "hosts" / "r.json").is_symlink()


def test_a_corrupt_record_is_moved_aside_said_once_and_blocks_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    record = host_state.RunHosts(tmp_path / "s", warn=said.append)
    record.write("aaaaaaaaaaaa", ("h1", "h2"))
    (tmp_path / "s" / "hosts" / "bbbbbbbbbbbb.json").write_bytes(b"\xff\xfe not json")
    (tmp_path / "s" / "hosts" / "cccccccccccc.json").write_text(json.dumps([]))
    assert record.every() == ("h1", "h2")
    assert len(said) == 2 and all("moved aside as" in s for s in said)
    assert sorted(p.name for p in (tmp_path / "s" / "hosts").iterdir()) == [
        "aaaaaaaaaaaa.json",
        "bbbbbbbbbbbb.json.corrupt",
        "cccccccccccc.json.corrupt",
    ]
    assert record.every() == ("h1", "h2") and len(said) == 2  # said once


def test_no_space_is_one_line_naming_the_file_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with host_state.state(tmp_path / "s") as d:
        monkeypatch.setattr(host_state.os, "open", full)
        with pytest.raises(errors.StateFault) as exc:
            d.write("x.json", b"{}")
    assert str(exc.value).startswith(f"cannot write {tmp_path / 's' / 'x.json'}: no space left")
    assert "\n" not in str(exc.value) and exc.value.exit_code == 1


def test_the_record_volumes_a_user_made_are_listed_until_forgotten(tmp_path: Path) -> None:
    records = host_state.RunRecords(tmp_path / "state")
    records.add("pp-launch-record-aaaaaaaaaaaa-00000000")
    records.add("pp-launch-record-bbbbbbbbbbbb-11111111")
    records.add("pp-launch-record-aaaaaaaaaaaa-00000000")  # said twice: listed once
    assert records.every() == ["pp-launch-record-aaaaaaaaaaaa-00000000", "pp-launch-record-bbbbbbbbbbbb-11111111"]
    records.forget("pp-launch-record-aaaaaaaaaaaa-00000000")
    assert records.every() == ["pp-launch-record-bbbbbbbbbbbb-11111111"]
    assert oct((tmp_path / "state" / "records").stat().st_mode & 0o777) == "0o700"


def test_a_record_entry_planted_as_a_link_is_never_followed(tmp_path: Path) -> None:
    records = host_state.RunRecords(tmp_path / "state")
    records.add("x")
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "state" / "records" / "pp-launch-record-cccccccccccc-22222222").symlink_to(target)
    with pytest.raises(errors.PpLaunchError):
        records.add("pp-launch-record-cccccccccccc-22222222")
    assert target.read_text() == "untouched"


def test_a_users_ray_runs_are_listed_with_their_cluster_and_told_by_age(tmp_path: Path) -> None:
    """The detached runs a user launched on Ray: each with its cluster's head; listed by cluster and by age."""
    runs = host_state.RunRecords(tmp_path, folder=host_state.RunRecords.RAY)
    runs.add("aaaaaaaaaaaa", "10.0.0.1:6379")
    runs.add("bbbbbbbbbbbb", "10.0.0.2:6379")
    assert runs.every(note="10.0.0.1:6379") == ["aaaaaaaaaaaa"]
    assert runs.every(older_than=3600) == []
    a_day_ago = time.time() - 86400
    os.utime(tmp_path / "ray-records" / "bbbbbbbbbbbb", (a_day_ago, a_day_ago))
    assert runs.every(older_than=3600) == ["bbbbbbbbbbbb"]
    assert runs.every(older_than=3600, note="10.0.0.1:6379") == []
    assert host_state.RunRecords(tmp_path).every() == []  # apart from the record volumes' list


def test_records_past_keeping_are_those_past_the_keep_or_beyond_the_newest_count(tmp_path: Path) -> None:
    runs = host_state.RunRecords(tmp_path)
    for k in range(5):
        runs.add(f"pp-launch-record-{k:012d}-0a0b0c0d")
        then = time.time() - 100 * (5 - k)  # record 0 the oldest
        os.utime(tmp_path / "records" / f"pp-launch-record-{k:012d}-0a0b0c0d", (then, then))
    names = runs.every()
    assert runs.past(keep=10_000, count=50) == []
    assert runs.past(keep=10_000, count=3) == names[:2]  # beyond the newest three
    assert runs.past(keep=250, count=50) == names[:3]  # 500, 400 and 300 s old
    assert runs.past(keep=10_000, count=0) == names
