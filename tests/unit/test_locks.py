"""The engine's GPU lock over a fake engine: a running lock is never taken, whatever its age or owner;
the wait is said once, bounded, and a stop signal ends it at once; only a lock that is not running is cleared."""

from __future__ import annotations

from typing import Any

import pytest

from pp_launch.app import locks
from pp_launch.core import errors, labels


class FakeHeld:
    def __init__(self, engine: FakeLockEngine) -> None:
        self.engine, self.id = engine, "mine" * 16

    def release(self) -> None:  # removes by id, as Held does: never a lock that another launch took since
        if self.alive():
            self.engine.lock = None

    def alive(self) -> bool:  # by id: the lock this holder created, still running
        return self.engine.lock is not None and self.engine.lock["Id"] == "mine" * 16

    def lost(self) -> str:
        return "removed"


class FakeLockEngine:
    """`hold` fails while `lock` (the inspect answer for the name) is set; removing clears it."""

    def __init__(self, lock: dict[str, Any] | None = None, clock: str = "2026-12-03T12:00:00.000000000Z") -> None:
        self.lock, self.now, self.removed, self.holds = lock, clock, [], 0

    def hold(self, name: str, image: str, lab: dict[str, str]) -> FakeHeld | None:
        self.holds += 1
        if self.lock is not None:
            return None
        self.lock = {"Id": "mine" * 16, "State": {"Running": True, "Status": "running"}, "Config": {"Labels": lab}}
        return FakeHeld(self)

    def inspect(self, name: str) -> dict[str, Any] | None:
        return self.lock

    def remove(self, ref: str) -> None:
        self.removed.append(ref)
        self.lock = None

    def clock(self) -> str:
        return self.now


def lock(status: str, ours: bool = True, created: str = "2026-12-03T11:00:00Z") -> dict[str, Any]:
    lab = {labels.RUN: "ffffffffffff", labels.STAGE: "lock", labels.OWNER: "otherbox:1:1"} if ours else {}
    return {
        "Id": "held" * 16,
        "Created": created,
        "State": {"Running": status == "running", "Status": status},
        "Config": {"Labels": lab},
    }


def take(engine: FakeLockEngine, timeout: float = 0.5, stop: Any = lambda: None) -> tuple[locks.GpuLocks, list[str]]:
    said: list[str] = []
    site = locks.LockSite("gpu1", engine, "id-1")  # type: ignore[arg-type]
    gl = locks.GpuLocks([site], "aaaaaaaaaaaa", "me:1:1", said.append, stop, timeout=timeout)
    gl.acquire()
    return gl, said


@pytest.mark.parametrize("ours", [True, False])
def test_a_running_lock_is_never_taken_over_whatever_its_age(ours: bool) -> None:
    engine = FakeLockEngine(lock("running", ours, created="2020-01-01T00:00:00Z"))  # years old
    with pytest.raises(errors.LockTimeout) as exc:
        take(engine)
    assert engine.removed == [] and engine.lock is not None
    holder = "run ffffffffffff of otherbox:1:1" if ours else "a container not made by pp-launch"
    assert f"the GPU lock on gpu1 is still held by {holder}" in str(exc.value) and exc.value.exit_code == 2


def test_the_wait_is_said_once_and_names_the_holder() -> None:
    engine = FakeLockEngine(lock("running"))
    said: list[str] = []
    site = locks.LockSite("gpu1", engine, "id-1")  # type: ignore[arg-type]
    with pytest.raises(errors.LockTimeout):
        locks.GpuLocks([site], "a" * 12, "me:1:1", said.append, timeout=0.6).acquire()
    assert engine.holds > 2 and len(said) == 1
    assert said[0].startswith("waiting for the GPU lock on gpu1, held by run ffffffffffff of otherbox:1:1")


def test_a_stop_signal_ends_the_wait_at_once_with_128_plus_n() -> None:
    engine = FakeLockEngine(lock("running"))
    with pytest.raises(errors.Interrupted) as exc:
        take(engine, timeout=3600, stop=lambda: 2)
    assert exc.value.exit_code == 130 and engine.lock is not None


@pytest.mark.parametrize(
    ("status", "created", "cleared"),
    [
        ("exited", "2026-12-03T11:59:59Z", True),  # it ended: holds nothing
        ("dead", "2026-12-03T11:59:59Z", True),
        ("created", "2026-12-03T11:59:00Z", True),  # never started 60 s after its creation: its creator died
        ("created", "2026-12-03T11:59:55Z", False),  # a launcher between create and start: wait
    ],
)
def test_only_a_lock_that_is_not_running_is_cleared(status: str, created: str, cleared: bool) -> None:
    engine = FakeLockEngine(lock(status, created=created))
    if cleared:
        gl, said = take(engine)
        assert engine.removed == ["held" * 16] and said == []
        gl.release()
        assert engine.lock is None
    else:
        with pytest.raises(errors.LockTimeout):
            take(engine)
        assert engine.removed == []


def test_a_stopped_container_of_that_name_that_is_not_ours_is_never_touched() -> None:
    engine = FakeLockEngine(lock("exited", ours=False))
    with pytest.raises(errors.LockTimeout):
        take(engine)
    assert engine.removed == []


def test_engines_are_locked_in_identity_order_and_all_released_on_failure() -> None:
    free, busy = FakeLockEngine(), FakeLockEngine(lock("running"))
    sites = [locks.LockSite("b", busy, "id-2"), locks.LockSite("a", free, "id-1")]  # type: ignore[arg-type]
    gl = locks.GpuLocks(sites, "a" * 12, "me:1:1", timeout=0.3)
    with pytest.raises(errors.LockTimeout):
        gl.acquire()
    assert free.holds == 1 and free.lock is None  # taken first (id-1), then let go when b could not be had
    assert gl.held == {}


def test_a_lock_removed_by_another_client_is_lost_and_stops_the_launch() -> None:
    """`docker rm -f pp-launch-gpu-lock` (or `down --all`) while this launch places: the holder's look by id says
    so before its stages are created, and again before it lets go; either way the launch stops (LockLost)."""
    engine = FakeLockEngine()
    gl, _ = take(engine)
    gl.check()  # still ours
    engine.lock = lock("running")  # removed, and another launch took the name meanwhile
    with pytest.raises(errors.LockLost, match="removed by another client") as exc:
        gl.check()
    assert exc.value.exit_code == 1
    with pytest.raises(errors.LockLost):
        gl.check_and_release()
    assert gl.held == {}  # let go either way
    assert engine.lock == lock("running")  # the other launch's lock was never touched


# ------------------------------------------------------------------------------------ held by the run's guard
class NamingEngine:
    """Containers by id with names, unique per engine as Docker keeps them: `rename` is a test-and-set."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # id -> name
        self.running: set[str] = set()
        self.lab: dict[str, dict[str, str]] = {}
        self.holds, self.renames = 0, 0

    def add(self, ref: str, name: str, stage: str, running: bool = True) -> None:
        self.names[ref], self.lab[ref] = name, {labels.RUN: ref[:12], labels.STAGE: stage, labels.OWNER: "o:1:1"}
        if running:
            self.running.add(ref)

    def rename(self, ref: str, name: str) -> bool:
        self.renames += 1
        if ref not in self.names:
            raise errors.EngineError(f"cannot rename container {ref[:12]}: it is gone")
        if name in self.names.values():
            return False
        self.names[ref] = name
        return True

    def inspect(self, ref: str) -> dict[str, Any] | None:
        by_name = {n: r for r, n in self.names.items()}
        ref = by_name.get(ref, ref)
        if ref not in self.names:
            return None
        state = {"Running": ref in self.running, "Status": "running" if ref in self.running else "exited"}
        return {"Id": ref, "Name": "/" + self.names[ref], "State": state, "Config": {"Labels": self.lab[ref]}}

    def hold(self, *args: object) -> None:
        self.holds += 1
        raise AssertionError("a launch with a guard makes no lock container")

    def remove(self, ref: str) -> None:
        self.names.pop(ref, None)
        self.running.discard(ref)

    def clock(self) -> str:
        return "2026-12-03T12:00:00.000000000Z"


def guarded(engine: NamingEngine, guard: str, timeout: float = 0.5) -> locks.GpuLocks:
    site = locks.LockSite("gpu1", engine, "id-1", lambda: guard)  # type: ignore[arg-type]
    return locks.GpuLocks([site], "aaaaaaaaaaaa", "me:1:1", timeout=timeout)


def test_the_runs_guard_holds_the_lock_by_its_name_and_is_named_back_once_its_stages_exist() -> None:
    engine = NamingEngine()
    engine.add("g" * 64, "pp-guard-aaaaaaaaaaaa-1234abcd", labels.STAGE_GUARD)
    gl = guarded(engine, "g" * 64)
    gl.acquire()
    assert engine.names["g" * 64] == locks.LOCK_NAME and engine.holds == 0  # one rename, no container
    gl.check()
    gl.check_and_release()
    assert engine.names["g" * 64].startswith("pp-guard-aaaaaaaaaaaa-") and "g" * 64 in engine.running
    assert engine.inspect(locks.LOCK_NAME) is None  # free for the next launch


def test_a_guard_waits_on_a_lock_held_by_anyone_and_names_the_holder() -> None:
    engine = NamingEngine()
    engine.add("g" * 64, "pp-guard-aaaaaaaaaaaa-1234abcd", labels.STAGE_GUARD)
    engine.add("h" * 64, locks.LOCK_NAME, labels.STAGE_GUARD)  # another run's guard holds it
    with pytest.raises(errors.LockTimeout, match=r"held by run hhhhhhhhhhhh of o:1:1 \(its guard hhhhhhhhhhhh\)"):
        guarded(engine, "g" * 64).acquire()
    assert engine.names["h" * 64] == locks.LOCK_NAME and "h" * 64 in engine.running  # never touched
    assert engine.names["g" * 64].startswith("pp-guard-")


def test_an_ended_guard_left_under_the_locks_name_holds_nothing() -> None:
    """Its auto-remove did not happen (an engine restarted under it): ended, it is cleared as an ended lock is."""
    engine = NamingEngine()
    engine.add("g" * 64, "pp-guard-aaaaaaaaaaaa-1234abcd", labels.STAGE_GUARD)
    engine.add("h" * 64, locks.LOCK_NAME, labels.STAGE_GUARD, running=False)
    gl = guarded(engine, "g" * 64)
    gl.acquire()
    assert "h" * 64 not in engine.names and engine.names["g" * 64] == locks.LOCK_NAME


@pytest.mark.parametrize("how", ["removed", "renamed-away"])
def test_a_guard_that_holds_the_lock_and_is_removed_or_renamed_by_another_client_is_a_lost_lock(how: str) -> None:
    engine = NamingEngine()
    engine.add("g" * 64, "pp-guard-aaaaaaaaaaaa-1234abcd", labels.STAGE_GUARD)
    gl = guarded(engine, "g" * 64)
    gl.acquire()
    if how == "removed":
        engine.remove("g" * 64)
    else:
        engine.names["g" * 64] = "someone-elses-name"
    engine.add("h" * 64, locks.LOCK_NAME, labels.STAGE_GUARD)  # and another launch took the lock meanwhile
    said = "removed" if how == "removed" else "renamed to someone-elses-name"
    with pytest.raises(errors.LockLost, match=f"was {said} by another client"):
        gl.check_and_release()
    assert engine.names["h" * 64] == locks.LOCK_NAME  # the other launch's lock was never touched


def test_a_guard_removed_before_it_could_take_the_lock_stops_the_launch_saying_so() -> None:
    engine = NamingEngine()
    with pytest.raises(errors.LockLost, match=r"the run's guard on gpu1 \(container gggggggggggg\) is gone"):
        guarded(engine, "g" * 64).acquire()


def test_a_locks_age_is_zero_when_either_time_is_unreadable() -> None:
    assert locks.age("2026-12-03T12:00:00Z", "2026-12-03T12:00:31.5Z") == pytest.approx(31.5)
    assert locks.age("garbage", "2026-12-03T12:00:31Z") == 0.0
    assert locks.age("2026-12-03T12:00:00Z", "") == 0.0
