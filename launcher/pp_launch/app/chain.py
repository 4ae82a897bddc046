"""The library API behind `pp-launch chain`: plan a chain, make sure its image exists, run it.

The CLI parses and maps errors to exit codes; everything a program embedding pp-launch needs is here."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pp_launch.adapters import bringup, host_state, watchdog
from pp_launch.adapters.docker_engine import DockerStageBackend, Engine
from pp_launch.adapters.process_backend import ProcessStageBackend
from pp_launch.app import gpus as gpu_select
from pp_launch.app import housekeeping, images
from pp_launch.core import errors, labels
from pp_launch.core.announce import escape
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainPlan, ChainRequest, build_plan, new_run_id
from pp_launch.core.chain.ports import QueueInbox, StageBackend
from pp_launch.core.chain.scope import ChainOutcome, ChainScope, Reporter
from pp_launch.core.gpu.inventory import GpuInventory

# docker's reference grammar, simplified: [host[:port]/]path[:tag][@sha256:digest], lowercase path
_IMAGE_REF = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


_NAME_PREFIX = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}")


def check_image_name(image: str, what: str = "--image") -> None:
    if not _IMAGE_REF.fullmatch(image):
        raise errors.ConfigError(f"{what} {image!r} is not a valid image reference (e.g. repo/name:tag)")


def check_name_prefix(prefix: str) -> None:
    if not _NAME_PREFIX.fullmatch(prefix):
        raise errors.ConfigError(f"--name {prefix!r} is not a valid container name prefix ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")


@dataclass(frozen=True)
class GpuOptions:
    mode: str = "auto"
    per_stage: int = 1
    attach: str = "request"
    inventory_path: str | None = None
    allow_shared: bool = False
    min_free_mib: int | None = None


def live_gpu_labels(engine: Engine) -> list[Mapping[str, str]]:
    """Labels of every existing pp-launch container that holds GPUs (exited ones hold nothing)."""
    return [
        c.labels
        for c in engine.containers([labels.GPUS])
        if c.state not in ("exited", "dead") and c.labels.get(labels.GPUS)
    ]


def plan_chain(
    request: ChainRequest,
    gpu: GpuOptions,
    engine: Engine | None,
    environ: Mapping[str, str] | None = None,
    owner: str | None = None,
    run_id: str | None = None,
    inventory: GpuInventory | None = None,
    reserve: bool = True,
) -> tuple[ChainPlan, str]:
    """The plan and a note for the user (e.g. why stages run on CPU). `engine` None: a dry run without an
    engine, which cannot see GPUs held by running containers."""
    check_image_name(request.image)
    if request.name_prefix is not None:
        check_name_prefix(request.name_prefix)
    environ = os.environ if environ is None else environ
    run_id = run_id or new_run_id()
    owner = owner or labels.Owner.current().label()
    inventory = inventory if inventory is not None else gpu_select.load_inventory(gpu.inventory_path)
    selection = gpu_select.select(
        mode=gpu.mode,
        stages=request.stages,
        per_stage=gpu.per_stage,
        attach=gpu.attach,
        inventory=inventory,
        engine_labels=(lambda: live_gpu_labels(engine)) if engine is not None else list,
        run_id=run_id,
        owner=owner,
        environ=environ,
        allow_shared=gpu.allow_shared,
        min_free_mib=gpu.min_free_mib,
        reserve=reserve,
    )
    plan = build_plan(
        request, environ, owner, selection.stage_gpus, selection.device_requests, run_id, selection.hop_levels,
        selection.cost,
    )
    return plan, selection.note


def ensure_image(engine: Engine, image: str, say: Callable[[str], None]) -> None:
    """The built-in image is built on first use; a user image must be there already (nothing is pulled)."""
    if engine.image_labels(image) is not None:
        return
    if image != BUILTIN_IMAGE:
        raise errors.ImageMissing(
            f"image {image} is not present on this engine, and pp-launch never pulls. Build it or load it "
            "('docker load -i FILE') first."
        )
    say(f"{BUILTIN_IMAGE} is missing: building it now (once; 'pp-launch images build' does the same)")
    images.build_all(engine, say)


def sweep_dead_owners(engine: Engine, say: Callable[[str], None]) -> None:
    """Before starting anything: remove what launchers that died on this host left behind, and say so."""
    collected = housekeeping.gc(engine)
    for c in collected.removed:
        say(f"removed {housekeeping.describe(c)}, left behind by a launcher that is gone")
    for c, why in collected.failed:
        gone = f"{housekeeping.describe(c)}, left behind by a launcher that is gone"
        say(f"could not remove {gone}: {housekeeping.safe(why)}")


def check_names_free(engine: Engine, plan: ChainPlan) -> None:
    """A stage's name held by any container, ours or not, is exit 2 before anything starts. The holder is named
    and never touched: a container is ours only by the id the engine gave us for our own create."""
    for spec in plan.stages:
        info = engine.inspect(spec.name)
        if info is None or str(info.get("Name", "")).lstrip("/") != spec.name:
            continue
        held = dict((info.get("Config") or {}).get("Labels") or {})
        run = held.get(labels.RUN)
        if run is None:
            holder, fix = "a container not made by pp-launch", ""
        else:
            holder = (
                f"stage {escape(held.get(labels.STAGE, '?'))} of pp-launch run {escape(run)} "
                f"(owner {escape(held.get(labels.OWNER, '?'))})"
            )
            fix = f", or end that run first ('pp-launch down {escape(run)}')"
        raise errors.NameInUse(
            f"container name {spec.name} is held by {holder}, id {str(info.get('Id', ''))[:12]}; it was left "
            f"untouched. Choose another --name{fix}"
        )


def run_chain(
    plan: ChainPlan,
    engine: Engine,
    reporter: Reporter,
    on_scope: Callable[[ChainScope], None] = lambda scope: None,
    detach: bool = False,
    gpu_node: str | None = None,
) -> ChainOutcome:
    """Run the chain to its end. `on_scope` receives the scope before anything starts (the CLI installs its
    signal handlers there). A watchdog removes the run's containers if this process dies; the GPU
    reservation is released whatever happens."""
    backend: StageBackend
    if gpu_node is not None:
        backend = ProcessStageBackend(
            gpu_node,
            plan.run_id,
            plan.grace,
            lambda run: [c.id for c in engine.containers(labels.run_selector(run))],
        )
    else:
        backend = DockerStageBackend(engine)
    scope = ChainScope(plan, backend, QueueInbox(), reporter, detach=detach)
    on_scope(scope)
    guard = None
    try:
        if gpu_node is None:
            check_names_free(engine, plan)
        if detach:
            bringup.begin(plan.run_id, labels.Owner.current().label())  # ours until the hand-over
        guard = watchdog.spawn(plan.run_id, plan.grace, detached=detach)
        return scope.run()
    finally:
        host_state.Reservations(host_state.state_dir()).release(plan.run_id)
        if detach:
            bringup.complete(plan.run_id)  # the hand-over: from here on only `down` ends the run
        if guard is not None:
            guard.stdin.close()  # type: ignore[union-attr]  # a clean end: the watchdog finds nothing and exits
