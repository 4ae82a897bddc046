"""The one teardown: a stop signal to every target at once, one grace, SIGKILL to those still there, then wait
for the engine to confirm them gone; bounded in time (grace + kill_wait, plus each engine call's own timeout).

Used by the chain scope, and so by every way in: chains, pp-gpu-node, the testing kit, the worker driver's
generations, and `down` and the watchdog (which adopt a run). Errors are gathered, typed (`TeardownError`), never
raised half-way: one stage that cannot be signalled must not keep the others from their grace. Once the engine is
lost it is asked nothing more (each call would wait for its timeout). How to wait is the caller's: the chain keeps
its events flowing while it waits.

Pure: time and threads come through the Runtime port.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pp_launch.core import errors
from pp_launch.core.chain.ports import Runtime

T = TypeVar("T")
Wait = Callable[[Callable[[], bool], float], None]  # return once the condition holds or the deadline passed


class Stopper(Protocol):
    """What a teardown asks of the engine (every StageBackend is one). "No such container" is success."""

    def signal(self, ref: str, signum: int) -> None: ...

    def kill(self, ref: str) -> None: ...

    def remove(self, ref: str) -> None: ...


@dataclass(frozen=True)
class TeardownError:
    """One engine call of a teardown that failed: what was asked, and the error."""

    what: str
    error: errors.PpLaunchError

    def __str__(self) -> str:
        return f"{self.what}: {self.error}"


class TeardownFailed(errors.PpLaunchError):
    """A teardown that could not confirm everything gone: what may be left, and every error on the way."""

    def __init__(self, what: str, left: Sequence[str], failures: Sequence[TeardownError]) -> None:
        said = [f"{', '.join(r[:12] for r in left)} not confirmed gone"] if left else []
        said += [str(f) for f in failures]
        super().__init__(f"{what}: " + "; ".join(said or ["failed"]))
        self.left = tuple(left)
        self.failures = tuple(failures)


class Teardown:
    """One teardown's engine calls, its gathered errors and its deadlines."""

    def __init__(self, stopper: Stopper, runtime: Runtime, grace: float, kill_wait: float) -> None:
        self.stopper = stopper
        self.runtime = runtime
        self.grace = grace
        self.kill_wait = kill_wait
        self.errors: list[TeardownError] = []
        self.lost: errors.EngineLost | None = None  # the engine went away: ask it nothing more

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        """One engine call: True when it was done; an error is gathered and the teardown goes on."""
        if self.lost is not None:
            return False
        try:
            fn(*args)
            return True
        except errors.EngineLost as exc:
            self.lost = exc
            self.errors.append(TeardownError(what, exc))
        except errors.PpLaunchError as exc:
            self.errors.append(TeardownError(what, exc))
        return False

    def each(self, items: Sequence[T], what: Callable[[T], str], fn: Callable[[T], None]) -> None:
        """The same engine call for every item at once: N targets cost one call's time, and a lost engine one
        timeout, not N. Every thread has ended when this returns; a bug in a call is raised here."""
        results = self.runtime.run_all([lambda item=item: self.call(what(item), fn, item) for item in items])  # type: ignore[misc]
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def stop(
        self,
        targets: Sequence[T],
        ref: Callable[[T], str],
        gone: Callable[[T], bool],
        wait: Wait,
        signum: int = signal.SIGTERM,
        on_kill: Callable[[T], None] = lambda target: None,
        hurry: Callable[[], bool] = lambda: False,
        name: Callable[[T], str] | None = None,
    ) -> list[T]:
        """`signum` to every target, the grace (cut short when `hurry()`: a second stop request), SIGKILL to those
        still there, then up to kill_wait for the engine to confirm them gone. Returns the targets not confirmed
        gone (none, unless the engine was lost or did not answer in time). `name`: a target in error messages."""
        named = name or (lambda t: ref(t)[:12])
        sig = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        self.each(targets, lambda t: f"{sig} to {named(t)}", lambda t: self.stopper.signal(ref(t), signum))
        wait(lambda: hurry() or self.lost is not None or all(gone(t) for t in targets), self.runtime.now() + self.grace)
        overran = [t for t in targets if not gone(t)]
        for t in overran:
            on_kill(t)
        self.each(overran, lambda t: f"SIGKILL to {named(t)}", lambda t: self.stopper.kill(ref(t)))
        wait(lambda: self.lost is not None or all(gone(t) for t in targets), self.runtime.now() + self.kill_wait)
        return [t for t in targets if not gone(t)]
