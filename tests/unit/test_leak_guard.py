"""The leak guard's rules, driving its hooks as pytest would, over a fake engine: it never
removes what it cannot prove a test made, leaves tests without the engine fixtures alone, and checks a fixture of
a wider scope when that scope ends."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pp_launch.adapters import identity
from pp_launch.adapters.docker_engine import ContainerInfo
from pp_launch.core import labels
from pp_launch.testing import fixtures

ME = identity.current_owner().label()


class FakeEngine:
    def __init__(self) -> None:
        self.items: dict[str, ContainerInfo] = {}
        self.removed: list[str] = []
        self.down = False

    def containers(self, label_filters: list[str]) -> list[ContainerInfo]:
        if self.down:
            raise ConnectionError("the engine does not answer")
        return [c for c in self.items.values() if labels.RUN in c.labels]

    def add(self, cid: str) -> None:
        self.items[cid] = ContainerInfo(cid, cid, "img", "running", 0, {labels.RUN: "r" * 12, labels.OWNER: ME})

    def remove(self, cid: str) -> None:
        self.removed.append(cid)
        self.items.pop(cid, None)


@dataclass
class Item:
    fixturenames: list[str] = field(default_factory=lambda: ["pp_engine"])
    nodeid: str = "test_x.py::test_x"


@dataclass
class FixtureDef:
    scope: str
    argname: str = "shared"


def drive(gen: Generator[Any, Any, Any], result: Any = None) -> Any:
    next(gen)
    try:
        gen.send(result)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the hook wrapper yielded twice")


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> tuple[fixtures.LeakGuard, FakeEngine]:
    monkeypatch.setattr(fixtures, "SETTLE", 0.0)
    monkeypatch.setattr(fixtures, "_launchers", lambda keep=frozenset(): [])
    g, engine = fixtures.LeakGuard(), FakeEngine()
    g._engine = engine
    return g, engine


def run_test(g: fixtures.LeakGuard, item: Item, during: Any = lambda: None) -> None:
    drive(g.pytest_runtest_setup(item))  # type: ignore[arg-type]
    during()
    drive(g.pytest_runtest_teardown(item, None))  # type: ignore[arg-type]


def test_a_leak_fails_the_test_and_is_removed(guard) -> None:  # type: ignore[no-untyped-def]
    g, engine = guard
    engine.add("old")
    with pytest.raises(pytest.fail.Exception, match="left container new"):
        run_test(g, Item(), lambda: engine.add("new"))
    assert engine.removed == ["new"] and "old" in engine.items


def test_a_test_without_the_engine_fixtures_is_left_alone(guard) -> None:  # type: ignore[no-untyped-def]
    g, engine = guard
    engine.down = True  # not even asked
    run_test(g, Item(fixturenames=["tmp_path"]), lambda: engine.add("x"))
    assert engine.removed == []


def test_a_failed_baseline_is_an_error_never_a_removal(guard) -> None:  # type: ignore[no-untyped-def]
    g, engine = guard
    engine.add("theirs")
    engine.down = True
    drive(g.pytest_runtest_setup(Item()))  # type: ignore[arg-type]
    engine.down = False  # it answers again: what is there now cannot be told apart from what was there before
    with pytest.raises(pytest.fail.Exception, match="nothing was checked and nothing removed"):
        drive(g.pytest_runtest_teardown(Item(), None))  # type: ignore[arg-type]
    assert engine.removed == [] and "theirs" in engine.items


def test_no_engine_at_all_is_no_error(guard) -> None:  # type: ignore[no-untyped-def]
    g, engine = guard
    engine.down = True
    run_test(g, Item())  # the test itself was skipped by pp_engine: nothing to say


def test_a_module_scoped_fixture_is_checked_when_its_scope_ends(guard) -> None:  # type: ignore[no-untyped-def]
    g, engine = guard
    shared = FixtureDef("module")
    drive(g.pytest_runtest_setup(Item()))  # type: ignore[arg-type]
    gen = g.pytest_fixture_setup(shared, None)  # type: ignore[arg-type]
    next(gen)
    engine.add("shared")  # the fixture's own setup makes it
    with pytest.raises(StopIteration):
        gen.send(None)
    drive(g.pytest_runtest_teardown(Item(), None))  # type: ignore[arg-type]  # not a leak of this test
    run_test(g, Item())  # nor of the next one
    assert engine.removed == [] and "shared" in engine.items
    with pytest.raises(pytest.fail.Exception, match=r"fixture shared \(module scope\) left container shared"):
        g.pytest_fixture_post_finalizer(shared, None)  # type: ignore[arg-type]  # its scope ended, it is still there
    assert engine.removed == ["shared"]
