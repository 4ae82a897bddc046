"""Health as docker's (docs/recovery.md, "Health checks"): a stage whose health check fails fails the chain as one
that exited, said in one line naming the stage and the check's last output; restarted under --max-restarts; and a
detached run's guard ends the run the same way once its launcher has left."""

from __future__ import annotations

import pytest

from ..helpers import Launcher, docker, remember_run, run_containers, wait_until

pytestmark = pytest.mark.docker
CHECK = ["--health-cmd", "if [ -e /tmp/sick ]; then echo sick since $(cat /tmp/sick); exit 1; fi",
         "--health-interval", "300ms", "--health-retries", "2"]  # fmt: skip


def test_a_stage_that_turns_unhealthy_fails_the_chain_naming_the_check_and_its_output(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--grace", "1", "--json", "--env", "STUB_MODE=hold",
                     *CHECK)  # fmt: skip
    run = chain.wait_event("pp_stage_roster", timeout=60)["run"]
    assert docker("exec", f"pp-{run}-1", "sh", "-c", "echo noon > /tmp/sick").returncode == 0
    assert chain.wait(60) == 1, chain.stderr_text()
    said = chain.stderr_text()
    line = next((x for x in said.splitlines() if x.startswith("pp-launch: error: stage 1 ")), "")
    assert f"(pp-{run}-1) exited with code 137 (unhealthy: its health check failed" in line, said
    assert "last output: sick since noon" in line, said
    assert run_containers(engine, run) == []


def test_a_detached_runs_guard_ends_the_run_when_a_stage_turns_unhealthy(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--grace", "1", "--json", "--detach",
                  "--env", "STUB_MODE=hold", *CHECK)  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    assert docker("exec", f"pp-{run}-0", "sh", "-c", "echo dusk > /tmp/sick").returncode == 0
    assert wait_until(lambda: run_containers(engine, run) == [], 30), run_containers(engine, run)
    waited = Launcher("wait", run, "--timeout", "30")
    assert waited.wait(60) == 0, waited.stderr_text()
    assert any(line.startswith("stage 0 ") and line.endswith(" exited 137") for line in waited.stdout_lines)
    assert "was ended as one by stage 0" in waited.stderr_text(), waited.stderr_text()
