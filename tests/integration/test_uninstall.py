"""Leaving cleanly (docs/getting-started.md, "Uninstall"): `pp-launch uninstall` removes everything of the user's
that pp-launch made on an engine (the records its runs made, pp-launch's images) and the user's state, with a dry
run that changes nothing; a live run of the user stops it; a neighbour's record is never touched. On the side
engine, whose images are loaded again after it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..engines import SideEngine
from ..helpers import Launcher, remember_run

pytestmark = pytest.mark.full
NEIGHBOUR = "pp-launch-record-aaaaaaaaaaaa-0a0b0c0d"


@pytest.fixture
def own_engine(side_engine, our_images) -> Iterator[SideEngine]:  # type: ignore[no-untyped-def]
    """The side engine, with pp-launch's images loaded again once the test removed them (other tests need them)."""
    yield side_engine
    side_engine.load(*our_images)


def test_uninstall_removes_the_users_records_images_and_state_and_nothing_else(
    own_engine: SideEngine, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = {"DOCKER_HOST": own_engine.host, "PP_LAUNCH_STATE_DIR": str(state)}

    def pp(*args: str) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, **env}
        return subprocess.run([sys.executable, "-m", "pp_launch", *args], capture_output=True, text=True, env=full,
                              timeout=120, check=False)  # fmt: skip

    others = set(own_engine.docker("volume", "ls", "-q").stdout.split())  # other tests' (the engine is shared)

    def ours() -> tuple[list[str], list[str]]:
        volumes = set(own_engine.docker("volume", "ls", "-q").stdout.split()) - others
        images = own_engine.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "pp-launch/*").stdout.split()
        return sorted(volumes), sorted(images)

    done = pp("chain", "--stages", "1", "--gpus", "none", "--grace", "1", "--env", "STUB_MODE=hold",
              "--stage-env", "0:STUB_EXIT_AFTER=0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    own_engine.docker("volume", "create", "--label", "pp-launch.run=aaaaaaaaaaaa", "--label",
                      "pp-launch.stage=record", NEIGHBOUR)  # fmt: skip
    volumes, images = ours()
    (record,) = [v for v in volumes if v != NEIGHBOUR]
    assert images == ["pp-launch/guard:latest", "pp-launch/stub-worker:latest"] and state.is_dir()

    dry = pp("uninstall", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"record {record} on {own_engine.host}: would remove" in dry.stdout, dry.stdout
    assert f"image pp-launch/guard:latest on {own_engine.host}: would remove" in dry.stdout
    assert f"state {state}: would remove" in dry.stdout and NEIGHBOUR not in dry.stdout
    assert ours() == (volumes, images) and state.is_dir()  # a dry run changes nothing

    up = Launcher("chain", "--stages", "1", "--gpus", "none", "--grace", "1", "--detach", "--json",
                  "--env", "STUB_MODE=hold", env=env)  # fmt: skip
    run = up.wait_event("pp_stage_roster", timeout=60)["run"]
    remember_run(run)
    assert up.wait(60) == 0, up.stderr_text()
    refused = pp("uninstall", "--yes")
    assert refused.returncode == 2 and f"run {run} of yours still has containers" in refused.stderr, refused.stderr
    assert f"pp-launch down {run}" in refused.stderr and state.is_dir()
    assert pp("down", run, "--grace", "1").returncode == 0

    gone = pp("uninstall", "--yes")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    volumes, images = ours()
    assert volumes == [NEIGHBOUR] and images == [] and not state.exists(), (volumes, images, gone.stdout)
    assert "then: pip uninstall pp-launch" in gone.stderr
    own_engine.docker("volume", "rm", NEIGHBOUR)
