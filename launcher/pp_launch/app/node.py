"""`pp-gpu-node`: one stage container in the foreground, a drop-in for docker-gpu-node.sh (docs/pp-gpu-node.md).

Reads the same environment as the old script, runs the container with tini as init and auto-remove,
passes its stdout and stderr through byte for byte, forwards stop signals, and exits with its exit code.
Unlike `exec docker run`, it cannot orphan its container:
- graceful: SIGTERM/SIGINT/SIGHUP/SIGQUIT are forwarded; after PP_STOP_GRACE the container is killed
  through the engine, and we exit 128+N only once the engine confirms it is gone;
- SIGKILL of this process: the run's guard on the engine (and the local watchdog) removes the container; the stdin
  lifeline also closes, which the built-in stage turns into its exit;
- left over from a dead owner: a same-named container is removed before we start (a live owner's never is).

`NodeConfig.from_env` is pure; the run goes through the chain's own pipeline (app/launch.py), its one stage in the
foreground of the chain's scope."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pp_launch.adapters import identity, local
from pp_launch.adapters.docker_engine import NODE_TOOLKIT_HINT, Engine
from pp_launch.app import gpus as gpu_select
from pp_launch.app.chain import check_image_name
from pp_launch.app.docker_site import DockerSite
from pp_launch.app.launch import launch
from pp_launch.app.locks import GpuLocks
from pp_launch.app.places import EnginePlace, engine_of
from pp_launch.app.planning import Planner
from pp_launch.app.request import GpuOptions, Hooks, LaunchRequest
from pp_launch.core import errors, labels, stage_env
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainPlan, ChainRequest, StageSpec
from pp_launch.core.chain.scope import ChainOutcome
from pp_launch.core.container import CACHE_MOUNT, MODEL_CACHE_MOUNT, ContainerOptions, MountSpec
from pp_launch.core.gpu.requests import gpu_request, read_gpus
from pp_launch.core.stage_env import FORWARD_ENV, NODE_FORWARDED, RUN_ENV


def run_node(
    environ: Mapping[str, str],
    args: tuple[str, ...],
    hooks: Hooks,
    stop: Callable[[int], None],
    extra_env: tuple[tuple[str, str], ...] = (),
) -> int:
    """pp-gpu-node: a run of one stage, in the foreground, through the chain's own pipeline (app/launch.py) on
    DOCKER_HOST's engine (its one stage `NodePlanner`'s). `args` become the container's command, `extra_env` is set
    in it (--env-file) before what pp-gpu-node sets itself; `hooks` route stop signals to the run (its output is
    passed through here); `stop` is how this process asks itself to stop (the parent's lifeline ended)."""
    config = dataclasses.replace(NodeConfig.from_env(environ, args), extra_env=extra_env)
    check_image_name(config.image, "PP_IMAGE")
    _check_count(environ.get("PP_GPUS", ""))
    if environ.get(stage_env.PARENT_LIFELINE) == "stdin":
        local.on_stdin_end(lambda: stop(signal.SIGTERM))
    request = LaunchRequest(
        ChainRequest(stages=1, image=config.image, network=config.network, grace=config.grace),
        GpuOptions(mode="none"),  # PP_GPUS is read as docker run --gpus reads it (NodePlanner.plan)
        run_id=config.run_id,
        keep_logs=False,
    )
    streams = {"stdout": 1, "stderr": 2}
    hooks = dataclasses.replace(hooks, passthrough=lambda stream, data: local.write_all(streams[stream], data))
    try:
        launched = launch(request, hooks, environ, DockerSite.to_launch(request, planner=NodePlanner(config)))
    except errors.GpuAttachUnavailable as exc:
        raise _no_gpus_here(exc, environ.get("PP_GPUS", "")) from None
    assert launched.outcome is not None
    return _exit_code(launched.outcome, hooks.say)


class NodePlanner(Planner[EnginePlace, GpuLocks]):
    """pp-gpu-node's stage on DOCKER_HOST's engine, the chain's site otherwise (app/docker_site.py: the image, the
    run's guard, the engine's GPU lock, the one teardown): the one stage docker-gpu-node.sh described. A dead owner's
    container of the same name is removed first; PP_GPUS is taken as `docker run --gpus` takes it (`auto`: NVML's
    pick, under the engine's GPU lock); the output is passed on byte for byte; a GPU fault does not end it (as
    docker run)."""

    backend_options: Mapping[str, Any] = {"split_lines": False, "toolkit_hint": NODE_TOOLKIT_HINT}
    watch_gpus = False

    def __init__(self, config: NodeConfig) -> None:
        self.config = config

    def prepare(self, request: LaunchRequest, places: Sequence[EnginePlace], say: Callable[[str], None]) -> None:
        """PP_IMAGE present (never pulled), the container's name free; then the site's own (pp-launch's images;
        the run's guard comes up while the launch plans)."""
        image, engine = self.config.image, engine_of(places[0])
        if image != BUILTIN_IMAGE and engine.image_labels(image) is None:
            raise errors.ImageMissing(
                f"image {image} (PP_IMAGE) is not present on this engine, and pp-gpu-node never pulls. "
                "Build it or load it ('docker load -i FILE') first."
            )
        _free_name(engine, self.config.name, say)

    def plan(
        self, request: LaunchRequest, places: Sequence[EnginePlace], environ: Mapping[str, str], held: GpuLocks | None
    ) -> tuple[ChainPlan, str]:
        gpus, note = self.config.gpus, ""
        if gpus.auto:
            here = places[0].gpus(request, environ)  # this machine's NVML (or inventory file), the engine's holdings
            if here.inventory.gpus and held is not None:
                held.acquire()  # released once the container exists (its labels then hold the GPU), or on the way out
            _, choice = gpu_select.select(
                mode="auto", stages=1, per_stage=1, attach="request", hosts_gpus=[here], environ=environ
            )
            uuids = choice.stage_gpus[0]
            gpus, note = GpuRequest(choice.device_requests[0], ",".join(uuids) or "void", uuids), choice.note
        run_id = request.run_id or ""
        spec = dataclasses.replace(self.config, run_id=run_id).spec(environ, request.owner or "", gpus)
        local.ensure_dirs([m.source for m in spec.options.mounts if m.ensure])  # here, wherever the engine is
        return ChainPlan(run_id=run_id, stages=(spec,), grace=self.config.grace), note


def _check_count(value: str) -> None:
    """PP_GPUS=N with fewer GPUs than N here, or device=LIST naming a GPU this host does not have (NVML, or the
    inventory file): said in one line as a chain says it, before the engine is asked (whose refusal would be a
    runtime's error text); exit 125 as `docker run --gpus` (cli/node_cmd.py). A host NVML sees none on is the
    engine's to say."""
    asked = read_gpus(value, bare_lists=False) if value.strip() else None
    if asked is None or asked.kind not in ("count", "list"):
        return
    inventory = gpu_select.load_inventory(None)
    if not inventory.gpus:
        return
    have = len(inventory.gpus)
    if asked.kind == "count" and asked.count > have:
        raise errors.NotEnoughGpus(
            f"not enough GPUs: PP_GPUS={value.strip()} asks for {asked.count}, and this host has "
            f"{have} ('pp-launch gpus' lists them): ask for at most {have}, or name them (device=0,2)"
        )
    known = {str(g.index) for g in inventory.gpus} | {g.uuid for g in inventory.gpus}
    missing = [i for i in asked.ids if i not in known and not i.startswith("MIG-")]
    if asked.kind == "list" and missing:
        raise errors.NotEnoughGpus(
            f"PP_GPUS={value.strip()} names {', '.join(missing)}, which this host does not have: its GPUs are "
            f"0-{have - 1} ('pp-launch gpus' lists them with their UUIDs)"
        )


def _no_gpus_here(exc: errors.GpuAttachUnavailable, asked: str) -> errors.GpuAttachUnavailable:
    """The engine could not attach GPUs: on a host where NVML sees none, that is the reason, not the toolkit."""
    inventory = gpu_select.load_inventory(None)
    if inventory.gpus:
        return exc
    why = inventory.note or "NVML lists none"
    return errors.GpuAttachUnavailable(
        f"PP_GPUS={asked.strip()} asks for GPUs, and this host has none that NVML can see ({why}): leave PP_GPUS "
        "unset to run this stage on CPU, or run it on a GPU host"
    )


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
    if identity.owner_is_gone(owner):
        engine.remove(name)
        say(f"removed stale container {name}: its owner {owner} is gone")
        return
    raise errors.NameInUse(
        f"container {name} is in use by a live owner ({owner}); it was left untouched. Stop that run first "
        "or choose another PP_CONTAINER_PREFIX"
    )


DEFAULT_IMAGE = "swactor-pp-gpu:latest"


DEFAULT_PREFIX = "pp-stage"


DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class GpuRequest:
    """PP_GPUS, mapped as `docker run --gpus` maps it."""

    device_requests: tuple[Mapping[str, Any], ...] = ()
    visible: str | None = stage_env.NO_GPU  # NVIDIA_VISIBLE_DEVICES; None: the engine's GPU driver sets it
    uuids: tuple[str, ...] = ()  # known exactly: for the pp-launch.gpus label
    auto: bool = False


def parse_gpus(value: str | None) -> GpuRequest:
    if value is None or value.strip() == "":
        return GpuRequest()
    asked = read_gpus(value, bare_lists=False)  # the one reader; docker-gpu-node.sh passed PP_GPUS to docker as is
    if asked is None or asked.kind == "none":
        raise errors.ConfigError(
            f"PP_GPUS={value.strip()!r} is not understood: use all, a count (2), device=0,2, device=GPU-<uuid> or auto"
        )
    if asked.kind == "auto":
        return GpuRequest(auto=True)
    if asked.kind == "all":
        return GpuRequest((gpu_request(count=-1),), "all")
    if asked.kind == "count":  # as docker run --gpus 2: the engine picks two
        return GpuRequest((gpu_request(count=asked.count),), None)
    uuids = tuple(i for i in asked.ids if i.startswith(("GPU-", "MIG-")))
    every = uuids if len(uuids) == len(asked.ids) else ()
    return GpuRequest((gpu_request(device_ids=list(asked.ids)),), ",".join(asked.ids), every)


@dataclass(frozen=True)
class NodeConfig:
    stage: int
    image: str = DEFAULT_IMAGE
    prefix: str = DEFAULT_PREFIX
    dev: str | None = None
    cache_dir: str = ""
    network: str = "host"
    gpus: GpuRequest = field(default_factory=GpuRequest)
    model_cache_dir: str | None = None
    entrypoint: str | None = None
    forward_extra: tuple[str, ...] = ()
    grace: float = DEFAULT_GRACE
    run_id: str | None = None
    command: tuple[str, ...] = ()  # our arguments, passed on as the container's command (as "$@" was)
    extra_env: tuple[tuple[str, str], ...] = ()  # --env-file: set in the container, under what we set ourselves

    @property
    def name(self) -> str:
        return f"{self.prefix}-{self.stage}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], args: tuple[str, ...] = ()) -> NodeConfig:
        raw_stage = _stage_of(environ)
        grace = _grace_of(environ)
        home = environ.get("HOME", os.path.expanduser("~"))
        network = environ.get("PP_STAGE_NETWORK") or environ.get("PP_DIAG_NETWORK") or "host"
        return cls(
            stage=int(raw_stage),
            image=environ.get("PP_IMAGE") or DEFAULT_IMAGE,
            prefix=environ.get("PP_CONTAINER_PREFIX") or DEFAULT_PREFIX,
            dev=environ.get("PP_DEV") or None,  # unset: the image's own default, not "CPU"
            cache_dir=environ.get("PP_CACHE_DIR") or os.path.join(home, ".cache", "tinygrad"),
            network=network,
            gpus=parse_gpus(environ.get("PP_GPUS")),
            model_cache_dir=environ.get("PP_MODEL_CACHE_DIR") or None,
            entrypoint=environ.get("PP_ENTRYPOINT") or None,
            forward_extra=_forwarded_names(environ),
            grace=grace,
            run_id=environ.get(RUN_ENV) or None,
            command=tuple(args),
        )

    def stage_env(self, environ: Mapping[str, str], gpus: GpuRequest) -> dict[str, str]:
        env = dict(self.extra_env)
        env.update(stage_env.forwarded(environ, NODE_FORWARDED + self.forward_extra))
        env[stage_env.STAGE] = str(self.stage)
        if self.dev is not None:
            env["DEV"] = self.dev
        if gpus.visible is not None:
            env[stage_env.NVIDIA_VISIBLE_DEVICES] = gpus.visible
        else:
            env.pop(stage_env.NVIDIA_VISIBLE_DEVICES, None)
        if self.model_cache_dir:
            env["PP_MODEL_CACHE_DIR"] = MODEL_CACHE_MOUNT
        env[stage_env.LIFELINE] = "stdin"
        return env

    def mounts(self) -> tuple[MountSpec, ...]:
        """Caches are per stage: stages of one host run at the same moment and would write them at once (the same
        mounts a chain's stages get: core/container.py, cache_mounts)."""
        mounts = [MountSpec("bind", CACHE_MOUNT, os.path.join(self.cache_dir, f"stage-{self.stage}"), ensure=True)]
        if self.model_cache_dir:
            source = os.path.join(self.model_cache_dir, f"stage-{self.stage}")
            mounts.append(MountSpec("bind", MODEL_CACHE_MOUNT, source, ensure=True))
        return tuple(mounts)

    def spec(self, environ: Mapping[str, str], owner: str, gpus: GpuRequest) -> StageSpec:
        run_id = self.run_id or identity.new_run_id()
        return StageSpec(
            index=self.stage,
            name=self.name,
            image=self.image,
            env=self.stage_env(environ, gpus),
            labels=labels.stage_labels(run_id, self.stage, owner, gpus.uuids),
            gpus=gpus.uuids,
            device_requests=gpus.device_requests,
            network=self.network,
            entrypoint=(self.entrypoint,) if self.entrypoint else None,
            command=self.command or None,
            options=ContainerOptions(mounts=self.mounts()),
        )


def _exit_code(outcome: ChainOutcome, say: Callable[[str], None]) -> int:
    """The container's exit code (or 128+N). A foreground stage fails only when the engine could not say how it
    ended: EngineLost (125, as `docker run` whose engine goes away). What else went wrong is said, with exit 1."""
    if outcome.reason in ("stage_failed", "place_lost"):
        raise errors.EngineLost(outcome.message)
    if (
        outcome.orphans
        or outcome.reason == "error"
        or (outcome.reason == "signal" and outcome.exit_code == errors.EXIT_FAILURE)
    ):
        say(f"error: {outcome.message}")
    return outcome.exit_code


def _stage_of(environ: Mapping[str, str]) -> str:
    """STAGE, as given: an index (0, 1, ...), else why not."""
    raw = environ.get("STAGE")
    if raw is None or raw.strip() == "":
        raise errors.ConfigError("STAGE is not set: set it to this stage's index (0, 1, ...)")
    if labels.ascii_int(raw.strip()) is None:
        raise errors.ConfigError(f"STAGE={raw!r} is not a stage index (0, 1, ...)")
    return raw


def _grace_of(environ: Mapping[str, str]) -> float:
    """PP_STOP_GRACE: finite, non-negative seconds (DEFAULT_GRACE unset)."""
    try:
        grace = float(environ.get("PP_STOP_GRACE", DEFAULT_GRACE))
    except ValueError:
        raise errors.ConfigError(f"PP_STOP_GRACE={environ['PP_STOP_GRACE']!r} is not a number of seconds") from None
    if grace < 0:
        raise errors.ConfigError("PP_STOP_GRACE must not be negative")
    if not math.isfinite(grace):
        raise errors.ConfigError(f"PP_STOP_GRACE={environ['PP_STOP_GRACE']!r} is not a finite number of seconds")
    return grace


def _forwarded_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """PP_FORWARD_ENV's names: comma-separated, as documented; spaces separate them too ("FOO BAR" forwarded
    nothing before)."""
    forward = tuple(environ.get(FORWARD_ENV, "").replace(",", " ").split())
    bad = [n for n in forward if not (n.replace("_", "a").isalnum() and n.isascii() and not n[0].isdigit())]
    if bad:
        raise errors.ConfigError(f"{FORWARD_ENV}: {bad[0]!r} is not a variable name (give names, comma-separated)")
    return forward
