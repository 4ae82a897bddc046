"""What several commands share: error mapping, option bundles, parameter types, NAME=VALUE parsing."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from pp_launch.core import hosts
from pp_launch.core import stage_env as stage_env_names
from pp_launch.core.chain.plan import BUILTIN_IMAGE
from pp_launch.core.gpu.requests import ATTACH_MODES, INVENTORY_ENV
from pp_launch.core.stage_env import parse_assignment

F = TypeVar("F", bound=Callable[..., Any])


def stage_options(f: F) -> F:
    """What a chain is made of, shared by chain and compose: how many stages, which image, what environment.
    The command receives `env` and `stage_env` parsed."""
    decorators = [
        click.option(
            "--stages",
            type=click.IntRange(min=1, max=64),
            default=2,
            show_default=True,
            help="Number of stages (containers).",
        ),
        click.option(
            "--image",
            default=BUILTIN_IMAGE,
            show_default=True,
            help="Stage image; must be present locally (pp-launch never pulls). The built-in one is built on "
            "first use.",
        ),
        click.option(
            "-e",
            "--env",
            "env",
            multiple=True,
            metavar="NAME[=VALUE]",
            help="Set a variable in every stage; a bare NAME passes this shell's value through (as docker run -e).",
        ),
        click.option(
            "--env-file",
            "env_files",
            multiple=True,
            metavar="FILE",
            help="Read variables for every stage from FILE, as docker run --env-file: NAME=VALUE lines (the value as "
            "it is), a bare NAME passes this shell's value, # comments; --env wins over it.",
        ),
        click.option("--stage-env", multiple=True, metavar="K:NAME=VALUE", help="Set a variable in stage K only."),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from_files = tuple(a for path in kwargs.pop("env_files") for a in read_env_file(path, "--env-file"))
        kwargs["env"] = from_files + parse_env(kwargs["env"])
        kwargs["stage_env"] = parse_stage_env(kwargs["stage_env"], kwargs["stages"])
        return f(*args, **kwargs)

    command: Any = wrapper
    for d in reversed(decorators):
        command = d(command)
    return command  # type: ignore[no-any-return]


def gpu_options(f: F) -> F:
    """The GPU selection flags shared by chain and compose."""
    decorators = [
        click.option(
            "--gpus",
            "gpus",
            default="auto",
            show_default=True,
            metavar="auto|none|all|N|device=LIST",
            help="GPUs for the stages, read as docker run --gpus reads them: auto (NVML picks free ones, "
            "--gpus-per-stage each), none (CPU stages), all (every GPU to every stage), N (a count: N free GPUs "
            "for each stage), or device=LIST of indices/UUIDs used in stage order (a bare list with a comma, "
            "3, or 0,3, works too).",
        ),
        click.option(
            "--gpus-per-stage",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="GPUs each stage gets with --gpus auto or a list.",
        ),
        click.option(
            "--gpu-inventory",
            multiple=True,
            metavar="[HOST=]FILE",
            envvar=INVENTORY_ENV,
            help="Read the GPU inventory from this file (the format of 'pp-launch gpus --record'; "
            "docs/formats.md) instead of NVML; example:NAME is one the package carries (example:nvlink-8gpu). "
            "HOST=FILE: for that --host only (repeatable), instead of its probe.",
        ),
        click.option(
            "--gpu-attach",
            type=click.Choice(ATTACH_MODES),
            default="request",
            show_default=True,
            help="request: engine device requests; cdi: CDI device names; env: only "
            "NVIDIA_VISIBLE_DEVICES (NVIDIA default runtime, or CPU-only test hosts).",
        ),
        click.option("--allow-shared", is_flag=True, help="Also use GPUs that other processes or runs are using."),
        click.option(
            "--allow-unhealthy",
            is_flag=True,
            help="Also use GPUs NVML says are unhealthy (uncorrected ECC errors, retired pages pending, a row "
            "remapping failure; 'pp-launch gpus' shows why). A GPU that faulted during the run is never used again.",
        ),
        click.option(
            "--min-free-mem",
            type=click.IntRange(min=0),
            metavar="MIB",
            help="Only GPUs with at least this much free memory (MiB).",
        ),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pp_launch.app import launch  # when a command runs: its --help needs no engine client

        plain, per_host = split_inventories(kwargs.pop("gpu_inventory"))
        kwargs["gpu"] = launch.GpuOptions(
            kwargs.pop("gpus"),
            kwargs.pop("gpus_per_stage"),
            kwargs.pop("gpu_attach"),
            plain,
            kwargs.pop("allow_shared"),
            kwargs.pop("min_free_mem"),
            per_host,
            kwargs.pop("allow_unhealthy"),
        )
        return f(*args, **kwargs)

    command: Any = wrapper
    for d in reversed(decorators):
        command = d(command)
    return command  # type: ignore[no-any-return]


def split_inventories(values: tuple[str, ...]) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """--gpu-inventory values: FILE (the last one counts) and HOST=FILE (HOST a context name, without '/', or an
    engine URL; an existing file of that exact name is a file)."""
    plain: str | None = None
    per_host: list[tuple[str, str]] = []
    for value in values:
        host, sep, path = value.partition("=")
        if sep and host and ("://" in host or "/" not in host) and path and not os.path.exists(value):
            per_host.append((host, path))
        else:
            plain = value
    return plain, tuple(per_host)


def host_option(help: str) -> Callable[[Any], Any]:
    """--host, repeatable (or a comma list, or PP_LAUNCH_HOSTS): Docker contexts or engine URLs; `help` says what
    the command does with them."""
    return click.option(
        "--host",
        "host_names",
        multiple=True,
        metavar="CONTEXT|URL",
        envvar=hosts.HOSTS_ENV,
        help=f"{help}: a Docker context ('docker context ls') or an engine URL (unix://, tcp://, "
        "ssh://USER@HOST:PORT). Repeat it or give a comma list (also PP_LAUNCH_HOSTS). Default: the one engine of "
        "DOCKER_HOST (or DOCKER_CONTEXT).",
    )


host_options = host_option("Run on these Docker engines, in ring order")


class Seconds(click.ParamType):  # type: ignore[type-arg]  # generic only in newer Click stubs
    """A finite, non-negative number of seconds (Click's FloatRange lets nan and inf through)."""

    name = "seconds"

    def __init__(self, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number < 0 or (self.positive and number == 0):
            self.fail(f"{value!r} is not a finite {'positive' if self.positive else 'non-negative'} number", param, ctx)
        return number


def swactor_options(f: F) -> F:
    """What a real swactor stage image needs, shared by chain and compose: its entrypoint and the seed to join."""
    decorators = [
        click.option(
            "--entrypoint",
            metavar="PATH",
            help="Run PATH as each stage's entrypoint instead of the image's own (swactor's images: "
            "/usr/local/bin/pp-worker; their default entrypoint holds the container for interactive use).",
        ),
        click.option(
            "--seed-addr",
            envvar=stage_env_names.SEED_ADDR,
            metavar="HEX64",
            help="The seed node's id (64 hex digits) that every stage joins; also from SEED_ADDR. swactor's "
            "pp-worker exits 2 without it.",
        ),
        click.option(
            "--seed-direct",
            envvar=stage_env_names.SEED_DIRECT,
            metavar="ADDRS",
            help="Swactor's direct addresses, host:port[,host:port...]; also from SEED_DIRECT.",
        ),
        click.option(
            "--seed-relay",
            envvar=stage_env_names.SEED_RELAY,
            metavar="URL",
            help="Swactor's iroh relay URL (WAN); also from SEED_RELAY.",
        ),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            seed = stage_env_names.seed_env(
                kwargs.pop("seed_addr"), kwargs.pop("seed_direct"), kwargs.pop("seed_relay")
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--seed-addr/--seed-direct/--seed-relay") from None
        kwargs["seed"] = tuple(seed.items())
        entrypoint = kwargs.pop("entrypoint")
        if entrypoint is not None and not entrypoint.strip():
            raise click.BadParameter("must name a program", param_hint="--entrypoint")
        kwargs["entrypoint"] = entrypoint
        return f(*args, **kwargs)

    command: Any = wrapper
    for d in reversed(decorators):
        command = d(command)
    return command  # type: ignore[no-any-return]


ENV_FILE_LIMIT = 1 << 20  # an env file is a handful of lines: more is a mistake (or /dev/zero)


def read_env_file(path: str, hint: str, environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """An env file's assignments (core/stage_env.py, parse_env_file); BadParameter naming the file (and line)."""
    environ = os.environ if environ is None else environ
    try:
        with open(path, "rb") as f:
            data = f.read(ENV_FILE_LIMIT + 1)
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint=hint) from None
    if len(data) > ENV_FILE_LIMIT:
        raise click.BadParameter(f"{path}: larger than {ENV_FILE_LIMIT >> 20} MiB: not an env file", param_hint=hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise click.BadParameter(f"{path}, line {line}: not UTF-8 text", param_hint=hint) from None
    try:
        return stage_env_names.parse_env_file(text, path, environ)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def parse_env(values: tuple[str, ...], environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """NAME=VALUE, or a bare NAME: the caller's own value passes through, as `docker run -e NAME` does (a NAME
    the caller has not set is left out, as docker leaves it)."""
    environ = os.environ if environ is None else environ
    out = []
    for v in values:
        if "=" not in v and v and (v[0].isalpha() or v[0] == "_") and v.replace("_", "a").isalnum():
            if v in environ:
                v = f"{v}={environ[v]}"
            else:
                continue
        try:
            out.append(parse_assignment(v))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--env") from None
    return tuple(out)


def parse_stage_env(values: tuple[str, ...], stages: int) -> tuple[tuple[int, str, str], ...]:
    out = []
    for v in values:
        k, sep, assignment = v.partition(":")
        if not sep or not k.isdigit():
            raise click.BadParameter(f"{v!r} is not K:NAME=VALUE", param_hint="--stage-env")
        if int(k) >= stages:
            raise click.BadParameter(f"{v!r}: stage {k} does not exist (--stages {stages})", param_hint="--stage-env")
        try:
            name, value = parse_assignment(assignment)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--stage-env") from None
        out.append((int(k), name, value))
    return tuple(out)


def restart_options(f: F) -> F:
    """--max-restarts and --restart-backoff, handed on as one `restarts` mapping (LaunchRequest's fields)."""
    decorators = [
        click.option(
            "--max-restarts",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            metavar="N",
            help="When a stage fails (a non-zero exit, lost, no announcement in time, a GPU fault), tear the whole "
            "chain down and bring it up again as the next attempt of the same run, up to N times; a GPU that faulted "
            "is not used again. A stop signal, 'pp-launch down' or a configuration error never restarts. The exit "
            "code is the last attempt's. A foreground feature: a --detach run restarts only while it comes up; once "
            "it is up, a stage that fails ends the whole run (its guard tears it down) and nothing restarts it.",
        ),
        click.option(
            "--restart-backoff",
            type=Seconds(),
            default=1.0,
            show_default=True,
            metavar="S",
            help="Seconds between a failed attempt and the next, doubling after each (at most 30 s).",
        ),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["restarts"] = {
            "max_restarts": kwargs.pop("max_restarts"),
            "restart_backoff": kwargs.pop("restart_backoff"),
        }
        return f(*args, **kwargs)

    for decorator in reversed(decorators):
        wrapper = decorator(wrapper)
    return wrapper  # type: ignore[return-value]


class DockerValue(click.ParamType):  # type: ignore[type-arg]
    """A value of one of docker run's options, read by core/container.py's parser: a chain file's value is checked
    by the same parser as the flag's."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name, self.parse = name, parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            value = str(value)
        from pp_launch.core import container

        try:
            self.parse(value)
        except container.OptionError as exc:
            hint = ""
            misread = value.strip("v") == "" or value.startswith("-")  # `-vv`, or `-v --stages 2`: -v took a flag
            if self.name == "volume" and misread and ctx is not None and ctx.info_name == "chain":
                hint = (
                    f". -v after 'chain' is docker run's --volume (it took {value!r} as its value): to say more, "
                    "use --verbose, or 'pp-launch -v chain ...'"
                )
            self.fail(f"{exc}{hint}", param, ctx)
        return value


def container_options(f: F) -> F:
    """docker run's options for a stage's container, docker's syntax and meaning (core/container.py), shared by chain
    and compose: the command receives `container` (a ContainerOptions), its mounts in the order given. `--rm`,
    `--init` and docker run's other flags that pp-launch sets itself are refused, saying what to use."""
    from pp_launch.core import container as c

    decorators = [
        click.option(
            "-v",
            "--volume",
            "volumes",
            multiple=True,
            type=DockerValue("volume", c.parse_volume),
            metavar="SRC:DST[:ro|rw]",
            help="Mount SRC (an absolute host path, or a volume's name) at DST in every stage, as docker run -v; "
            "{stage} in the host path is the stage's index (-v /models/llama/stage-{stage}:/weights:ro). A missing "
            "host path is refused (docker would create it empty, owned by root). DST alone: an anonymous volume.",
        ),
        click.option(
            "--stage-volume",
            "stage_volumes",
            multiple=True,
            metavar="K:SRC:DST[:ro]",
            help="Mount SRC at DST in stage K only.",
        ),
        click.option(
            "--mount",
            "mounts",
            multiple=True,
            type=DockerValue("mount", c.parse_mount),
            metavar="type=bind|volume|tmpfs,...",
            help="A mount in every stage, as docker run --mount: type, source (src), target (dst), readonly, "
            "bind-propagation, volume-nocopy, tmpfs-size, tmpfs-mode; {stage} in a bind's source is the stage's index.",
        ),
        click.option(
            "--shm-size",
            type=DockerValue("size", c.parse_size),
            metavar="SIZE",
            help="Size of each stage's /dev/shm, as docker run (64m, 16g); NCCL and PyTorch want several GB (or "
            "--ipc host).",
        ),
        click.option(
            "--ipc",
            type=DockerValue("ipc", c.parse_ipc),
            metavar="MODE",
            help="IPC namespace, as docker run: host (the host's /dev/shm), private, shareable, none, container:NAME.",
        ),
        click.option(
            "--ulimit",
            "ulimits",
            multiple=True,
            type=DockerValue("ulimit", c.parse_ulimit),
            metavar="NAME=SOFT[:HARD]",
            help="A resource limit, as docker run (--ulimit memlock=-1 for RDMA, --ulimit nofile=65536).",
        ),
        click.option(
            "--device",
            "devices",
            multiple=True,
            type=DockerValue("device", c.parse_device),
            metavar="HOST[:CONTAINER[:PERMS]]",
            help="A host device in every stage, as docker run (--device /dev/infiniband/uverbs0).",
        ),
        click.option(
            "--cap-add",
            "cap_add",
            multiple=True,
            type=DockerValue("capability", c.parse_cap),
            metavar="CAP",
            help="A Linux capability for every stage, as docker run (IPC_LOCK, SYS_PTRACE).",
        ),
        click.option(
            "-u",
            "--user",
            type=DockerValue("user", c.parse_user),
            metavar="UID[:GID]",
            help="Run each stage's process as this user, as docker run.",
        ),
        click.option(
            "-w",
            "--workdir",
            type=DockerValue("path", c.parse_workdir),
            metavar="DIR",
            help="Working directory inside each stage, as docker run.",
        ),
        click.option(
            "-l",
            "--label",
            "user_labels",
            multiple=True,
            type=DockerValue("label", c.parse_label),
            metavar="KEY=VALUE",
            help="A label on every stage's container, as docker run (pp-launch.* are pp-launch's own).",
        ),
        click.option(
            "--health-cmd",
            metavar="CMD",
            help="A health check in every stage, as docker run (run by /bin/sh in the stage; exit 0: healthy). A stage "
            "that turns unhealthy fails the chain as one that exited (restarted under --max-restarts), said with the "
            "check's last output. The image's own HEALTHCHECK counts too, unless --no-healthcheck.",
        ),
        click.option("--health-interval", metavar="DURATION", help="Time between two checks (30s, 1m; docker's 30s)."),
        click.option("--health-timeout", metavar="DURATION", help="Time a check may take (docker's 30s)."),
        click.option("--health-retries", metavar="N", help="Checks failed in a row that make a stage unhealthy (3)."),
        click.option(
            "--health-start-period", metavar="DURATION", help="Time a stage has to start before failures count (0s)."
        ),
        click.option("--no-healthcheck", is_flag=True, default=None, help="No health check, the image's own neither."),
        *[
            click.option(*flags, is_flag=True, hidden=True, expose_value=False, callback=_ours)
            for flags in (("--rm",), ("--init",), ("-i", "--interactive"), ("-t", "--tty"))
        ],
        click.option("--restart", hidden=True, expose_value=False, callback=_ours, metavar="POLICY"),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(key) for key, name in CONTAINER_KEYS.items()}
        try:
            kwargs["container"] = c.ContainerOptions.parse(kwargs.get("stages") or 1, **given)
        except c.OptionError as exc:
            raise click.UsageError(str(exc)) from None
        return f(*args, **kwargs)

    command: Any = wrapper
    for d in reversed(decorators):
        command = d(command)
    return command  # type: ignore[no-any-return]


# container_options' parameters, as ContainerOptions.parse names them
CONTAINER_KEYS = {
    "volumes": "volumes",
    "stage_volumes": "stage_volumes",
    "mounts": "mounts",
    "shm_size": "shm_size",
    "ipc": "ipc",
    "ulimits": "ulimits",
    "devices": "devices",
    "cap_add": "cap_add",
    "user": "user",
    "workdir": "workdir",
    "user_labels": "labels",
    "health_cmd": "health_cmd",
    "health_interval": "health_interval",
    "health_timeout": "health_timeout",
    "health_retries": "health_retries",
    "health_start_period": "health_start_period",
    "no_healthcheck": "no_healthcheck",
}


def _ours(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """docker run's flags that pp-launch sets itself: refused, saying what to use instead."""
    if value is not None and value is not False:
        from pp_launch.core import container

        flag = max(param.opts, key=len)
        raise click.UsageError(f"{flag}: {container.ours(flag)}")
