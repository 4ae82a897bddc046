"""The GPU lock of an engine: held by one launch from before it reads which GPUs are taken (the containers' labels)
until its own stages exist (their labels then say which GPUs they hold), so that no two launches, of any user on
any machine, give one GPU twice.

The lock is an engine object, not a file: a running container named `pp-launch-gpu-lock` (names are unique per
engine), tied to its launcher by the same stdin lifeline as a stage (`Engine.hold`), running `cat` from
pp-launch's own guard image (nothing from the stage image). It lives exactly as long as its holder: when the
launcher dies, however it dies, the engine removes it. It counts as held only once the engine says it runs, and
the holder looks at it again, by id, before its stages are created and before it lets go: a lock that another
client removed meanwhile stops the launch (LockLost, exit 1) before any of its stages starts. There is no
staleness clock, so a live lock is never taken over, whatever its age: a second launch waits, says once on whom,
and gives up after PP_LOCK_TIMEOUT seconds (exit 2, nothing started); a stop signal ends the wait at once
(128+N). A running container is never removed here, nor one that is not ours (a container of that name without
our labels is waited on and named, never touched). Only a lock container that is not running can be removed: one
that ended, or one whose launcher died between creating and starting it (still unstarted 30 s after its creation
on the engine's clock). Engines are locked in a fixed order (their identity), so two launches never wait on each
other.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pp_launch.adapters.docker_engine import Engine, Held
from pp_launch.core import errors, labels
from pp_launch.core.announce import escape
from pp_launch.core.chain.plan import GUARD_IMAGE

LOCK_NAME = "pp-launch-gpu-lock"
LOCK_STAGE = "lock"
TIMEOUT_ENV = "PP_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
UNSTARTED = 30.0  # seconds a lock container may sit created but not started before its creator counts as dead
POLL = 0.2


@dataclass(frozen=True)
class LockSite:
    """One engine to lock: its name in messages (a --host, or the engine's address) and its identity."""

    name: str
    engine: Engine
    engine_id: str


def age(created: str, now: str) -> float:
    """Seconds between two of the engine's RFC 3339 times (nanoseconds cut to micro); 0 when either is unreadable."""

    def parse(text: str) -> datetime.datetime:
        head, _, frac = text.rstrip("Z").partition(".")
        zone = ""
        for sign in ("+", "-"):
            if sign in frac:
                frac, zone = frac.split(sign, 1)[0], sign + frac.split(sign, 1)[1]
        return datetime.datetime.fromisoformat(f"{head}.{(frac or '0')[:6]}{zone or '+00:00'}")

    try:
        return (parse(now) - parse(created)).total_seconds()
    except ValueError:
        return 0.0


def holder(info: dict[str, object]) -> str:
    """Who holds a lock container, in words, everything from its labels escaped."""
    held = dict((info.get("Config") or {}).get("Labels") or {})  # type: ignore[attr-defined]
    ident = str(info.get("Id", ""))[:12]
    if labels.RUN not in held:
        return f"a container not made by pp-launch (id {ident})"
    return f"run {escape(held[labels.RUN])} of {escape(held.get(labels.OWNER, '?'))} (lock container {ident})"


class GpuLocks:
    def __init__(
        self,
        sites: Sequence[LockSite],
        run_id: str,
        owner: str,
        say: Callable[[str], None] = lambda text: None,
        stop_requested: Callable[[], int | None] = lambda: None,
        timeout: float | None = None,
        attempt: int = 1,
    ) -> None:
        self.sites = sorted(sites, key=lambda s: s.engine_id)
        self.image = GUARD_IMAGE  # the lock's body is ours, whatever the stages run
        self.run_id = run_id
        self.labels = {
            labels.RUN: run_id,
            labels.STAGE: LOCK_STAGE,
            labels.OWNER: owner,
            labels.GPUS: "",
            labels.ATTEMPT: str(attempt),
        }
        self.say = say
        self.stop_requested = stop_requested
        self.timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT)) if timeout is None else timeout
        self.held: dict[str, Held] = {}

    def acquire(self) -> None:
        try:
            for site in self.sites:
                self.held[site.name] = self._take(site, time.monotonic() + self.timeout)
        except BaseException:
            self.release()
            raise

    def _take(self, site: LockSite, deadline: float) -> Held:
        said = ""
        while True:
            if (signum := self.stop_requested()) is not None:
                raise errors.Interrupted(signum)
            got = site.engine.hold(LOCK_NAME, self.image, self.labels)
            if got is not None:
                return got
            info = site.engine.inspect(LOCK_NAME)
            if info is None:
                continue  # released in between
            if self._dead_lock(site, info):
                site.engine.remove(str(info.get("Id", "")))
                continue
            who = holder(info)
            if who != said:
                self.say(
                    f"waiting for the GPU lock on {site.name}, held by {who} (up to {self.timeout:g} s, "
                    f"{TIMEOUT_ENV}; Ctrl-C stops waiting)"
                )
                said = who
            if time.monotonic() > deadline:
                raise errors.LockTimeout(
                    f"the GPU lock on {site.name} is still held by {who} after {self.timeout:g} s: another launch "
                    f"is placing its stages there. Nothing was started; try again when it is up, or raise "
                    f"{TIMEOUT_ENV}"
                )
            time.sleep(POLL)

    def _dead_lock(self, site: LockSite, info: dict[str, object]) -> bool:
        """A lock container of ours that is not running: it holds nothing (ended, or never started)."""
        state = dict(info.get("State") or {})  # type: ignore[call-overload]
        held = dict((info.get("Config") or {}).get("Labels") or {})  # type: ignore[attr-defined]
        if state.get("Running") or labels.RUN not in held or held.get(labels.STAGE) != LOCK_STAGE:
            return False
        status = str(state.get("Status", ""))
        if status in ("exited", "dead"):
            return True
        return status == "created" and age(str(info.get("Created", "")), site.engine.clock()) > UNSTARTED

    def check(self) -> None:
        """Every lock taken still runs (by the id the engine gave): else LockLost, naming the engine."""
        for name, got in self.held.items():
            if not got.alive():
                raise errors.LockLost(
                    f"the GPU lock on {name or 'this engine'} (container {got.id[:12]}) was removed by another "
                    "client while this launch placed its stages: another launch may be taking the same GPUs, so "
                    "this one stops before any stage starts. Nothing else was touched; run it again"
                )

    def check_and_release(self) -> None:
        """Once every stage exists: the locks are checked, then let go (their labels now hold the GPUs). Let go
        either way: a lost lock is LockLost, which stops the launch."""
        try:
            self.check()
        finally:
            self.release()

    def release(self) -> None:
        """Idempotent; called once the chain's containers exist, and on every way out."""
        while self.held:
            _, got = self.held.popitem()
            got.release()


@contextlib.contextmanager
def reserve(
    sites: Sequence[LockSite],
    run_id: str,
    owner: str,
    say: Callable[[str], None] = lambda text: None,
    stop_requested: Callable[[], int | None] = lambda: None,
    attempt: int = 1,
) -> Iterator[GpuLocks]:
    """The one reservation scope of a launch (the chain and pp-gpu-node): inside it the engines' GPU locks are
    taken when GPUs are picked (`acquire`), released early once every stage exists (`release`, idempotent: the
    stages' labels then hold the GPUs), and always when the block ends, however it ends."""
    locks = GpuLocks(sites, run_id, owner, say, stop_requested, attempt=attempt)
    try:
        yield locks
    finally:
        locks.release()
