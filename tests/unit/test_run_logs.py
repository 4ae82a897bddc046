"""Each run's output kept after it ended: per stage, bounded, in the user's private state."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from pp_launch.adapters import run_logs
from pp_launch.adapters.docker_engine import engine_time
from pp_launch.core import errors


def test_lines_are_kept_per_stage_and_read_back_in_stage_order(tmp_path: Path) -> None:
    log = run_logs.RunLog("r1", tmp_path)
    log.line(1, "stdout", "one")
    log.line(0, "stderr", "zero")
    log.line(1, "stdout", "two ünïcode")
    log.close()
    kept = run_logs.read("r1", tmp_path)
    assert [(k.stage, k.stream, k.text) for k in kept] == [
        (0, "stderr", "zero"),
        (1, "stdout", "one"),
        (1, "stdout", "two ünïcode"),
    ]
    assert all(k.time.endswith("Z") for k in kept)
    assert run_logs.kept_runs(tmp_path) == ["r1"]
    assert os.stat(tmp_path / "logs" / "r1" / "stage-0.log").st_mode & 0o777 == 0o600


def test_a_stage_keeps_at_most_two_files_of_the_limit(tmp_path: Path) -> None:
    log = run_logs.RunLog("big", tmp_path, limit=1000)
    for i in range(500):
        log.line(0, "stdout", f"line {i:04d} " + "x" * 40)
    log.close()
    sizes = [p.stat().st_size for p in (tmp_path / "logs" / "big").iterdir() if p.name.startswith("stage-")]
    assert len(sizes) == 2 and all(s <= 1000 for s in sizes)
    texts = [k.text for k in run_logs.read("big", tmp_path)]
    assert texts[-1].startswith("line 0499") and not any(t.startswith("line 0000") for t in texts)
    numbers = [int(t.split()[1]) for t in texts]
    assert numbers == sorted(numbers)  # the older file first


def test_only_the_newest_runs_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_logs, "KEEP_RUNS", 3)
    for i in range(5):
        log = run_logs.RunLog(f"run{i}", tmp_path)
        log.line(0, "stdout", "x")
        log.close()
        os.utime(tmp_path / "logs" / f"run{i}", (1000 + i, 1000 + i))
    assert run_logs.kept_runs(tmp_path) == ["run2", "run3", "run4"]


def test_a_planted_link_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "logs").symlink_to(target)
    with pytest.raises(errors.PpLaunchError):
        run_logs.RunLog("r", tmp_path / "state")
    assert list(target.iterdir()) == []


def test_a_run_never_kept_reads_as_nothing(tmp_path: Path) -> None:
    assert run_logs.read("nope", tmp_path) == []


def test_a_live_run_is_never_pruned_however_many_runs_come_after(tmp_path: Path) -> None:
    """A long chain keeps its output while 60 short ones come and go with the same directory: pruning takes ended
    runs only (the live one holds its `.live` lock), and takes it once it ended."""
    live = run_logs.RunLog("long", tmp_path)
    live.line(0, "stdout", "still here")
    for i in range(run_logs.KEEP_RUNS + 10):
        short = run_logs.RunLog(f"short{i:02d}", tmp_path)
        short.line(0, "stdout", "done")
        short.close()
    assert "long" in run_logs.kept_runs(tmp_path)
    assert [k.text for k in run_logs.read("long", tmp_path)] == ["still here"]
    assert len(run_logs.kept_runs(tmp_path)) == run_logs.KEEP_RUNS + 1  # the bound, plus the live run
    live.close()
    run_logs.RunLog("next", tmp_path).close()
    assert "long" not in run_logs.kept_runs(tmp_path) and len(run_logs.kept_runs(tmp_path)) == run_logs.KEEP_RUNS


def test_ps_a_shows_an_ended_run_only_for_the_engines_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run keeps where it ran; `ps -a` on one engine, on --host engines or as before for a run that kept no
    place, never lists another engine's ended runs as if they were this one's."""
    from pp_launch.app.docker_runs import ended_rows

    monkeypatch.setenv("PP_LAUNCH_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)

    def ran(run: str, docker_host: str | None, hosts: list[str], ray: str | None = None) -> None:
        if docker_host is None:
            monkeypatch.delenv("DOCKER_HOST", raising=False)
        else:
            monkeypatch.setenv("DOCKER_HOST", docker_host)
        log = run_logs.RunLog(run)
        log.place(hosts=hosts, ray=ray)
        log.stage(0, container=f"pp-{run}-0", image="img")
        log.line(0, "stdout", "hello")
        log.stage(0, exit_code=3)
        log.close()

    ran("here", None, [])
    ran("side", "unix:///tmp/side.sock", [])
    ran("hosts", None, ["gpu2", "gpu3"])
    ran("onray", None, [], "10.0.0.1:6379")
    older = run_logs.RunLog("older")  # kept before runs kept their place
    older.line(0, "stdout", "x")
    older.close()
    monkeypatch.delenv("DOCKER_HOST", raising=False)

    def shown(asked: set[str | None]) -> set[str]:
        return {r.run for r in ended_rows(set(), None, asked)}

    assert shown({None}) == {"here", "older"}
    assert shown({"gpu3"}) == {"hosts", "older"}
    assert shown({None, "gpu2"}) == {"here", "hosts", "older"}
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/side.sock")
    assert shown({None}) == {"side", "older"}
    row = next(r for r in ended_rows(set(), "side", {None}))
    assert (row.container, row.status, row.exit_code) == ("pp-side-0", "Exited (3)", 3)
    assert run_logs.facts("side")[0].exit_code == 3  # the place line is not a stage's


def test_ps_a_takes_a_code_its_launcher_could_not_keep_from_the_engines_record() -> None:
    """A detached run's launcher leaves before its stages end: what it kept has no code; the record on the engine
    (its guard's) has, and its last end of that stage counts. A code the launcher kept is never replaced."""
    from pp_launch.app.docker_runs import with_recorded_codes
    from pp_launch.app.rows import StageRow

    def row(run: str, stage: int, code: int | None) -> StageRow:
        status = "Exited (?)" if code is None else f"Exited ({code})"
        return StageRow(run=run, stage=stage, container=f"pp-{run}-{stage}", id="", image="i", owner="-",
                        owner_status="ended", state="exited", status=status, exit_code=code)  # fmt: skip

    kept = [row("a", 0, None), row("a", 1, 3), row("b", 0, None)]
    recorded = [row("a", 0, 1), row("a", 0, 143), row("a", 1, 0), row("b", 0, None), row("c", 0, 2)]
    filled = with_recorded_codes(kept, recorded)
    assert [(r.run, r.stage, r.exit_code, r.status) for r in filled] == [
        ("a", 0, 143, "Exited (143)"),  # the record's last end of stage 0
        ("a", 1, 3, "Exited (3)"),  # kept by its launcher: kept
        ("b", 0, None, "Exited (?)"),  # nobody knows
    ]


def test_an_ended_runs_logs_take_each_stage_its_guard_kept_from_the_record_and_the_rest_from_the_launcher(
    tmp_path: Path,
) -> None:
    """A detached run's launcher kept its stages' lines until the hand-over; its guard kept stage 1's from the
    start to its end in the record: stage 1 is the record's, stage 0 (nothing recorded) the launcher's, in time
    order, each stage's last N with -n."""
    from pp_launch.app.docker_runs import _print_kept
    from pp_launch.app.site import LogView, Voice

    log = run_logs.RunLog("r1", tmp_path)
    log.stage(0, container="pp-r1-0", image="i")
    log.stage(1, container="pp-r1-1", image="i")
    log.line(0, "stdout", "zero, before the hand-over")
    log.line(1, "stdout", "one, before the hand-over")
    log.close()
    recorded = {1: [run_logs.parse(1, f"2999-01-01T00:00:0{i}.5Z stdout one, line {i}") for i in range(3)]}
    said: list[str] = []
    voice = Voice(answer=said.append, note=said.append)
    asked: list[str] = []

    def by_guards(run: str) -> dict[int, list[run_logs.KeptLine]]:
        asked.append(run)
        return recorded

    assert _print_kept("r", LogView(log_dir=str(tmp_path)), voice, by_guards)
    assert asked == ["r1"] and said[0].splitlines() == [
        "[stage 0] zero, before the hand-over",
        "[stage 1] one, line 0",
        "[stage 1] one, line 1",
        "[stage 1] one, line 2",
    ]
    said.clear()
    assert _print_kept("r1", LogView(log_dir=str(tmp_path), tail=1, stages=(1,)), voice, by_guards)
    assert said == ["[stage 1] one, line 2"]
    ended = run_logs.RunLog("r2", tmp_path)  # a foreground run: its launcher kept every stage's end
    ended.stage(0, container="pp-r2-0", image="i")
    ended.line(0, "stdout", "all of it")
    ended.stage(0, exit_code=0)
    ended.close()
    said.clear()
    assert _print_kept("r2", LogView(log_dir=str(tmp_path)), voice, by_guards)
    assert said == ["[stage 0] all of it"] and asked == ["r1", "r1"]  # its record is not looked at


def test_a_live_detached_runs_gone_stage_is_read_from_the_record_its_other_stages_mount(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stage 1 crashed (auto-removed) while stage 0 runs: its kept lines are read where stage 0 mounts the run's
    record (`docker cp`), the file before the newest first; a stage still there is the engine's; a record that is
    not this user's own is never read; -n and --since apply as to the engine's lines."""
    from pp_launch.adapters.docker_engine import ContainerInfo
    from pp_launch.app import docker_runs
    from pp_launch.app.site import LogView

    own = "pp-launch-record-r1-0a0b0c0d"

    class Engine:
        def __init__(self) -> None:
            self.read: list[tuple[str, str]] = []

        def inspect(self, ref: str) -> dict[str, object]:
            return {"Config": {"Env": ["PATH=/bin", "NUM_STAGES=2", "STAGE=0"]}}

        def read_files(self, ref: str, path: str, limit: int) -> dict[str, bytes]:
            self.read.append((ref, path))
            return {
                "log": b"owned x\n",
                "stage-1.log": b"2026-12-07T09:00:03Z stderr exiting with 3\n",
                "stage-1.log.1": b"2026-12-07T09:00:01Z stdout older\n2026-12-07T09:00:02Z stdout old\n",
                "stage-0.log": b"2026-12-07T09:00:00Z stdout the engine has these\n",
            }

    labels = {"pp-launch.run": "r1", "pp-launch.stage": "0", "pp-launch.owner": "detached"}
    stage0 = ContainerInfo("c0", "pp-r1-0", "i", "running", 0, labels, (own,), own)
    engine = Engine()
    monkeypatch.setattr(docker_runs, "_own_records", lambda: {own})
    gone = docker_runs._gone_stages([(engine, stage0)])  # type: ignore[list-item]
    assert engine.read == [("c0", "/run/pp-launch-record")]
    assert [(k.stage, k.text) for k in gone[1]] == [(1, "older"), (1, "old"), (1, "exiting with 3")] and 0 not in gone
    rows = docker_runs._kept_rows(gone, LogView(tail=2))
    assert [(head, text) for _, head, text in rows] == [("[stage 1] ", b"old"), ("[stage 1] ", b"exiting with 3")]
    since = int(engine_time("2026-12-07T09:00:02"))
    assert [text for _, _, text in docker_runs._kept_rows(gone, LogView(since=since))] == [b"old", b"exiting with 3"]
    monkeypatch.setattr(docker_runs, "_own_records", lambda: {"pp-launch-record-r1-ffffffff"})
    assert docker_runs._gone_stages([(engine, stage0)]) == {} and len(engine.read) == 1  # type: ignore[list-item]
    attached = dataclasses.replace(stage0, labels={**labels, "pp-launch.owner": "host:1:2"})
    monkeypatch.setattr(docker_runs, "_own_records", lambda: {own})
    assert docker_runs._gone_stages([(engine, attached)]) == {} and len(engine.read) == 1  # type: ignore[list-item]
    stage1 = dataclasses.replace(stage0, id="c1", labels={**labels, "pp-launch.stage": "1"})
    both = [(engine, stage0), (engine, stage1)]
    assert docker_runs._gone_stages(both) == {} and len(engine.read) == 1  # type: ignore[arg-type]  # all there
