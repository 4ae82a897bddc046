"""The Ray use case's pure parts, without a cluster: which node takes which block of stages, the order of each
block's stages over the GPUs Ray granted, and the words of a refusal. (The cluster itself: tests/integration/
test_ray.py.)"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from pp_launch.adapters import inventory_file
from pp_launch.adapters.ray_cluster import RayNode, StageHandle
from pp_launch.app import on_ray, planning
from pp_launch.app.launch import GpuOptions, LaunchRequest
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainRequest
from pp_launch.core.gpu.allocator import (
    HOST_LEVEL,
    distance,
    order_groups,
    passed_over,
    plan_cost,
    split_granted,
    units,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def node(name: str, gpus: int, free: int | None = None) -> RayNode:
    return RayNode(f"id-{name}", name, gpus, gpus if free is None else free, 2.0, "")


def request(stages: int, **kw: object) -> LaunchRequest:
    return LaunchRequest(ChainRequest(stages=stages), GpuOptions(), ray="HEAD:6379", **kw)  # type: ignore[arg-type]


def blocks(req: LaunchRequest, nodes: list[RayNode], per_stage: int = 1) -> list[tuple[str, int]]:
    return [(n.name, k) for n, k in planning.node_blocks(req, nodes, per_stage)]


def test_pack_fills_the_node_with_the_most_free_gpus_first() -> None:
    assert blocks(request(6), [node("a", 4, 2), node("b", 8, 5)]) == [("b", 5), ("a", 1)]


def test_spread_shares_the_stages_over_every_node_in_name_order() -> None:
    assert blocks(request(5, placement="spread"), [node("a", 4), node("b", 4), node("c", 4)]) == [
        ("a", 2),
        ("b", 2),
        ("c", 1),
    ]


def test_stages_per_host() -> None:
    assert blocks(request(5, stages_per_host=2), [node("a", 4), node("b", 4), node("c", 4)]) == [
        ("a", 2),
        ("b", 2),
        ("c", 1),
    ]


def test_nodes_without_gpus_take_no_gpu_stage_and_cpu_stages_go_anywhere_with_cpus() -> None:
    assert blocks(request(2), [node("head", 0), node("a", 2)]) == [("a", 2)]
    cpu_only = [RayNode("id-h", "head", 0, 0, 0.0, ""), node("a", 0)]
    assert blocks(request(3), cpu_only, per_stage=0) == [("a", 3)]


def test_a_run_that_fits_only_an_idle_cluster_is_planned_on_the_totals_and_waits_for_the_grant() -> None:
    assert blocks(request(4), [node("a", 4, 0), node("b", 4, 1)]) == [("b", 4)]  # the most free first


def test_a_run_that_never_fits_is_refused_naming_every_node() -> None:
    with pytest.raises(errors.NotEnoughGpus) as caught:
        planning.node_blocks(request(3), [node("a", 4), node("b", 2, 1)], per_stage=3)
    text = str(caught.value)
    assert "3 stages of 3 GPUs each" in text
    assert "a: 4 GPUs (4 free); b: 2 GPUs (1 free)" in text
    assert "HEAD:6379" in text and "--host" not in text


def test_no_node_with_gpus() -> None:
    with pytest.raises(errors.NotEnoughGpus, match="no live node with GPUs"):
        planning.node_blocks(request(1), [node("head", 0)], per_stage=1)


def handle(name: str, gpus: tuple[str, ...], inventory: dict[str, object]) -> StageHandle:
    return StageHandle(None, node(name, 8), {"gpus": list(gpus), "inventory": inventory})


def test_a_block_is_ordered_round_its_closest_ring_and_the_ring_leaves_each_node_once() -> None:
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    doc = inv.to_json()
    by_index = [g.uuid for g in inv.gpus]
    granted = [(by_index[i],) for i in (0, 5, 1, 4)]  # as Ray handed them out: not in ring order
    row_a = [handle("a", g, doc) for g in granted]
    row_b = [handle("b", (by_index[2],), doc), handle("b", (by_index[3],), doc)]
    ordered, hops = planning.ring_order([row_a, row_b], per_stage=1)
    assert [h.node.name for h in ordered] == ["a"] * 4 + ["b"] * 2
    assert hops[3] == HOST_LEVEL and hops[5] == HOST_LEVEL
    u = {x.uuid: x for x in units(inv)}
    inside = [distance(inv, u[ordered[i].gpus[0]], u[ordered[i + 1].gpus[0]]) for i in range(3)]
    assert list(hops[:3]) == inside
    given = [distance(inv, u[granted[i][0]], u[granted[(i + 1) % 4][0]]) for i in range(4)]
    order, levels = order_groups(inv, [g for g in granted])
    assert sum(levels) <= sum(given)  # never worse than the order Ray gave
    assert sorted(order) == [0, 1, 2, 3] and order[0] == 0


def test_a_node_agents_grant_is_shared_out_round_the_closest_ring() -> None:
    """An agent is granted its block's GPUs at once (in Ray's order): each stage gets `per_stage` of them, every one
    given exactly once, and the share is never worse than taking them in Ray's order."""
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    u = {x.uuid: x for x in units(inv)}
    by_index = [g.uuid for g in inv.gpus]
    granted = [by_index[i] for i in (0, 5, 1, 4, 2, 7)]
    for per_stage in (1, 2, 3):
        k = len(granted) // per_stage
        shares = split_granted(inv, granted, k, per_stage)
        assert len(shares) == k and all(len(s) == per_stage for s in shares)
        assert sorted(g for s in shares for g in s) == sorted(granted)
        ours = plan_cost(inv, [u[g] for s in shares for g in s], per_stage)
        assert ours <= plan_cost(inv, [u[g] for g in granted], per_stage)
        if per_stage < 3:  # Ray's order here is a poor ring (1) and pairs far-apart GPUs (2): strictly better
            assert ours < plan_cost(inv, [u[g] for g in granted], per_stage)
    assert split_granted(inv, ["GPU-not-known", by_index[0]], 2, 1) == [("GPU-not-known",), (by_index[0],)]
    assert split_granted(inv, [], 3, 0) == [(), (), ()]  # CPU stages


def test_of_more_granted_than_needed_the_closest_ring_of_as_many_is_taken() -> None:
    """A node asked for more GPUs than its stages need (to pass some over) shares out only as many as they need,
    the closest of them: no 4 of the 5 granted, in any order, make a closer ring."""
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    by_index = [g.uuid for g in inv.gpus]
    granted = [by_index[i] for i in (7, 0, 1, 2, 3)]
    shares = split_granted(inv, granted, 2, 2)
    assert len(shares) == 2 and all(len(s) == 2 for s in shares)
    taken = {g for s in shares for g in s}
    assert len(taken) == 4 and taken <= set(granted)
    u = {x.uuid: x for x in units(inv)}
    best = min(plan_cost(inv, [u[g] for g in o], 2) for o in itertools.permutations(granted, 4))
    assert plan_cost(inv, [u[g] for s in shares for g in s], 2) == best  # no 4 of the 5, in no order, do better


def test_granted_gpus_faulted_or_unhealthy_are_passed_over_with_the_allocators_words() -> None:
    inv = inventory_file.load(DATA / "nvlink-8gpu.json")
    sick = dataclasses.replace(inv.gpus[2], ecc_uncorrected=3)
    inv = dataclasses.replace(inv, gpus=(*inv.gpus[:2], sick, *inv.gpus[3:]))
    g = [x.uuid for x in inv.gpus]
    avoid = ((g[1], "GPU 1 reported Xid 79 on attempt 1"),)
    assert passed_over(inv, g[:4], avoid, False) == {
        g[1]: "faulted in this run: GPU 1 reported Xid 79 on attempt 1",
        g[2]: "unhealthy: 3 uncorrected ECC errors since the driver loaded",
    }
    assert passed_over(inv, g[:4], avoid, True) == {g[1]: "faulted in this run: GPU 1 reported Xid 79 on attempt 1"}
    assert passed_over(inv, ["GPU-unknown"], (), False) == {}  # nothing held against a GPU NVML does not list


def test_a_node_is_asked_for_as_many_more_as_were_passed_over_until_it_has_no_more() -> None:
    b = node("b", 4)
    bad = [{"GPU-1": "unhealthy: 2 uncorrected ECC errors since the driver loaded"}]
    assert on_ray._more([(b, 2)], 1, [0], bad) == [1]
    assert on_ray._more([(b, 2)], 1, [1], bad) == [2]
    with pytest.raises(errors.NotEnoughGpus) as refused:
        on_ray._more([(b, 2)], 1, [2], bad)
    text = str(refused.value)
    assert text.startswith("not enough GPUs on Ray node b: 2 stages x 1 need 2, and of its 4 the run must pass over 3")
    assert "GPU-1 on node b (unhealthy: 2 uncorrected ECC errors" in text and "--allow-unhealthy" in text
    with pytest.raises(errors.NotEnoughGpus):  # nothing passed over, and still too few: never asked again
        on_ray._more([(b, 2)], 1, [0], [{}])


def test_cpu_stages_have_no_hops() -> None:
    rows = [[handle("a", (), {"gpus": []})] * 2, [handle("b", (), {"gpus": []})]]
    ordered, hops = planning.ring_order(rows, per_stage=0)
    assert len(ordered) == 3 and hops == ()


def test_without_ray_installed_the_message_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pp_launch.adapters import ray_cluster

    monkeypatch.setattr(ray_cluster, "ray", None)
    with pytest.raises(errors.ConfigError, match=r"pip install 'pp-launch\[ray\]'") as caught:
        ray_cluster.connect("auto")
    assert caught.value.exit_code == errors.EXIT_USAGE


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "nohost"])
def test_an_address_where_nothing_answers_is_exit_2_at_once(address: str) -> None:
    pytest.importorskip("ray")
    from pp_launch.adapters import ray_cluster

    with pytest.raises(errors.EngineUnavailable, match="does not answer"):
        ray_cluster.connect(address)


def test_ray_and_its_timeout_are_chain_file_keys() -> None:
    from pp_launch.cli.chain_cmd import chain, file_keys

    keys = file_keys(chain)
    assert keys["ray"] == "ray_address" and keys["ray-timeout"] == "ray_timeout"


def test_the_head_lost_is_a_failure_said_once_with_what_the_teardown_said() -> None:
    """A place lost (the head) ends the chain with exit 1 (chain_stopped carries it too); its line names the head
    once, then what the teardown had to add."""
    from pp_launch.core.chain.scope import ChainOutcome

    why = "the Ray head at 127.0.0.1:6379 stopped answering (Connection refused) for 3 s"
    plain = on_ray._with_lost_head(ChainOutcome(1, "place_lost", why), why)
    assert plain.exit_code == errors.EXIT_FAILURE and plain.message.count("the Ray head") == 1
    assert plain.message.startswith(why + ": the chain was stopped and torn down through its node agents;")
    more = on_ray._with_lost_head(ChainOutcome(1, "place_lost", f"{why}; teardown errors: X"), why)
    assert "torn down through its node agents (teardown errors: X);" in more.message
    other = ChainOutcome(143, "signal", "stopped")
    assert on_ray._with_lost_head(other, why) is other  # a stop that was not the head's loss is left as it was


def test_the_head_lost_takes_the_stages_on_its_own_node_and_nothing_more_is_asked_of_them() -> None:
    """Ray would wait out a call to an agent that went with the head: such a stage is not asked at all, and is
    counted as possibly left; the other nodes' agents are still asked."""
    from pp_launch.adapters.ray_cluster import RayStageBackend

    head = RayNode("id-h", "head", 0, 0, 2.0, "", head=True)
    asked: list[str] = []

    class Agent:
        def __getattr__(self, method: str) -> object:
            asked.append(method)
            raise AssertionError("the lost head's agent was asked")

    backend = RayStageBackend([StageHandle(Agent(), head), StageHandle(Agent(), node("a", 0))])
    told: list[object] = []
    backend._stage_of.update({"r0": 0, "r1": 1})  # both started, their output pulled into `told`
    backend._sinks.update({"r0": told.append, "r1": told.append})
    backend.lose_head("the Ray head at h:6379 stopped answering")
    assert told == []  # its ends come after (the chain hears the head's loss first)
    backend.end_head_stages()
    backend.end_head_stages()  # said twice: each stage's end is told once
    assert [(e.stage, e.exit_code) for e in told] == [(0, None)]  # type: ignore[attr-defined]
    assert "went with the lost head" in told[0].detail  # type: ignore[attr-defined]
    assert backend.lost == {"head": "the head's own node"}
    with pytest.raises(errors.HostLost, match="Ray node head is lost"):
        backend._ask(0, "stop", "signal", "ref", 15)
    assert asked == []


def test_a_place_lost_is_said_first_then_how_the_chain_ended() -> None:
    """The cause leads the one error line (a stage's last lines come after it, never glued behind them)."""
    from pp_launch.app.chain import with_places_lost
    from pp_launch.core.chain.scope import ChainOutcome

    ended = ChainOutcome(1, "stage_failed", "stage 2 (pp-x-2 on host b) exited with code unknown; its last lines:\n  x")
    lost = with_places_lost(ended, ["Ray node b was lost (its raylet died)"])
    assert lost.message.startswith("Ray node b was lost (its raylet died); stage 2 ") and lost.exit_code == 1
    assert lost.message.endswith("its last lines:\n  x")
    assert with_places_lost(ChainOutcome(0, "completed", ""), ["host h could not be reached"]).message == (
        "host h could not be reached"
    )
    assert with_places_lost(ended, []) is ended


def test_a_pull_waiting_on_an_agent_answers_as_soon_as_the_run_is_handed_over(tmp_path: Path) -> None:
    """A detached run's launcher joins its pumps before it closes Ray: a pull waiting on the agent must not hold
    that up for its whole wait."""
    import threading
    import time

    from pp_launch.adapters.ray_cluster import NodeAgent

    agent = NodeAgent("run1", 1.0, f"unix://{tmp_path}/no-engine.sock", "a")  # no engine: the agent alone
    assert agent.problem
    agent.queues[0], agent.names[0] = __import__("queue").Queue(), "pp-run1-0"  # one stage, still running
    answers: list[object] = []
    pull = threading.Thread(target=lambda: answers.append(agent.poll(0, 30.0)))
    t0 = time.monotonic()
    pull.start()
    agent.hand_over()
    pull.join(10.0)
    assert answers == [[]] and time.monotonic() - t0 < 10.0  # nothing to hand on, at once (not after 30 s)


class _Cluster:
    def __init__(self) -> None:
        self.ended: list[str] = []

    def close(self) -> None:
        self.ended.append("close")

    def abandon(self, exit_code: int) -> None:
        self.ended.append(f"abandon {exit_code}")


class _Pumps:
    def __init__(self, straggling: list[str]) -> None:
        self.straggling, self.asked = straggling, 0

    def settle(self, timeout: float) -> list[str]:
        self.asked += 1
        return self.straggling


@pytest.mark.parametrize(
    ("straggling", "head_lost", "told", "ended", "asked"),
    [
        ([], "", 0, "close", 1),
        (["ray-stage-0"], "", 0, "abandon 0", 1),
        ([], "the head is gone", 3, "abandon 3", 0),
        ([], "the head is gone", None, "abandon 1", 0),
    ],
    ids=["settled", "a-pump-still-in-ray", "head-lost", "head-lost-and-no-outcome"],
)
def test_ray_is_shut_down_only_once_no_pump_of_the_run_is_inside_it(
    straggling: list[str], head_lost: str, told: int | None, ended: str, asked: int
) -> None:
    """Ray's shutdown under a thread still inside one of its calls ends the process with exit 1 and nothing said
    (its core worker "has already been shutdown"): a detached run's launcher did so right after its roster. With a
    pump still inside Ray the process ends with the run's own code instead (1 when the run ended without an
    outcome: an error); a lost head is never waited for."""
    from types import SimpleNamespace

    from pp_launch.app.request import Launched
    from pp_launch.app.site import Voice, Where
    from pp_launch.core.chain.scope import ChainOutcome

    site = on_ray.RaySite(Where(ray="auto"), Voice(lambda text: None, lambda text: None))
    cluster, pumps = _Cluster(), _Pumps(straggling)
    attempt = SimpleNamespace(backend=pumps, head=[head_lost] if head_lost else [])  # an attempt's stages, as ended
    site.cluster, site.attempts = cluster, [attempt]  # type: ignore[assignment,list-item]
    outcome = None if told is None else ChainOutcome(told, "completed" if told == 0 else "failed", "the run's own")
    site.finish(None if outcome is None else Launched(None, "", outcome))  # type: ignore[arg-type]
    assert cluster.ended == [ended] and pumps.asked == asked


class FakeGrant:
    """What a Ray attempt holds, without a cluster: each block's agent reports a port free on its node."""

    def __init__(self) -> None:
        self.served: list[StageHandle] = []

    def grant(
        self, request: LaunchRequest, blocks: list[tuple[RayNode, int]], per_stage: int
    ) -> list[list[StageHandle]]:
        return [
            [StageHandle(None, n, {"gpus": [], "port": 40000 + i}) for _ in range(k)]
            for i, (n, k) in enumerate(blocks)
        ]

    def serve(self, handles: list[StageHandle]) -> None:
        self.served = handles


def test_a_rendezvous_on_ray_meets_on_stage_0s_node_at_a_port_its_agent_picked() -> None:
    """--rendezvous torch on Ray: MASTER_ADDR is stage 0's node as Ray knows it, MASTER_PORT one its agent found free
    there; LOCAL_RANK and GROUP_RANK count per node; --env wins; a dry run names the node and leaves the port to the
    launch."""
    nodes = [dataclasses.replace(node(n, 0), address=a) for n, a in (("a", "10.0.0.1"), ("b", "10.9.9.9"))]
    chain = ChainRequest(stages=4, rendezvous="torch")
    req = LaunchRequest(chain, GpuOptions(mode="none"), ray="HEAD:6379", stages_per_host=2, run_id="r" * 12)
    plan, _ = planning.Granted().plan(req, nodes, {"HOME": "/h"}, FakeGrant())
    envs = [s.env for s in plan.stages]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "40000")}
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")
    ]  # fmt: skip
    given = dataclasses.replace(req, chain=dataclasses.replace(chain, env=(("MASTER_PORT", "29400"),)))
    assert planning.Granted().plan(given, nodes, {}, FakeGrant())[0].stages[3].env["MASTER_PORT"] == "29400"
    dry = planning.Granted().dry_plan(dataclasses.replace(req, placement="spread"), nodes[::-1], {}, False).plan
    assert dry.stages[0].env["MASTER_ADDR"] == "10.9.9.9" and "MASTER_PORT" not in dry.stages[0].env
    plain = planning.Granted().plan(dataclasses.replace(req, chain=ChainRequest(stages=2)), nodes, {}, FakeGrant())
    assert "MASTER_ADDR" not in plain[0].stages[0].env


def test_a_dry_run_on_ray_passes_over_unhealthy_gpus_as_the_launch_does() -> None:
    """The dry run plans with each node's GPU health, read on the node as its agent reads it at a launch: of node b's
    4 GPUs, 3 with uncorrected ECC errors. One stage there fits (the plan names what it passes over); two are
    refused as the launch refuses them, naming each GPU and --allow-unhealthy; --allow-unhealthy plans them."""
    four = inventory_file.load(DATA / "plain-4gpu.json")
    sick = dataclasses.replace(
        four, gpus=tuple(dataclasses.replace(g, ecc_uncorrected=2) if i < 3 else g for i, g in enumerate(four.gpus))
    )
    nodes = [dataclasses.replace(node("a", 4), inventory=four), dataclasses.replace(node("b", 4), inventory=sick)]
    spread = request(2, placement="spread")
    one = planning.Granted().dry_plan(spread, nodes, {}, True)
    assert [s.host for s in one.plan.stages] == ["a", "b"]
    assert f"passed over as a launch would: {sick.gpus[0].uuid} on node b (unhealthy: " in one.note
    two = request(4, stages_per_host=2)
    with pytest.raises(errors.NotEnoughGpus) as refused:
        planning.Granted().dry_plan(two, nodes, {}, True)
    said = str(refused.value)
    assert "do not fit" in said and "uncorrected ECC error" in said and "--allow-unhealthy" in said, said
    allowed = dataclasses.replace(two, gpu=GpuOptions(allow_unhealthy=True))
    assert len(planning.Granted().dry_plan(allowed, nodes, {}, True).plan.stages) == 4
    unread = [dataclasses.replace(n, inventory=None) for n in nodes]  # a node that did not answer: Ray's count
    assert len(planning.Granted().dry_plan(two, unread, {}, True).plan.stages) == 4
