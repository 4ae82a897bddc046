"""Issue #10 on the real engine: what is not ours is never touched, and bad input is refused, not crashed on.
Each test here failed on the code before the fix it names."""

from __future__ import annotations

import signal

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from ..helpers import Launcher, run_containers, unique

pytestmark = pytest.mark.docker


def held(stub_image: str, name: str) -> DockerContainer:
    c = DockerContainer(stub_image, name=name, network_mode="host").with_env("STUB_MODE", "hold")
    c.waiting_for(LogMessageWaitStrategy("holding")).start()
    return c


def test_a_name_held_by_a_foreign_container_is_exit_2_and_the_holder_is_untouched(engine, stub_image) -> None:
    prefix = unique("coll")
    decoy = held(stub_image, f"{prefix}-0")
    try:
        launcher = Launcher("chain", "--name", prefix, "--gpus", "none", "--json")
        assert launcher.wait(60) == 2
        text = launcher.stderr_text()
        assert f"container name {prefix}-0 is held by a container not made by pp-launch" in text
        assert "left untouched" in text
        assert engine.inspect(decoy.get_container_id())["State"]["Running"]
        assert not launcher.events_named("stage_started")  # nothing of the run started
    finally:
        decoy.stop()


def test_a_name_held_by_a_live_chain_is_exit_2_naming_its_run_and_that_chain_lives_on(engine, stub_image) -> None:
    prefix = unique("coll")
    first = Launcher("chain", "--name", prefix, "--gpus", "none", "--json", "--env", "STUB_MODE=hold")
    roster = first.wait_event("pp_stage_roster", timeout=60)
    try:
        second = Launcher("chain", "--name", prefix, "--stages", "3", "--gpus", "none", "--json")
        assert second.wait(60) == 2
        text = second.stderr_text()
        assert f"container name {prefix}-0 is held by stage 0 of pp-launch run {roster['run']}" in text
        assert f"pp-launch down {roster['run']}" in text
        assert len(run_containers(engine, roster["run"])) == 2  # the first chain is whole
    finally:
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 143
    assert run_containers(engine, roster["run"]) == []
