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

A launch with a guard on the engine (adapters/guard.py: a chain's run has one from before its GPUs are picked)
holds the lock with it instead of a container of its own: its guard is renamed `pp-launch-gpu-lock` (a rename is a
test-and-set: names are unique per engine) and renamed back once its stages exist. The guard lives exactly as long
as its launcher (the same lifeline), so the lock does too, and one engine call replaces a container's create and
start (docs/benchmarks.md, "The GPU lock"). To everyone else it is a lock like any other: a running container of
that name, waited on and named.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pp_launch.adapters.docker_engine import Engine, engine_time
from pp_launch.adapters.guard import guard_name
from pp_launch.core import errors, labels
from pp_launch.core.announce import escape
from pp_launch.core.chain.plan import GUARD_IMAGE

LOCK_NAME = "pp-launch-gpu-lock"
LOCK_STAGE = "lock"
GUARD_STAGE = labels.STAGE_GUARD  # a run's guard holding the lock (renamed)
TIMEOUT_ENV = "PP_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
UNSTARTED = 30.0  # seconds a lock container may sit created but not started before its creator counts as dead
POLL = 0.2


class Holder(Protocol):
    """What holds a lock: `Held` (a lock container of its own) or `GuardHeld` (the run's guard, renamed)."""

    id: str

    def alive(self) -> bool: ...

    def lost(self) -> str:
        """How it stopped holding the lock, in words ("removed", "renamed to NAME")."""
        ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class LockSite:
    """One engine to lock: its name in messages (a --host, or the engine's address) and its identity; `guard`: the
    id of the run's guard there, once it runs (waited for), when the launch has one: it holds the lock."""

    name: str
    engine: Engine
    engine_id: str
    guard: Callable[[], str] | None = None


class GuardHeld:
    """The lock held by the run's guard, renamed: it holds it while the engine says that very container (by id)
    runs under the lock's name; let go by naming it back (a fresh guard name: nobody can have taken it)."""

    def __init__(self, engine: Engine, ref: str, run_id: str) -> None:
        self.engine, self.id, self.run_id = engine, ref, run_id
        self._held = True

    def alive(self) -> bool:
        info = self._info()
        return bool((info.get("State") or {}).get("Running")) and info.get("Name") == f"/{LOCK_NAME}"

    def lost(self) -> str:
        """How it no longer holds the lock, in words ("removed", "renamed to NAME", "stopped")."""
        info = self._info()
        if not info:
            return "removed"
        if (info.get("State") or {}).get("Running"):
            return f"renamed to {escape(str(info.get('Name', '?')).lstrip('/'))}"
        return "stopped"

    def running(self) -> bool:
        """The guard still runs, under whatever name."""
        return bool((self._info().get("State") or {}).get("Running"))

    def _info(self) -> dict[str, Any]:
        try:
            return self.engine.inspect(self.id) or {}
        except errors.PpLaunchError:
            return {}

    def release(self) -> None:
        """Idempotent; a guard that is gone holds nothing (its container went with its name)."""
        if not self._held:
            return
        self._held = False
        for _ in range(3):
            with contextlib.suppress(errors.PpLaunchError):
                if self.engine.rename(self.id, guard_name(self.run_id)):
                    return


def age(created: str, now: str) -> float:
    """Seconds between two of the engine's RFC 3339 times; 0 when either is unreadable."""
    then, at = engine_time(created), engine_time(now)
    return at - then if then and at else 0.0


def holder(info: dict[str, object]) -> str:
    """Who holds a lock container, in words, everything from its labels escaped."""
    held = dict((info.get("Config") or {}).get("Labels") or {})  # type: ignore[attr-defined]
    ident = str(info.get("Id", ""))[:12]
    if labels.RUN not in held:
        return f"a container not made by pp-launch (id {ident})"
    what = "its guard" if held.get(labels.STAGE) == GUARD_STAGE else "lock container"
    return f"run {escape(held[labels.RUN])} of {escape(held.get(labels.OWNER, '?'))} ({what} {ident})"


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
        self.held: dict[str, Holder] = {}
        self.taken: list[str] = []  # the engines whose lock this attempt took (held or let go since)

    def acquire(self) -> None:
        try:
            for site in self.sites:
                self.held[site.name] = self._take(site, time.monotonic() + self.timeout)
                self.taken.append(site.name)
        except BaseException:
            self.release()
            raise

    def _take(self, site: LockSite, deadline: float) -> Holder:
        said = ""
        guard = site.guard() if site.guard is not None else ""
        while True:
            if (signum := self.stop_requested()) is not None:
                raise errors.Interrupted(signum)
            got = self._hold(site, guard)
            if got is not None:
                return got
            info = site.engine.inspect(LOCK_NAME)
            if info is None:
                if guard and not GuardHeld(site.engine, guard, self.run_id).running():
                    raise errors.LockLost(
                        f"the run's guard on {site.name or 'this engine'} (container {guard[:12]}) is gone: removed "
                        "by another client before it could hold the GPU lock. Nothing was started; run it again"
                    )
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

    def _hold(self, site: LockSite, guard: str) -> Holder | None:
        """The lock taken by this launch's guard there (renamed), or by a lock container of its own; None: taken."""
        if not guard:
            return site.engine.hold(LOCK_NAME, self.image, self.labels)
        try:
            return GuardHeld(site.engine, guard, self.run_id) if site.engine.rename(guard, LOCK_NAME) else None
        except errors.EngineError:  # the guard is gone: said by the caller, once it sees the lock free
            return None

    def _dead_lock(self, site: LockSite, info: dict[str, object]) -> bool:
        """A lock container of ours that is not running: it holds nothing (ended, or never started)."""
        state = dict(info.get("State") or {})  # type: ignore[call-overload]
        held = dict((info.get("Config") or {}).get("Labels") or {})  # type: ignore[attr-defined]
        if state.get("Running") or labels.RUN not in held or held.get(labels.STAGE) not in (LOCK_STAGE, GUARD_STAGE):
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
                    f"the GPU lock on {name or 'this engine'} (container {got.id[:12]}) was {got.lost()} by another "
                    "client while this launch placed its stages: another launch may be taking the same GPUs, so "
                    "this one stops before any stage starts. Nothing else was touched; run it again"
                )

    def made(self) -> list[str]:
        """The run's guards (started while the launch plans, one per engine) and the GPU locks taken, in words."""
        guards = [f"the run's guard on {s.name or 'this engine'}" for s in self.sites if s.guard is not None]
        return guards + [f"the GPU lock on {name or 'this engine'}" for name in self.taken]

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
