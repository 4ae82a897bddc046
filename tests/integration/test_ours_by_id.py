"""Ours by id only (docs/chain.md): a container that only looks like a run's guard (the guard's image, the run's
labels, even a volume under the run's record name) is never signalled, waited on or removed by `down`, `down --all`,
`gc` or `ps`, whoever runs them; it is named, with how to remove it. On the side engine: `down --all` there stops
only what the test made."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pp_launch.core.chain.plan import GUARD_IMAGE

from ..helpers import Launcher, remember_run, unique

pytestmark = pytest.mark.full


def _as_another_user(side_engine, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """pp-launch for a second user of the engine: a state directory of their own, nothing the launcher kept."""
    (tmp_path / "other-state").mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "PP_LAUNCH_STATE_DIR": str(tmp_path / "other-state"), "DOCKER_HOST": side_engine.host}
    argv = [sys.executable, "-m", "pp_launch", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90, check=False)


def _look_alike(side_engine, run: str) -> str:  # type: ignore[no-untyped-def]
    """A neighbour's container of the guard's image, with run `run`'s guard labels and a volume under its record's
    name mounted where a guard keeps it."""
    volume = f"pp-launch-record-{run}-deadbeef"
    made = side_engine.docker(
        "run", "-d", "--init", "--name", unique("look-alike-guard-"), "--network", "none",
        "--label", f"pp-launch.run={run}", "--label", "pp-launch.stage=guard", "--label", "pp-launch.owner=detached",
        "--label", "pp-launch.gpus=", "--label", "pp-launch.attempt=1", "-v", f"{volume}:/record",
        "--entrypoint", "sleep", GUARD_IMAGE, "300",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _state(side_engine, ref: str) -> str:  # type: ignore[no-untyped-def]
    return side_engine.docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", ref, check=False).stdout.strip()


def test_a_guard_look_alike_is_never_signalled_by_down_or_down_all_and_is_named(side_engine, tmp_path: Path) -> None:
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--grace", "1", "--json", "--detach",
                  "--env", "STUB_MODE=hold", env={"DOCKER_HOST": side_engine.host})  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    fake = _look_alike(side_engine, run)
    stray = _look_alike(side_engine, "0123456789ab")  # a run that does not exist
    try:
        began = time.monotonic()
        down = _as_another_user(side_engine, tmp_path, "down", run, "--grace", "1")
        took = time.monotonic() - began
        said = down.stdout + down.stderr
        assert down.returncode == 0, said
        assert "stopped and removed 2 containers" in said, said
        assert _state(side_engine, fake) == "running 0", said  # never signalled (SIGUSR1 would exit it 138)
        assert f"docker rm -f {fake[:12]}" in said, said  # named, with how to remove it
        assert took < 12, f"down waited {took:.1f} s (on the look-alike?)\n{said}"
        ps = _as_another_user(side_engine, tmp_path, "ps", "-a")
        assert ps.returncode == 0 and "unrecorded" in ps.stdout, ps.stdout + ps.stderr
        everything = _as_another_user(side_engine, tmp_path, "down", "--all", "--yes", "--grace", "1")
        said = everything.stdout + everything.stderr
        assert _state(side_engine, stray) == "running 0" and _state(side_engine, fake) == "running 0", said
        assert f"docker rm -f {stray[:12]}" in said, said
        gc = _as_another_user(side_engine, tmp_path, "gc")
        assert _state(side_engine, stray) == "running 0", gc.stdout + gc.stderr
    finally:
        side_engine.docker("rm", "-f", fake, stray, check=False)
        side_engine.docker("volume", "rm", f"pp-launch-record-{run}-deadbeef", "pp-launch-record-0123456789ab-deadbeef",
                           check=False)  # fmt: skip
        for volume in side_engine.docker("volume", "ls", "-q", "--filter", f"label=pp-launch.run={run}").stdout.split():
            side_engine.docker("volume", "rm", volume, check=False)
