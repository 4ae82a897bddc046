"""`pp-launch compose`: parses the chain's options into a request and writes the Compose project the launch use
case (app/launch.py, app/compose.py) plans; it starts nothing."""

from __future__ import annotations

import re
import shlex

import click

from pp_launch.app import launch
from pp_launch.cli.main import main
from pp_launch.cli.options import container_options, gpu_options, stage_options, swactor_options
from pp_launch.core.chain.plan import ChainRequest
from pp_launch.core.container import ContainerOptions


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
@stage_options
@gpu_options
@swactor_options
@container_options
@click.option("--project", default="pp-chain", show_default=True, help="Compose project name.")
@click.option(
    "--worker-cmd",
    default="/usr/local/bin/pp-worker",
    show_default=True,
    help="The worker command each stage runs under pp-stage-entry (split like a shell would); "
    "--entrypoint PATH replaces it with PATH alone.",
)
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
    env: tuple[tuple[str, str], ...],
    stage_env: tuple[tuple[int, str, str], ...],
    addr_timeout: float,
    container: ContainerOptions,
) -> None:
    """Write a Compose file for a chain of STAGES stages to stdout.

    One service per stage: init, host network, the stage environment, pp-launch labels (owner
    compose:PROJECT), GPUs pinned by UUID. Each stage runs under pp-stage-entry, which hands its
    announcement to the next stage through a shared directory; all services start at once and stage k's
    worker starts once stage k-1 (and stage 0) announced.

    \b
    Examples:
      pp-launch compose --stages 4 --gpus none > chain.yaml && docker compose -f chain.yaml up -d
      pp-launch compose --stages 2 --gpus auto --project llama > llama.yaml
    """
    from pp_launch.app import compose as compose_file

    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", project):
        raise click.BadParameter(
            "use lowercase letters, digits, '-' and '_', starting with a letter or digit", param_hint="--project"
        )
    if container.healthcheck is not None:
        raise click.UsageError(
            "--health-* and --no-healthcheck are chain's: a Compose file's healthcheck tells Compose when each "
            "service has announced its address"
        )
    request = launch.LaunchRequest(
        ChainRequest(
            stages=stages,
            image=image,
            env=seed + env,
            stage_env=stage_env,
            lifeline=False,
            container=container,
            caches="named",  # written for wherever it runs: this machine's HOME means nothing there
        ),
        gpu,
        owner=compose_file.owner_for(project),
        run_id=compose_file.run_id_for(project),
    )
    command = (entrypoint,) if entrypoint else tuple(shlex.split(worker_cmd))
    planned = launch.plan_launch(request, dry_run=False)
    plan, note = planned.plan, planned.note
    if note:
        click.echo(f"pp-launch: {note}", err=True)
    click.echo(compose_file.render(plan, project, _canonical(ctx), command, addr_timeout), nl=False)
