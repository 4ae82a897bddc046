"""On the real engine, with spare guards on (as a user has them by default; the rest of the suite turns them off):
a run leaves a spare guard for its user's next run on the engine, that run takes it (its id and its guard), an
unclaimed one goes by itself, and a neighbour's container under the spare's name and labels is never taken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pp_launch.adapters import guard, host_state

from ..helpers import Launcher, docker, drop_records, guard_of, remember_run, running, wait_until

pytestmark = pytest.mark.docker


@pytest.fixture
def own_state(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A user of their own (their state directory: their spares), spares kept 60 s; whatever spare is left at the
    end removed, then the records its runs made."""
    state = tmp_path / "state"
    env = {"PP_LAUNCH_STATE_DIR": str(state), "PP_LAUNCH_SPARE_GUARD": "60"}
    yield env
    kept = spare_of(state)
    if kept:
        docker("rm", "-f", kept["guard"])
        wait_until(lambda: docker("inspect", kept["guard"]).returncode != 0, 10)
    drop_records(tmp_path)


def spare_of(state: Path) -> dict[str, str] | None:
    import os

    return host_state.Spares(state).peek(guard.spare_key(os.environ))


def chain(env: dict[str, str], *extra: str) -> Launcher:
    """A two-stage demo that ends by itself, exit 0, once its tokens are through the ring (a timed exit of one stage
    could cut the ring while the other still reads)."""
    return Launcher("chain", "--stages", "2", "--gpus", "none", "--json", *extra, env=env)


def test_a_run_leaves_a_spare_the_next_run_takes_and_an_unclaimed_one_goes(engine, stub_image, own_state) -> None:
    state = Path(own_state["PP_LAUNCH_STATE_DIR"])
    first = chain(own_state)
    assert first.wait(60) == 0, first.stderr_text()
    spare = spare_of(state)
    assert spare is not None and spare["run"] != first.run_id
    assert guard_of(engine, spare["run"]) == [spare["guard"]] and running(spare["guard"])  # up, waiting
    ps = Launcher("ps", "--json", "--run", spare["run"], env=own_state)
    assert ps.wait(30) == 0 and ps.events == []  # a spare no run took is no run: `ps` lists nothing of it

    # the next run takes it: the spare's run id is its own, its guard is the spare (no guard started), and it
    # leaves the next spare, kept 3 s
    second = chain({**own_state, "PP_LAUNCH_SPARE_GUARD": "3"}, "--grace", "1")
    roster = second.wait_event("pp_stage_roster", timeout=60)
    remember_run(roster["run"])
    assert roster["run"] == spare["run"] and guard_of(engine, spare["run"]) == [spare["guard"]]
    assert second.wait(60) == 0, second.stderr_text()
    assert wait_until(lambda: guard_of(engine, spare["run"]) == [], 15)  # the run's guard went with it
    later = spare_of(state)
    assert later is not None and later["run"] not in (spare["run"], first.run_id)

    # unclaimed for 3 s, it goes by itself; the run after it starts its own guard and leaves nothing of it
    assert wait_until(lambda: not running(later["guard"]), 20)
    third = chain(own_state)
    assert third.wait_event("pp_stage_roster", timeout=60)["run"] == later["run"]  # its id; a guard of its own
    assert third.wait(60) == 0, third.stderr_text()
    assert docker("volume", "inspect", later["record"]).returncode != 0  # the gone spare's record, dropped

    # `gc` ends this user's spare (and its record); another user's gc never sees it
    last = spare_of(state)
    assert last is not None and running(last["guard"])
    other = Launcher("gc", env={"PP_LAUNCH_STATE_DIR": str(state.parent / "other-state")})
    assert other.wait(30) == 0 and running(last["guard"]), other.stderr_text()
    gc = Launcher("gc", env=own_state)
    assert gc.wait(30) == 0, gc.stderr_text()
    assert any(f"ending this user's spare guard {last['guard'][:12]}" in line for line in gc.stdout_lines)
    assert docker("inspect", last["guard"]).returncode != 0 and spare_of(state) is None
    assert docker("volume", "inspect", last["record"]).returncode != 0


def test_a_neighbours_container_under_the_spares_name_and_labels_is_never_taken(engine, stub_image, own_state) -> None:
    """The spare is known by the id the engine gave its maker (this user's private state), never by its name or
    labels: a neighbour who removes it and starts a container of their own in its place is never this run's guard,
    and never touched."""
    state = Path(own_state["PP_LAUNCH_STATE_DIR"])
    first = chain(own_state)
    assert first.wait(60) == 0, first.stderr_text()
    spare = spare_of(state)
    assert spare is not None
    name = docker("inspect", "-f", "{{.Name}}", spare["guard"]).stdout.strip().lstrip("/")
    assert docker("rm", "-f", spare["guard"]).returncode == 0
    labels = {"pp-launch.run": spare["run"], "pp-launch.stage": "guard", "pp-launch.owner": "x", "pp-launch.gpus": ""}
    flags = [part for key, value in labels.items() for part in ("--label", f"{key}={value}")]
    made = docker("run", "-d", "--name", name, "--network", "none", *flags, "-e", "STUB_MODE=hold", stub_image)
    assert made.returncode == 0, made.stderr
    theirs = made.stdout.strip()
    try:
        second = chain(own_state)
        roster = second.wait_event("pp_stage_roster", timeout=60)
        assert roster["run"] == spare["run"]  # the id was this user's to use; the guard is a new one of its own
        guards = guard_of(engine, spare["run"])  # by label: theirs and the run's own
        assert theirs in guards and len(guards) == 2 and spare["guard"] not in guards
        assert second.wait(60) == 0, second.stderr_text()
        assert running(theirs)  # never ours: not taken, not stopped
    finally:
        docker("rm", "-f", theirs)
