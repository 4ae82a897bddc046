"""Nothing resident (docs/chain.md, "Nothing resident"): after every way a run ends, no container of pp-launch's is
left on the engine it used; nothing is started ahead of a run. On the side engine, where no other test's run is
there to be counted at the same moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import Launcher, remember_run

pytestmark = pytest.mark.full


def _ours(side_engine) -> list[str]:  # type: ignore[no-untyped-def]
    """Every container with pp-launch's run label on the side engine, as `docker ps -a` lists it."""
    return side_engine.docker("ps", "-aq", "--filter", "label=pp-launch.run", check=False).stdout.split()


def _chain(side_engine, *args: str) -> Launcher:  # type: ignore[no-untyped-def]
    return Launcher("chain", "--gpus", "none", "--grace", "1", *args, env={"DOCKER_HOST": side_engine.host})


def test_nothing_is_left_on_the_engine_after_any_end_of_a_run(side_engine, tmp_path: Path) -> None:
    """A completed chain, a stage that fails, a missing host path, a missing image, an image the engine cannot start,
    and a detached run ended by `down`: each launcher's end leaves no container labelled pp-launch.run, at once (the
    launcher says what it removed only once the engine confirmed it)."""
    weights = tmp_path / "weights"
    weights.mkdir()
    cases: list[tuple[str, tuple[str, ...], int]] = [
        ("completed", ("--stages", "2", "--env", "STUB_MODE=write-weights", "--env", "STUB_WEIGHTS=/w/demo.npz",
                       "-v", f"{weights}:/w"), 0),
        ("a stage failed", ("--stages", "2", "--env", "STUB_MODE=hold", "--stage-env", "1:STUB_EXIT_AFTER=0.3",
                            "--stage-env", "1:STUB_EXIT_CODE=3"), 1),
        ("a missing host path", ("--stages", "2", "-v", f"{tmp_path}/nowhere:/w"), 2),
        ("a missing image", ("--stages", "2", "--image", "pp-launch-test/never-built:none"), 2),
        ("an entrypoint that is not there", ("--stages", "2", "--entrypoint", "/no/such/program"), 1),
        ("a device the engine refuses", ("--stages", "2", "--device", "/dev/pp-tests-no-such-device"), 1),
    ]  # fmt: skip
    for what, args, code in cases:
        chain = _chain(side_engine, *args)
        got = chain.wait(120)
        said = chain.stderr_text()
        assert got == code, f"{what}: exit {got}\n{said}"
        assert _ours(side_engine) == [], f"{what}: left on the engine after the launcher's end\n{said}"
    up = _chain(side_engine, "--stages", "2", "--json", "--detach", "--env", "STUB_MODE=hold")
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    assert len(_ours(side_engine)) == 3  # a detached run: exactly its two stages and its guard, while it lives
    down = Launcher("down", run, "--grace", "1", env={"DOCKER_HOST": side_engine.host})
    assert down.wait(60) == 0, down.stderr_text()
    assert _ours(side_engine) == [], f"after down {run}: {down.stderr_text()}"


def test_a_run_the_engine_refused_to_start_is_in_ps_a_and_logs_with_the_engines_reason(side_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A device the engine cannot give the stage (it refuses the start): nothing is left, and the run is not lost
    from sight: `ps -a` lists its stages as not started, `logs RUN` says why, in the engine's words."""
    chain = _chain(side_engine, "--stages", "2", "--json", "--device", "/dev/pp-tests-no-such-device")
    assert chain.wait(120) == 1, chain.stderr_text()
    run = chain.events_named("chain_stopped")[-1]["run"]
    env = {"DOCKER_HOST": side_engine.host}
    shown = Launcher("ps", "-a", "--filter", f"run={run}", "--format", "{{.Names}} {{.Status}}", env=env)
    assert shown.wait(60) == 0, shown.stderr_text()
    assert shown.stdout_lines == [f"pp-{run}-0 Not started", f"pp-{run}-1 Not started"], shown.stdout_lines
    logs = Launcher("logs", run, env=env)
    assert logs.wait(60) == 0, logs.stderr_text()
    said = "\n".join(logs.stdout_lines)
    assert "pp-launch: not started: stage " in said and "pp-tests-no-such-device" in said, said
