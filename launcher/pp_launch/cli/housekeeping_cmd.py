"""`pp-launch ps`, `down` and `gc`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pp_launch.app import housekeeping, runs
from pp_launch.cli import go_template, runs_cmd
from pp_launch.cli.engines import RAY_OPTION, host_choice, voice, where
from pp_launch.cli.main import main
from pp_launch.cli.options import Seconds
from pp_launch.core import errors


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per container.")
@click.option("-q", "--quiet", "ids_only", is_flag=True, help="Only the run ids, one per line (as docker ps -q).")
@click.option(
    "-f",
    "--filter",
    "filters",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only rows whose KEY (a --json field: run, stage, container, id, image, owner, owner_status, state, host) "
    "is VALUE (run and id: a prefix is enough); repeat to narrow (as docker ps --filter).",
)
@click.option(
    "--format",
    "template",
    metavar="TEMPLATE",
    help="Each row through TEMPLATE, as docker ps --format: {{.run}} {{.container}} ... any --json field, or "
    "docker's names ({{.ID}} {{.Names}} {{.Image}} {{.State}} {{.Status}} {{.RunningFor}}); {{json .}}, "
    "{{upper .X}}; 'table ...' adds a header and aligns \\t columns; 'json' prints one object per row. An "
    "unknown field is an error (exit 1).",
)
@click.option(
    "--run",
    "run_id",
    metavar="RUN",
    shell_complete=runs_cmd.complete_runs,
    help="Only this run (a unique prefix is enough).",
)
@click.option(
    "-a",
    "--all",
    "ended_too",
    is_flag=True,
    help="Also the runs started here that ended and whose output is still kept (as docker ps -a): one row per "
    "stage, newest run first, with its container, image and 'Exited (N)'; 'pp-launch logs RUN' shows their output.",
)
@host_choice
@RAY_OPTION
def ps(
    as_json: bool,
    ids_only: bool,
    filters: tuple[str, ...],
    template: str | None,
    run_id: str | None,
    ended_too: bool,
    host_names: tuple[str, ...],
    all_hosts: bool,
    ray_address: str | None,
) -> None:
    """List pp-launch runs and their stages: run, stage, container, image, GPUs (index, memory, utilisation
    where NVML answers), announced address, owner, alive or gone, uptime.

    \b
    Examples:
      pp-launch ps
      pp-launch ps -a                      # and the runs that ended, whose output is kept
      pp-launch ps -q                      # run ids only, one per line
      pp-launch ps --run 3f2a --json
      pp-launch ps --filter owner_status=gone --format '{{.run}} {{.container}}'
      pp-launch ps --all-hosts
      pp-launch ps --ray 10.0.0.1:6379     # the detached runs on a Ray cluster
    """
    wanted = _filters(filters)
    if template is not None:
        go_template.Template(template, PS_FIELDS)  # a template that cannot run is said before any engine is asked
    place = where(host_names, all_hosts, ray_address)
    rows, answered = runs.stages(place, run_id, not ids_only, ended_too, voice())
    _show([r for r in rows if _kept(r, wanted)], ids_only, as_json, template)
    if not answered:
        sys.exit(errors.EXIT_FAILURE)


def _show(rows: list[dict[str, Any]], ids_only: bool, as_json: bool, template: str | None) -> None:
    shape = None if template is None else go_template.Template(template, PS_FIELDS)
    if ids_only:
        for r in sorted({row["run"] for row in rows}):
            click.echo(r)
        return
    ended = [r for r in rows if r.get("state") == "exited"]  # as the use case gives them: newest run first
    live = [r for r in rows if r.get("state") != "exited"]
    live.sort(key=lambda r: (r["run"], r["stage"] if r["stage"] is not None else -1, r.get("host") or ""))
    rows[:] = live + ended
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
    elif shape is not None:
        for line in shape.render(rows):
            click.echo(line)
    else:
        click.echo(housekeeping.render(rows))


PS_FIELDS = (
    "run",
    "stage",
    "role",
    "container",
    "id",
    "image",
    "gpus",
    "owner",
    "owner_status",
    "state",
    "age_s",
    "host",
    "address",
    "uptime_s",
    "attempt",
)


def _filters(values: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for value in values:
        key, sep, wanted = value.partition("=")
        if not sep or key not in PS_FIELDS:
            raise click.BadParameter(
                f"{value!r}: use KEY=VALUE with KEY one of {', '.join(PS_FIELDS)}", param_hint="--filter"
            )
        out.append((key, wanted))
    return out


def _kept(row: dict[str, Any], wanted: list[tuple[str, str]]) -> bool:
    """Every filter holds: run and id by prefix (as every command takes them), the rest exactly."""
    for key, value in wanted:
        have = row.get(key)
        text = ",".join(map(str, have)) if isinstance(have, list) else "" if have is None else str(have)
        if not (text.startswith(value) if key in ("run", "id") else text == value):
            return False
    return True


@main.command()
@click.argument("run_ids", nargs=-1, metavar="[RUN]...", shell_complete=runs_cmd.complete_runs)
@click.option("--all", "all_runs", is_flag=True, help="Every pp-launch container, whatever its owner.")
@click.option(
    "--grace",
    type=Seconds(),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Budget between SIGTERM and SIGKILL, for all containers at once.",
)
@click.option("--yes", "-y", is_flag=True, help="With --all: do not ask first.")
@host_choice
@RAY_OPTION
def down(
    run_ids: tuple[str, ...],
    all_runs: bool,
    grace: float,
    yes: bool,
    host_names: tuple[str, ...],
    all_hosts: bool,
    ray_address: str | None,
) -> None:
    """Stop runs (or --all) with the chain's guarantees: SIGTERM, one grace, SIGKILL, removal confirmed.

    Acts on containers with pp-launch labels only, of any owner (detached and compose runs included). Each RUN
    may be a unique prefix; several are stopped one after another, and every one is tried even when one fails
    (exit 1 then). --all asks first (other people's runs may be among them) unless --yes.

    \b
    Examples:
      pp-launch down 3f2a9c1b7d00
      pp-launch down 3f2a 77c1
      pp-launch down --all --yes --grace 2
      pp-launch down 3f2a --all-hosts
      pp-launch down 3f2a --ray 10.0.0.1:6379   (a detached run on a Ray cluster)
    """
    if bool(run_ids) == all_runs:
        raise click.UsageError("name a RUN (or several), or --all")
    if all_runs and ray_address is not None:
        raise click.UsageError("--all and --ray do not go together: name the runs ('pp-launch ps --ray ADDRESS -q')")
    place = where(host_names, all_hosts, ray_address)
    if not runs.down(place, run_ids, grace, None if yes else _confirm, voice()):
        sys.exit(errors.EXIT_FAILURE)


def _confirm(question: str) -> None:
    """down --all, before it stops other people's runs: asked on a terminal, refused (exit 2) otherwise."""
    if not sys.stdin.isatty():
        raise errors.ConfigError(f"--all would {question[:-1]}: add --yes to confirm")
    click.confirm(f"pp-launch: {question}", abort=True, err=True)


@main.command()
@click.option("-n", "--dry-run", is_flag=True, help="Say what would be removed, and remove nothing.")
@host_choice
@RAY_OPTION
def gc(dry_run: bool, host_names: tuple[str, ...], all_hosts: bool, ray_address: str | None) -> None:
    """Remove what your runs left when their guard went too (an engine crash, a guard removed by someone else);
    name, and never touch, containers that only carry pp-launch labels.

    What a launcher leaves, however it ended, its run's guard on the engine removes (docs/chain.md). gc acts only
    on ids your own runs recorded at create, whose launcher is gone or that no longer run; never on a detached run
    (its guard's, or `down`'s). A container that merely carries pp-launch's labels is named, with how to remove it.

    \b
    Example:
      pp-launch gc
      pp-launch gc --dry-run
      pp-launch gc --host gpu2
      pp-launch gc --ray 10.0.0.1:6379   (detached runs on a Ray cluster whose stages all ended: GPUs released)
    """
    if not runs.gc(where(host_names, all_hosts, ray_address), dry_run, voice()):
        sys.exit(errors.EXIT_FAILURE)
