"""`pp-launch ps`, `down` and `gc`: parses where to look (--host, --all-hosts, --ray) and renders the rows and
words the use cases (app/runs.py) give back; it decides nothing about what is whose."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from pp_launch.app import runs
from pp_launch.app.rows import StageRow
from pp_launch.cli import go_template, runs_cmd, tables
from pp_launch.cli.engines import RAY_OPTION, host_choice, voice, where
from pp_launch.cli.main import main
from pp_launch.cli.options import Seconds
from pp_launch.core import errors, labels


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per container.")
@click.option("-q", "--quiet", "ids_only", is_flag=True, help="Only the run ids, one per line (as docker ps -q).")
@click.option(
    "-f",
    "--filter",
    "filters",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only the rows docker ps --filter would keep: name=TEXT (a regular expression in the container's name), "
    "status=STATE (created, running, paused, restarting, removing, exited, dead), label=KEY or label=KEY=VALUE, "
    "id=PREFIX, ancestor=IMAGE[:TAG], exited=CODE (with -a); or by any --json field of ours (run=PREFIX, stage, "
    "role, owner, owner_status, host, ...). The same key repeated: any of its values; different keys: all of them.",
)
@click.option(
    "--format",
    "template",
    metavar="TEMPLATE",
    help="Each row through TEMPLATE, as docker ps --format: docker's names ({{.ID}} {{.Names}} {{.Image}} {{.State}} "
    '{{.Status}} {{.RunningFor}} {{.CreatedAt}} {{.Labels}} {{.Label "k"}}) or any --json field of ours '
    "({{.run}} {{.stage}} ...); {{json .}}, {{upper .X}}; 'table ...' adds a header and aligns \\t columns; 'json' "
    "prints one object per row with docker's field names (and ours where docker has none). A bad template, like a "
    "bad --filter, is exit 1 (as docker ps) before any engine is asked.",
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
    help="Also the runs started here that ended and whose output is still kept (as docker ps -a), of the engines "
    "asked (-H/DOCKER_HOST, --host): one row per stage, newest run first, with its container, image and "
    "'Exited (N)'; 'pp-launch logs RUN' shows their output.",
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
      pp-launch ps -a --filter status=exited --format 'table {{.Names}}\\t{{.Status}}\\t{{.Label "pp-launch.run"}}'
      pp-launch ps --all-hosts
      pp-launch ps --ray 10.0.0.1:6379     # the detached runs on a Ray cluster
    """
    wanted = _filters(filters)
    if template is not None:
        go_template.Template(template, PS_FIELDS)  # a template that cannot run is said before any engine is asked
    place = where(host_names, all_hosts, ray_address)
    rows, answered = runs.stages(place, run_id, not ids_only, ended_too, voice())
    _show([r for r in rows if _kept(r.as_json(), wanted)], ids_only, as_json, template)
    if not answered:
        sys.exit(errors.EXIT_FAILURE)


def _show(rows: list[StageRow], ids_only: bool, as_json: bool, template: str | None) -> None:
    shape = None if template is None else go_template.Template(template, PS_FIELDS)
    if ids_only:
        for r in sorted({row.run for row in rows}):
            click.echo(r)
        return
    ended = [r for r in rows if r.ended]  # as the use case gives them: newest run first
    rows = sorted((r for r in rows if not r.ended), key=StageRow.order) + ended
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.as_json()))
    elif shape is not None:
        for line in shape.render([row.as_json() for row in rows]):
            click.echo(line)
    else:
        click.echo(tables.render_ps(rows))


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
    "exit_code",
)


# docker ps's own filter keys (as docker means them), beside our --json fields
DOCKER_FILTERS = ("name", "status", "label", "id", "ancestor", "exited")
DOCKER_STATES = ("created", "restarting", "running", "removing", "paused", "exited", "dead")
OUR_FILTERS = tuple(k for k in PS_FIELDS if k not in DOCKER_FILTERS and k != "labels")


def _filters(values: tuple[str, ...]) -> dict[str, list[Any]]:
    """--filter values by key, checked: a key or value docker's engine or we would refuse is exit 1 naming it (as
    docker ps: its engine refuses the filter)."""
    out: dict[str, list[Any]] = {}
    for value in values:
        key, sep, wanted = value.partition("=")
        key = key.strip().lower()
        if not sep or key not in (*DOCKER_FILTERS, *OUR_FILTERS):
            raise go_template.TemplateError(
                f"--filter {value!r}: use KEY=VALUE with KEY one of docker's {', '.join(DOCKER_FILTERS)} or ours, "
                f"{', '.join(OUR_FILTERS)}"
            )
        item: Any = wanted
        if key == "status" and wanted not in DOCKER_STATES:
            raise go_template.TemplateError(f"--filter {value!r}: a status is one of {', '.join(DOCKER_STATES)}")
        if key == "exited" and labels.ascii_int(wanted) is None:
            raise go_template.TemplateError(f"--filter {value!r}: exited takes an exit code (exited=0, exited=137)")
        if key == "name":
            try:
                item = re.compile(wanted)
            except re.error as exc:
                raise go_template.TemplateError(f"--filter {value!r}: not a regular expression ({exc})") from None
        out.setdefault(key, []).append(item)
    return out


def _text(have: Any) -> str:
    return ",".join(map(str, have)) if isinstance(have, list) else "" if have is None else str(have)


def _holds(row: dict[str, Any], key: str, wanted: Any) -> bool:
    """One filter value, as docker ps means its keys; ours: run and id by prefix (as every command takes them), the
    rest exactly."""
    if key == "name":
        return bool(wanted.search(str(row.get("container") or "")))
    if key == "status":
        return bool(row.get("state") == wanted)
    if key == "label":
        name, sep, value = wanted.partition("=")
        found = row.get("labels") or {}
        return bool(name in found and (not sep or found[name] == value))
    if key == "exited":
        return row.get("state") == "exited" and row.get("exit_code") == labels.ascii_int(wanted)
    if key == "ancestor":
        image = str(row.get("image") or "")
        return image == wanted or (":" not in wanted.rsplit("/", 1)[-1] and image == f"{wanted}:latest")
    text = _text(row.get(key))
    return text.startswith(wanted) if key in ("run", "id") else text == wanted


def _kept(row: dict[str, Any], wanted: dict[str, list[Any]]) -> bool:
    """As docker ps: every key holds, each by any of its values."""
    return all(any(_holds(row, key, value) for value in values) for key, values in wanted.items())


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
    It also removes the records of runs gone for longer than PP_LAUNCH_RECORD_KEEP seconds (a week; the end of a
    run removes its user's own too).

    \b
    Example:
      pp-launch gc
      pp-launch gc --dry-run
      pp-launch gc --host gpu2
      pp-launch gc --ray 10.0.0.1:6379   (detached runs on a Ray cluster whose stages all ended: GPUs released)
    """
    if not runs.gc(where(host_names, all_hosts, ray_address), dry_run, voice()):
        sys.exit(errors.EXIT_FAILURE)


@main.command()
@click.option("-n", "--dry-run", is_flag=True, help="Say what would be removed, and remove nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask first (needed where there is no terminal to ask on).")
@click.option(
    "--host",
    "host_names",
    multiple=True,
    metavar="CTX",
    help="On this Docker engine (a context name or an URL) instead of DOCKER_HOST's; repeat for several.",
)
def uninstall(dry_run: bool, yes: bool, host_names: tuple[str, ...]) -> None:
    """Remove everything of yours that pp-launch made, before 'pip uninstall pp-launch': on each engine, the
    records your runs made and pp-launch's images (pp-launch/stub-worker, pp-launch/guard, pp-launch/base); then
    your state directory (run logs, the ids your runs created). A run of yours that still lives stops it (end it
    with 'pp-launch down RUN' first); an image another user's run still uses is kept, and said. The images are
    every pp-launch user's of that engine: any of them rebuilds them with 'pp-launch images build'.

    \b
    Example:
      pp-launch uninstall --dry-run
      pp-launch uninstall --yes && pip uninstall pp-launch
      pp-launch uninstall --host gpu2 --host gpu3
    """
    from pp_launch.app.uninstall import uninstall as remove

    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise errors.ConfigError("uninstall removes your records, pp-launch's images and your state: add --yes")
        click.confirm("pp-launch: remove your records, pp-launch's images and your state?", abort=True, err=True)
    done = remove(host_names, dry_run, say=lambda text: click.echo(f"pp-launch: {text}", err=True))
    for r in done:
        where = f" on {r.where}" if r.kind != "state" else ""
        click.echo(f"{r.kind} {r.name}{where}: {r.done}")
    if not dry_run:
        click.echo("then: pip uninstall pp-launch", err=True)
    if any(r.done.startswith("kept: a container") for r in done):
        sys.exit(errors.EXIT_FAILURE)
