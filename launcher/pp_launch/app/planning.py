"""What runs at each attempt on Docker engines, and where (docs/architecture.md, "Sites"): the `Planner` port and its
planners: the chain's stages placed by the GPU allocator over every place's GPUs and holdings (`Allocated`), or the
one stage a caller describes (`Given`); pp-gpu-node's is app/node.py's `NodePlanner`. A planner reads its places
only through their own methods (app/places.py), so one engine and many are planned alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pp_launch.adapters.runtime import map_all
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app.locks import GpuLocks
from pp_launch.app.places import EnginePlace, hosts_of, is_local
from pp_launch.app.request import Launched, LaunchRequest
from pp_launch.core import errors, hosts
from pp_launch.core.chain.plan import ChainPlan, StageSpec, build_plan
from pp_launch.core.gpu.allocator import HOST_LEVEL, order_groups, passed_over
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.gpu.requests import device_requests
from pp_launch.core.lines import count

if TYPE_CHECKING:
    from pp_launch.adapters.ray_cluster import RayNode, StageHandle


P = TypeVar("P", contravariant=True)  # the places a planner plans over: engines, or a Ray cluster's nodes
H = TypeVar("H", contravariant=True)  # what an attempt holds on them: the engines' GPU locks, or Ray's grant


class Planner(Protocol[P, H]):
    """What runs at each attempt, where, and how (docs/architecture.md, "Sites"). On Docker engines: the chain's
    stages placed by the GPU allocator (`Allocated`), or the one stage a caller describes (`Given`: the testing kit,
    the worker driver; app/node.py: pp-gpu-node's); on Ray: the chain's stages over the GPUs Ray grants
    (`Granted`). `backend_options`: for one engine's stage backend; `watch_gpus`: a stage whose GPU faults (Xid)
    fails. A planner that subclasses it takes the defaults: no options, no watch, nothing to prepare, and a dry run
    that is its plan with nothing reserved."""

    backend_options: Mapping[str, Any] = {}
    watch_gpus: bool = False

    def prepare(self, request: LaunchRequest, places: Sequence[P], say: Callable[[str], None]) -> None:
        """Before the site prepares its places: what this planner's stages need first (none by default)."""
        return None

    def plan(
        self, request: LaunchRequest, places: Sequence[P], environ: Mapping[str, str], held: H | None
    ) -> tuple[ChainPlan, str]:
        """The attempt's plan (held None: a dry run, nothing reserved), and a note for the user."""
        ...

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[P], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        """The plan only (strict: fail where a launch would, before starting)."""
        return Launched(*self.plan(request, places, environ, None))


EnginePlanner = Planner[EnginePlace, GpuLocks]  # a Docker site's


class Allocated(Planner[EnginePlace, GpuLocks]):
    """The chain's stages, each placed on its host and GPUs by the allocator (app/gpus.py) under the engines' GPU
    locks."""

    watch_gpus = True

    def plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], held: GpuLocks | None
    ) -> tuple[ChainPlan, str]:
        return plan_on(request, places, environ, held)

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        """strict (a dry run): a stage image the engine lacks is the error a launch would meet; a Compose file is
        written for wherever it will run, so it checks none."""
        across.check_image(hosts_of(places), request.chain.image)
        for s in places:
            s.check(request.chain, strict)
        plan, note = plan_on(request, places, environ, None)
        asked_gpus = request.gpu.mode.strip() != "none"
        warning = "no Docker engine answered: GPUs held by running containers were not checked"
        return Launched(plan, note, None, warning if asked_gpus and places[0].engine is None else "")


class Given(Planner[EnginePlace, GpuLocks]):
    """At each attempt, the one stage its caller describes (`describe(attempt)`): the testing kit's
    StageContainer, the worker driver's generations. Its GPUs are the caller's own choice."""

    def __init__(self, describe: Callable[[int], StageSpec]) -> None:
        self.describe = describe

    def plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], held: GpuLocks | None
    ) -> tuple[ChainPlan, str]:
        spec = self.describe(request.chain.attempt)
        return ChainPlan(run_id=request.run_id or "", stages=(spec,), grace=request.chain.grace), ""


def plan_on(
    request: LaunchRequest,
    sites: Sequence[EnginePlace],
    environ: Mapping[str, str],
    locks: GpuLocks | None,
) -> tuple[ChainPlan, str]:
    """Each engine's GPUs and holdings, the engines' GPU locks taken before their labels are read (when GPUs are
    picked; released once every stage exists), each stage's host and GPUs, the plan. The request's run id and
    owner are set (app/launch.py)."""
    gpu, run_id, owner = request.gpu, request.run_id or "", request.owner or ""
    host_gpus = engine_gpus(request, sites, environ)
    if locks is not None and _locks_needed(gpu.mode, [h.inventory for h in host_gpus]):
        locks.acquire()
    stage_hosts, selection = gpu_select.select(
        mode=gpu.mode,
        stages=request.chain.stages,
        per_stage=gpu.per_stage,
        attach=gpu.attach,
        hosts_gpus=host_gpus,
        environ=environ,
        placement=request.placement,
        stages_per_host=request.stages_per_host,
        allow_shared=gpu.allow_shared,
        min_free_mib=gpu.min_free_mib,
        allow_unhealthy=gpu.allow_unhealthy,
        avoid=request.avoid_gpus,
    )
    launcher = steps.launcher_label(owner)
    plan = build_plan(
        request.chain,
        environ,
        owner,
        selection.stage_gpus,
        selection.device_requests,
        run_id,
        selection.hop_levels,
        selection.cost,
        tuple(stage_hosts),
        launcher,
        frozenset(s.name for s in sites if s.engine is not None and not is_local(s)),
    )
    return plan, selection.note


def engine_gpus(
    request: LaunchRequest, sites: Sequence[EnginePlace], environ: Mapping[str, str]
) -> list[gpu_select.HostGpus]:
    """Each engine's GPUs and holdings (its place's: the probes of several --host engines run at once)."""
    if request.gpu.mode.strip() == "none":
        return [gpu_select.HostGpus(s.name, GpuInventory(), list) for s in sites]
    return map_all(lambda s: s.gpus(request, environ), sites, "host-probe")


def _locks_needed(mode: str, inventories: list[GpuInventory]) -> bool:
    """The engines' GPU locks matter only when GPUs are picked from what others hold (not none, not all)."""
    return mode.strip() not in ("none", "all") and any(inv.gpus for inv in inventories)


# ------------------------------------------------------------------------------------------------ on Ray
class Grant(Protocol):
    """What a Ray attempt holds while it plans (app/on_ray.py): the placement group and its node agents."""

    def grant(
        self, request: LaunchRequest, blocks: list[tuple[RayNode, int]], per_stage: int
    ) -> list[list[StageHandle]]:
        """Each block's agents, with the GPUs Ray granted them (which ones is Ray's choice)."""
        ...

    def serve(self, handles: list[StageHandle]) -> None:
        """Each stage's agent, in the plan's order."""
        ...


class Granted(Planner["RayNode", Grant]):
    """On a Ray cluster: the stages in blocks of consecutive stages per node (`--placement`, `--stages-per-host` as
    across --host engines: the ring crosses each node boundary once), each block's GPUs as Ray grants them, shared
    out round the closest ring over them (the allocator's `order_groups`), blocks in ring order."""

    watch_gpus = True  # each node agent watches the GPUs Ray granted it; each checks the image on its node

    def plan(
        self, request: LaunchRequest, places: Sequence[RayNode], environ: Mapping[str, str], held: Grant | None
    ) -> tuple[ChainPlan, str]:
        assert held is not None  # a dry run on Ray is dry_plan's: nothing is granted then
        per_stage = gpus_per_stage(request)
        ordered, hops = ring_order(held.grant(request, node_blocks(request, places, per_stage), per_stage), per_stage)
        held.serve(ordered)
        request = met_at(request, ordered[0].node.address, str(ordered[0].facts.get("port", "")))
        return _on_nodes(request, environ, [h.gpus for h in ordered], hops, [h.node.name for h in ordered]), ""

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[RayNode], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        """Which node takes which stages, from what the cluster says is free now; nothing is reserved or started
        (Ray says which GPUs it grants a node only with the grant)."""
        per_stage = gpus_per_stage(request)
        blocks, passing = _healthy_blocks(request, places, per_stage)
        hops: list[int | None] = []
        for _, k in blocks:
            hops += [None] * (k - 1) + ([HOST_LEVEL] if len(blocks) > 1 else [None])
        stages = sum(k for _, k in blocks)
        nodes = [n.name for n, k in blocks for _ in range(k)]
        request = met_at(request, blocks[0][0].address, "")  # the port: picked on stage 0's node at launch
        built = _on_nodes(request, environ, [()] * stages, tuple(hops) if per_stage and stages > 1 else (), nodes)
        free = "; ".join(f"{n.name}: {n.free_gpus} of {count(n.gpus, 'GPU')} free" for n in places)
        wanted = "; ".join(f"{n.name}: {count(k * per_stage, 'GPU')}" for n, k in blocks) if per_stage else ""
        fits = all(n.free_gpus >= k * per_stage for n, k in blocks)
        note = (
            f"nothing reserved: Ray grants the GPUs at launch ({wanted}), which ones is its choice; the cluster now: "
            f"{free}" + ("" if fits else f"; not free now: a launch would wait up to {request.ray_timeout:g} s")
            if per_stage
            else "nothing reserved: CPU stages"
        ) + (f"; passed over as a launch would: {passing}" if passing else "")
        return Launched(built, note)


def _healthy_blocks(
    request: LaunchRequest, places: Sequence[RayNode], per_stage: int
) -> tuple[list[tuple[RayNode, int]], str]:
    """The blocks as the launch plans them, each node's unhealthy GPUs passed over (its agent's rule) unless allowed,
    and what was passed over, in words; the launch's refusal (NotEnoughGpus) naming them when it does not fit."""
    sick = {n.name: _unhealthy(request, n) for n in places} if per_stage else {}
    passing = "; ".join(f"{u} on node {name} ({why})" for name, no in sick.items() for u, why in no.items())
    try:
        return node_blocks(request, [_less(n, len(sick.get(n.name, {}))) for n in places], per_stage), passing
    except errors.NotEnoughGpus as exc:
        if not passing:
            raise
        raise errors.NotEnoughGpus(
            f"{exc}; passed over as a launch would: {passing}. Use unhealthy GPUs anyway (--allow-unhealthy; "
            "docs/recovery.md)"
        ) from None


def _unhealthy(request: LaunchRequest, node: RayNode) -> dict[str, str]:
    """The GPUs of a node a launch's agent would pass over for their health (UUID -> why); none where the node's
    GPUs were not read, or with --allow-unhealthy."""
    if node.inventory is None:
        return {}
    uuids = [g.uuid for g in node.inventory.gpus]
    return passed_over(node.inventory, uuids, (), request.gpu.allow_unhealthy)


def _less(node: RayNode, sick: int) -> RayNode:
    """The node as a launch can use it: its unhealthy GPUs out of its count, and out of its free ones at most."""
    gpus = max(node.gpus - sick, 0)
    return dataclasses.replace(node, gpus=gpus, free_gpus=min(node.free_gpus, gpus))


def _on_nodes(
    request: LaunchRequest,
    environ: Mapping[str, str],
    stage_gpus: Sequence[tuple[str, ...]],
    hops: tuple[int | None, ...],
    nodes: Sequence[str],
) -> ChainPlan:
    """The plan of a chain on Ray: each stage on its node, with the GPUs it was given."""
    owner = request.owner or ""
    attach = request.gpu.attach
    return build_plan(
        request.chain,
        environ,
        owner,
        list(stage_gpus),
        [device_requests(g, attach) for g in stage_gpus],
        request.run_id or "",
        hops,
        None,
        tuple(nodes),
        steps.launcher_label(owner),
    )


def met_at(request: LaunchRequest, address: str, port: str) -> LaunchRequest:
    """--rendezvous torch on Ray: the master on stage 0's node, at its address as Ray knows it and a port free
    there (MASTER_ADDR and MASTER_PORT in --env win)."""
    chain = request.chain
    if not chain.rendezvous:
        return request
    given = {name for name, _ in chain.env}
    more = tuple((k, v) for k, v in (("MASTER_ADDR", address), ("MASTER_PORT", port)) if v and k not in given)
    return dataclasses.replace(request, chain=dataclasses.replace(chain, env=(*chain.env, *more)))


def gpus_per_stage(request: LaunchRequest) -> int:
    """GPUs each stage asks Ray for: --gpus-per-stage, or 0 with --gpus none (CPU stages)."""
    mode, per_stage = gpu_select.parse_gpus_flag(request.gpu.mode, request.gpu.per_stage)
    return 0 if mode == "none" else per_stage


def node_blocks(request: LaunchRequest, nodes: Sequence[RayNode], per_stage: int) -> list[tuple[RayNode, int]]:
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


def _never_fits(request: LaunchRequest, usable: Sequence[RayNode], per_stage: int) -> errors.NotEnoughGpus:
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


def ring_order(
    rows: Sequence[Sequence[StageHandle]], per_stage: int
) -> tuple[list[StageHandle], tuple[int | None, ...]]:
    """Each block's actors in the order of the closest ring over the GPUs Ray granted them, blocks in ring order;
    each stage's hop to the next (HOST_LEVEL out of a node)."""
    ordered: list[StageHandle] = []
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
