"""adapters/guard.py: what the launcher says became of a guard that fell silent, as the engine answers `inspect`. A
fake engine stands at the I/O boundary; the launcher's replacing of a guard on a real engine is
tests/integration/test_guard.py."""

from __future__ import annotations

from typing import Any, cast

import pytest

from pp_launch.adapters import guard
from pp_launch.adapters.docker_engine import Engine


class DyingEngine:
    """A guard container that still runs for the first `running_for` looks, then is gone (killed and auto-removed),
    or stays (None); paused when told."""

    def __init__(self, running_for: int | None, paused: bool = False) -> None:
        self.running_for, self.paused, self.looks = running_for, paused, 0

    def inspect(self, ref: str) -> dict[str, Any] | None:
        self.looks += 1
        if self.running_for is not None and self.looks > self.running_for:
            return None
        return {"Id": ref, "State": {"Running": True, "Paused": self.paused}}


def happened(engine: DyingEngine, ended: bool) -> str:
    return guard._what_happened(cast(Engine, engine), "g1", ended)


def test_a_guard_the_engine_says_died_a_while_after_its_session_ended_is_said_killed_not_silenced() -> None:
    """`docker rm -f` of a guard under load: the session ended, and the engine said the container died over a second
    later (seen in CI). 21 looks 50 ms apart are past a second."""
    engine = DyingEngine(running_for=21)
    assert happened(engine, ended=True) == "killed or removed"
    assert engine.looks == 22


def test_a_guard_that_still_runs_with_its_session_cut_is_said_silenced_and_one_only_slow_is_not_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(guard, "KILL_SEEN_WITHIN", 0.2)  # waited for that long, then said as it is
    assert happened(DyingEngine(running_for=None), ended=True) == "silenced (its session ended)"
    quiet = DyingEngine(running_for=None)
    assert happened(quiet, ended=False) == "" and quiet.looks == 1  # only slow: asked once, not waited for


def test_a_paused_guard_is_said_paused_at_once() -> None:
    engine = DyingEngine(running_for=None, paused=True)
    assert happened(engine, ended=True) == "paused" and engine.looks == 1
