"""The run's record outlives its guard (docs/chain.md, "The record"): what is whose, and every stage's end, are kept on
the engine in the run's record volume, which its guards append to and its stages mount. A detached run whose guard
someone removed is shown as such by `ps`, ended by `down RUN` or collected by `gc` from another user (a state
directory of their own: nothing of the launching user's); `wait` and `ps -a` give every stage's code after the run
ended; a prune leaves a live run's record; a neighbour's forged record vouches for nothing of anyone else's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import Launcher, docker, forged, remember_run, run_containers, wait_until

pytestmark = pytest.mark.docker


def as_another_user(tmp_path: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """pp-launch for a second user of the engine: a state directory of their own, so nothing this user's launcher
    kept is known to it; only the engine's record is."""
    (tmp_path / "other-state").mkdir(mode=0o700, exist_ok=True)
    full = {**os.environ, "PP_LAUNCH_STATE_DIR": str(tmp_path / "other-state"), **env}
    argv = [sys.executable, "-m", "pp_launch", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=timeout, check=False)


def prune_volumes(*on: str, selector: str) -> subprocess.CompletedProcess[str]:
    """`docker volume prune` of every unused volume, named ones included (`-a` where the engine knows it: before
    API 1.42 a prune removed named volumes too)."""
    pruned = docker(*on, "volume", "prune", "-af", "--filter", selector)
    if pruned.returncode != 0 and "requires API version" in pruned.stderr:
        pruned = docker(*on, "volume", "prune", "-f", "--filter", selector)
    return pruned


def record_of(run: str, *on: str) -> str:
    """The run's one record volume on the engine ("" when there is none)."""
    found = docker(*on, "volume", "ls", "-q", "--filter", f"label=pp-launch.run={run}").stdout.split()
    assert len(found) <= 1, found
    return found[0] if found else ""


def of_run(run: str, *on: str, stage: str | None = None) -> list[str]:
    label = ["--filter", f"label=pp-launch.stage={stage}"] if stage else []
    return docker(*on, "ps", "-aq", "--no-trunc", "--filter", f"label=pp-launch.run={run}", *label).stdout.split()


@pytest.mark.parametrize("how", ["down", "gc"])
def test_a_detached_run_whose_guard_was_removed_is_shown_and_ended_by_another_user(
    side_engine, tmp_path: Path, how: str
) -> None:
    """On a private engine (a `gc` anywhere on an engine collects such a run, whoever runs it): a detached run, up;
    a neighbour removes its guard, then prunes volumes. Another user sees it, and ends it."""
    on, env = ("-H", side_engine.host), {"DOCKER_HOST": side_engine.host}
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", "--detach",
                  "--env", "STUB_MODE=hold", env=env)  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    (guard,) = of_run(run, *on, stage="guard")
    assert docker(*on, "rm", "-f", guard).returncode == 0
    assert wait_until(lambda: of_run(run, *on, stage="guard") == [], 10)
    pruned = prune_volumes(*on, selector=f"label=pp-launch.run={run}")  # the stages still mount the record
    record = record_of(run, *on)
    assert record and pruned.returncode == 0 and record not in pruned.stdout, pruned.stdout + pruned.stderr
    listed = as_another_user(tmp_path, "ps", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in map(json.loads, listed.stdout.splitlines()) if r["run"] == run]
    assert sorted(r["stage"] for r in rows) == [0, 1]
    assert {r["owner_status"] for r in rows} == {"guard-gone"}, rows
    table = as_another_user(tmp_path, "ps", **env)
    assert "its guard is gone: 'pp-launch down RUN' ends it" in table.stdout, table.stdout
    ended = as_another_user(tmp_path, *(["down", run] if how == "down" else ["gc"]), **env)
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert wait_until(lambda: of_run(run, *on) == [], 15), of_run(run, *on)
    said = ended.stdout + ended.stderr
    removed = [line for line in said.splitlines() if line.startswith("removing") and f"(run {run}," in line]
    assert ("stopped and removed 2 containers" in said) if how == "down" else len(removed) == 2, said
    assert docker(*on, "volume", "rm", record).returncode == 0  # unused once its run is gone


def test_every_stage_end_is_told_after_the_run_ended_to_another_user(side_engine, tmp_path: Path) -> None:
    """Stage 0 ends with 3 at once; the run ends; another user, who has none of the launcher's state: `wait` gives
    every stage's code (exit 0, as docker wait), `ps -a` shows `Exited (3)`, `logs` says its lines are not theirs;
    `gc` keeps the record a week (on a private engine: a `gc` that removes records is no test's to run on a shared
    one)."""
    on, env = ("-H", side_engine.host), {"DOCKER_HOST": side_engine.host}
    chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", "--env", "STUB_MODE=hold",
                     "--stage-env", "0:STUB_EXIT_AFTER=0.5", "--stage-env", "0:STUB_EXIT_CODE=3", env=env)  # fmt: skip
    run = chain.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert chain.wait(60) == 1, chain.stderr_text()
    assert wait_until(lambda: of_run(run, *on) == [], 15)
    waited = as_another_user(tmp_path, "wait", run, "--timeout", "10", **env)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    lines = waited.stdout.splitlines()
    assert any(line.startswith("stage 0 ") and line.endswith(" exited 3") for line in lines), lines
    assert any(line.startswith("stage 1 ") and line.endswith(" exited 0") for line in lines), lines  # stopped: 0
    shown = as_another_user(tmp_path, "ps", "-a", "--json", **env)
    rows = [r for r in map(json.loads, shown.stdout.splitlines()) if r["run"] == run]
    assert any(r["stage"] == 0 and r["status"] == "Exited (3)" and r["exit_code"] == 3 for r in rows), rows
    logs = as_another_user(tmp_path, "logs", run, **env)  # not theirs to read: said so, and what they can ask
    assert logs.returncode == 2 and logs.stdout == "", logs.stdout + logs.stderr
    assert f"run {run} has ended, and its lines are not kept for this user" in logs.stderr, logs.stderr
    assert f"'pp-launch wait {run}'" in logs.stderr, logs.stderr
    record = record_of(run, *on)
    assert record, "no record volume of the run"  # kept: until gc finds it old
    kept = as_another_user(tmp_path, "gc", "--dry-run", **env)
    assert f"the record of run {run}" not in kept.stdout  # a week by default
    swept = as_another_user(tmp_path, "gc", PP_LAUNCH_RECORD_KEEP="0", **env)
    assert f"removing the record of run {run}" in swept.stdout, swept.stdout + swept.stderr
    assert docker(*on, "volume", "inspect", record).returncode != 0


def test_a_detached_run_ended_by_down_tells_its_codes_to_the_user_who_launched_it(engine, stub_image) -> None:
    """The launching user keeps the run's facts, but its launcher left at the hand-over, before any stage ended:
    `wait` and `ps -a` take each code from the run's record (one its own runs made), never `unknown`, and `logs`
    what the stages printed after it left; never from a record a neighbour made under the run's name, claiming
    later ends and lines."""
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", "--detach",
                  "--env", "STUB_MODE=hold")  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()

    def pp(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pp_launch", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    downed = pp("down", run, "--grace", "1")
    assert downed.returncode == 0, downed.stdout + downed.stderr
    assert wait_until(lambda: run_containers(engine, run) == [], 15)
    fake = f"pp-launch-record-{run}-ffffffff"  # a neighbour's: the run's labels, a later end of each stage, code 77
    try:
        made = docker("volume", "create", "--label", f"pp-launch.run={run}", "--label", "pp-launch.stage=record", fake)
        assert made.returncode == 0, made.stderr
        ids = [f"{k:x}" * 64 for k in (14, 15)]
        later = int(time.time()) + 3600
        lines = "".join(f"owned {ids[k]}\\nended {ids[k]} {k} 1 77 {later} pp-{run}-{k}\\n" for k in (0, 1))
        forged = "2026-01-01T00:00:00.000000000Z stdout FORGED by a neighbour"  # and a stage's lines
        wrote = docker("run", "--rm", "--network", "none", "-v", f"{fake}:/r", "--entrypoint", "sh", stub_image, "-c",
                       f"printf '{lines}' > /r/log && echo '{forged}' > /r/stage-0.log")  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        # what each stage printed after its launcher left (on `down`), kept in the run's record by its
        # guard: `logs` shows it after the stages are gone; never a neighbour's lines
        logs = pp("logs", run)
        assert logs.returncode == 0, logs.stdout + logs.stderr
        for k in (0, 1):
            assert any(line.startswith(f"[stage {k}] ") and "stopping on request" in line
                       for line in logs.stdout.splitlines()), logs.stdout  # fmt: skip
            assert any(line.startswith(f"[stage {k}] PP_GPU_NODE_ADDR ") for line in logs.stdout.splitlines())
        assert "FORGED" not in logs.stdout
        waited = pp("wait", run, "--timeout", "10")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert sorted(line.split()[1] for line in waited.stdout.splitlines()) == ["0", "1"], waited.stdout
        assert "unknown" not in waited.stdout, waited.stdout
        shown = pp("ps", "-a", "--json")
        rows = [r for r in map(json.loads, shown.stdout.splitlines()) if r["run"] == run]
        assert sorted(r["stage"] for r in rows) == [0, 1], rows
        assert all(isinstance(r["exit_code"], int) and r["status"] == f"Exited ({r['exit_code']})" for r in rows), rows
        assert 77 not in [r["exit_code"] for r in rows] and " 77" not in waited.stdout, (rows, waited.stdout)
    finally:
        docker("volume", "rm", fake)


def test_a_forged_record_vouches_for_nothing_of_anyone_elses(engine, stub_image, tmp_path: Path) -> None:
    """A neighbour makes a record volume for a run of its own naming a real run's stage ids, and containers with that
    run's labels: `down` of the forged run touches neither the real stages (another run's labels) nor the forged
    containers (they do not mount a record that names them: labels and a volume of the right name do not make a
    container a run's)."""
    real = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", "--env", "STUB_MODE=hold")
    real_run = real.wait_event("pp_stage_roster", timeout=60)["run"]
    fake_run = f"f{os.urandom(6).hex()}"[:12]
    fake_record = f"pp-launch-record-{fake_run}-{os.urandom(4).hex()}"
    victims = [c.id for c in engine.containers([f"pp-launch.run={real_run}"]) if c.labels["pp-launch.stage"] != "guard"]
    made: list[str] = []
    try:
        made.append(forged(fake_run, f"pp-forged-{fake_run}"))
        labels = ["--label", f"pp-launch.run={fake_run}", "--label", "pp-launch.stage=record",
                  "--label", "pp-launch.owner=detached"]  # fmt: skip
        assert docker("volume", "create", *labels, fake_record).returncode == 0
        lines = "".join(f"owned {ref}\\n" for ref in [*victims, made[0]]) + "detached\\n"
        wrote = docker("run", "--rm", "-v", f"{fake_record}:/r", "--entrypoint", "sh",
                       "pp-launch/guard:latest", "-c", f"printf '{lines}' > /r/log")  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        downed = as_another_user(tmp_path, "down", fake_run)
        assert downed.returncode == 1, downed.stdout + downed.stderr
        assert "nothing stopped" in downed.stderr, downed.stderr
        time.sleep(0.5)  # a stop, had one been sent, reaches the engine at once
        assert all(c.state == "running" for c in engine.containers([f"pp-launch.run={real_run}"]))
        assert docker("inspect", made[0]).returncode == 0
    finally:
        for ref in made:
            docker("rm", "-f", ref)
        docker("volume", "rm", "-f", fake_record)
        real.signal()
        real.wait(30)
    assert wait_until(lambda: run_containers(engine, real_run) == [], 15)


def test_a_runs_end_removes_its_users_records_past_the_keep_and_nobody_elses(engine, stub_image, tmp_path) -> None:
    """One user (a state directory of their own), two runs: the first's record stays once it ended (kept a week by
    default); the second, with a keep of 0 s, removes it as it ends (as `gc` would) and forgets it. A neighbour's
    volume under a record's name and labels, as old, is never touched. (The parallel tests' `ps -a` and `wait`
    mount every record a moment to read it, and a record in use stays: up to three runs are given the chance.)"""
    env = {"PP_LAUNCH_STATE_DIR": str(tmp_path / "state")}
    demo = ("chain", "--stages", "2", "--gpus", "none", "--json")
    first = Launcher(*demo, env=env)
    assert first.wait(60) == 0, first.stderr_text()
    remember_run(first.run_id)
    kept = record_of(first.run_id)
    assert kept and kept in os.listdir(tmp_path / "state" / "records")
    neighbour = f"pp-launch-record-{first.run_id}-ffffffff"
    made = docker("volume", "create", "--label", f"pp-launch.run={first.run_id}", "--label",
                  "pp-launch.stage=record", neighbour)  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        for _ in range(3):  # a neighbour's `ps -a` may mount every record a moment to read it: in use, kept then
            second = Launcher(*demo, env={**env, "PP_LAUNCH_RECORD_KEEP": "0"})
            assert second.wait(60) == 0, second.stderr_text()
            remember_run(second.run_id)
            if docker("volume", "inspect", kept).returncode != 0:
                break
        assert docker("volume", "inspect", kept).returncode != 0  # gone with a later run's end
        assert kept not in os.listdir(tmp_path / "state" / "records")
        assert docker("volume", "inspect", neighbour).returncode == 0  # not this user's: untouched
    finally:
        docker("volume", "rm", "-f", neighbour)
        for name in os.listdir(tmp_path / "state" / "records"):
            docker("volume", "rm", name)


def test_an_entry_whose_record_a_prune_removed_is_forgotten_by_gc_once_an_hour_old(
    engine, stub_image, tmp_path
) -> None:
    """The user's list names the engine each record was made on. A record removed by other means (as `docker volume
    prune` does once the run is gone) leaves its entry; `gc` forgets it once it is past the keep and an hour old
    (the unit tests hold the hour), not within the keep; another engine's entry (a --host's) is kept. (The second
    gc's keep is 3 hours, not 0: gc removes any gone run's record past the keep, the parallel tests' too.)"""
    state = tmp_path / "state"
    env = {"PP_LAUNCH_STATE_DIR": str(state)}
    run = Launcher("chain", "--stages", "1", "--gpus", "none", "--json", env=env)
    assert run.wait(60) == 0, run.stderr_text()
    remember_run(run.run_id)
    name = record_of(run.run_id)
    ident = docker("info", "--format", "{{.ID}}|{{.Name}}|{{.DockerRootDir}}").stdout.strip()
    assert (state / "records" / name).read_text() == ident
    elsewhere = state / "records" / "pp-launch-record-0123456789ab-0a0b0c0d"
    elsewhere.write_text("ID2|another-host|/var/lib/docker")
    # Removed by other means. Another test's `ps -a` or `gc` may read the engine's records in a helper that mounts
    # them all, so the engine can say "in use" for a moment (a prune would pass it over then, and get it later).
    assert wait_until(lambda: docker("volume", "rm", name).returncode == 0, 30), docker("volume", "inspect", name)
    gc = [sys.executable, "-m", "pp_launch", "gc"]
    assert subprocess.run(gc, env={**os.environ, **env}, capture_output=True, timeout=60).returncode == 0
    assert (state / "records" / name).exists()  # within the keep (a week)
    hours_ago = time.time() - 4 * 3600
    for entry in (state / "records" / name, elsewhere):
        os.utime(entry, (hours_ago, hours_ago))
    done = subprocess.run(gc, env={**os.environ, **env, "PP_LAUNCH_RECORD_KEEP": "10800"}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(state / "records")) == [elsewhere.name]
