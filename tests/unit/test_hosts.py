"""Chains across hosts, without Docker: host names, stage blocks per host, placement across hosts,
the backend over several engines (one lost), and Docker contexts as the CLI stores them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from pp_launch.adapters import docker_engine, inventory_file
from pp_launch.adapters.multi_host import MultiHostBackend
from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.app import gpus as gpu_select
from pp_launch.core import errors, hosts, labels
from pp_launch.core.chain.plan import ChainRequest, build_plan
from pp_launch.core.chain.ports import StageGone, StopRequested
from pp_launch.core.chain.scope import ChainScope
from pp_launch.core.gpu.allocator import HOST_LEVEL
from pp_launch.core.gpu.inventory import GpuInventory

from ..helpers import wait_until
from .fakes import FakeClock, FakeHandoffBackend, FakeInbox, RecordingReporter

DATA = Path(__file__).resolve().parents[1] / "data"
FOUR = inventory_file.load(DATA / "pcie-2socket-4gpu.json")  # GPU 0 is busy (a foreign process)
EIGHT = inventory_file.load(DATA / "nvlink-8gpu.json")


# ---------------------------------------------------------------------------------------------------- names
def test_hosts_come_repeated_or_as_comma_lists_in_order() -> None:
    assert hosts.parse_hosts(["gpu1", "gpu2,ssh://root@10.0.0.3:22", " tcp://h:2376 "]) == (
        "gpu1",
        "gpu2",
        "ssh://root@10.0.0.3:22",
        "tcp://h:2376",
    )
    assert hosts.parse_hosts([]) == ()


@pytest.mark.parametrize("bad", ["gpu1,gpu1", "-gpu", "http://x", "a b", "gpu1;rm"])
def test_a_host_named_twice_or_malformed_is_a_config_error(bad: str) -> None:
    with pytest.raises(errors.ConfigError, match="--host"):
        hosts.parse_hosts([bad])


# ---------------------------------------------------------------------------------------------------- blocks
def test_pack_fills_each_host_in_order_before_the_next() -> None:
    assert hosts.assign(6, ["a", "b", "c"], [2, 3, 9]) == [0, 0, 1, 1, 1, 2]
    assert hosts.assign(4, ["a", "b"], [None, None]) == [0, 0, 0, 0]  # CPU stages: the first host takes all
    assert hosts.assign(3, ["a", "b"], [0, 5]) == [1, 1, 1]  # a host without room takes none


def test_spread_shares_stages_out_evenly_first_hosts_first() -> None:
    assert hosts.assign(7, ["a", "b", "c"], [None] * 3, "spread") == [0, 0, 0, 1, 1, 2, 2]
    assert hosts.assign(2, ["a", "b", "c"], [None] * 3, "spread") == [0, 1]


def test_stages_per_host_puts_n_consecutive_stages_on_each_host_in_turn() -> None:
    assert hosts.assign(5, ["a", "b", "c"], [None] * 3, per_host=2) == [0, 0, 1, 1, 2]
    with pytest.raises(errors.ConfigError, match="holds 4 stages, not 5"):
        hosts.assign(5, ["a", "b"], [None, None], per_host=2)


def test_stages_that_do_not_fit_name_every_host_and_what_it_can_take() -> None:
    with pytest.raises(errors.NotEnoughGpus) as pack:
        hosts.assign(6, ["a", "b"], [2, 3])
    assert "a: 2; b: 3" in str(pack.value)
    with pytest.raises(errors.NotEnoughGpus, match="host a cannot take its share of 3"):
        hosts.assign(6, ["a", "b"], [2, 9], "spread")
    with pytest.raises(errors.NotEnoughGpus, match="host b cannot take 2"):
        hosts.assign(4, ["a", "b"], [5, 1], per_host=2)


def test_each_host_holds_one_block_of_consecutive_stages() -> None:
    """The ring crosses each boundary once: whatever the placement, a host's stages are consecutive."""
    for placement in hosts.PLACEMENTS:
        for n in range(1, 12):
            got = (
                hosts.assign(n, ["a", "b", "c"], [4, None, 2], placement)
                if placement == "pack"
                else (hosts.assign(n, ["a", "b", "c"], [None] * 3, placement))
            )
            assert got == sorted(got)
            assert [h for h, _ in hosts.blocks(got)] == sorted(set(got))


# ---------------------------------------------------------------------------------------------------- GPUs
def host(name: str, inventory: GpuInventory, held: list[dict[str, str]] | None = None) -> gpu_select.HostGpus:
    return gpu_select.HostGpus(name, inventory, lambda: list(held or []))


def select(hosts_gpus: list[gpu_select.HostGpus], stages: int, **kw: Any) -> tuple[list[str], gpu_select.GpuSelection]:
    args: dict[str, Any] = dict(mode="auto", stages=stages, per_stage=1, attach="request", environ={})
    args.update(kw)
    return gpu_select.select(hosts_gpus=hosts_gpus, **args)


def test_stages_get_gpus_of_their_own_host_and_hops_between_hosts_are_host_level() -> None:
    where, sel = select([host("a", FOUR), host("b", EIGHT)], 6)
    assert where == ["a", "a", "a", "b", "b", "b"]  # pack: a has 3 free GPUs (GPU 0 is busy)
    four, eight = {g.uuid for g in FOUR.gpus}, {g.uuid for g in EIGHT.gpus}
    assert all(len(g) == 1 for g in sel.stage_gpus)
    assert {g[0] for g in sel.stage_gpus[:3]} <= four - {FOUR.gpus[0].uuid}
    assert {g[0] for g in sel.stage_gpus[3:]} <= eight
    assert len({g[0] for g in sel.stage_gpus}) == 6
    assert sel.hop_levels[2] == HOST_LEVEL and sel.hop_levels[5] == HOST_LEVEL  # a -> b, and b -> a (closing)
    assert all(level is not None and level < HOST_LEVEL for level in sel.hop_levels[:2] + sel.hop_levels[3:5])
    assert sel.device_requests[0][0]["DeviceIDs"] == list(sel.stage_gpus[0])


def test_gpus_held_on_a_host_by_labels_are_never_given_again() -> None:
    taken = [{labels.RUN: "bbbbbbbbbbbb", labels.STAGE: "0", labels.GPUS: EIGHT.gpus[0].uuid}]
    first_where, first = select([host("a", FOUR), host("b", EIGHT, taken)], 5)
    mine = {g[0] for g in first.stage_gpus}
    assert EIGHT.gpus[0].uuid not in mine
    assert first_where == ["a"] * 3 + ["b"] * 2
    # the first launch's stages now exist: their labels hold its GPUs
    on_a = [{labels.RUN: "aaaaaaaaaaaa", labels.STAGE: str(k), labels.GPUS: first.stage_gpus[k][0]} for k in range(3)]
    on_b = taken + [
        {labels.RUN: "aaaaaaaaaaaa", labels.STAGE: str(k), labels.GPUS: first.stage_gpus[k][0]} for k in (3, 4)
    ]
    where, second = select([host("a", FOUR, on_a), host("b", EIGHT, on_b)], 5)
    assert where == ["b"] * 5  # a is full: its 3 free GPUs are held by the first launch
    assert not mine & {g[0] for g in second.stage_gpus}
    with pytest.raises(errors.NotEnoughGpus, match="a: 0; b: 5"):
        select([host("a", FOUR, on_a), host("b", EIGHT, on_b)], 6)


def test_stages_that_do_not_fit_across_hosts_name_each_gpu_passed_over_and_why() -> None:
    """As one engine's "not enough GPUs": a host's unhealthy GPUs and those faulted in the run are named, with the
    --allow-unhealthy advice, and --allow-unhealthy then places on them (never on a faulted one)."""
    sick = dataclasses.replace(EIGHT.gpus[1], ecc_uncorrected=2)
    eight = dataclasses.replace(EIGHT, gpus=(EIGHT.gpus[0], sick, *EIGHT.gpus[2:]))
    faulted = ((EIGHT.gpus[2].uuid, "GPU 2 reported Xid 79 on attempt 1"),)
    with pytest.raises(errors.NotEnoughGpus) as refused:
        select([host("a", FOUR), host("b", eight)], 10, avoid=faulted)
    text = str(refused.value)
    assert "a: 3; b: 6" in text, text
    assert f"  host b: GPU 1 ({sick.uuid}) unhealthy: 2 uncorrected ECC errors since the driver loaded" in text
    assert f"  host b: GPU 2 ({EIGHT.gpus[2].uuid}) faulted in this run: GPU 2 reported Xid 79" in text
    assert f"  host a: GPU 0 ({FOUR.gpus[0].uuid}) busy" in text
    assert text.endswith("--allow-unhealthy (docs/recovery.md).")
    where, _ = select([host("a", FOUR), host("b", eight)], 10, avoid=faulted, allow_unhealthy=True)
    assert where == ["a"] * 3 + ["b"] * 7


def test_hosts_without_gpus_take_no_gpu_stage_but_cpu_chains_use_every_host() -> None:
    empty = GpuInventory(note="NVML not found")
    where, sel = select([host("cpu", empty), host("b", EIGHT)], 2)
    assert where == ["b", "b"] and sel.note == "hosts without GPUs take no GPU stage: NVML not found"
    where, sel = select([host("cpu", empty), host("b", EIGHT)], 4, mode="none", placement="spread")
    assert where == ["cpu", "cpu", "b", "b"] and sel.stage_gpus == [()] * 4
    assert sel.hop_levels == (None, HOST_LEVEL, None, HOST_LEVEL)
    where, sel = select([host("x", empty), host("y", empty)], 2)
    assert where == ["x", "x"] and "stages run on CPU" in sel.note


def test_a_gpu_list_over_several_hosts_is_refused() -> None:
    with pytest.raises(errors.ConfigError, match="lists GPUs of one host"):
        select([host("a", FOUR), host("b", EIGHT)], 2, mode="device=0,1")


def test_the_dry_run_shows_each_stage_host_and_host_hops() -> None:
    where, sel = select([host("a", FOUR), host("b", EIGHT)], 4, stages_per_host=2)
    plan = build_plan(
        ChainRequest(stages=4),
        {},
        "h:1:2",
        sel.stage_gpus,
        sel.device_requests,
        "aaaaaaaaaaaa",
        sel.hop_levels,
        sel.cost,
        tuple(where),
    )
    doc = plan.to_json()
    assert doc["hosts"] == ["a", "b"]
    assert [s["host"] for s in doc["stages"]] == ["a", "a", "b", "b"]
    assert [h["topology_level"] == "host" for h in doc["hops"]] == [False, True, False, True]
    assert doc["hops"][1]["link"].startswith("host")
    assert plan.stages[2].labels[labels.HOST] == "b" and plan.stages[2].labels[labels.HOSTS] == "a,b"
    single = build_plan(ChainRequest(stages=2), {}, "h:1:2", [(), ()], [(), ()], "aaaaaaaaaaaa")
    assert "hosts" not in single.to_json() and labels.HOST not in single.stages[0].labels


# ---------------------------------------------------------------------------------------------------- backend
def across(n: int, check: Any = lambda host: None) -> tuple[ChainScope, dict[str, FakeHandoffBackend], Any]:
    where = ["a"] * (n // 2) + ["b"] * (n - n // 2)
    plan = build_plan(
        ChainRequest(stages=n, addr_timeout=5.0, grace=2.0),
        {},
        "h:1:2",
        [()] * n,
        [()] * n,
        "abcdef012345",
        stage_hosts=tuple(where),
    )
    clock = FakeClock()
    inbox = FakeInbox(clock)
    fakes = {"a": FakeHandoffBackend(inbox=inbox), "b": FakeHandoffBackend(inbox=inbox)}
    backend = MultiHostBackend(fakes, check, heartbeat=0)  # type: ignore[arg-type]  # fakes for DockerStageBackend
    scope = ChainScope(plan, backend, inbox, RecordingReporter(), ThreadRuntime(clock))
    return scope, fakes, backend


def test_one_scope_runs_each_stage_on_its_own_host_and_tears_all_down() -> None:
    scope, fakes, backend = across(4)
    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    outcome = scope.run()
    assert [c[1] for c in fakes["a"].calls if c[0] in ("create", "create_waiting")] == [0, 1]
    assert [c[1] for c in fakes["a"].calls if c[0] == "create_waiting"] == [1]  # stage 0 runs its own command
    assert [c[1] for c in fakes["b"].calls if c[0] == "create_waiting"] == [2, 3]
    assert fakes["b"].envs[2]["PEER_DIRECT"] == "127.0.0.1:7001"  # stage 1's announcement, from host a
    assert outcome.exit_code == 128 + signal.SIGTERM and not outcome.orphans
    assert fakes["a"].existing == {} and fakes["b"].existing == {}
    assert backend.where("pp-abcdef012345-3") == "b" and backend.where("pp-abcdef012345-0") == "a"


def test_a_lost_host_is_reported_with_what_may_be_left_and_the_others_are_still_torn_down() -> None:
    scope, fakes, backend = across(4)
    fakes["a"].scripts = {}

    def lose_a() -> None:
        fakes["a"].lost = True

    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    original = fakes["a"].signal

    def signal_then_lost(ref: str, signum: int) -> None:
        lose_a()
        original(ref, signum)

    fakes["a"].signal = signal_then_lost  # type: ignore[method-assign]
    outcome = scope.run()
    assert set(backend.lost) == {"a"}
    assert fakes["b"].existing == {}  # b was torn down although a stopped answering
    assert sorted(outcome.orphans) == ["pp-abcdef012345-0", "pp-abcdef012345-1"]  # possibly left on a
    assert outcome.exit_code == errors.EXIT_FAILURE
    assert "host a" in outcome.message
    a_calls_after_loss = [c for c in fakes["a"].calls if c[0] in ("kill", "remove")]
    assert len(a_calls_after_loss) <= 2, "a lost host is not asked again for every stage"


def two_stages(check: Any, heartbeat: float = 0) -> tuple[MultiHostBackend, dict[str, FakeHandoffBackend], list[Any]]:
    fakes = {"a": FakeHandoffBackend(), "b": FakeHandoffBackend()}
    backend = MultiHostBackend(fakes, check, heartbeat=heartbeat)  # type: ignore[arg-type]
    got: list[Any] = []
    plan = build_plan(ChainRequest(stages=2), {}, "h:1:2", [(), ()], [(), ()], "abcdef012345", stage_hosts=("a", "b"))
    for k, spec in enumerate(plan.stages):
        backend.start(backend.create(spec, {}), k, got.append)
    return backend, fakes, got


def test_a_stage_that_ends_on_a_host_that_no_longer_answers_is_lost_not_exited() -> None:
    """An engine that is stopping stops its containers first: they may exit 0. A fresh connection then fails."""
    backend, fakes, got = two_stages(lambda host: "refused" if host == "b" else None)
    fakes["a"]._gone("pp-abcdef012345-0", 0)
    fakes["b"]._gone("pp-abcdef012345-1", 0)
    gone = [(e.stage, e.exit_code, e.detail) for e in got if isinstance(e, StageGone)]
    assert gone == [(0, 0, ""), (1, None, "lost the connection to host b (refused)")]
    assert set(backend.lost) == {"b"}


def test_the_heartbeat_ends_the_stages_of_a_host_that_stops_answering() -> None:
    answering = {"a": True, "b": True}
    backend, _, got = two_stages(lambda h: None if answering[h] else "timed out", heartbeat=0.01)
    answering["b"] = False
    assert wait_until(lambda: any(isinstance(e, StageGone) for e in got), 5)
    gone = [e for e in got if isinstance(e, StageGone)]
    assert [(e.stage, e.exit_code) for e in gone] == [(1, None)]
    assert "host b (timed out)" in gone[0].detail
    backend.tearing_down()


# ---------------------------------------------------------------------------------------------------- contexts
def write_context(config: Path, name: str, endpoint: dict[str, Any], tls: bool = False) -> None:
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / digest
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": name, "Metadata": {}, "Endpoints": {"docker": endpoint}}))
    if tls:
        tls_dir = config / "contexts" / "tls" / digest / "docker"
        tls_dir.mkdir(parents=True)
        for part in ("ca", "cert", "key"):
            (tls_dir / f"{part}.pem").write_text("x")


def test_contexts_are_read_where_the_docker_cli_writes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    write_context(tmp_path, "gpu2", {"Host": "ssh://ops@gpu2:2222", "SkipTLSVerify": False})
    write_context(tmp_path, "gpu3", {"Host": "tcp://gpu3:2376", "SkipTLSVerify": False}, tls=True)
    assert docker_engine._context("gpu2").url == "ssh://ops@gpu2:2222"
    assert docker_engine._context("gpu3").url == "https://gpu3:2376"
    assert docker_engine._context("unix:///run/x.sock").url == "unix:///run/x.sock"
    with pytest.raises(errors.EngineUnavailable, match=r"no Docker context of that name.*docker context ls"):
        docker_engine._context("nosuch")
