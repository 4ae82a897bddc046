"""app/docker_runs.py: `pp-launch wait RUN --until announced` on one engine. A fake engine stands at the I/O boundary
(what `inspect` finds and what a container's log says); the run's guard's record of each stage's end is handed in,
as the site reads it. The command on a real engine: tests/integration/test_runs_cmd.py."""

from __future__ import annotations

from typing import Any, cast

import pytest

from pp_launch.adapters.docker_engine import ContainerInfo, Engine
from pp_launch.adapters.guard import StageEnd
from pp_launch.app import docker_runs
from pp_launch.app.site import Voice
from pp_launch.core import errors

RUN = "0123456789ab"


class FakeEngine:
    """Containers that are there (by id) with the lines of their log; one that leaves after it was looked at once."""

    def __init__(self, logs: dict[str, list[bytes]], leaves: str = "") -> None:
        self.logs, self.leaves, self.looked = logs, leaves, 0

    def inspect(self, ref: str) -> dict[str, Any] | None:
        if ref == self.leaves:
            self.looked += 1
            return None if self.looked > 1 else {"Id": ref}
        return {"Id": ref} if ref in self.logs else None

    def log_lines(self, ref: str) -> list[bytes]:
        return self.logs.get(ref, [])


def stage(k: int, attempt: int = 1) -> ContainerInfo:
    tags = {"pp-launch.run": RUN, "pp-launch.stage": str(k), "pp-launch.attempt": str(attempt)}
    return ContainerInfo(id=f"c{k}a{attempt}", name=f"pp-{RUN}-{k}", image="i", state="running", created=0, labels=tags)


def end(k: int, code: int | None, attempt: int = 1, at: int = 100) -> StageEnd:
    return StageEnd(id=f"c{k}a{attempt}", stage=str(k), attempt=attempt, exit_code=code, at=at, name=f"pp-{RUN}-{k}")


def announce(k: int) -> list[bytes]:
    return [f"PP_GPU_NODE_ADDR {'ab' * 32} 127.0.0.1:{4000 + k}".encode()]


def wait(engine: FakeEngine, found: list[ContainerInfo], ends: list[StageEnd]) -> tuple[int, list[str], list[str]]:
    answers: list[str] = []
    notes: list[str] = []
    pairs = [(cast(Engine, engine), c) for c in found]
    recorded = {e.id: e for e in ends}
    code = docker_runs._wait_announced(RUN, pairs, None, Voice(answers.append, notes.append), lambda: recorded)
    return code, answers, notes


def test_every_stage_announced_is_printed_and_the_answer_is_0() -> None:
    engine = FakeEngine({"c0a1": announce(0), "c1a1": announce(1)})
    code, answers, notes = wait(engine, [stage(0), stage(1)], [])
    assert code == 0 and notes == []
    assert answers == [f"stage 0 pp-{RUN}-0 127.0.0.1:4000", f"stage 1 pp-{RUN}-1 127.0.0.1:4001"]


def test_a_stage_that_ended_before_the_wait_looked_is_said_with_its_code_and_the_answer_is_1() -> None:
    engine = FakeEngine({"c1a1": announce(1)})
    code, answers, notes = wait(engine, [stage(1)], [end(0, 4)])
    assert code == errors.EXIT_FAILURE
    assert answers == [f"stage 1 pp-{RUN}-1 127.0.0.1:4001"]
    assert notes == [f"pp-launch: run {RUN}: stage 0 (pp-{RUN}-0) has ended: exited 4; 'pp-launch wait {RUN}' gives "
                     "every stage's code"]  # fmt: skip


def test_a_stage_that_ends_while_the_wait_looks_is_said_with_its_code_not_as_never_announced() -> None:
    engine = FakeEngine({"c1a1": announce(1)}, leaves="c0a1")  # stage 0 there at first, with nothing said yet
    code, answers, notes = wait(engine, [stage(0), stage(1)], [end(0, None)])
    assert code == errors.EXIT_FAILURE
    assert answers == [f"stage 1 pp-{RUN}-1 127.0.0.1:4001"]
    assert len(notes) == 1 and "stage 0 (pp-" in notes[0] and "exited with an unknown code" in notes[0], notes


def test_a_stage_gone_with_no_recorded_end_is_an_error_that_does_not_claim_it_never_announced() -> None:
    engine = FakeEngine({"c1a1": announce(1)}, leaves="c0a1")
    with pytest.raises(errors.PpLaunchError, match=r"stage 0 \(pp-0123456789ab-0\) is gone before its address"):
        wait(engine, [stage(0), stage(1)], [])


def test_an_earlier_attempts_end_of_a_restarted_stage_is_not_a_stage_that_ended() -> None:
    engine = FakeEngine({"c0a2": announce(0), "c1a2": announce(1)})
    code, answers, notes = wait(engine, [stage(0, 2), stage(1, 2)], [end(0, 3), end(1, 137)])
    assert code == 0 and notes == [] and len(answers) == 2


def test_of_several_ends_of_a_stage_that_is_gone_the_last_is_said() -> None:
    engine = FakeEngine({"c1a2": announce(1)})
    code, _, notes = wait(engine, [stage(1, 2)], [end(0, 3, attempt=1, at=100), end(0, 9, attempt=2, at=200)])
    assert code == errors.EXIT_FAILURE and len(notes) == 1 and "exited 9" in notes[0], notes
