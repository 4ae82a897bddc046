"""The one owner of threads (adapters/runtime.py, Nursery): every thread of pp-launch starts there, is joined
within its owner's bound, and one that cannot be is reported by name and owner, once: never silently left."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pp_launch.adapters.runtime import Nursery, map_all, run_all

PKG = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch"


def test_threads_that_end_are_joined_and_nothing_is_reported() -> None:
    said: list[str] = []
    done: list[int] = []
    with Nursery("the owner", said.append) as nursery:
        for k in range(3):
            nursery.start(done.append, k, name=f"worker-{k}")
    assert sorted(done) == [0, 1, 2] and said == []


def test_one_that_cannot_be_joined_is_reported_by_name_once_and_returned() -> None:
    said: list[str] = []
    release = threading.Event()
    nursery = Nursery("run abc's stages", said.append)
    nursery.start(release.wait, name="stage-1-output")
    nursery.start(lambda: None, name="stage-0-output")
    assert nursery.join(0.05) == ["stage-1-output"]
    assert said == ["run abc's stages: thread stage-1-output still runs after 0.05 s; it ends with the process"]
    assert nursery.join(0.0) == ["stage-1-output"] and len(said) == 1  # reported once, still returned
    release.set()
    assert nursery.join(None) == [] and len(said) == 1


def test_its_threads_are_daemons_unless_asked_and_named() -> None:
    nursery = Nursery("owner", lambda text: None)
    gate = threading.Event()
    quiet = nursery.start(gate.wait, name="quiet")
    kept = nursery.start(gate.wait, name="kept", daemon=False)
    assert (quiet.daemon, kept.daemon, quiet.name, kept.name) == (True, False, "quiet", "kept")
    gate.set()
    assert nursery.join(None) == []


def test_no_thread_of_the_package_starts_anywhere_else() -> None:
    """threading.Thread( appears once in the package: in the nursery; and no thread pool of its own anywhere
    (run_all and map_all run calls at once on a nursery)."""
    starts = [
        f"{path.relative_to(PKG)}:{n}"
        for path in sorted(PKG.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "threading.Thread(" in line or "ThreadPoolExecutor" in line
    ]
    assert [where.split(":")[0] for where in starts] == ["adapters/runtime.py"], starts


def test_run_all_runs_every_call_at_once_and_hands_back_results_and_exceptions_in_order() -> None:
    gate = threading.Barrier(3, timeout=10)  # three calls that wait for each other: they must run at once

    def meet(k: int) -> int:
        gate.wait()
        return k

    def fails() -> int:
        raise ValueError("no")

    got = run_all([lambda: meet(0), lambda: meet(1), lambda: meet(2), fails], "pp-test-all", max_workers=4)
    assert got[:3] == [0, 1, 2] and isinstance(got[3], ValueError)
    assert not [t for t in threading.enumerate() if t.name.startswith("pp-test-all")]  # every one joined


def test_map_all_raises_the_first_exception_raised_but_returns_one_that_is_a_result() -> None:
    ended: list[int] = []

    def fn(k: int) -> object:
        ended.append(k)
        if k in (1, 3):
            raise KeyError(k)
        return ValueError(k) if k == 0 else k  # an exception object returned is a result

    with pytest.raises(KeyError) as raised:
        map_all(fn, range(5), "pp-test-map")
    assert raised.value.args == (1,)
    assert sorted(ended) == [0, 1, 2, 3, 4]  # raised once every call ended
    got = map_all(lambda k: ValueError(k) if k == 0 else k, range(3), "pp-test-map")
    assert isinstance(got[0], ValueError) and got[1:] == [1, 2]
