"""`pp-launch chain`: parses its options and chain file into a LaunchRequest, hands it to the launch use case
(app/launch.py) and renders its events (lines, or JSON with --json); signals reach the run through cli/signals.py."""

from __future__ import annotations

import json
import math
import shlex
import sys
from typing import TYPE_CHECKING, Any

import click

from pp_launch.cli import signals, streams
from pp_launch.cli.main import main
from pp_launch.cli.options import (
    Seconds,
    container_options,
    gpu_options,
    host_options,
    restart_options,
    stage_options,
    swactor_options,
)
from pp_launch.core import errors, hosts
from pp_launch.core.chain.plan import ChainPlan, ChainRequest, StageSpec
from pp_launch.core.lines import count

if TYPE_CHECKING:  # the use case (and the engine client under it) is imported when a chain runs, not for --help
    from pp_launch.app.launch import Launched, LaunchRequest
    from pp_launch.core.chain.scope import ChainOutcome

FILE_SKIPS = {"file", "as_json", "dry_run", "detach", "help", "verbose", "quiet"}  # not settable from a chain file


def file_keys(command: click.Command) -> dict[str, str]:
    """A chain file's keys are the command's long flags without their dashes (`gpus-per-stage`, `name`, `host`),
    each mapped to the option it sets."""
    keys = {}
    for p in command.params:
        if isinstance(p, click.Option) and p.name and p.name not in FILE_SKIPS and not p.hidden:
            flag = max((o for o in p.opts if o.startswith("--")), key=len, default=None)
            if flag is not None:
                keys[flag[2:]] = p.name
    return keys


def _did_you_mean(key: str, keys: dict[str, str]) -> str:
    import difflib

    close = difflib.get_close_matches(key.replace("_", "-"), list(keys), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


CHAIN_FILE_LIMIT = 1 << 20  # bytes: a chain file is a few lines; more is a mistake (or /dev/zero)


def load_chain_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """-f FILE: a TOML chain file whose keys are chain's long flags (`gpus-per-stage`, or `gpus_per_stage`); it sets
    their defaults, so flags given on the command line override it. `env` is a table, `stage-env` a table of
    tables keyed by stage. Every value is checked here, as its option would check it: a wrong one is exit 2
    naming the file, the key and its line."""
    if value is None:
        return None
    import tomllib

    text = _read_bounded(value)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.ConfigError(f"chain file {value} is not TOML: {exc}") from None
    except RecursionError:  # tables or arrays nested thousands deep: no chain file is
        raise errors.ConfigError(f"chain file {value} nests its tables or arrays too deeply: not a chain file") from (
            None
        )
    keys = file_keys(ctx.command)
    options = {p.name: p for p in ctx.command.params if isinstance(p, click.Option)}
    defaults: dict[str, Any] = {}
    for raw_key, item in doc.items():
        key = keys.get(raw_key.replace("_", "-"))
        where = f"chain file {value}, line {_line_of(text, raw_key)}: {raw_key}"
        if raw_key == "command":
            ctx.meta[CHAIN_FILE_COMMAND] = _command_value(item, where)
            continue
        if key is None:
            raise errors.ConfigError(
                f"{where}: unknown key{_did_you_mean(raw_key, {**keys, 'command': ''})}; keys: "
                f"{', '.join(sorted([*keys, 'command']))}"
            )
        defaults[key] = (
            _env_value(item, where) if key in ("env", "stage_env") else _checked(ctx, options[key], item, where)
        )
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


CHAIN_FILE_COMMAND = "pp_launch.chain_file_command"  # where a chain file's `command` waits for the command


def _command_value(item: object, where: str) -> list[str]:
    """`command` is a list of arguments (["python", "serve.py", "--rank", "{stage}"]), or one line split as a shell
    splits it."""
    import shlex

    if isinstance(item, str):
        try:
            return shlex.split(item)
        except ValueError as exc:
            raise errors.ConfigError(f"{where}: cannot split it as a shell would ({exc})") from None
    if not isinstance(item, list) or not all(isinstance(a, str) for a in item) or not item:
        raise errors.ConfigError(f'{where}: command is a list of arguments (["python", "serve.py"]) or one line')
    return list(item)


def _env_value(item: object, where: str) -> list[str]:
    """`env` is a table of NAME = "value"; `stage-env` tables of them by stage ([stage-env.1]); values are text."""
    if where.endswith(": env"):
        if not isinstance(item, dict) or not all(isinstance(v, str) for v in item.values()):
            raise errors.ConfigError(f'{where}: env must be a table of NAME = "value" (values in quotes)')
        return [f"{k}={v}" for k, v in item.items()]
    tables = item.values() if isinstance(item, dict) else ()
    if not isinstance(item, dict) or not all(
        isinstance(t, dict) and all(isinstance(v, str) for v in t.values()) for t in tables
    ):
        raise errors.ConfigError(f'{where}: stage-env must be tables by stage: [stage-env.1] NAME = "value"')
    return [f"{k}:{n}={v}" for k, table in item.items() for n, v in table.items()]


def _read_bounded(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(CHAIN_FILE_LIMIT + 1)
    except OSError as exc:
        raise errors.ConfigError(f"cannot read chain file {path}: {exc.strerror}") from None
    if len(data) > CHAIN_FILE_LIMIT:
        raise errors.ConfigError(f"chain file {path} is larger than {CHAIN_FILE_LIMIT >> 20} MiB: not a chain file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise errors.ConfigError(f"chain file {path}, line {line}: not UTF-8 text") from None


def _line_of(text: str, key: str) -> int | str:
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().strip("[]").split("=")[0].strip().strip("\"'") == key:
            return n
    return "?"


def _checked(ctx: click.Context, option: click.Option, item: object, where: str) -> object:
    """A chain file's value as its option takes it: a flag is true or false, a repeatable option a list, any other
    one value; each converted by the option's own type (no infinity, no table where a number goes)."""
    kind = "a list" if option.multiple else "true or false" if option.is_flag else "one value"
    values = item if option.multiple and isinstance(item, list) else [item]
    scalar = (bool,) if option.is_flag else (str, int, float)
    if (option.multiple and not isinstance(item, list)) or not all(
        isinstance(v, scalar) and not (isinstance(v, bool) and not option.is_flag) for v in values
    ):
        raise errors.ConfigError(f"{where}: takes {kind}, not {item!r}")
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        raise errors.ConfigError(f"{where}: takes a finite number, not {item!r}")
    if not option.is_flag:
        for v in values:
            try:
                option.type.convert(v, option, ctx)
            except click.BadParameter as exc:
                raise errors.ConfigError(f"{where}: {exc.format_message()}") from None
    return item


@main.command()
@click.option(
    "-f",
    "--file",
    type=click.Path(dir_okay=False),
    is_eager=True,
    expose_value=False,
    callback=load_chain_file,
    metavar="FILE",
    help="A TOML chain file (examples/chain.toml): its keys are this command's options; flags override it.",
)
@stage_options
@gpu_options
@swactor_options
@container_options
@click.option("--network", default="host", show_default=True, help="Network mode of every stage container.")
@click.option("--name", "name_prefix", metavar="PREFIX", help="Containers are named PREFIX-K [default: pp-RUNID].")
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
@click.option(
    "--handoff",
    type=click.Choice(["env", "stdin"]),
    default="env",
    show_default=True,
    help="How stage k learns stage k-1's and stage 0's addresses. Every container starts at once either way. "
    "env: the worker starts under a small sh entry once its peers are known, with PEER_*/FIRST_PEER_* set (any "
    "image with /bin/sh). stdin: the worker starts at once (PP_HANDOFF=stdin) and reads 'PP_PEER <id> <addrs>' "
    "and 'PP_FIRST_PEER <id> <addrs>' lines on stdin later, so all stages load side by side.",
)
@click.option(
    "--rendezvous",
    type=click.Choice(["torch"]),
    help="torch: every stage gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, "
    "MASTER_PORT; the master on stage 0's place, at a port free here, or on stage 0's Ray node, unless --env "
    "MASTER_PORT=...), all start at once, and no stage has to announce: an unmodified "
    "init_process_group(init_method='env://') program runs as a chain.",
)
@click.option(
    "--swactor-caches",
    is_flag=True,
    help="Mount swactor's pp-worker caches in every stage as docker-gpu-node.sh does: $PP_CACHE_DIR (default "
    "~/.cache/tinygrad) at /root/.cache/tinygrad and $PP_MODEL_CACHE_DIR at /root/.cache/pp-pipeline, each in a "
    "stage-K folder made first as you. Without it only a cache you name with those variables is mounted; nothing "
    "else is ever mounted unasked. --dry-run lists the mounts.",
)
@click.option(
    "--bring-up",
    "bring_up",
    type=click.Choice(["parallel", "in-turn"]),
    default="parallel",
    show_default=True,
    help="parallel: create and start every container at once (--handoff env needs /bin/sh in the image). "
    "in-turn: start stage k only once stage k-1 announced, PEER_* in its create-time environment (images "
    "without /bin/sh; swactor's order).",
)
@restart_options
@host_options
@click.option(
    "--placement",
    type=click.Choice(hosts.PLACEMENTS),
    default="pack",
    show_default=True,
    help="With several --host: pack fills each host (in --host order) before the next, so the ring crosses as "
    "few host boundaries as it can; spread shares the stages out evenly. Stages on a host are always consecutive.",
)
@click.option(
    "--stages-per-host",
    type=click.IntRange(min=1),
    metavar="N",
    help="With several --host (or --ray nodes): N consecutive stages on each host in turn.",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run the chain on a Ray cluster: HOST:PORT of its GCS, ray://HOST:PORT (Ray Client), or auto (RAY_ADDRESS, "
    "or this machine's cluster). Ray places the stages (--placement, --stages-per-host) and grants their GPUs; "
    "an agent on each node owns its stages' containers on the node's Docker engine. Ray's own log lines are shown "
    "only with -v. Needs pp-launch[ray].",
)
@click.option(
    "--ray-timeout",
    type=Seconds(positive=True),
    default=60.0,
    show_default=True,
    metavar="S",
    help="With --ray: how long the cluster may take to grant the run's GPUs; then exit 2, nothing started.",
)
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines on stdout; stage lines on stderr.")
@click.option("--dry-run", is_flag=True, help="Print the plan (GPUs, env, labels) and start nothing.")
@click.option(
    "-d",
    "--detach",
    is_flag=True,
    help="Bring the chain up, print its run id (alone, on stdout), exit 0; then only 'pp-launch down' ends it. "
    "Until every stage has announced, the run ends with this launcher, as a foreground chain does.",
)
@click.option(
    "--sweep/--no-sweep",
    default=True,
    envvar="PP_LAUNCH_SWEEP",
    show_default=True,
    hidden=True,
    help="No effect, kept for scripts: what a launcher leaves, its run's guard removes (docs/chain.md).",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Keep each stage's output here after the run ('pp-launch logs RUN --log-dir DIR'), instead of your "
    "state directory; bounded per stage, the newest 50 runs kept.",
)
@click.option(
    "--gpu-node",
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="Run each stage as the child process PATH (pp-gpu-node, or wrappers/docker-gpu-node.sh) instead of "
    "creating its container directly.",
)
@click.option(
    "-a",
    "--attach",
    "attach",
    multiple=True,
    type=click.IntRange(min=0),
    metavar="K",
    help="Show only stage K's own lines (repeatable), as 'docker compose up --attach'; pp-launch's own lines stay.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND [ARG]...]")
@click.pass_context
def chain(ctx: click.Context, /, **options: Any) -> None:
    """Start STAGES stages at once and supervise them until they end.

    Each stage is a container with tini as init and daemon-side auto-remove; all are created and started
    together. Stage k >= 1 receives stage k-1's announcement (PEER_*) and stage 0's (FIRST_PEER_*) as soon as
    they are known (--handoff). Exit: 0 when every stage exits 0, 1 when one
    fails, 2 on bad configuration, 128+N after signal N. Nothing is left behind either way.

    COMMAND and ARGs after `--` are each stage's command, as `docker run IMAGE COMMAND ARG...` (the chain file's
    `command`); in them and in --env values {stage} is the stage's index, {stages} how many there are, and
    {first_peer} stage 0's announced host:port (empty on stage 0).

    \b
    Examples:
      pp-launch chain --stages 4
      pp-launch chain --stages 8 --gpus auto --gpus-per-stage 1 --json
      pp-launch chain --stages 2 --dry-run --json --gpu-inventory inventory.json
      pp-launch chain --stages 8 --host gpu1 --host gpu2 --gpus-per-stage 2   (Docker contexts)
      pp-launch chain --stages 8 --ray 10.0.0.1:6379 --gpus-per-stage 2      (a Ray cluster)
      pp-launch chain --stages 4 --max-restarts 3 --restart-backoff 2       (recover from failures)
      pp-launch chain --stages 2 --image my/model:1 -v /models/m/stage-{stage}:/weights:ro --ipc host
      pp-launch chain --stages 4 --image my/model:1 -- python serve.py --rank {stage} --world {stages}
    """
    verbosity, o = ctx.obj["verbosity"], options
    request = _request(o)
    if o["ray_address"] is not None:
        streams.set_aside_ray_output(verbosity)  # Ray's own lines only with -v
    if o["dry_run"]:
        from pp_launch.app.launch import plan_launch

        _print_plan(plan_launch(request), o["as_json"], request.gpu.inventory_path)
        return
    if any(k >= request.chain.stages for k in o["attach"]):
        raise errors.UsageError(f"--attach {max(o['attach'])}: the chain has stages 0-{request.chain.stages - 1}")
    _run(request, verbosity, o["as_json"], tuple(o["attach"]))


def _command(o: dict[str, Any]) -> tuple[str, ...] | None:
    """The stages' command: the arguments after `--`, else the chain file's `command`, else the image's own."""
    if o["command"]:
        return tuple(o["command"])
    ctx = click.get_current_context()
    given = ctx.meta.get(CHAIN_FILE_COMMAND)
    return tuple(given) if given is not None else None


def _request(o: dict[str, Any]) -> LaunchRequest:
    """The launch the options ask for (each option's name as Click gives it; `sweep` has no effect, see its help)."""
    from pp_launch.app.launch import LaunchRequest

    chain_request = ChainRequest(
        stages=o["stages"],
        image=o["image"],
        network=o["network"],
        name_prefix=o["name_prefix"],
        env=o["seed"] + o["env"],
        stage_env=o["stage_env"],
        addr_timeout=o["addr_timeout"],
        grace=o["grace"],
        entrypoint=(o["entrypoint"],) if o["entrypoint"] else None,
        command=_command(o),
        handoff=o["handoff"],
        parallel=o["bring_up"] == "parallel",
        container=o["container"],
        caches="all" if o["swactor_caches"] else "asked",
        rendezvous=o["rendezvous"] or "",
        lifeline=True,  # a detached run is its launcher's until it is up, then its guards' (adapters/guard.py)
    )
    return LaunchRequest(
        chain_request,
        o["gpu"],
        o["host_names"],
        o["placement"],
        o["stages_per_host"],
        o["detach"],
        o["gpu_node"],
        log_dir=o["log_dir"],
        ray=o["ray_address"],
        ray_timeout=o["ray_timeout"],
        **o["restarts"],
    )


def _run(request: LaunchRequest, verbosity: int, as_json: bool, attach: tuple[int, ...] = ()) -> None:
    """Launch, with the CLI's hooks: words on stderr, a reporter once the run id exists, stop signals routed to
    the chain (and held while planning); then the result line, last."""
    from pp_launch.app.launch import Hooks, launch

    say = (lambda t: click.echo(f"pp-launch: {t}", err=True)) if verbosity >= 0 or as_json else (lambda t: None)
    reporters: list[Any] = []

    def reporter(plan: ChainPlan) -> Any:
        reporters.append(_reporter(plan, verbosity, as_json, request.detach, request.ray is None, attach))
        return reporters[0]

    signals.install()  # already done by the console entry; here for programs that call main() directly
    hooks = Hooks(say, reporter, lambda scope: signals.route_to(scope.request_stop), signals.pending)
    try:
        done = launch(request, hooks)
    except errors.Interrupted as exc:
        if as_json and exc.run_id:  # stopped while placing, before any reporter: the run's end as an event too
            _stopped_placing_event(exc)
        raise
    finally:
        for r in reporters:
            r.close()
    assert done.outcome is not None
    said = getattr(reporters[0], "said", "") if reporters else ""
    _finish(done.outcome, done.plan.run_id, as_json, said, quiet=verbosity < 0)


def _stopped_placing_event(exc: errors.Interrupted) -> None:
    from pp_launch.cli.report import JsonReporter
    from pp_launch.core import events

    stopped = events.ChainStopped(
        reason=events.StopReason(exc.reason), exit_code=exc.exit_code, removed=(), orphans=(), message=str(exc)
    )
    JsonReporter(exc.run_id).event(stopped)


def _reporter(
    plan: ChainPlan, verbosity: int, as_json: bool, detach: bool, records: bool = True, attach: tuple[int, ...] = ()
) -> Any:
    """--json: events on stdout; --detach: stdout is the run id alone (RUN=$(pp-launch chain --detach)), so
    everything else goes to stderr; a terminal: the live table; else plain lines. records: the run keeps a record
    volume on its engines (docs/chain.md, "The record"), named in the final line."""
    reporter = _made_reporter(plan, verbosity, as_json, detach)
    if records and hasattr(reporter, "record"):
        reporter.record = f"pp-launch-record-{plan.run_id}-…"
    reporter.attach = frozenset(attach)
    return reporter


def _made_reporter(plan: ChainPlan, verbosity: int, as_json: bool, detach: bool) -> Any:
    from pp_launch.cli.report import JsonReporter, LiveReporter, PlainReporter

    run_id, stages = plan.run_id, len(plan.stages)
    if detach and verbosity >= 0:
        click.echo(
            f"pp-launch: run {run_id}: bringing up {count(stages, 'stage')}; until every stage has announced it ends "
            "with this launcher, then only 'pp-launch down' ends it",
            err=True,
        )
    if as_json:
        return JsonReporter(run_id, verbosity=verbosity)
    if detach:
        return PlainReporter(run_id, verbosity, out=sys.stderr)
    if sys.stdout.isatty() and verbosity >= 0:
        return LiveReporter(run_id, stages, verbosity, addr_timeout=plan.addr_timeout, handoff=plan.handoff)
    return PlainReporter(run_id, verbosity)


def _finish(outcome: ChainOutcome, run_id: str, as_json: bool, said: str = "", quiet: bool = False) -> None:
    """The result last; a failure's cause was said before the teardown summary (only what it did not say yet)."""
    if outcome.reason == "detached":
        if not as_json:  # --json: stdout carries events only, and every event names the run
            click.echo(run_id)
        if not quiet:
            click.echo(f"pp-launch: {outcome.message}; stop it with 'pp-launch down {run_id}'", err=True)
    elif outcome.exit_code != 0:
        rest = outcome.message[len(said) :].lstrip("; ") if said and outcome.message.startswith(said) else None
        if rest is None:
            click.echo(f"pp-launch: {'error: ' if outcome.reason != 'signal' else ''}{outcome.message}", err=True)
        elif rest:
            click.echo(f"pp-launch: {rest}", err=True)
    sys.exit(outcome.exit_code)


def _print_plan(done: Launched, as_json: bool, inventory_path: str | None) -> None:
    from pp_launch.app import gpus as gpu_select
    from pp_launch.cli.tables import gpu_names

    plan, note, warning = done.plan, done.note, done.warning
    local = any(s.gpus for s in plan.stages) and not plan.hosts
    names = gpu_names(gpu_select.load_inventory(inventory_path)) if local else {}
    doc = plan.to_json()
    if note:
        doc["note"] = note
    if warning:
        doc["warning"] = warning
    if as_json:
        click.echo(json.dumps(doc, separators=(",", ":")))  # JSON lines, as every --json (docs/formats.md)
        return
    click.echo(f"run {plan.run_id}: {count(len(plan.stages), 'stage')} (nothing started: dry run)")
    for s in plan.stages:
        gpus = ", ".join(f"{names[u]} {u}" if u in names else u for u in s.gpus) or "none"
        on = f"  host {s.host}" if s.host else ""
        click.echo(f"  stage {s.index}: {s.name}{on}  image {s.image}  GPUs {gpus}")
        for k, v in sorted(doc["stages"][s.index]["env"].items()):
            click.echo(f"      {k}={v}")
        for line in _container_lines(s):
            click.echo(f"      {line}")
    _print_ring(doc, names, len(plan.stages))


def _print_ring(doc: dict[str, Any], names: dict[str, str], stages: int) -> None:
    """The dry run's hops, its ring over the topology, its placement's cost and what it notes."""
    from pp_launch.cli.tables import render_ring

    for hop in doc.get("hops", []):
        click.echo(f"  hop {hop['from']} -> {hop['to']}: {hop['link']}")
    if stages > 1:
        click.echo("  the ring over the topology:")
        for line in render_ring(doc, names).splitlines():
            click.echo(f"    {line}")
    if cost := doc.get("placement_cost"):
        how = "the least possible" if cost["search"] == "exact" else "greedy (more than 16 candidates)"
        click.echo(
            f"  placement cost: {cost['within_stages']} within stages, {cost['ring_hops']} round the ring "
            f"({how}, {cost['candidates']} candidate GPUs; lower is closer)"
        )
    for extra in ("note", "warning"):
        if extra in doc:
            click.echo(f"  {extra}: {doc[extra]}")


def _container_lines(spec: StageSpec) -> list[str]:
    """A stage's docker run options as a dry run shows them: each mount as --mount (and who creates its folder), then
    the other options as docker run's flags."""
    o = spec.options
    lines = [f"--mount {m.docker_flag()}" + ("  (folder created by pp-launch)" if m.ensure else "") for m in o.mounts]
    lines += [f"--shm-size {o.shm_size}"] if o.shm_size is not None else []
    lines += [f"--ipc {o.ipc}"] if o.ipc is not None else []
    lines += [f"--ulimit {u.text()}" for u in o.ulimits] + [f"--device {d.text()}" for d in o.devices]
    lines += [f"--cap-add {c}" for c in o.cap_add] + [f"--label {k}={v}" for k, v in o.labels]
    lines += [f"--user {o.user}"] if o.user is not None else []
    lines += [f"--workdir {o.workdir}"] if o.workdir is not None else []
    lines += [f"--entrypoint {shlex.join(spec.entrypoint)}"] if spec.entrypoint is not None else []
    lines += [f"command: {shlex.join(spec.command)}"] if spec.command is not None else []
    return lines
