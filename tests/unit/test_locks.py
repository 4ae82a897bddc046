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
