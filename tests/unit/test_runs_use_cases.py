"""app/runs.py: the housekeeping use cases over a site, whichever it is. A fake site stands where a Docker engine or
a Ray cluster would (the use cases only ever ask a Site); the Docker and Ray sites themselves are tested on real
engines and a real cluster (tests/integration/test_runs_cmd.py, test_housekeeping*.py, test_ray.py)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from pp_launch.app import docker_runs, on_ray, runs
from pp_launch.app.rows import StageRow
from pp_launch.core import errors


def row(run: str) -> StageRow:
    return StageRow(
        run=run, stage=0, container=f"pp-{run}-0", id="c0", image="i", owner="o", owner_status="alive", state="running"
    )


class FakeSite:
    """Answers as told; records what it was asked, and whether it was closed."""

    opened: ClassVar[list[FakeSite]] = []

    def __init__(self, run: str | None, fail: dict[str | None, Exception] | None = None, answers: bool = True) -> None:
        self.run, self.fail, self.answers = run, fail or {}, answers
        self.asked: list[tuple[Any, ...]] = []
        self.closed = False
        FakeSite.opened.append(self)

    def _maybe_fail(self, run: str | None) -> None:
        if run in self.fail:
            raise self.fail[run]

    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[StageRow]:
        self.asked.append(("stages", run, details, ended_too))
        self._maybe_fail(run)
        return [row(run or "r1")]

    def down(self, run: str | None, grace: float, confirm: runs.Confirm | None) -> bool:
        self.asked.append(("down", run, grace))
        self._maybe_fail(run)
        if confirm is not None and run is None:
            confirm("stop 2 containers of 1 runs (r1), whoever owns them?")
        return run != "stays"

    def gc(self, dry_run: bool) -> bool:
        self.asked.append(("gc", dry_run))
        return True

    def logs(self, run: str, view: runs.LogView) -> None:
        self.asked.append(("logs", run, view))
        self._maybe_fail(run)

    def wait(self, run: str, until: str, timeout: float | None) -> int:
        self.asked.append(("wait", run, until, timeout))
        self._maybe_fail(run)
        return 1 if run == "failed" else 0

    def close(self) -> bool:
        self.closed = True
        return self.answers


def opener(**kwargs: Any) -> runs.Opener:
    FakeSite.opened = []

    def open_site(where: runs.Where, run: str | None, voice: runs.Voice) -> runs.Site:
        return FakeSite(run, **kwargs)

    return open_site


def voice() -> tuple[runs.Voice, list[str], list[str]]:
    answers: list[str] = []
    notes: list[str] = []
    return runs.Voice(answer=answers.append, note=notes.append), answers, notes


HERE = runs.Where()


def test_down_tries_every_run_when_one_fails_says_why_once_and_reports_the_failure() -> None:
    v, _, notes = voice()
    ok = runs.down(HERE, ("a", "b", "c"), 2.0, None, v, opener(fail={"b": errors.ConfigError("no run 'b' here")}))
    assert ok is False
    assert [s.asked for s in FakeSite.opened] == [[("down", "a", 2.0)], [("down", "b", 2.0)], [("down", "c", 2.0)]]
    assert notes == ["pp-launch: error: no run 'b' here"]
    assert all(s.closed for s in FakeSite.opened)


def test_down_of_a_lone_run_raises_its_error_as_it_is_and_still_closes_the_site() -> None:
    v, _, _ = voice()
    with pytest.raises(errors.ConfigError, match="no run 'x'"):
        runs.down(HERE, ("x",), 1.0, None, v, opener(fail={"x": errors.ConfigError("no run 'x' here")}))
    assert FakeSite.opened[0].closed


def test_down_is_a_failure_when_something_stays_or_a_place_did_not_answer() -> None:
    v, _, _ = voice()
    assert runs.down(HERE, ("stays",), 1.0, None, v, opener()) is False
    assert runs.down(HERE, ("a",), 1.0, None, v, opener(answers=False)) is False
    assert runs.down(HERE, ("a",), 1.0, None, v, opener()) is True


def test_down_all_asks_first_and_a_refusal_stops_it() -> None:
    v, _, _ = voice()
    asked: list[str] = []

    def refuse(question: str) -> None:
        asked.append(question)
        raise errors.ConfigError(f"--all would {question[:-1]}: add --yes to confirm")

    with pytest.raises(errors.ConfigError, match="add --yes"):
        runs.down(HERE, (), 1.0, refuse, v, opener())
    assert asked == ["stop 2 containers of 1 runs (r1), whoever owns them?"]
    assert FakeSite.opened[0].asked == [("down", None, 1.0)]


def test_wait_gives_the_waits_code_and_at_least_1_when_a_place_did_not_answer() -> None:
    v, _, _ = voice()
    assert runs.wait(HERE, "ok", "exit", None, v, opener()) == 0
    assert runs.wait(HERE, "failed", "exit", 5.0, v, opener()) == 1
    assert runs.wait(HERE, "ok", "exit", None, v, opener(answers=False)) == 1
    assert FakeSite.opened[0].asked == [("wait", "ok", "exit", None)]


def test_ps_gives_the_rows_and_whether_every_place_answered() -> None:
    v, _, _ = voice()
    assert runs.stages(HERE, "r9", True, False, v, opener()) == ([row("r9")], True)
    assert runs.stages(HERE, None, False, True, v, opener(answers=False)) == ([row("r1")], False)
    assert FakeSite.opened[0].asked == [("stages", None, False, True)]


def test_a_site_that_raises_is_closed_all_the_same() -> None:
    v, _, _ = voice()
    with pytest.raises(errors.EngineError):
        runs.logs(HERE, "r", runs.LogView(), v, opener(fail={"r": errors.EngineError("lost")}))
    assert FakeSite.opened[0].closed


def test_logs_passes_the_view_on_as_it_was_asked() -> None:
    v, _, _ = voice()
    view = runs.LogView(stages=(1,), since=100, tail=5, timestamps=True, follow=False, log_dir="/x")
    assert runs.logs(HERE, "r", view, v, opener()) is True
    assert FakeSite.opened[0].asked == [("logs", "r", view)]


def test_gc_is_a_failure_when_a_place_did_not_answer() -> None:
    v, _, _ = voice()
    assert runs.gc(HERE, True, v, opener()) is True
    assert runs.gc(HERE, False, v, opener(answers=False)) is False


def test_the_site_for_ray_is_rays_and_quiets_rays_output_first_without_connecting() -> None:
    quieted: list[bool] = []
    v, _, _ = voice()
    place = runs.site(runs.Where(ray="127.0.0.1:1", quiet_ray=lambda: quieted.append(True)), None, v)
    assert isinstance(place, on_ray.RaySite) and quieted == [True]
    assert place.close() is True
    with pytest.raises(errors.UsageError, match="name the runs"):
        place.down(None, 1.0, None)  # every run of a cluster at once is refused before anything is asked


@pytest.mark.parametrize(
    ("stamp", "sortable"),
    [
        ("2026-01-02T03:04:05.5Z", "2026-01-02T03:04:05.500000000"),
        ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05.000000000"),
        ("2026-01-02T03:04:05.123456789Z", "2026-01-02T03:04:05.123456789"),
    ],
)
def test_instant_pads_the_fraction_so_times_sort_as_text(stamp: str, sortable: str) -> None:
    assert docker_runs.instant(stamp) == sortable
