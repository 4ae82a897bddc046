"""The library API behind `pp-launch chain`: plan a chain, make sure its image exists, run it.

The CLI parses and maps errors to exit codes; everything a program embedding pp-launch needs is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import bringup, errors, images, labels, node, sweep, watchdog
from .announce import escape
from .chain.plan import BUILTIN_IMAGE, ChainPlan, ChainRequest, build_plan, new_run_id
from .chain.ports import QueueInbox, StageBackend, StopRequested
from .chain.scope import ChainOutcome, ChainScope, Reporter
from .docker_engine import DockerStageBackend, Engine, connect
from .gpu import select as gpu_select
from .gpu.inventory import GpuInventory
from .process_backend import ProcessStageBackend

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


def sweep_dead_owners(engine: Engine, say: Callable[[str], None]) -> None:
    """Before starting anything: remove what launchers that died on this host left behind, and say so."""
    collected = sweep.gc(engine)
    for c in collected.removed:
        say(f"removed {sweep.describe(c)}, left behind by a launcher that is gone")
    for c, why in collected.failed:
        say(f"could not remove {sweep.describe(c)}, left behind by a launcher that is gone: {sweep.safe(why)}")


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
            lambda run: [c.id for c in engine.containers([f"{labels.RUN}={run}"])],
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
        gpu_select.Reservations(gpu_select.state_dir()).release(plan.run_id)
        if detach:
            bringup.complete(plan.run_id)  # the hand-over: from here on only `down` ends the run
        if guard is not None:
            guard.stdin.close()  # type: ignore[union-attr]  # a clean end: the watchdog finds nothing and exits


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return  # our reader is gone; the stage runs on until stopped (the lifeline covers our death)
        view = view[n:]


def _watch_parent_lifeline(inbox: QueueInbox) -> None:
    """A child of `chain --gpu-node`: our stdin is a pipe the launcher holds and never writes. Its end (the
    launcher died, SIGKILL included) is a stop request, so the stage is torn down as for SIGTERM."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        inbox.put(StopRequested(signal.SIGTERM))

    threading.Thread(target=watch, daemon=True, name="parent-lifeline").start()


def run_node(environ: Mapping[str, str], args: tuple[str, ...], inbox: QueueInbox, say: Callable[[str], None]) -> int:
    """pp-gpu-node: one stage container in the foreground; `args` become its command. Stop signals must
    already be arriving in `inbox`."""
    config = node.NodeConfig.from_env(environ, args)
    if environ.get(node.PARENT_LIFELINE) == "stdin":
        _watch_parent_lifeline(inbox)
    engine = connect()
    if engine.image_labels(config.image) is None:
        if config.image != BUILTIN_IMAGE:
            raise errors.ImageMissing(
                f"image {config.image} (PP_IMAGE) is not present on this engine, and pp-gpu-node never pulls. "
                "Build it or load it ('docker load -i FILE') first."
            )
        ensure_image(engine, config.image, say)
    sweep_dead_owners(engine, say)
    _free_name(engine, config.name, say)
    owner = labels.Owner.current().label()
    gpus = config.gpus
    run_id = config.run_id or new_run_id()
    if gpus.auto:
        choice = gpu_select.select(
            mode="auto",
            stages=1,
            per_stage=1,
            attach="request",
            inventory=gpu_select.load_inventory(None),
            engine_labels=lambda: live_gpu_labels(engine),
            run_id=run_id,
            owner=owner,
            environ=environ,
        )
        uuids = choice.stage_gpus[0]
        gpus = node.GpuRequest(choice.device_requests[0], ",".join(uuids) or "void", uuids)
        if choice.note:
            say(choice.note)
    spec = dataclasses.replace(config, run_id=run_id).spec(environ, owner, gpus)
    for m in spec.mounts:
        os.makedirs(m.host, exist_ok=True)
    guard = watchdog.spawn(run_id, config.grace)  # before the container exists: no moment is uncovered
    backend = DockerStageBackend(engine, split_lines=False)
    try:
        ref = backend.create(spec, spec.env)
        streams = {"stdout": 1, "stderr": 2}
        supervisor = node.NodeSupervisor(
            backend, inbox, lambda stream, data: _write_all(streams[stream], data), config.grace
        )
        return supervisor.run(ref, config.stage)
    finally:
        gpu_select.Reservations(gpu_select.state_dir()).release(run_id)
        guard.stdin.close()  # type: ignore[union-attr]


def _free_name(engine: Engine, name: str, say: Callable[[str], None]) -> None:
    """A same-named container of a dead owner is removed; anyone else's is an error, never touched."""
    owner = engine.container_owner(name)
    if owner is None:
        return
    if owner == "":
        raise errors.NameInUse(
            f"container {name} exists and was not made by pp-launch; remove it yourself if it is stale "
            f"(docker rm -f {name}) or choose another PP_CONTAINER_PREFIX"
        )
    if labels.owner_is_gone(owner):
        engine.remove(name)
        say(f"removed stale container {name}: its owner {owner} is gone")
        return
    raise errors.NameInUse(
        f"container {name} is in use by a live owner ({owner}); it was left untouched. Stop that run first "
        "or choose another PP_CONTAINER_PREFIX"
    )


def teardown_containers(engine: Engine, selector: list[str], grace: float, kill_wait: float = 15.0) -> list[str]:
    """`pp-launch down`: the chain's guarantees for containers found by label. SIGTERM to all at once, one
    shared grace, SIGKILL through the engine, removal confirmed by the engine. Returns what is left."""
    targets = engine.containers(selector)
    for c in targets:
        if c.state == "running":
            engine.signal(c.id, signal.SIGTERM)

    def running() -> list[str]:
        return [c.id for c in engine.containers(selector) if c.state == "running"]

    deadline = time.monotonic() + grace
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    for ref in running():
        engine.signal(ref, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait
    while engine.containers(selector) and time.monotonic() < deadline:
        left = engine.containers(selector)
        if all(c.state in ("exited", "created", "dead") for c in left):
            for c in left:  # not auto-removed (never started, or made without it): remove by force
                engine.remove(c.id)
        time.sleep(0.1)
    return [c.name for c in engine.containers(selector)]
