"""What runs at each attempt on Docker engines, and where (docs/architecture.md, "Sites"): the `Planner` port and its
planners: the chain's stages placed by the GPU allocator over every place's GPUs and holdings (`Allocated`), or the
one stage a caller describes (`Given`); pp-gpu-node's is app/node.py's `NodePlanner`. A planner reads its places
only through their own methods (app/places.py), so one engine and many are planned alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pp_launch.adapters.runtime import map_all
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app.locks import GpuLocks
from pp_launch.app.places import EnginePlace, hosts_of, is_local
from pp_launch.app.request import Launched, LaunchRequest
from pp_launch.core.chain.plan import ChainPlan, StageSpec, build_plan
from pp_launch.core.gpu.inventory import GpuInventory


class Planner(Protocol):
    """What a Docker site runs at each attempt, and how (docs/architecture.md, "Sites"): the chain's stages placed
    by the GPU allocator (`Allocated`), or the one stage a caller describes (`Given`: the testing kit, the worker
    driver; app/node.py: pp-gpu-node's). `backend_options`: for the one engine's stage backend; `watch_gpus`: a
    stage whose GPU faults (Xid) fails."""

    backend_options: Mapping[str, Any]
    watch_gpus: bool

    def prepare(self, request: LaunchRequest, places: Sequence[EnginePlace], say: Callable[[str], None]) -> None:
        """Before the site prepares its engines: what this planner's stages need first (none by default)."""
        ...

    def plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], held: GpuLocks | None
    ) -> tuple[ChainPlan, str]:
        """The attempt's plan (held None: a dry run, nothing reserved), and a note for the user."""
        ...

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        """The plan only (strict: fail where a launch would, before starting)."""
        ...


class Allocated:
    """The chain's stages, each placed on its host and GPUs by the allocator (app/gpus.py) under the engines' GPU
    locks."""

    backend_options: Mapping[str, Any] = {}
    watch_gpus = True

    def prepare(self, request: LaunchRequest, places: Sequence[EnginePlace], say: Callable[[str], None]) -> None:
        pass

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


class Given:
    """At each attempt, the one stage its caller describes (`describe(attempt)`): the testing kit's
    StageContainer, the worker driver's generations. Its GPUs are the caller's own choice."""

    backend_options: Mapping[str, Any] = {}
    watch_gpus = False

    def __init__(self, describe: Callable[[int], StageSpec]) -> None:
        self.describe = describe

    def prepare(self, request: LaunchRequest, places: Sequence[EnginePlace], say: Callable[[str], None]) -> None:
        pass

    def plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], held: GpuLocks | None
    ) -> tuple[ChainPlan, str]:
        spec = self.describe(request.chain.attempt)
        return ChainPlan(run_id=request.run_id or "", stages=(spec,), grace=request.chain.grace), ""

    def dry_plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], strict: bool
    ) -> Launched:
        return Launched(*self.plan(request, places, environ, None))


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
