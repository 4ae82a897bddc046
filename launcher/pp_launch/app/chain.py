"""The library API behind `pp-launch chain`: plan a chain, make sure its image exists, run it.

The CLI parses and maps errors to exit codes; everything a program embedding pp-launch needs is here."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pp_launch.adapters import bringup, host_state, watchdog
from pp_launch.adapters.docker_engine import DockerStageBackend, Engine
from pp_launch.adapters.multi_host import MultiHostBackend
from pp_launch.adapters.process_backend import ProcessStageBackend
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app import housekeeping, images
from pp_launch.app.hosts import live_gpu_labels
from pp_launch.app.locks import GpuLocks
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


def check_request(request: ChainRequest) -> None:
    """What a plan checks of the request before anything else (exit 2)."""
    check_image_name(request.image)
    if request.name_prefix is not None:
        check_name_prefix(request.name_prefix)


@dataclass(frozen=True)
class GpuOptions:
    mode: str = "auto"
    per_stage: int = 1
    attach: str = "request"
    inventory_path: str | None = None
    allow_shared: bool = False
    min_free_mib: int | None = None
    host_inventories: tuple[tuple[str, str], ...] = ()  # --gpu-inventory HOST=FILE (chains across hosts)


def _locks_needed(mode: str, inventories: list[GpuInventory]) -> bool:
    """The engines' GPU locks matter only when GPUs are picked from what others hold (not none, not all)."""
    return mode.strip() not in ("none", "all") and any(inv.gpus for inv in inventories)


def _launcher(owner: str) -> str:
    """A detached run's launcher (labels.LAUNCHER): the run is its own until the hand-over."""
    return labels.Owner.current().label() if owner == labels.OWNER_DETACHED else ""


def plan_chain(
    request: ChainRequest,
    gpu: GpuOptions,
    engine: Engine | None,
    environ: Mapping[str, str] | None = None,
    owner: str | None = None,
    run_id: str | None = None,
    inventory: GpuInventory | None = None,
    locks: GpuLocks | None = None,
) -> tuple[ChainPlan, str]:
    """The plan and a note for the user (e.g. why stages run on CPU). `engine` None: a dry run without an
    engine, which cannot see GPUs held by running containers. `locks`: the engine's GPU lock, taken here before
    the engine's labels are read when GPUs are picked; the caller releases it once the stages exist."""
    check_request(request)
    environ = os.environ if environ is None else environ
    run_id = locks.run_id if locks is not None else (run_id or new_run_id())
    owner = owner or labels.Owner.current().label()
    inventory = inventory if inventory is not None else gpu_select.load_inventory(gpu.inventory_path)
    if locks is not None and _locks_needed(gpu.mode, [inventory]):
        locks.acquire()
    selection = gpu_select.select(
        mode=gpu.mode,
        stages=request.stages,
        per_stage=gpu.per_stage,
        attach=gpu.attach,
        inventory=inventory,
        engine_labels=(lambda: live_gpu_labels(engine)) if engine is not None else list,
        environ=environ,
        allow_shared=gpu.allow_shared,
        min_free_mib=gpu.min_free_mib,
    )
    plan = build_plan(
        request,
        environ,
        owner,
        selection.stage_gpus,
        selection.device_requests,
        run_id,
        selection.hop_levels,
        selection.cost,
        launcher=_launcher(owner),
    )
    return plan, selection.note


@dataclass(frozen=True)
class HostOptions:
    """A chain across hosts (--host ...): where stages go, and per-host inventories (--gpu-inventory HOST=FILE)."""

    names: tuple[str, ...]
    placement: str = "pack"
    stages_per_host: int | None = None


def plan_chain_across(
    request: ChainRequest,
    gpu: GpuOptions,
    reached: list[across.Host],
    where: HostOptions,
    environ: Mapping[str, str] | None = None,
    owner: str | None = None,
    run_id: str | None = None,
    locks: GpuLocks | None = None,
) -> tuple[ChainPlan, str]:
    """The plan of a chain across hosts: each host's GPUs (its probe, or its inventory file), stages in blocks of
    consecutive stages per host, placed on each host by the allocator. `locks`: the hosts' GPU locks, taken here
    before their labels are read when GPUs are picked; the caller releases them once the stages exist."""
    check_request(request)
    environ = os.environ if environ is None else environ
    run_id = locks.run_id if locks is not None else (run_id or new_run_id())
    owner = owner or labels.Owner.current().label()
    overrides = dict(gpu.host_inventories)
    if unknown := sorted(set(overrides) - set(where.names)):
        raise errors.ConfigError(
            f"--gpu-inventory {unknown[0]}=FILE: {unknown[0]} is not one of the hosts ({', '.join(where.names)})"
        )
    every = gpu.inventory_path or environ.get(gpu_select.INVENTORY_ENV) or None
    if gpu.mode.strip() == "none":
        host_gpus = [gpu_select.HostGpus(h.name, GpuInventory(), list) for h in reached]
    else:
        host_gpus = across.host_gpus(reached, request.image, gpu.attach, run_id, owner, overrides, every)
    if locks is not None and _locks_needed(gpu.mode, [h.inventory for h in host_gpus]):
        locks.acquire()
    stage_hosts, selection = gpu_select.select_across(
        mode=gpu.mode,
        stages=request.stages,
        per_stage=gpu.per_stage,
        attach=gpu.attach,
        hosts_gpus=host_gpus,
        environ=environ,
        placement=where.placement,
        stages_per_host=where.stages_per_host,
        allow_shared=gpu.allow_shared,
        min_free_mib=gpu.min_free_mib,
    )
    plan = build_plan(
        request, environ, owner, selection.stage_gpus, selection.device_requests, run_id, selection.hop_levels,
        selection.cost, tuple(stage_hosts), _launcher(owner),
    )  # fmt: skip
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
    """Before starting anything: remove what launchers that died on this host left behind, saying first what
    it removes and then what it removed (--no-sweep, PP_LAUNCH_SWEEP=0: leave it to `pp-launch gc`)."""
    found = housekeeping.orphans(engine)
    if not found:
        return
    say(f"removing {len(found)} container{'s' if len(found) != 1 else ''} left behind by launchers that are gone "
        "(--no-sweep leaves them): " + ", ".join(housekeeping.describe(c) for c in found))  # fmt: skip
    collected = housekeeping.gc(engine, found)
    for c in collected.removed:
        say(f"removed {housekeeping.describe(c)}, left behind by a launcher that is gone")
    for c, why in collected.failed:
        gone = f"{housekeeping.describe(c)}, left behind by a launcher that is gone"
        say(f"could not remove {gone}: {housekeeping.safe(why)}")


def check_names_free(engine: Engine, plan: ChainPlan, host: str | None = None) -> None:
    """A stage's name held by any container, ours or not, is exit 2 before anything starts. The holder is named
    and never touched: a container is ours only by the id the engine gave us for our own create. `host`: only
    the stages of that host (a chain across hosts), on its engine."""
    for spec in plan.stages:
        if host is not None and spec.host != host:
            continue
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
        on = f" on host {host}" if host is not None else ""
        raise errors.NameInUse(
            f"container name {spec.name}{on} is held by {holder}, id {str(info.get('Id', ''))[:12]}; it was left "
            f"untouched. Choose another --name{fix}"
        )


def run_chain(
    plan: ChainPlan,
    engine: Engine,
    reporter: Reporter,
    on_scope: Callable[[ChainScope], None] = lambda scope: None,
    detach: bool = False,
    gpu_node: str | None = None,
    reached: list[across.Host] | None = None,
    locks: GpuLocks | None = None,
) -> ChainOutcome:
    """Run the chain to its end. `on_scope` receives the scope before anything starts (the CLI installs its
    signal handlers there). A watchdog removes the run's containers if this process dies. The engines' GPU
    locks (taken while planning) are released once every stage's container exists, and on every way out. A
    detached run is handed over (bringup.py) once it is up, and only then."""
    release = locks.release if locks is not None else (lambda: None)
    if reached:
        return _run_across(plan, reached, reporter, on_scope, detach, release)
    backend: StageBackend
    if gpu_node is not None:
        backend = ProcessStageBackend(
            gpu_node,
            plan.run_id,
            plan.grace,
            lambda run: [c.id for c in engine.containers(labels.run_selector(run))],
        )
    else:
        backend = DockerStageBackend(engine, expected=len(plan.stages), on_all_created=release)
    scope = ChainScope(plan, backend, QueueInbox(), reporter, detach=detach)
    on_scope(scope)
    guard = None
    try:
        if gpu_node is None:
            check_names_free(engine, plan)
        guard = watchdog.spawn(plan.run_id, plan.grace, detached=detach)
        outcome = scope.run()
        if outcome.reason == "detached":
            bringup.hand_over(engine, plan.run_id, plan.stages[0].image)  # from here on only `down` ends it
        return outcome
    finally:
        release()
        if guard is not None:
            guard.stdin.close()  # type: ignore[union-attr]  # a clean end: the watchdog finds nothing and exits


def _run_across(
    plan: ChainPlan,
    reached: list[across.Host],
    reporter: Reporter,
    on_scope: Callable[[ChainScope], None],
    detach: bool,
    release: Callable[[], None],
) -> ChainOutcome:
    """run_chain for a chain across hosts: one scope over every host's engine, a watchdog per engine, the run's
    hosts recorded (ps/down/gc --all-hosts); a host lost on the way is named with the command to run later.
    The hosts' GPU locks (taken before planning) are released once every stage's container exists."""
    backends = {h.name: DockerStageBackend(h.engine) for h in reached}
    backend = MultiHostBackend(backends, expected=len(plan.stages), on_all_created=release)
    scope = ChainScope(plan, backend, QueueInbox(), reporter, detach=detach)
    on_scope(scope)
    record = host_state.RunHosts()
    record.write(plan.run_id, plan.hosts)
    guards = []
    outcome: ChainOutcome | None = None
    try:
        for h in reached:
            check_names_free(h.engine, plan, h.name)
        guards = [watchdog.spawn(plan.run_id, plan.grace, detached=detach, host=h.name) for h in reached]
        outcome = scope.run()
        if outcome.reason == "detached":
            for h in reached:
                bringup.hand_over(h.engine, plan.run_id, plan.stages[0].image)
    finally:
        release()
        for guard in guards:
            guard.stdin.close()  # type: ignore[union-attr]
        if outcome is not None and not outcome.orphans and not backend.lost and outcome.reason != "detached":
            record.forget(plan.run_id)
    assert outcome is not None  # scope.run() returned, or its exception went up through the finally
    if backend.lost:
        run = plan.run_id
        said = []
        for host, why in backend.lost.items():
            left = [ref[:12] for ref in outcome.orphans if backend.where(ref) == host]
            maybe = f"containers {', '.join(left)} of run {run} may still be there" if left else "none known left"
            said.append(
                f"host {host} could not be reached ({why}): {maybe}; this run's watchdog for that host removes them "
                f"if it comes back soon, else run 'pp-launch down {run} --host {host}' when it is back"
            )
        message = f"{outcome.message}; {'; '.join(said)}"
        outcome = dataclasses.replace(outcome, exit_code=errors.EXIT_FAILURE, message=message)
    return outcome
