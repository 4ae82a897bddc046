"""A run's attempts (`--max-restarts N`, `--restart-backoff S`; docs/recovery.md): the same run id, a new attempt of
the whole chain after a stage failed, the GPUs that faulted passed over, until one attempt ends otherwise or none is
left. Every site (one engine, several, a Ray cluster) runs each attempt with its own `once`; this loop is the same.

Between two attempts nothing of the run's stages exists (the attempt's teardown confirmed it), but the run does: on
Docker engines its guards stay up from the first attempt to the last, so `pp-launch down RUN` during the backoff ends
the run there (no further attempt), as a stop signal does. The run's reporter and its kept output (`pp-launch logs`)
are one across the attempts.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pp_launch.adapters import run_logs
from pp_launch.adapters.runtime import StopLatch
from pp_launch.core import errors, events
from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.chain.restarts import Attempt, RestartPolicy, final_message, first_line
from pp_launch.core.chain.scope import ChainOutcome, Reporter

if TYPE_CHECKING:
    from pp_launch.adapters.guard import RunGuard
    from pp_launch.app.request import Hooks, Launched, LaunchRequest, Stoppable

Once = Callable[["LaunchRequest", "Hooks"], "Launched"]
DOWN = "'pp-launch down' (told to the run's guard)"


def run(request: LaunchRequest, hooks: Hooks, once: Once, guards: Mapping[str, RunGuard]) -> Launched:
    """Attempt after attempt of `request` (its run id set), each through `once`, as the policy allows."""
    policy = RestartPolicy(request.max_restarts, request.restart_backoff)
    output = _RunOutput(request, hooks)
    if policy.max_restarts == 0:  # one attempt: the caller's hooks as they are
        try:
            return once(request, _one(hooks, output))
        finally:
            output.close()
    between = StopLatch()
    relay = _Relay(between)
    hooks.on_scope(relay)  # from now on every stop reaches the attempt running, or ends the backoff
    history: list[Attempt] = []
    avoid = request.avoid_gpus
    last: Launched | None = None
    try:
        attempt = 1
        while True:
            this = dataclasses.replace(
                request, avoid_gpus=avoid, chain=dataclasses.replace(request.chain, attempt=attempt)
            )
            try:
                done = once(this, _hooks_for(hooks, output, relay))
            except errors.ConfigError as exc:  # a later attempt that cannot be placed: the run failed, exit 1
                if attempt == 1 or last is None:
                    raise
                return _could_not_start(last, tuple(history), attempt, exc, output)
            last = done
            relay.target = None
            assert done.outcome is not None
            delay = policy.after(attempt, done.restartable)
            if delay is None:
                return _final(done, tuple(history), policy, hooks)
            reason = first_line(done.outcome.message) or done.outcome.reason
            history.append(Attempt(attempt, reason, done.outcome.failed_stage))
            avoid = tuple(dict.fromkeys((*avoid, *done.faults)))
            output.event(
                events.ChainRestarting(
                    attempt=attempt + 1,
                    max=policy.attempts,
                    reason=reason,
                    stage=done.outcome.failed_stage,
                    backoff_s=delay,
                )
            )
            hooks.say(
                f"attempt {attempt} of run {request.run_id} failed ({reason}): attempt {attempt + 1} of "
                f"{policy.attempts} in {delay:g} s (--max-restarts {policy.max_restarts})"
            )
            for g in guards.values():  # `pp-launch down` during the backoff: no further attempt
                g.when_down(lambda: relay.request_stop(signal.SIGTERM, DOWN))
            if between.wait(delay):
                return _stopped_between(done, tuple(history), attempt + 1, between, output)
            attempt += 1
    finally:
        between.close()
        output.close()


def _one(hooks: Hooks, output: _RunOutput) -> Hooks:
    return dataclasses.replace(hooks, reporter=output.reporter)


def _hooks_for(hooks: Hooks, output: _RunOutput, relay: _Relay) -> Hooks:
    """An attempt's hooks: the run's one reporter; its scope takes the stops from the relay (one that came between
    attempts, or while this one planned, is handed to it at once)."""

    def on_scope(scope: Stoppable) -> None:
        relay.target = scope
        if relay.latch.signum is not None:
            scope.request_stop(relay.latch.signum, relay.latch.by)

    def stop_pending() -> int | None:
        return relay.latch.signum if relay.latch.signum is not None else hooks.stop_pending()

    return dataclasses.replace(hooks, reporter=output.reporter, on_scope=on_scope, stop_pending=stop_pending)


def _could_not_start(
    done: Launched, history: tuple[Attempt, ...], attempt: int, exc: errors.PpLaunchError, output: _RunOutput
) -> Launched:
    """An attempt after the first that cannot start (its GPUs no longer fit, its image is gone): the run has run,
    so this is a failure (exit 1), not a configuration error; every attempt is named."""
    said = "; ".join(f"attempt {a.number}: {a.reason}" for a in history)
    message = f"attempt {attempt} could not start: {first_line(str(exc))}; every attempt before it: {said}"
    output.event(
        events.ChainStopped(
            reason=events.StopReason.ERROR, exit_code=errors.EXIT_FAILURE, removed=(), orphans=(), message=message
        )
    )
    outcome = ChainOutcome(errors.EXIT_FAILURE, "error", message)
    return dataclasses.replace(done, outcome=outcome, restartable=False)


class _Relay:
    """Where the caller's stops go for the whole run: to the attempt's scope while one runs, and always into the
    latch, so that a stop between two attempts (or as one ends) ends the run instead of being lost."""

    def __init__(self, latch: StopLatch) -> None:
        self.latch = latch
        self.target: Stoppable | None = None

    def request_stop(self, signum: int, by: str = "") -> None:
        self.latch.request_stop(signum, by)
        target = self.target
        if target is not None:
            target.request_stop(signum, by)


def _final(done: Launched, history: tuple[Attempt, ...], policy: RestartPolicy, hooks: Hooks) -> Launched:
    """The last attempt's result, its exit code kept; the message names every attempt's reason."""
    outcome = done.outcome
    assert outcome is not None
    if not history:
        return done
    failed = outcome.exit_code != 0
    message = final_message(outcome.message, history, policy, failed, done.restartable)
    if not failed:
        hooks.say(message)
    return dataclasses.replace(done, outcome=dataclasses.replace(outcome, message=message if failed else ""))


def _stopped_between(
    done: Launched, history: tuple[Attempt, ...], next_attempt: int, between: StopLatch, output: _RunOutput
) -> Launched:
    """Stopped during the backoff: nothing of the run's stages existed; the run ends with 128+N, said."""
    signum = between.signum if between.signum is not None else signal.SIGTERM
    name = between.by or (signal.Signals(signum).name if signum in signal.valid_signals() else str(signum))
    said = "; ".join(f"attempt {a.number}: {a.reason}" for a in history)
    message = f"stopped by {name} before attempt {next_attempt} (nothing of the run was running); {said}"
    code = errors.exit_code_for_signal(signum)
    output.event(
        events.ChainStopped(reason=events.StopReason.SIGNAL, exit_code=code, removed=(), orphans=(), message=message)
    )
    outcome = ChainOutcome(code, "signal", message)
    return dataclasses.replace(done, outcome=outcome, restartable=False)


class _RunOutput:
    """The run's reporter (the caller's, made with the first attempt's plan) and its output kept beside it for
    `pp-launch logs`, the same across every attempt."""

    def __init__(self, request: LaunchRequest, hooks: Hooks) -> None:
        self.request, self.hooks = request, hooks
        self._reporter: Reporter | None = None
        self.kept: run_logs.RunLog | None = None

    def reporter(self, plan: ChainPlan) -> Reporter:
        if self._reporter is None:
            self.kept = _keep_logs(self.request, plan, self.hooks.say)
            inner = self.hooks.reporter(plan)
            self._reporter = inner if self.kept is None else _Kept(inner, self.kept, plan)
        return self._reporter

    def event(self, event: events.Event) -> None:
        if self._reporter is not None:
            self._reporter.event(event)

    def close(self) -> None:
        if self.kept is not None:
            self.kept.close()
            if self.kept.problem:
                self.hooks.say(f"warning: {self.kept.problem}")


def _keep_logs(request: LaunchRequest, plan: ChainPlan, say: Callable[[str], None]) -> run_logs.RunLog | None:
    """Where the run's output is kept; a state directory that cannot be used is said, and the chain runs on."""
    if not request.keep_logs:
        return None
    try:
        kept = run_logs.RunLog(plan.run_id, request.log_dir)
        kept.place(hosts=list(request.hosts), ray=request.ray)
        if kept.note:
            say(f"note: {kept.note}")
        return kept
    except errors.PpLaunchError as exc:
        say(f"warning: this run's output will not be kept for 'pp-launch logs': {exc}")
        return None


class _Kept:
    """The caller's reporter, and every stage line kept beside it. A chain that stopped before a stage of it
    started (the engine refused it) keeps that too, with the reason: `ps -a` and `logs` show it."""

    def __init__(self, inner: Reporter, kept: run_logs.RunLog, plan: ChainPlan) -> None:
        self.inner, self.kept, self.plan = inner, kept, plan
        self.started: set[int] = set()

    def event(self, event: events.Event) -> None:
        if isinstance(event, events.StageStarted):
            self.started.add(event.stage)
            self.kept.stage(event.stage, container=event.container, image=event.image)
        elif isinstance(event, events.StageExited):
            self.kept.stage(event.stage, exit_code=event.exit_code)
        elif isinstance(event, events.ChainStopped) and event.message and not self.started:
            for s in self.plan.stages:
                self.kept.stage(s.index, container=s.name, image=s.image, refused=event.message)
                self.kept.line(s.index, "stderr", f"pp-launch: not started: {event.message}")
        self.inner.event(event)

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        self.kept.line(stage, stream, text)
        self.inner.stage_line(stage, stream, text)

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        self.inner.stage_state(stage, state, detail)
