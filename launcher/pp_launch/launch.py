"""The library API behind `pp-launch chain`: plan a chain, make sure its image exists, run it.

The CLI parses and maps errors to exit codes; everything a program embedding pp-launch needs is here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import errors, images, labels
from .chain.plan import BUILTIN_IMAGE, ChainPlan, ChainRequest, build_plan, new_run_id
from .chain.ports import QueueInbox
from .chain.scope import ChainOutcome, ChainScope, Reporter
from .docker_engine import DockerStageBackend, Engine
from .gpu import select as gpu_select
from .gpu.inventory import GpuInventory

# docker's reference grammar, simplified: [host[:port]/]path[:tag][@sha256:digest], lowercase path
_IMAGE_REF = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
_NAME_PREFIX = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}")


def check_image_name(image: str) -> None:
    if not _IMAGE_REF.fullmatch(image):
        raise errors.ConfigError(f"--image {image!r} is not a valid image reference (e.g. repo/name:tag)")


def check_name_prefix(prefix: str) -> None:
    if not _NAME_PREFIX.fullmatch(prefix):
        raise errors.ConfigError(
            f"--name {prefix!r} is not a valid container name prefix ([a-zA-Z0-9][a-zA-Z0-9_.-]*)"
        )


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
        request, environ, owner, selection.stage_gpus, selection.device_requests, run_id, selection.hop_levels
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


def run_chain(
    plan: ChainPlan,
    engine: Engine,
    reporter: Reporter,
    on_scope: Callable[[ChainScope], None] = lambda scope: None,
    detach: bool = False,
) -> ChainOutcome:
    """Run the chain to its end. `on_scope` receives the scope before anything starts (the CLI installs its
    signal handlers there). The GPU reservation is released whatever happens."""
    scope = ChainScope(plan, DockerStageBackend(engine), QueueInbox(), reporter, detach=detach)
    on_scope(scope)
    try:
        return scope.run()
    finally:
        gpu_select.Reservations(gpu_select.state_dir()).release(plan.run_id)
