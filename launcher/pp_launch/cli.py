"""The command line: parse, build a spec, call the library, map errors to exit codes (contract §5).

Signal handlers are installed here and nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from . import __version__, errors, images, labels, launch, signals, sweep
from . import stage_env as stage_env_names
from .chain.plan import BUILTIN_IMAGE, ChainRequest
from .chain.ports import QueueInbox, StopRequested
from .docker_engine import connect
from .gpu import select as gpu_select
from .report import JsonReporter, LiveReporter, PlainReporter
from .stage_env import parse_assignment

F = TypeVar("F", bound=Callable[..., Any])


def fail(exc: errors.PpLaunchError) -> None:
    click.echo(f"pp-launch: error: {exc}", err=True)
    sys.exit(exc.exit_code)


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Our own errors become one plain message and their exit code; no traceback."""
    try:
        yield
    except errors.PpLaunchError as exc:
        fail(exc)


def gpu_options(f: F) -> F:
    """The GPU selection flags shared by chain and compose."""
    decorators = [
        click.option(
            "--gpus",
            "gpus",
            default="auto",
            show_default=True,
            metavar="auto|none|all|LIST",
            help="GPUs for the stages: auto (NVML picks free ones), none (CPU stages), all (every GPU "
            "to every stage) or a comma-separated list of indices/UUIDs used in stage order.",
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
            type=click.Path(dir_okay=False),
            envvar=gpu_select.INVENTORY_ENV,
            help="Read the GPU inventory from this file (contract §7) instead of NVML.",
        ),
        click.option(
            "--gpu-attach",
            type=click.Choice(gpu_select.ATTACH_MODES),
            default="request",
            show_default=True,
            help="request: engine device requests; cdi: CDI device names; env: only "
            "NVIDIA_VISIBLE_DEVICES (NVIDIA default runtime, or CPU-only test hosts).",
        ),
        click.option("--allow-shared", is_flag=True, help="Also use GPUs that other processes or runs are using."),
        click.option(
            "--min-free-mem",
            type=click.IntRange(min=0),
            metavar="MIB",
            help="Only GPUs with at least this much free memory (MiB).",
        ),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["gpu"] = launch.GpuOptions(
            kwargs.pop("gpus"),
            kwargs.pop("gpus_per_stage"),
            kwargs.pop("gpu_attach"),
            kwargs.pop("gpu_inventory"),
            kwargs.pop("allow_shared"),
            kwargs.pop("min_free_mem"),
        )
        return f(*args, **kwargs)

    command: Any = wrapper
    for d in reversed(decorators):
        command = d(command)
    return command  # type: ignore[no-any-return]


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
            help="The seed's direct addresses, host:port[,host:port...]; also from SEED_DIRECT.",
        ),
        click.option(
            "--seed-relay",
            envvar=stage_env_names.SEED_RELAY,
            metavar="URL",
            help="The seed's iroh relay URL (WAN); also from SEED_RELAY.",
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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="pp-launch")
@click.option("-v", "--verbose", count=True, help="Say more (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final result; no stage lines.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Launch pipeline-parallel inference stages as GPU containers, and never leave one behind.

    \b
    Examples:
      pp-launch chain                      # the 2-stage demo on the built-in image
      pp-launch chain --stages 4 --json    # 4 stages, events as JSON lines
      pp-launch gpus                       # what NVML sees, and who holds what
    """
    ctx.obj = {"verbosity": -1 if quiet else verbose}
    if ctx.invoked_subcommand not in ("chain", "node"):
        signals.release()  # nothing of theirs needs a teardown: Ctrl-C interrupts them as usual


def _parse_env(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values:
        try:
            out.append(parse_assignment(v))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--env") from None
    return tuple(out)


def _parse_stage_env(values: tuple[str, ...], stages: int) -> tuple[tuple[int, str, str], ...]:
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


@main.command()
@click.option(
    "--stages",
    type=click.IntRange(min=1, max=64),
    default=2,
    show_default=True,
    help="Number of stages (containers).",
)
@click.option(
    "--image",
    default=BUILTIN_IMAGE,
    show_default=True,
    help="Stage image; must be present locally (pp-launch never pulls). The built-in one is built on first use.",
)
@gpu_options
@swactor_options
@click.option("--network", default="host", show_default=True, help="Network mode of every stage container.")
@click.option("--name", "name_prefix", metavar="PREFIX", help="Containers are named PREFIX-K [default: pp-RUNID].")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Set a variable in every stage.")
@click.option("--stage-env", multiple=True, metavar="K:NAME=VALUE", help="Set a variable in stage K only.")
@click.option(
    "--addr-timeout",
    type=Seconds(positive=True),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Seconds each stage has to announce its address.",
)
@click.option(
    "--grace",
    type=Seconds(),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Each stage's budget between SIGTERM and SIGKILL at teardown (all stages at once).",
)
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines on stdout; stage lines on stderr.")
@click.option("--dry-run", is_flag=True, help="Print the plan (GPUs, env, labels) and start nothing.")
@click.option(
    "--detach",
    is_flag=True,
    help="Bring the chain up, print its run id (alone, on stdout), exit 0; then only 'pp-launch down' ends it. "
    "Until every stage has announced, the run ends with this launcher, as a foreground chain does.",
)
@click.option(
    "--gpu-node",
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="Run each stage as the child process PATH (pp-gpu-node, or wrappers/docker-gpu-node.sh) instead of "
    "creating its container directly.",
)
@click.pass_context
def chain(
    ctx: click.Context,
    stages: int,
    image: str,
    gpu: launch.GpuOptions,
    seed: tuple[tuple[str, str], ...],
    entrypoint: str | None,
    network: str,
    name_prefix: str | None,
    env: tuple[str, ...],
    stage_env: tuple[str, ...],
    addr_timeout: float,
    grace: float,
    as_json: bool,
    dry_run: bool,
    detach: bool,
    gpu_node: str | None,
) -> None:
    """Start STAGES stages one after another and supervise them until they end.

    Each stage is a container with tini as init and daemon-side auto-remove. Stage k >= 1 receives stage
    k-1's announcement (PEER_*) and stage 0's (FIRST_PEER_*). Exit: 0 when every stage exits 0, 1 when one
    fails, 2 on bad configuration, 128+N after signal N. Nothing is left behind either way.

    \b
    Examples:
      pp-launch chain --stages 4
      pp-launch chain --stages 8 --gpus auto --gpus-per-stage 1 --json
      pp-launch chain --stages 2 --dry-run --json --gpu-inventory inventory.json
    """
    verbosity = ctx.obj["verbosity"]
    request = ChainRequest(
        stages=stages,
        image=image,
        network=network,
        name_prefix=name_prefix,
        env=seed + _parse_env(env),
        stage_env=_parse_stage_env(stage_env, stages),
        addr_timeout=addr_timeout,
        grace=grace,
        lifeline=True,  # a detached run is its launcher's until it is up (bringup.py)
        entrypoint=(entrypoint,) if entrypoint else None,
    )
    if detach and gpu_node:
        raise click.UsageError("--detach and --gpu-node do not go together: child processes end with the launcher")
    with mapped_errors():
        if dry_run:
            _dry_run(request, gpu, as_json)
            return
        launch.check_image_name(image)
        engine = connect()
        say = (lambda t: click.echo(f"pp-launch: {t}", err=True)) if verbosity >= 0 or as_json else (lambda t: None)
        launch.ensure_image(engine, image, say)
        launch.sweep_dead_owners(engine, say)
        owner = labels.OWNER_DETACHED if detach else None
        plan, note = launch.plan_chain(request, gpu, engine, owner=owner)
    if note:
        click.echo(f"pp-launch: {note}", err=True)
    if as_json:
        reporter: Any = JsonReporter(plan.run_id)
    elif detach:  # stdout is the run id alone: RUN=$(pp-launch chain --detach)
        reporter = PlainReporter(plan.run_id, verbosity, out=sys.stderr)
    elif sys.stdout.isatty() and verbosity >= 0:
        reporter = LiveReporter(plan.run_id, stages, verbosity)
    else:
        reporter = PlainReporter(plan.run_id, verbosity)
    if detach:
        click.echo(
            f"pp-launch: run {plan.run_id}: bringing up {stages} stages; until every stage has announced it ends "
            "with this launcher, then only 'pp-launch down' ends it",
            err=True,
        )
    signals.install()  # already done by the console entry; here for programs that call main() directly
    if (held := signals.pending()) is not None:  # stopped while planning: nothing was started
        gpu_select.Reservations(gpu_select.state_dir()).release(plan.run_id)
        sys.exit(errors.exit_code_for_signal(held))
    try:
        with mapped_errors():
            outcome = launch.run_chain(
                plan,
                engine,
                reporter,
                lambda scope: signals.route_to(scope.request_stop),
                detach=detach,
                gpu_node=gpu_node,
            )
    finally:
        reporter.close()
    if outcome.reason == "detached":
        if not as_json:  # --json: stdout carries events only, and every event names the run
            click.echo(plan.run_id)
        click.echo(f"pp-launch: {outcome.message}; stop it with 'pp-launch down {plan.run_id}'", err=True)
    elif outcome.exit_code != 0:
        click.echo(f"pp-launch: {'error: ' if outcome.reason != 'signal' else ''}{outcome.message}", err=True)
    sys.exit(outcome.exit_code)


def _dry_run(request: ChainRequest, gpu: launch.GpuOptions, as_json: bool) -> None:
    try:
        engine = connect(timeout=5)
    except errors.EngineUnavailable:
        engine = None
    plan, note = launch.plan_chain(request, gpu, engine, reserve=False)
    doc = plan.to_json()
    if note:
        doc["note"] = note
    if engine is None:
        doc["warning"] = "no Docker engine answered: GPUs held by running containers were not checked"
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"run {plan.run_id}: {len(plan.stages)} stages (nothing started: dry run)")
    for s in plan.stages:
        click.echo(f"  stage {s.index}: {s.name}  image {s.image}  GPUs {','.join(s.gpus) or 'none'}")
        for k, v in sorted(doc["stages"][s.index]["env"].items()):
            click.echo(f"      {k}={v}")
    for hop in doc.get("hops", []):
        click.echo(f"  hop {hop['from']} -> {hop['to']}: topology level {hop['topology_level']}")
    for extra in ("note", "warning"):
        if extra in doc:
            click.echo(f"  {extra}: {doc[extra]}")


@main.group("images")
def images_group() -> None:
    """Build the images pp-launch needs, with no registry."""


@images_group.command("build")
@click.option(
    "--base",
    metavar="IMAGE",
    help="Build the stage image on this local image (needs python3 and numpy) instead of importing a "
    "Debian root filesystem made with debootstrap.",
)
@click.pass_context
def images_build(ctx: click.Context, base: str | None) -> None:
    """Build the base image (debootstrap + docker import) and pp-launch/stub-worker:latest on it.

    Each image records a hash of its inputs; a second call with unchanged inputs rebuilds nothing.

    \b
    Example:
      pp-launch images build
    """
    quiet = ctx.obj["verbosity"] < 0
    with mapped_errors():
        engine = connect()
        results = images.build_all(engine, (lambda t: None) if quiet else _progress_printer(), base)
    for r in results:
        click.echo(f"{r.image}: {'built' if r.built else 'up to date'}")


def _progress_printer() -> Callable[[str], None]:
    if sys.stderr.isatty():
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
        return lambda text: console.print(f"[dim]images:[/] {text}", markup=True, soft_wrap=True)
    return lambda text: click.echo(f"images: {text}", err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The inventory as JSON (contract §7) on stdout.")
@click.option(
    "--gpu-inventory",
    type=click.Path(dir_okay=False),
    envvar=gpu_select.INVENTORY_ENV,
    help="Read this inventory file instead of NVML.",
)
@click.option("--record", type=click.Path(dir_okay=False), metavar="FILE", help="Write the inventory to FILE.")
def gpus(as_json: bool, gpu_inventory: str | None, record: str | None) -> None:
    """Show the GPUs NVML sees: memory, utilization, processes, and which pp-launch run holds each.

    \b
    Examples:
      pp-launch gpus
      pp-launch gpus --record inventory.json
    """
    from .gpu.table import holders_by_uuid, render_table

    with mapped_errors():
        inventory = gpu_select.load_inventory(gpu_inventory)
        if record:
            inventory.save(record)
        try:
            held = holders_by_uuid(launch.live_gpu_labels(connect(timeout=5)))
        except errors.EngineUnavailable:
            held = {}
    if inventory.note:
        click.echo(inventory.note, err=True)
    if as_json:
        click.echo(json.dumps(inventory.to_json(), indent=2))
    elif inventory.gpus:
        click.echo(render_table(inventory, held))
    if record:
        click.echo(f"recorded {len(inventory.gpus)} GPUs to {record}", err=True)


@main.command("node", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def node_command(args: tuple[str, ...]) -> None:
    """Run one stage container in the foreground: the same as `pp-gpu-node`.

    A drop-in for docker-gpu-node.sh, configured by the environment: STAGE (required), PP_IMAGE,
    PP_CONTAINER_PREFIX, PP_DEV, PP_CACHE_DIR, PP_STAGE_NETWORK, PP_GPUS (all, N, device=0,2, device=GPU-...,
    auto), PP_MODEL_CACHE_DIR, PP_ENTRYPOINT, PP_FORWARD_ENV, PP_STOP_GRACE. Output passes through unchanged;
    the exit code is the container's (128+N after signal N). The container cannot outlive this process.
    ARGS, if any, are the container's command, as docker-gpu-node.sh passed "$@".

    \b
    Example:
      STAGE=0 NUM_STAGES=2 PP_IMAGE=pp-launch/stub-worker:latest pp-launch node
    """
    sys.exit(_run_node(args))


def _run_node(args: tuple[str, ...]) -> int:
    inbox = QueueInbox()
    signals.install()  # idempotent; also covers `pp-launch node` and direct calls
    signals.route_to(lambda signum: inbox.put(StopRequested(signum)))
    try:
        return launch.run_node(os.environ, args, inbox, lambda text: click.echo(f"pp-gpu-node: {text}", err=True))
    except errors.PpLaunchError as exc:
        click.echo(f"pp-gpu-node: error: {exc}", err=True)
        return exc.exit_code


def gpu_node_main() -> None:
    """The `pp-gpu-node` console script: environment as contract §9, arguments as the container's command."""
    sys.exit(_run_node(tuple(sys.argv[1:])))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per container.")
def ps(as_json: bool) -> None:
    """List pp-launch runs and their stages: run, stage, container, image, GPUs, owner, alive or gone, age.

    \b
    Example:
      pp-launch ps
    """
    from .ps import list_stages, render

    with mapped_errors():
        rows = list_stages(connect())
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
    else:
        click.echo(render(rows))


@main.command()
@click.argument("run_id", required=False)
@click.option("--all", "all_runs", is_flag=True, help="Every pp-launch container, whatever its owner.")
@click.option(
    "--grace",
    type=Seconds(),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Budget between SIGTERM and SIGKILL, for all containers at once.",
)
def down(run_id: str | None, all_runs: bool, grace: float) -> None:
    """Stop a run (or --all) with the chain's guarantees: SIGTERM, one grace, SIGKILL, removal confirmed.

    Acts on containers with pp-launch labels only, of any owner (detached and compose runs included).

    \b
    Examples:
      pp-launch down 3f2a9c1b7d00
      pp-launch down --all --grace 2
    """
    if bool(run_id) == all_runs:
        raise click.UsageError("name one RUN_ID, or --all")
    selector = [labels.RUN] if all_runs else [f"{labels.RUN}={run_id}"]
    with mapped_errors():
        engine = connect()
        targets = engine.containers(selector)
        if not targets:
            what = "no pp-launch containers" if all_runs else f"no containers of run {run_id}"
            click.echo(f"pp-launch: nothing to stop ({what})", err=True)
            return
        names = ", ".join(sorted(c.name for c in targets))
        click.echo(f"pp-launch: stopping {len(targets)} containers: {names}", err=True)
        left = launch.teardown_containers(engine, selector, grace)
    if left:
        click.echo(f"pp-launch: error: still present after teardown: {', '.join(left)}", err=True)
        sys.exit(errors.EXIT_FAILURE)
    click.echo(f"pp-launch: stopped and removed {len(targets)} containers", err=True)


@main.command()
def gc() -> None:
    """Remove containers whose launcher is gone (a process on this host that no longer runs).

    Never touches detached or compose runs, runs of another host, or containers without pp-launch labels.
    Every `chain` and `pp-gpu-node` does this by itself before it starts.

    \b
    Example:
      pp-launch gc
    """
    with mapped_errors():
        collected = sweep.gc(connect())
    for c in collected.removed:
        click.echo(f"removed {sweep.describe(c)}: its owner is gone")
    for c, why in collected.failed:
        click.echo(f"pp-launch: error: could not remove {sweep.describe(c)}: {sweep.safe(why)}", err=True)
    if not collected.removed and not collected.failed:
        click.echo("nothing to collect", err=True)
    if collected.failed:
        sys.exit(errors.EXIT_FAILURE)


@main.group("worker")
def worker_group() -> None:
    """Drive GPU workers over the worker-control wire (JSON lines on stdin/stdout)."""


@worker_group.command("check")
@click.argument("image")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Set a variable in the worker container.")
@click.pass_context
def worker_check(ctx: click.Context, image: str, env: tuple[str, ...]) -> None:
    """Run the worker-control conformance sequence against IMAGE; exit 0 only if every step passes.

    Initialize, configure, install rings, readable -> loaded, execute -> produced + completed, release,
    uninstall -> quiesced, stale generation after a restart, invalid JSON -> fatal, graceful shutdown,
    end of stdin. One line per step, with what was expected when it fails. STUB_MODE=worker is set for
    the built-in image's sake; other images ignore it.

    \b
    Examples:
      pp-launch worker check pp-launch/stub-worker:latest
      pp-launch worker check pp-launch/stub-worker:latest --env STUB_WORKER_MISBEHAVE=sequence
    """
    from .worker.check import check

    verbose = ctx.obj["verbosity"] > 0
    with mapped_errors():
        launch.check_image_name(image, "IMAGE")
        engine = connect()
        launch.ensure_image(engine, image, lambda text: click.echo(f"pp-launch: {text}", err=True))
        ok = check(
            engine,
            image,
            dict(_parse_env(env)),
            click.echo,
            (lambda text: click.echo(text, err=True)) if verbose else (lambda text: None),
        )
    sys.exit(errors.EXIT_OK if ok else errors.EXIT_FAILURE)


def _canonical(ctx: click.Context) -> str:
    """The command as options that differ from their defaults, in declaration order."""
    words = ["pp-launch", ctx.info_name or "compose"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if not isinstance(param, click.Option) or value in (None, (), False):
            continue
        if param.is_flag:  # present when true, whatever this Click version reports as a flag's default
            words.append(param.opts[0])
            continue
        if value == param.get_default(ctx):
            continue
        for v in value if isinstance(value, tuple) else (value,):
            words += [param.opts[0], str(v)]
    return shlex.join(words)


@main.command()
@click.option("--stages", type=click.IntRange(min=1, max=64), default=2, show_default=True)
@click.option("--image", default=BUILTIN_IMAGE, show_default=True, help="Stage image (needs /bin/sh).")
@gpu_options
@swactor_options
@click.option("--project", default="pp-chain", show_default=True, help="Compose project name.")
@click.option(
    "--worker-cmd",
    default="/usr/local/bin/pp-worker",
    show_default=True,
    help="The worker command each stage runs under pp-stage-entry (split like a shell would); "
    "--entrypoint PATH replaces it with PATH alone.",
)
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Set a variable in every stage.")
@click.option("--stage-env", multiple=True, metavar="K:NAME=VALUE", help="Set a variable in stage K only.")
@click.option(
    "--addr-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="S",
    help="How long a stage may take to announce before Compose calls it unhealthy.",
)
@click.pass_context
def compose(
    ctx: click.Context,
    stages: int,
    image: str,
    gpu: launch.GpuOptions,
    seed: tuple[tuple[str, str], ...],
    entrypoint: str | None,
    project: str,
    worker_cmd: str,
    env: tuple[str, ...],
    stage_env: tuple[str, ...],
    addr_timeout: float,
) -> None:
    """Write a Compose file for a chain of STAGES stages to stdout.

    One service per stage: init, host network, the stage environment, pp-launch labels (owner
    compose:PROJECT), GPUs pinned by UUID. Each stage runs under pp-stage-entry, which hands its
    announcement to the next stage through a shared directory; stage k starts once stage k-1 is healthy.

    \b
    Examples:
      pp-launch compose --stages 4 --gpus none > chain.yaml && docker compose -f chain.yaml up -d
      pp-launch compose --stages 2 --gpus auto --project llama > llama.yaml
    """
    from . import compose as compose_file

    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", project):
        raise click.BadParameter(
            "use lowercase letters, digits, '-' and '_', starting with a letter or digit", param_hint="--project"
        )
    request = ChainRequest(
        stages=stages,
        image=image,
        env=seed + _parse_env(env),
        stage_env=_parse_stage_env(stage_env, stages),
        lifeline=False,
    )
    command = (entrypoint,) if entrypoint else tuple(shlex.split(worker_cmd))
    with mapped_errors():
        try:
            engine = connect(timeout=5) if gpu.mode != "none" else None
        except errors.EngineUnavailable:
            engine = None
        plan, note = launch.plan_chain(
            request,
            gpu,
            engine,
            owner=compose_file.owner_for(project),
            run_id=compose_file.run_id_for(project),
            reserve=False,
        )
    if note:
        click.echo(f"pp-launch: {note}", err=True)
    click.echo(
        compose_file.render(plan, project, _canonical(ctx), command, addr_timeout), nl=False
    )
