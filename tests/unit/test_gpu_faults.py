"""What an Xid means for a run's stages, the same on every site (app/gpu_faults.py): the sites only feed it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pp_launch.app.gpu_faults import GpuFaults


def stage(index: int, gpus: tuple[str, ...], host: str = "") -> Any:
    name = f"pp-r-{index}"
    return SimpleNamespace(index=index, gpus=gpus, where=lambda: f"{name} on host {host}" if host else name)


class Scope:
    def __init__(self) -> None:
        self.failed: list[tuple[int, str]] = []

    def fail_stage(self, index: int, why: str) -> None:
        self.failed.append((index, why))


def faults() -> tuple[GpuFaults, Scope, list[str]]:
    plan: Any = SimpleNamespace(stages=(stage(0, ("GPU-a",), "a"), stage(1, ("GPU-b", "GPU-c"), "b")), attempt=2)
    said: list[str] = []
    f, scope = GpuFaults(plan, said.append), Scope()
    f.watching(scope)  # type: ignore[arg-type]
    return f, scope, said


def test_a_fatal_xid_fails_every_stage_on_that_gpu_and_is_kept_for_the_next_attempt() -> None:
    f, scope, said = faults()
    f.on_xid("GPU-c", 3, 79, "Ray node b")
    assert scope.failed == [
        (1, "stage 1 (pp-r-1 on host b) failed: its GPU 3 (GPU-c) reported Xid 79 (GPU has fallen off the bus); "
         "that GPU is not used again in this run"),
    ]  # fmt: skip
    assert f.seen() == (("GPU-c", "GPU 3 (GPU-c) reported Xid 79 (GPU has fallen off the bus) on attempt 2"),)
    assert said == []


def test_another_xid_is_said_and_the_stage_runs_on() -> None:
    f, scope, said = faults()
    f.on_xid("GPU-a", -1, 13)
    assert scope.failed == [] and f.seen() == ()
    assert said == [
        "warning: GPU-a, under stage 0 (pp-r-0 on host a), reported Xid 13 (graphics engine exception (usually the "
        "application's own fault)); the stage runs on"
    ]


def test_a_fatal_xid_on_a_gpu_no_stage_uses_names_where_and_fails_nothing() -> None:
    f, scope, said = faults()
    f.on_xid("GPU-z", 5, 48, "Ray node b")
    assert scope.failed == [] and [uuid for uuid, _ in f.seen()] == ["GPU-z"]
    assert said == [
        "warning: GPU 5 (GPU-z), under no stage of this run, on Ray node b, reported Xid 48 (double-bit ECC error: "
        "uncorrectable memory error); it is not used again in this run"
    ]
