"""The restart policy of a chain (`--max-restarts N`, `--restart-backoff S`; docs/recovery.md). Pure.

A run is one or more attempts. When an attempt ends because a stage failed (a non-zero exit, a stage lost, no
announcement in time, a GPU fault), the whole chain has already been torn down by the one teardown; the policy
says whether another attempt of the same run comes and after how long. A stop signal, `pp-launch down`, a usage
or configuration error and a lost engine never restart. The exit code is the last attempt's; the final message
names every attempt's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BACKOFF_CAP = 30.0  # seconds: the backoff doubles after each attempt up to this


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    backoff: float = 1.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after attempt `attempt` (1-based) failed: backoff, doubling, capped at 30 s."""
        return min(self.backoff * 2 ** (attempt - 1), BACKOFF_CAP) if self.backoff > 0 else 0.0

    def after(self, attempt: int, restartable: bool) -> float | None:
        """After attempt `attempt` ended: the backoff before the next one, or None (the run ends here)."""
        if not restartable or attempt > self.max_restarts:
            return None
        return self.delay(attempt)

    @property
    def attempts(self) -> int:
        return self.max_restarts + 1


def may_restart(reason: str, orphans: bool, places_lost: bool, guards_held: Callable[[], bool] = lambda: True) -> bool:
    """Whether another attempt may follow an attempt that ended with `reason`, on any site: only a stage's failure,
    with every container confirmed gone (no orphans), no place lost (an engine, a host, a Ray node or head), and
    the run's guards still up (a guard that another client ended, and that could not be replaced, ends the run).
    `guards_held` asks the places (an engine call each), so only when all else allows a restart: an attempt stopped
    by a signal on a frozen engine must not wait on it."""
    return reason == "stage_failed" and not orphans and not places_lost and guards_held()


@dataclass(frozen=True)
class Attempt:
    """One attempt that failed and was followed by another: its number, why, which stage (None: not one stage)."""

    number: int
    reason: str
    stage: int | None = None


def first_line(message: str) -> str:
    """An attempt's reason in one line (a stage's last lines stay in that attempt's own report)."""
    line = message.split("\n", 1)[0].strip()
    for tail in ("; its last lines:", "; it printed nothing"):
        line = line.removesuffix(tail)
    return line


def final_message(
    last: str, history: tuple[Attempt, ...], policy: RestartPolicy, last_failed: bool, restartable: bool = True
) -> str:
    """The run's last message: the last attempt's own, then every attempt's reason (only when there was more than
    one). `last_failed`: the last attempt failed too (else it succeeded after restarts); `restartable`: it failed
    as a stage fails (so the restarts ran out), not by a stop or a lost engine."""
    if not history:
        return last
    n = len(history) + 1
    said = "; ".join(f"attempt {a.number}: {first_line(a.reason)}" for a in history)
    if not last_failed:
        return f"completed on attempt {n} of at most {policy.attempts}; before it: {said}"
    if not restartable:  # stopped, or a failure no attempt can mend: said as it is, the attempts before it named
        return f"{last}; on attempt {n}, after {said}"
    return (
        f"{last}; no restart left (--max-restarts {policy.max_restarts}); every attempt: {said}; attempt {n}: "
        f"{first_line(last)}"
    )
