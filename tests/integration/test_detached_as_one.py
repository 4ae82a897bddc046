"""A pipeline ends as one, detached too (docs/recovery.md): once a detached run is up, a stage that ends ends the
whole run; its guard stops the others (every stage confirmed gone), its record says which stage ended it and how,
and `wait RUN` reports it."""

from __future__ import annotations

import pytest

from ..helpers import Launcher, remember_run, run_containers, wait_until

pytestmark = pytest.mark.docker


def test_a_stage_of_a_detached_run_that_fails_ends_the_whole_run(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    up = Launcher("chain", "--stages", "3", "--gpus", "none", "--grace", "1", "--json", "--detach",
                  "--env", "STUB_MODE=hold", "--stage-env", "1:STUB_EXIT_AFTER=3",
                  "--stage-env", "1:STUB_EXIT_CODE=3")  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    waited = Launcher("wait", run, "--timeout", "60")
    assert waited.wait(90) == 0, waited.stderr_text()  # every code known: docker wait's 0
    codes = {line.split()[1]: line.split()[-1] for line in waited.stdout_lines if line.startswith("stage ")}
    assert codes.get("1") == "3" and set(codes) == {"0", "1", "2"}, waited.stdout_lines
    said = waited.stderr_text()
    assert f"run {run} was ended as one by stage 1 (pp-{run}-1), which exited 3" in said, said
    assert wait_until(lambda: run_containers(engine, run) == [], 15), run_containers(engine, run)
