"""ChainPlan: everything about a chain that is known before any container starts. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pp_launch.core import labels, stage_env
from pp_launch.core.announce import StageAnnouncement
from pp_launch.core.chain import fields, handoff, rendezvous
from pp_launch.core.container import ContainerOptions, cache_mounts
from pp_launch.core.hosts import HOST_LEVEL

if TYPE_CHECKING:  # the allocator is loaded by what places GPUs, not by every import of a plan (chain --help)
    from pp_launch.core.gpu.allocator import PlacementCost

BUILTIN_IMAGE = "pp-launch/stub-worker:latest"
GUARD_IMAGE = "pp-launch/guard:latest"  # every run's guard and every engine's GPU lock (images/guard)


@dataclass(frozen=True)
class StageSpec:
    index: int
    name: str
    image: str
    env: Mapping[str, str]  # everything but the peer values, which come from earlier announcements
    labels: Mapping[str, str]
    gpus: tuple[str, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    network: str = "host"
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None  # None: the image's own
    options: ContainerOptions = field(default_factory=ContainerOptions)  # docker run's: mounts, --shm-size, ...
    host: str = ""  # the engine it runs on, as the user named it (--host); "" for the one engine

    def where(self) -> str:
        """How messages name the stage: its container, and its host when the chain spans several."""
        return f"{self.name} on host {self.host}" if self.host else self.name

    def with_first_peer(self, first: StageAnnouncement | None) -> StageSpec:
        """The stage with `{first_peer}` filled in its command and environment (empty on stage 0): what a stage
        created once stage 0 announced runs (core/chain/fields.py)."""
        values = fields.first_peer(first.direct if first is not None and self.index > 0 else None)
        env = {k: fields.fill(v, values) for k, v in self.env.items()}
        command = tuple(fields.fill(a, values) for a in self.command) if self.command is not None else None
        return replace(self, env=env, command=command)

    def first_peer_env(self, first: StageAnnouncement | None) -> dict[str, str]:
        """The variables whose values carry `{first_peer}`, filled: what the hand-off entry exports with the peers."""
        filled = self.with_first_peer(first).env
        return {k: filled[k] for k, v in self.env.items() if fields.FIRST_PEER in v}

    def launch_env(self, prev: StageAnnouncement | None, first: StageAnnouncement | None) -> dict[str, str]:
        env = dict(self.env)
        if self.index > 0:
            if prev is None or first is None:
                raise ValueError(f"stage {self.index} needs stage {self.index - 1}'s and stage 0's announcements")
            env.update(stage_env.peer_env(prev, first))
        return env


@dataclass(frozen=True)
class ChainPlan:
    run_id: str
    stages: tuple[StageSpec, ...]
    addr_timeout: float = 60.0
    grace: float = 5.0
    hop_levels: tuple[int | None, ...] = field(default=())  # topology level of each hop k -> k+1 and last -> 0
    cost: PlacementCost | None = None  # the allocator's cost of the GPU placement (None: none, or listed)
    handoff: str = "env"  # how later stages learn their peers (core/chain/handoff.py)
    parallel: bool = True  # bring-up: every container at once, or one after another
    hosts: tuple[str, ...] = ()  # the engines of a chain across hosts, in ring order; () for the one engine
    attempt: int = 1  # which attempt of its run (core/chain/restarts.py)
    rendezvous: str = ""  # "torch": the stages meet by torch's variables, no announcement (core/chain/rendezvous.py)

    def to_json(self) -> dict[str, Any]:
        """The dry-run document (docs/getting-started.md)."""
        from pp_launch.core.gpu.allocator import describe_level  # see the imports above

        stages = []
        for s in self.stages:
            env = dict(s.env)
            if s.index > 0 and self.handoff == "env":
                env.update(stage_env.peer_placeholders(s.index))
            stages.append(
                {
                    "stage": s.index,
                    "name": s.name,
                    "image": s.image,
                    "env": dict(sorted(env.items())),
                    "gpus": list(s.gpus),
                    "device_requests": [dict(r) for r in s.device_requests],
                    "labels": {**dict(s.options.labels), **dict(s.labels)},
                    "network": s.network,
                    "entrypoint": list(s.entrypoint) if s.entrypoint is not None else None,
                    "command": list(s.command) if s.command is not None else None,
                    "init": True,
                    "auto_remove": True,
                    **s.options.to_json(),
                    **({"host": s.host} if self.hosts else {}),
                }
            )
        doc: dict[str, Any] = {"run": self.run_id, "addr_timeout": self.addr_timeout, "grace": self.grace}
        doc["handoff"] = self.handoff
        if self.rendezvous:
            doc["rendezvous"] = self.rendezvous
        if self.hosts:
            doc["hosts"] = list(self.hosts)
        doc["stages"] = stages
        if self.hop_levels:
            doc["hops"] = [
                {
                    "from": k,
                    "to": (k + 1) % len(self.stages),
                    "topology_level": "host" if lvl is not None and lvl >= HOST_LEVEL else lvl,
                    "link": describe_level(lvl),
                }
                for k, lvl in enumerate(self.hop_levels)
            ]
        if self.cost is not None:
            doc["placement_cost"] = {
                "within_stages": self.cost.within,
                "ring_hops": self.cost.hops,
                "search": "exact" if self.cost.exact else "greedy",
                "candidates": self.cost.candidates,
            }
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


@dataclass(frozen=True)
class ChainRequest:
    """What the user asked for, after parsing; `build_plan` turns it into a ChainPlan."""

    stages: int = 2
    image: str = BUILTIN_IMAGE
    network: str = "host"
    name_prefix: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    stage_env: tuple[tuple[int, str, str], ...] = ()
    addr_timeout: float = 60.0
    grace: float = 5.0
    lifeline: bool = True
    entrypoint: tuple[str, ...] | None = None  # None: the image's own
    command: tuple[str, ...] | None = None  # None: the image's own (CMD); fields as core/chain/fields.py says
    rendezvous: str = ""  # "torch": RANK, WORLD_SIZE, MASTER_ADDR... set, no announcement (core/chain/rendezvous.py)
    handoff: str = "env"  # env | stdin (core/chain/handoff.py)
    parallel: bool = True  # every container at once; False: one after another (images without /bin/sh)
    attempt: int = 1  # which attempt of the run this plan is (core/chain/restarts.py)
    container: ContainerOptions = field(default_factory=ContainerOptions)  # docker run's options, every stage
    # PP_CACHE_DIR and PP_MODEL_CACHE_DIR, mounted as pp-gpu-node mounts them: "all" (the default cache too:
    # pp-gpu-node, `chain --swactor-caches`), "asked" (only the caches the environment names, their folders made
    # first: a chain's default), "named" (the same, folders left to the engine: a Compose file, written for wherever
    # it runs), "none"
    caches: str = "all"


def build_plan(
    request: ChainRequest,
    environ: Mapping[str, str],
    owner: str,
    stage_gpus: list[tuple[str, ...]],
    device_requests: list[tuple[Mapping[str, Any], ...]],
    run_id: str,
    hop_levels: tuple[int | None, ...] = (),
    cost: PlacementCost | None = None,
    stage_hosts: tuple[str, ...] = (),
    launcher: str = "",
    remote_hosts: frozenset[str] = frozenset(),
) -> ChainPlan:
    """stage_hosts: each stage's host (a chain across hosts), () or all "" for the one engine. launcher: for a
    detached run (owner `detached`), the launcher that owns it until the hand-over (labels.LAUNCHER). remote_hosts: the
    hosts whose engine is not on the machine that creates the stage's container: pp-launch cannot create cache
    folders there (core/container.py, cache_mounts)."""
    base = _base_env(request, environ)
    stage_hosts = stage_hosts if any(stage_hosts) else ()
    every_host = tuple(dict.fromkeys(stage_hosts))
    specs = []
    for k in range(request.stages):
        gpus, host = stage_gpus[k], stage_hosts[k] if stage_hosts else ""
        options, env = request.container.for_stage(k), _stage_env(request, base, k, gpus, stage_hosts)
        command = _stage_command(request, k, env)
        if request.caches != "none":
            home = environ.get("HOME", "/")  # absolute paths: app/launch.py, launch_environ
            creatable = host not in remote_hosts and request.caches in ("all", "asked")
            caches, inside = cache_mounts(environ, k, home, creatable=creatable, default=request.caches == "all")
            options = options.with_mounts(*caches)
            env.update(inside)
        specs.append(
            StageSpec(
                index=k,
                name=f"{request.name_prefix or f'pp-{run_id}'}-{k}",
                image=request.image,
                env=env,
                labels=labels.stage_labels(run_id, k, owner, gpus, host, every_host, launcher, request.attempt),
                gpus=gpus,
                device_requests=device_requests[k],
                network=request.network,
                entrypoint=request.entrypoint,
                command=command,
                options=options,
                host=host,
            )
        )
    return ChainPlan(
        run_id=run_id,
        stages=tuple(specs),
        addr_timeout=request.addr_timeout,
        grace=request.grace,
        hop_levels=hop_levels,
        cost=cost,
        handoff=request.handoff,
        parallel=request.parallel,
        hosts=every_host,
        attempt=request.attempt,
        rendezvous=request.rendezvous,
    )


def _stage_command(request: ChainRequest, k: int, env: dict[str, str]) -> tuple[str, ...] | None:
    """Stage k's command with the fields known when planned filled (core/chain/fields.py), its --env values too;
    what the hand-off entry fills later is named in `env`."""
    known = fields.planned(k, request.stages)
    if k == 0 or request.rendezvous:  # stage 0 is the first peer; a rendezvous run's first peer is its master
        known.update(fields.first_peer(rendezvous.master(env) if request.rendezvous else None))
    for name in {n for n, _ in request.env} | {n for s, n, _ in request.stage_env if s == k}:
        env[name] = fields.fill(env[name], known)
    command = tuple(fields.fill(a, known) for a in request.command) if request.command is not None else None
    if request.handoff == "env" and request.parallel and fields.FIRST_PEER not in known:
        _hand_off_fields(env, command)
    return command


def _hand_off_fields(env: dict[str, str], command: tuple[str, ...] | None) -> None:
    """What the hand-off entry fills once stage 0 announced (core/chain/handoff.py): the variables whose values carry
    `{first_peer}` (their names in PP_HANDOFF_FILLS), and the command's arguments (PP_HANDOFF_ARGS=1)."""
    names = sorted(k for k, v in env.items() if fields.FIRST_PEER in v)
    if names:
        env[handoff.FILLS_ENV] = " ".join(names)
    if command is not None and fields.wants_first_peer(command):
        env[handoff.ARGS_ENV] = "1"


def _base_env(request: ChainRequest, environ: Mapping[str, str]) -> dict[str, str]:
    """What every stage's environment starts from: the forwarded variables, --env, the lifeline and hand-off modes."""
    base = stage_env.forwarded(environ)
    base.update(request.env)
    if request.lifeline:
        base[stage_env.LIFELINE] = "stdin"
    if request.handoff == "stdin":
        base[handoff.MODE_ENV] = "stdin"
    return base


def _stage_env(
    request: ChainRequest, base: Mapping[str, str], k: int, gpus: tuple[str, ...], stage_hosts: tuple[str, ...] = ()
) -> dict[str, str]:
    """Stage k's environment: the base, its --stage-env, and what the launcher alone sets (docs/formats.md); with
    --rendezvous torch, torchrun's variables (core/chain/rendezvous.py)."""
    env = dict(base)
    if request.rendezvous == "torch":
        env.update(rendezvous.torch_env(k, request.stages, stage_hosts, dict(request.env)))
    env.update({name: value for (stage, name, value) in request.stage_env if stage == k})
    env[stage_env.STAGE] = str(k)
    env[stage_env.NUM_STAGES] = str(request.stages)
    env[stage_env.ATTEMPT] = str(request.attempt)
    env[stage_env.NVIDIA_VISIBLE_DEVICES] = ",".join(gpus) if gpus else stage_env.NO_GPU
    return env
