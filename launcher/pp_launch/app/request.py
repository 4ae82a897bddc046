"""What a launch is asked to do, and what it gives back: `LaunchRequest` (every option, checked when it is made),
`Hooks` (how a caller watches and steers it) and `Launched` (its plan and outcome). Apart from the launch itself
(app/launch.py, app/on_ray.py, app/attempts.py), so that each of those imports this alone and none the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.core import errors, hosts
from pp_launch.core.chain import fields
from pp_launch.core.chain.plan import ChainPlan, ChainRequest
from pp_launch.core.chain.scope import ChainOutcome, QuietReporter, Reporter
from pp_launch.core.container import ContainerOptions


@dataclass(frozen=True)
class GpuOptions:
    """--gpus and its companions: which GPUs, how many per stage, how the engine attaches them."""

    mode: str = "auto"
    per_stage: int = 1
    attach: str = "request"
    inventory_path: str | None = None
    allow_shared: bool = False
    min_free_mib: int | None = None
    host_inventories: tuple[tuple[str, str], ...] = ()  # --gpu-inventory HOST=FILE (chains across hosts)
    allow_unhealthy: bool = False  # also GPUs NVML says are unhealthy (never one that faulted in the run)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launch needs, checked when it is made: UsageError (exit 2) names the first rule broken."""

    chain: ChainRequest
    gpu: GpuOptions = field(default_factory=GpuOptions)
    hosts: tuple[str, ...] = ()  # --host: Docker contexts or engine URLs in ring order; () for DOCKER_HOST
    placement: str = "pack"
    stages_per_host: int | None = None
    detach: bool = False
    gpu_node: str | None = None  # run each stage as this child process (pp-gpu-node) instead
    owner: str | None = None  # the containers' owner label; None: this process
    run_id: str | None = None  # None: a new one
    keep_logs: bool = True  # each stage's output kept after the run (adapters/run_logs.py) for `pp-launch logs`
    log_dir: str | None = None  # where: None for this user's state directory
    ray: str | None = None  # --ray ADDRESS: the stages run on that Ray cluster (app/on_ray.py)
    ray_timeout: float = 60.0  # how long Ray may take to grant the run's GPUs before it is refused (exit 2)
    max_restarts: int = 0  # further attempts of the run after a stage fails (core/chain/restarts.py)
    restart_backoff: float = 1.0  # seconds before the first restart, doubling after each, capped at 30 s
    avoid_gpus: tuple[tuple[str, str], ...] = ()  # (UUID, why): GPUs this attempt must not use (a fault seen)
    kill_wait: float = 15.0  # after a stage's SIGKILL, how long the engine has to confirm it gone

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "hosts", hosts.parse_hosts(self.hosts))
            problem = next((p for p in _problems(self) if p), None)
        except errors.UsageError:
            raise
        except errors.ConfigError as exc:  # a value no option takes (--gpus foo, --host 'a b'): a usage error too
            raise errors.UsageError(str(exc)) from None
        if problem is not None:
            raise errors.UsageError(problem)


def _problems(r: LaunchRequest) -> list[str]:
    """Every rule between the options, one message each ("" when kept)."""
    stdin, gpu = r.chain.handoff == "stdin", r.gpu
    steps.check_request(r.chain)
    gpu_select.parse_gpus_flag(gpu.mode, gpu.per_stage)  # ConfigError for a --gpus it cannot read
    mode = gpu_select.parse_gpus_flag(gpu.mode, gpu.per_stage)[0]
    return [
        *_ray_problems(r, mode),
        "--handoff stdin needs --bring-up parallel: it starts every worker at once" if stdin and not r.chain.parallel
        else "",
        *_gpu_node_problems(r),
        "--stages-per-host needs --host or --ray (a chain across hosts)"
        if r.stages_per_host is not None and not (r.hosts or r.ray) else "",
        f"--placement {r.placement!r}: use one of {', '.join(hosts.PLACEMENTS)}" if r.placement not in hosts.PLACEMENTS
        else "",
        f"--gpu-attach {gpu.attach!r}: use one of {', '.join(gpu_select.ATTACH_MODES)}"
        if gpu.attach not in gpu_select.ATTACH_MODES else "",
        *_inventory_problems(r),
        *_restart_problems(r),
        *_field_problems(r),
        *_rendezvous_problems(r),
    ]  # fmt: skip


def _gpu_node_problems(r: LaunchRequest) -> list[str]:
    """What --gpu-node (stages as pp-gpu-node child processes) does not go with."""
    if not r.gpu_node:
        return []
    return [
        "--handoff stdin and --gpu-node do not go together: pp-gpu-node children take their peers from the "
        "environment" if r.chain.handoff == "stdin" else "",
        "--detach and --gpu-node do not go together: child processes end with the launcher" if r.detach else "",
        "docker run's options (--volume, --mount, --shm-size, ...) and --gpu-node do not go together: a pp-gpu-node "
        "child mounts its caches alone (PP_CACHE_DIR, PP_MODEL_CACHE_DIR)"
        if r.chain.container != ContainerOptions() else "",
        "--host and --gpu-node do not go together: child processes run on this machine" if r.hosts else "",
        "a command (chain ... -- COMMAND) and --gpu-node do not go together: each pp-gpu-node child runs its "
        "image's own (PP_ENTRYPOINT sets the entrypoint)" if r.chain.command is not None else "",
    ]  # fmt: skip


def _inventory_problems(r: LaunchRequest) -> list[str]:
    """--gpu-inventory HOST=FILE names one of the chain's hosts."""
    unknown = sorted({h for h, _ in r.gpu.host_inventories} - set(r.hosts))
    if not unknown:
        return []
    if r.hosts:
        return [f"--gpu-inventory {unknown[0]}=FILE: {unknown[0]} is not one of the hosts ({', '.join(r.hosts)})"]
    return [f"--gpu-inventory {unknown[0]}=FILE names a host, but this chain has no --host"]


def _rendezvous_problems(r: LaunchRequest) -> list[str]:
    """--rendezvous torch needs the master's address where a launch can tell it (one engine, --host engines, Ray)."""
    if not r.chain.rendezvous:
        return []
    return [
        "--rendezvous torch and --gpu-node do not go together: pp-gpu-node children set their own environment"
        if r.gpu_node else "",
    ]  # fmt: skip


def _field_problems(r: LaunchRequest) -> list[str]:
    """{first_peer} is filled once stage 0 announced: a worker started at once (--handoff stdin) cannot have it."""
    c = r.chain
    texts = [*(c.command or ()), *(v for _, v in c.env), *(v for _, _, v in c.stage_env)]
    late = c.handoff == "stdin" and c.parallel and fields.wants_first_peer(texts)
    return [
        "{first_peer} and --handoff stdin do not go together: the worker starts before stage 0 announced; use "
        "--handoff env (the default) or read PP_FIRST_PEER on stdin" if late else "",
    ]


def _restart_problems(r: LaunchRequest) -> list[str]:
    return [
        f"--max-restarts {r.max_restarts}: use 0 (no restart) or more" if r.max_restarts < 0 else "",
        f"--restart-backoff {r.restart_backoff:g}: use 0 seconds or more" if not r.restart_backoff >= 0 else "",
    ]


def _ray_problems(r: LaunchRequest, mode: str) -> list[str]:
    if r.ray is None:
        return []
    return [
        "--ray ADDRESS is empty: name the cluster (HOST:PORT, ray://HOST:PORT, or auto)" if not r.ray.strip() else "",
        "--ray and --host do not go together: the Ray cluster's nodes are the hosts" if r.hosts else "",
        "--ray and --gpu-node do not go together: stages run as containers on the cluster's nodes"
        if r.gpu_node
        else "",
        f"--gpus {r.gpu.mode} and --ray do not go together: Ray grants the GPUs; use --gpus auto (with "
        "--gpus-per-stage N) or none"
        if mode not in ("auto", "none")
        else "",
        "--gpu-inventory HOST=FILE and --ray do not go together: each node reads its own GPUs"
        if r.gpu.host_inventories
        else "",
        "--ray-timeout must be positive" if r.ray_timeout <= 0 else "",
    ]


class Stoppable(Protocol):
    """What a stop signal is routed to: an attempt's chain scope, or the backoff between two attempts."""

    def request_stop(self, signum: int, by: str = "") -> None: ...


@dataclass(frozen=True)
class Hooks:
    """How a caller watches and steers a launch; every hook is optional."""

    say: Callable[[str], None] = lambda text: None  # progress in words ("pp-launch: ..." on the CLI)
    reporter: Callable[[ChainPlan], Reporter] = lambda plan: QuietReporter()  # once the plan exists
    on_scope: Callable[[Stoppable], None] = lambda scope: None  # what a stop goes to from now on (signal routing)
    stop_pending: Callable[[], int | None] = lambda: None  # a stop signal that arrived while planning
    # one stage in the foreground (pp-gpu-node, the testing kit's StageContainer): its output, passed through
    passthrough: Callable[[str, bytes], None] | None = None


@dataclass(frozen=True)
class Launched:
    plan: ChainPlan
    note: str = ""  # said plainly to the user (e.g. why stages run on CPU)
    outcome: ChainOutcome | None = None  # None: a dry run (plan_launch)
    warning: str = ""  # what a dry run could not check
    restartable: bool = False  # a stage failed and nothing forbids another attempt (no down, no lost engine)
    faults: tuple[tuple[str, str], ...] = ()  # (GPU UUID, why): GPUs that faulted under the run's stages
