"""The chain use case on a Ray cluster (`pp-launch chain --ray ADDRESS`): the same request, plan, scope and
teardown as on Docker engines; Ray places the stages, grants their GPUs and watches the nodes.

1. the cluster's live nodes, and the stages in blocks of consecutive stages per node (`--placement`,
   `--stages-per-host` as across Docker hosts: the ring crosses each node boundary once);
2. one placement group for the run, a bundle per block pinned to its node, granted within `--ray-timeout` or
   refused (exit 2, saying what the cluster has and what is missing) before any container exists;
3. an agent per node in its block's bundle; it reports the GPUs Ray granted it (UUIDs, from its node's NVML)
   and our allocator shares them out to the block's stages (the closest ring);
4. the chain scope over `RayStageBackend`, exactly as over Docker engines.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pp_launch.adapters import identity, ray_cluster
from pp_launch.adapters.inbox import QueueInbox
from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import housekeeping
from pp_launch.app.request import Hooks, Launched, LaunchRequest
from pp_launch.core import errors, hosts, labels
from pp_launch.core.chain.plan import ChainPlan, build_plan
from pp_launch.core.chain.scope import ChainOutcome, ChainScope
from pp_launch.core.gpu.allocator import HOST_LEVEL, order_groups
from pp_launch.core.gpu.requests import device_requests
from pp_launch.core.lines import count


def launch(request: LaunchRequest, hooks: Hooks, environ: Mapping[str, str]) -> Launched:
    assert request.ray is not None
    cluster = ray_cluster.connect(request.ray)
    placed = _Placed(cluster)
    keep, head, code = False, "", errors.EXIT_FAILURE
    try:
        plan = placed.plan(request, environ, hooks.say)
        if request.chain.attempt == 1:
            steps.say_plan(plan, "", hooks.say)
        if (held := hooks.stop_pending()) is not None:
            raise errors.Interrupted(held)  # stopped while planning: nothing was started
        outcome, lost, head = _run(request, plan, placed.handles, hooks, cluster)
        keep = outcome.reason == "detached"
        restartable = outcome.reason == "stage_failed" and not lost and not head and not outcome.orphans
        outcome = _with_lost_head(_with_lost_nodes(outcome, plan.run_id, lost), head)
        code = outcome.exit_code
        return Launched(plan, "", outcome, restartable=restartable)
    finally:
        if head:  # nothing to ask a lost head (Ray would wait for it): the run's actors and group went with it
            cluster.abandon(code)
        else:
            if not keep:
                placed.release()
            cluster.close()


def plan(request: LaunchRequest, environ: Mapping[str, str]) -> Launched:
    """The dry run: which node takes which stages, from what the cluster says is free now; nothing is reserved or
    started (Ray says which GPUs it grants a node only with the grant)."""
    assert request.ray is not None
    cluster = ray_cluster.connect(request.ray)
    try:
        run_id, owner = request.run_id or identity.new_run_id(), request.owner or steps.owner_label(request.detach)
        mode, per_stage = gpu_select.parse_gpus_flag(request.gpu.mode, request.gpu.per_stage)
        per_stage = 0 if mode == "none" else per_stage
        nodes = cluster.nodes()
        blocks = _blocks(request, nodes, per_stage)
        hops: list[int | None] = []
        for _, k in blocks:
            hops += [None] * (k - 1) + ([HOST_LEVEL] if len(blocks) > 1 else [None])
        stages = sum(k for _, k in blocks)
        built = build_plan(
            request.chain,
            environ,
            owner,
            [()] * stages,
            [device_requests((), request.gpu.attach)] * stages,
            run_id,
            tuple(hops) if per_stage and stages > 1 else (),
            None,
            tuple(n.name for n, k in blocks for _ in range(k)),
            identity.current_owner().label() if owner == labels.OWNER_DETACHED else "",
        )
        free = "; ".join(f"{n.name}: {n.free_gpus} of {count(n.gpus, 'GPU')} free" for n in nodes)
        wanted = "; ".join(f"{n.name}: {count(k * per_stage, 'GPU')}" for n, k in blocks) if per_stage else ""
        fits = all(n.free_gpus >= k * per_stage for n, k in blocks)
        note = (
            f"nothing reserved: Ray grants the GPUs at launch ({wanted}), which ones is its choice; the cluster now: "
            f"{free}" + ("" if fits else f"; not free now: a launch would wait up to {request.ray_timeout:g} s")
            if per_stage
            else "nothing reserved: CPU stages"
        )
        return Launched(built, note)
    finally:
        cluster.close()


class _Placed:
    """The run's placement group and node agents, held until released."""

    def __init__(self, cluster: ray_cluster.Cluster) -> None:
        self.cluster = cluster
        self.pg: Any = None  # Ray's PlacementGroup
        self.handles: list[ray_cluster.StageHandle] = []
        self.run_id = ""

    def plan(self, request: LaunchRequest, environ: Mapping[str, str], say: Callable[[str], None]) -> ChainPlan:
        run_id, owner = request.run_id or identity.new_run_id(), request.owner or steps.owner_label(request.detach)
        self.run_id = run_id
        mode, per_stage = gpu_select.parse_gpus_flag(request.gpu.mode, request.gpu.per_stage)
        per_stage = 0 if mode == "none" else per_stage
        blocks = _blocks(request, self.cluster.nodes(), per_stage)
        asked = [count(k * per_stage, "GPU") if per_stage else count(k, "CPU stage") for _, k in blocks]
        say(
            f"run {run_id}: asking the Ray cluster at {request.ray} for "
            + "; ".join(f"{node.name}: {a}" for (node, _), a in zip(blocks, asked, strict=True))
        )
        self.pg = self.cluster.reserve(run_id, blocks, per_stage, request.detach, request.ray_timeout)
        rows = self.cluster.node_agents(
            self.pg, blocks, per_stage, run_id, request.chain.grace, request.chain.image, request.detach
        )
        self.handles, hops = _order(rows, per_stage)
        stage_gpus = [h.gpus for h in self.handles]
        launcher = identity.current_owner().label() if owner == labels.OWNER_DETACHED else ""
        return build_plan(
            request.chain,
            environ,
            owner,
            stage_gpus,
            [device_requests(g, request.gpu.attach) for g in stage_gpus],
            run_id,
            hops,
            None,
            tuple(h.node.name for h in self.handles),
            launcher,
        )

    def release(self) -> None:
        self.cluster.release(self.pg, self.handles, self.run_id)


def _run(
    request: LaunchRequest,
    plan: ChainPlan,
    handles: Sequence[ray_cluster.StageHandle],
    hooks: Hooks,
    cluster: ray_cluster.Cluster,
) -> tuple[ChainOutcome, Mapping[str, str], str]:
    """The scope over the node agents, with our own watch on the head: when it is lost the chain is stopped (and
    torn down through the agents, which answer without it) before Ray ends this process. (outcome, nodes lost,
    why the head was lost or "")."""
    backend = ray_cluster.RayStageBackend(handles, detached=request.detach)
    head: list[str] = []
    scope = ChainScope(plan, backend, QueueInbox(), hooks.reporter(plan), ThreadRuntime(), detach=request.detach)
    hooks.on_scope(scope)

    def lost(why: str) -> None:
        head.append(why)
        scope.request_stop(signal.SIGTERM, why)

    watch = cluster.watch_head(lost)
    try:
        outcome = scope.run()
    finally:
        watch.close()
    return outcome, backend.lost, head[0] if head else ""


def _blocks(
    request: LaunchRequest, nodes: Sequence[ray_cluster.RayNode], per_stage: int
) -> list[tuple[ray_cluster.RayNode, int]]:
    """The stages in blocks of consecutive stages per node: pack fills the nodes with the most free GPUs first,
    spread shares them out over every node that can run a stage; NotEnoughGpus (exit 2) names each node."""
    usable = [n for n in nodes if (n.gpus if per_stage else n.cpus) > 0]
    if not usable:
        what = "GPUs" if per_stage else "CPUs"
        raise errors.NotEnoughGpus(
            f"the Ray cluster at {request.ray} has no live node with {what} "
            f"(nodes: {', '.join(n.name for n in nodes) or 'none'})"
        )
    if request.placement == "pack":
        usable = sorted(usable, key=lambda n: (-n.free_gpus, n.name))
    names = [n.name for n in usable]
    stages, placement, per_host = request.chain.stages, request.placement, request.stages_per_host
    try:  # what is free now; else what the nodes have (the grant then waits up to --ray-timeout for others to end)
        free = [n.free_gpus // per_stage if per_stage else None for n in usable]
        assignment = hosts.assign(stages, names, free, placement, per_host)
    except errors.NotEnoughGpus:
        try:
            assignment = hosts.assign(stages, names, [n.gpus // per_stage for n in usable], placement, per_host)
        except errors.NotEnoughGpus:
            raise _never_fits(request, usable, per_stage) from None
    return [(usable[h], len(block)) for h, block in hosts.blocks(assignment)]


def _never_fits(request: LaunchRequest, usable: Sequence[ray_cluster.RayNode], per_stage: int) -> errors.NotEnoughGpus:
    have = "; ".join(f"{n.name}: {count(n.gpus, 'GPU')} ({n.free_gpus} free)" for n in usable)
    per_host, stages = request.stages_per_host, request.chain.stages
    how = f"{per_host} per node" if per_host else "in blocks per node"
    if request.placement == "spread" and per_host is None:
        how = f"spread evenly over {count(len(usable), 'node')}"
    return errors.NotEnoughGpus(
        f"{count(stages, 'stage')} of {count(per_stage, 'GPU')} each ({how}) do not fit on the Ray cluster at "
        f"{request.ray}, even with every GPU free: {have}. Add nodes, use fewer GPUs per stage (--gpus-per-stage), "
        "or --placement pack"
    )


def _order(
    rows: Sequence[Sequence[ray_cluster.StageHandle]], per_stage: int
) -> tuple[list[ray_cluster.StageHandle], tuple[int | None, ...]]:
    """Each block's actors in the order of the closest ring over the GPUs Ray granted them, blocks in ring order;
    each stage's hop to the next (HOST_LEVEL out of a node)."""
    ordered: list[ray_cluster.StageHandle] = []
    hops: list[int | None] = []
    for row in rows:
        if per_stage and len(row) > 1:
            order, levels = order_groups(row[0].inventory, [h.gpus for h in row])
        else:
            order, levels = list(range(len(row))), [0] * len(row)
        ordered += [row[i] for i in order]
        inside: list[int | None] = list(levels[: len(row) - 1]) if len(rows) > 1 else list(levels)
        hops += inside + ([HOST_LEVEL] if len(rows) > 1 else [])
    return ordered, tuple(hops) if per_stage and len(ordered) > 1 else ()


def _with_lost_nodes(outcome: ChainOutcome, run: str, lost: Mapping[str, str]) -> ChainOutcome:
    """A node lost on the way is named, with what to run there when it is back."""
    said = [f"Ray node {node} was lost ({why})" for node, why in lost.items()]
    if said:
        said[-1] += (
            f": its stages' lifelines ended with their actors; if that node comes back with containers of run {run}, "
            "'pp-launch gc' there removes them"
        )
    return steps.with_places_lost(outcome, said)


def _with_lost_head(outcome: ChainOutcome, why: str) -> ChainOutcome:
    """A chain stopped because the head was lost is a failure, and says what was done and what may remain."""
    if not why or outcome.reason != "signal":
        return outcome
    left = f" ({outcome.message})" if outcome.orphans else ""
    message = (
        f"{why}: the chain was stopped and torn down through its node agents{left}; if the head comes back, "
        "'pp-launch gc --ray' releases what Ray still holds for the run"
    )
    return dataclasses.replace(outcome, exit_code=errors.EXIT_FAILURE, message=message)


# ------------------------------------------------------------------------------------------------ housekeeping
def runs(address: str, run: str | None = None) -> list[dict[str, Any]]:
    """`ps --ray`: every stage container of the detached runs on the cluster (or of `run`), one row each, its node
    as the host; the actor that owns it answers for its node."""
    cluster = ray_cluster.connect(address)
    try:
        found = ray_cluster.detached_runs()
        wanted = [housekeeping.resolve_run(run, set(found))] if run is not None else sorted(found)
        rows: list[dict[str, Any]] = []
        for run_id in wanted:
            for answer in ray_cluster.run_status(found[run_id]):
                for ref, name, state, tags in answer["containers"]:
                    gpus = [g for g in tags.get(labels.GPUS, "").split(",") if g]
                    rows.append(
                        {
                            "run": run_id,
                            "stage": labels.ascii_int(tags.get(labels.STAGE, "")),
                            "role": "stage",
                            "container": name,
                            "id": ref[:12],
                            "image": "-",
                            "gpus": gpus,
                            "owner": tags.get(labels.OWNER, ""),
                            "owner_status": "detached",
                            "state": state,
                            "age_s": None,
                            "host": answer["node"],
                            "address": None,
                            "uptime_s": None,
                        }
                    )
        return rows
    finally:
        cluster.close()


def down(address: str, run: str, grace: float) -> tuple[str, list[str]]:
    """`down --ray RUN`: the run's containers stopped and confirmed gone on every node, then its actors and its
    placement group released. (run id, container names removed); ConfigError when the cluster has no such run."""
    cluster = ray_cluster.connect(address)
    try:
        found = ray_cluster.detached_runs()
        run_id = housekeeping.resolve_run(run, set(found))
        return run_id, ray_cluster.end_run(run_id, found[run_id], grace)
    finally:
        cluster.close()


def logs(
    address: str,
    run: str,
    lines: int,
    follow: Callable[[list[tuple[int, str, str]]], None] | None = None,
    every: float = 0.5,
) -> tuple[str, list[tuple[int, str, str]]]:
    """`logs --ray RUN`: each stage's last lines as its node's agent kept them (stage, stream, text), in stage
    order. follow: given those, then every new line as it comes (every `every` s), until every stage of the run
    is gone (`logs -f`); the agents number their lines, so nothing is shown twice."""
    import time

    cluster = ray_cluster.connect(address)
    try:
        found = ray_cluster.detached_runs()
        run_id = housekeeping.resolve_run(run, set(found))
        agents = found[run_id]
        shown: dict[str, int] = {}
        first = ray_cluster.run_logs(agents, lines, shown)
        if follow is None:
            return run_id, first
        follow(first)
        while True:
            left = sum(len(a["containers"]) for a in ray_cluster.run_status(agents))
            new = ray_cluster.run_logs(agents, 0, shown)
            if new:
                follow(new)
            if left == 0:
                return run_id, []
            time.sleep(every)
    finally:
        cluster.close()


def gc(address: str, dry_run: bool = False) -> list[str]:
    """`gc --ray`: the detached runs that ended by themselves (no container of theirs left on any node) have their
    actors and GPUs released, and placement groups of ours with no actor left are removed. Returns what was (or,
    dry run, would be) released, in words."""
    cluster = ray_cluster.connect(address)
    try:
        found = ray_cluster.detached_runs()
        said = []
        for run_id, actors in sorted(found.items()):
            answers = ray_cluster.run_status(actors)
            if answers and not any(a["containers"] for a in answers):
                said.append(f"run {run_id}: every stage has ended; its actors and GPUs released")
                if not dry_run:
                    ray_cluster.end_run(run_id, actors, 0.0)
        for run_id in ray_cluster.stray_groups(list(found)):
            said.append(f"run {run_id}: no node agent left; its placement group (GPUs) released")
            if not dry_run:
                ray_cluster.release_group(run_id)
        return said
    finally:
        cluster.close()


def wait_gone(
    address: str, run: str, timeout: float | None, every: float = 1.0
) -> tuple[str, int, dict[int, tuple[str, int | None]]]:
    """`wait --ray RUN`: until no container of the run is left on any node, or `timeout` seconds passed;
    (run id, how many are left, each ended stage's container name and exit code as its node's agent saw it)."""
    import time

    cluster = ray_cluster.connect(address)
    try:
        found = ray_cluster.detached_runs()
        run_id = housekeeping.resolve_run(run, set(found))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            answers = ray_cluster.run_status(found[run_id])
            left = sum(len(a["containers"]) for a in answers)
            if left == 0 or (deadline is not None and time.monotonic() >= deadline):
                exits = {int(k): (str(v[0]), v[1]) for a in answers for k, v in a.get("exits", {}).items()}
                return run_id, left, dict(sorted(exits.items()))
            time.sleep(every)
    finally:
        cluster.close()
