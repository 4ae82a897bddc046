"""The restart policy (core/chain/restarts.py) and a run's attempts (app/attempts.py) through their own API: each
attempt is a `once` that returns what an attempt of the chain would; nothing else is faked."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from pp_launch.app import attempts
from pp_launch.app.launch import Hooks, Launched, LaunchRequest
from pp_launch.core import events
from pp_launch.core.chain.plan import ChainPlan, ChainRequest
from pp_launch.core.chain.restarts import (
    BACKOFF_CAP,
    Attempt,
    RestartPolicy,
    final_message,
    first_line,
    may_restart,
)
from pp_launch.core.chain.scope import ChainOutcome


def test_the_backoff_doubles_and_is_capped() -> None:
    policy = RestartPolicy(max_restarts=10, backoff=1.5)
    assert [policy.delay(a) for a in range(1, 7)] == [1.5, 3.0, 6.0, 12.0, 24.0, BACKOFF_CAP]
    assert RestartPolicy(3, 0).delay(5) == 0.0


def test_only_a_restartable_end_restarts_and_only_while_attempts_are_left() -> None:
    policy = RestartPolicy(max_restarts=2, backoff=1)
    assert policy.after(1, restartable=True) == 1 and policy.after(2, restartable=True) == 2
    assert policy.after(3, restartable=True) is None  # the third attempt was the last
    assert policy.after(1, restartable=False) is None
    assert RestartPolicy().after(1, restartable=True) is None  # the default: no restart, today's behaviour


@pytest.mark.parametrize(
    ("reason", "orphans", "lost", "held", "may"),
    [
        ("stage_failed", False, False, True, True),
        ("stage_failed", True, False, True, False),  # a container not confirmed gone
        ("stage_failed", False, True, True, False),  # an engine, host, Ray node or head lost
        ("stage_failed", False, False, False, False),  # a guard another client ended, not replaced
        ("signal", False, False, True, False),
        ("down", False, False, True, False),
        ("place_lost", False, False, True, False),
        ("completed", False, False, True, False),
    ],
)
def test_may_restart_is_one_rule_for_every_site(reason: str, orphans: bool, lost: bool, held: bool, may: bool) -> None:
    asked: list[bool] = []

    def guards_held() -> bool:  # an engine call each: asked only when nothing else rules a restart out
        asked.append(True)
        return held

    assert may_restart(reason, orphans, lost, guards_held) is may
    assert asked == ([True] if reason == "stage_failed" and not orphans and not lost else [])


def test_an_attempts_reason_is_one_line() -> None:
    message = "stage 1 (pp-x-1) exited with code 3; its last lines:\n  [stage 1] boom"
    assert first_line(message) == "stage 1 (pp-x-1) exited with code 3"


def test_the_final_message_names_every_attempt() -> None:
    history = (Attempt(1, "stage 1 (a) exited with code 3", 1), Attempt(2, "stage 0 (b) exited with code 9", 0))
    policy = RestartPolicy(2)
    ran_out = final_message("stage 1 (c) exited with code 3; its last lines:\n  x", history, policy, True)
    assert ran_out.startswith(
        "stage 1 (c) exited with code 3; its last lines:\n  x; no restart left (--max-restarts 2)"
    )
    assert ran_out.endswith(
        "every attempt: attempt 1: stage 1 (a) exited with code 3; attempt 2: stage 0 (b) exited with code 9; "
        "attempt 3: stage 1 (c) exited with code 3"
    )
    stopped = final_message("stopped by SIGTERM", history[:1], policy, True, restartable=False)
    assert stopped == "stopped by SIGTERM; on attempt 2, after attempt 1: stage 1 (a) exited with code 3"
    assert final_message("", history[:1], policy, False) == (
        "completed on attempt 2 of at most 3; before it: attempt 1: stage 1 (a) exited with code 3"
    )
    assert final_message("as is", (), policy, True) == "as is"


# ------------------------------------------------------------------------------------------ the attempts loop
class Recorder:
    def __init__(self) -> None:
        self.events: list[events.Event] = []

    def event(self, event: events.Event) -> None:
        self.events.append(event)

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        pass

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        pass


def request(max_restarts: int, backoff: float = 0.0) -> LaunchRequest:
    return LaunchRequest(
        ChainRequest(stages=2),
        run_id="0123456789ab",
        max_restarts=max_restarts,
        restart_backoff=backoff,
        keep_logs=False,
    )


def scripted(results: list[tuple[int, str, bool, tuple[tuple[str, str], ...]]]) -> tuple[Any, list[LaunchRequest]]:
    """A `once` returning, attempt by attempt, (exit code, reason, restartable, faults); it records each request."""
    seen: list[LaunchRequest] = []

    def once(r: LaunchRequest, hooks: Hooks) -> Launched:
        seen.append(r)
        code, reason, restartable, faults = results[len(seen) - 1]
        plan = ChainPlan(run_id=r.run_id or "", stages=())
        hooks.reporter(plan)
        message = "" if code == 0 else f"stage 1 (pp-{len(seen)}) exited with code {code}"
        outcome = ChainOutcome(code, reason, message, 1 if code else None)
        return Launched(plan, "", outcome, restartable=restartable, faults=faults)

    return once, seen


def test_attempts_run_until_one_succeeds_each_with_its_number_and_the_faulted_gpus_avoided() -> None:
    once, seen = scripted(
        [(3, "stage_failed", True, (("GPU-a", "Xid 79"),)), (3, "stage_failed", True, ()), (0, "completed", False, ())]
    )
    rec, said = Recorder(), []
    done = attempts.run(request(3), Hooks(say=said.append, reporter=lambda plan: rec), once, {})
    assert done.outcome is not None and done.outcome.exit_code == 0
    assert [r.chain.attempt for r in seen] == [1, 2, 3]
    assert [r.avoid_gpus for r in seen] == [(), (("GPU-a", "Xid 79"),), (("GPU-a", "Xid 79"),)]
    restarting = [e for e in rec.events if isinstance(e, events.ChainRestarting)]
    assert [(e.attempt, e.max, e.stage) for e in restarting] == [(2, 4, 1), (3, 4, 1)]
    assert said[-1].startswith("completed on attempt 3 of at most 4")


def test_the_last_attempts_exit_code_is_the_runs() -> None:
    once, seen = scripted([(3, "stage_failed", True, ()), (7, "stage_failed", True, ())])
    done = attempts.run(request(1), Hooks(reporter=lambda plan: Recorder()), once, {})
    assert done.outcome is not None and done.outcome.exit_code == 7 and len(seen) == 2
    assert "no restart left (--max-restarts 1)" in done.outcome.message


@pytest.mark.parametrize("reason", ["signal", "error"])
def test_what_is_not_restartable_is_never_restarted(reason: str) -> None:
    once, seen = scripted([(143, reason, False, ()), (0, "completed", False, ())])
    done = attempts.run(request(5), Hooks(reporter=lambda plan: Recorder()), once, {})
    assert len(seen) == 1 and done.outcome is not None and done.outcome.exit_code == 143


def test_a_stop_during_the_backoff_ends_the_run_with_128_plus_n_and_a_last_chain_stopped() -> None:
    once, seen = scripted([(3, "stage_failed", True, ()), (0, "completed", False, ())])
    rec = Recorder()

    def on_scope(target: Any) -> None:  # where stops go for the run: a signal arrives a moment later
        threading.Timer(0.05, target.request_stop, (signal.SIGINT,)).start()

    done = attempts.run(request(3, backoff=30), Hooks(reporter=lambda plan: rec, on_scope=on_scope), once, {})
    assert len(seen) == 1 and done.outcome is not None
    assert (done.outcome.exit_code, done.outcome.reason) == (130, "signal")
    assert done.outcome.message.startswith("stopped by SIGINT before attempt 2 (nothing of the run was running)")
    last = rec.events[-1]
    assert isinstance(last, events.ChainStopped) and last.exit_code == 130 and last.removed == ()


def test_chain_files_and_the_command_line_take_the_policy(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from pp_launch.cli.chain_cmd import chain, file_keys
    from pp_launch.cli.main import main

    assert {"max-restarts", "restart-backoff"} <= set(file_keys(chain))
    bad = CliRunner().invoke(main, ["chain", "--max-restarts", "-1", "--dry-run"])
    assert bad.exit_code == 2 and "--max-restarts" in bad.output
    path = tmp_path / "chain.toml"
    path.write_text('stages = 2\nrestart-backoff = "soon"\n')
    wrong = CliRunner().invoke(main, ["chain", "-f", str(path), "--dry-run"])
    assert wrong.exit_code == 2 and f"chain file {path}, line 2: restart-backoff" in wrong.output


def test_a_later_attempt_that_cannot_be_placed_fails_the_run_with_exit_1_not_2() -> None:
    """Exit 2 means nothing was started; by attempt 2 the run has run, so its GPUs running out is a failure."""
    from pp_launch.core import errors

    once, _ = scripted([(3, "stage_failed", True, (("GPU-a", "Xid 79"),))])

    def then_no_gpus(r: LaunchRequest, hooks: Hooks) -> Launched:
        if r.chain.attempt == 2:
            raise errors.NotEnoughGpus("not enough GPUs: 2 stages x 1 need 2, 1 free of 2\n  GPU 0 faulted")
        return once(r, hooks)

    rec = Recorder()
    done = attempts.run(request(2), Hooks(reporter=lambda plan: rec), then_no_gpus, {})
    assert done.outcome is not None and done.outcome.exit_code == 1 and not done.restartable
    assert done.outcome.message.startswith("attempt 2 could not start: not enough GPUs: 2 stages x 1 need 2")
    assert "every attempt before it: attempt 1: stage 1 (pp-1) exited with code 3" in done.outcome.message
    last = rec.events[-1]
    assert isinstance(last, events.ChainStopped) and last.exit_code == 1


def test_a_first_attempt_that_cannot_be_placed_is_still_exit_2() -> None:
    from pp_launch.core import errors

    def no_gpus(r: LaunchRequest, hooks: Hooks) -> Launched:
        raise errors.NotEnoughGpus("not enough GPUs")

    with pytest.raises(errors.NotEnoughGpus):
        attempts.run(request(2), Hooks(reporter=lambda plan: Recorder()), no_gpus, {})
