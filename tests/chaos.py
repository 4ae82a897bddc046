"""Chaos scenarios: kill the launcher with a signal at a chosen phase and count what it leaves behind.

Used by tests/integration/test_chaos.py (assertions) and bench/chaos_report.py (the README's table).
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from .helpers import Launcher, wait_until

PHASES = ("starting", "roster", "logging", "teardown")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
GRACE = 1.0


@dataclass(frozen=True)
class Case:
    phase: str
    signum: int
    ignore_sigterm: bool = False

    @property
    def name(self) -> str:
        ignore = "-ignoring" if self.ignore_sigterm else ""
        return f"{self.phase}-{signal.Signals(self.signum).name}{ignore}"


@dataclass(frozen=True)
class Result:
    case: Case
    exit_code: int | None
    expected_exit: int
    left: list[str]
    teardown_s: float  # from the (first) signal until the launcher exited and, for SIGKILL, the engine was clean
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.left and self.exit_code == self.expected_exit


def _args(case: Case) -> list[str]:
    args = ["chain", "--stages", "4", "--json", "--gpus", "none", "--grace", str(GRACE), "--env", "STUB_MODE=hold"]
    if case.ignore_sigterm:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    if case.phase == "starting":
        args += ["--stage-env", "2:STUB_ANNOUNCE_DELAY=3"]
    if case.phase == "logging":
        args += ["--env", "STUB_LOG_RATE=1000"]
    if case.phase == "teardown" and not case.ignore_sigterm:
        args += ["--stage-env", "3:STUB_IGNORE_SIGTERM=1"]  # something for the teardown to be in the middle of
    return args


def run_case(engine: Any, case: Case) -> Result:
    launcher = Launcher(*_args(case))
    run = launcher.run_id
    if case.phase == "starting":
        launcher.wait_event("stage_started", stage=2, timeout=60)
    else:
        launcher.wait_event("pp_stage_roster", timeout=60)
    if case.phase == "logging":
        time.sleep(1.0)
    t0 = time.monotonic()
    if case.phase == "teardown":
        launcher.signal(signal.SIGTERM)
        time.sleep(GRACE / 2)
    launcher.signal(case.signum)
    rc = launcher.wait(60)
    if case.signum == signal.SIGKILL:
        expected = -signal.SIGKILL
        wait_until(lambda: not _left(engine, run), 10)
    else:
        expected = 143 if case.phase == "teardown" else 128 + case.signum
    elapsed = time.monotonic() - t0
    return Result(case, rc, expected, _left(engine, run), elapsed, launcher.stderr_text()[-2000:])


def _left(engine: Any, run: str) -> list[str]:
    return [c.name for c in engine.containers([f"pp-launch.run={run}"])]


def matrix() -> list[Case]:
    return [Case(p, s, i) for i in (False, True) for p in PHASES for s in SIGNALS]


def random_kill(engine: Any, rng: random.Random) -> Result:
    """A chain killed at a random moment (from just after its start to well after its roster) with a random signal."""
    signum = rng.choice(SIGNALS)
    ignore = rng.random() < 0.5
    case = Case("random", signum, ignore)
    args = ["chain", "--stages", "4", "--json", "--gpus", "none", "--grace", str(GRACE), "--env", "STUB_MODE=hold"]
    if ignore:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    launcher = Launcher(*args)
    time.sleep(rng.uniform(0.05, 2.5))
    t0 = time.monotonic()
    launcher.signal(signum)
    rc = launcher.wait(60)
    run = next((e["run"] for e in launcher.events), None)
    if run is None:  # killed before it said anything: find its containers by its owner label instead
        owner_pid = f":{launcher.proc.pid}:"

        def left_fn():
            return [
                c.name for c in engine.containers(["pp-launch.run"]) if owner_pid in c.labels.get("pp-launch.owner", "")
            ]
    else:
        left_fn = lambda: _left(engine, run)  # noqa: E731
    if signum == signal.SIGKILL:
        wait_until(lambda: not left_fn(), 10)
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
    return Result(case, rc, expected, left_fn(), time.monotonic() - t0, launcher.stderr_text()[-2000:])
