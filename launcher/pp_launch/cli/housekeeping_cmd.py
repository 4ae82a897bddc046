"""`pp-launch ps`, `down` and `gc`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pp_launch.adapters import host_state, run_logs
from pp_launch.adapters.docker_engine import Engine
from pp_launch.adapters.nvml import NvmlUnavailable, read_inventory
from pp_launch.app import housekeeping
from pp_launch.cli import go_template, runs_cmd, streams
from pp_launch.cli.engines import RAY_OPTION, Engines, host_choice
from pp_launch.cli.main import main
from pp_launch.cli.options import Seconds
from pp_launch.core import errors, labels
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.lines import count


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
    help="Also the runs started here that ended and whose output is still kept (as docker ps -a): state "
    "'ended', one row per stage; 'pp-launch logs RUN' shows their output.",
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
    if ray_address is not None:
        from pp_launch.app import on_ray

        streams.set_aside_ray_output()
        _show([r for r in on_ray.runs(ray_address, run_id) if _kept(r, wanted)], ids_only, as_json, template)
        return
    engines = Engines(host_names, all_hosts, run_id)
    rows = []
    for name, engine in engines.reached:
        try:
            run = None if run_id is None else housekeeping.find_run(engine, run_id)[0]
        except errors.ConfigError:
            if engines.several:
                continue  # not on this host
            raise
        gpus = _inventory() if name is None else None  # NVML of this machine: only its own engine's GPUs
        where = (name or "local") if engines.several else None
        rows += housekeeping.list_stages(engine, run, details=not ids_only, gpus=gpus, host=where)
    if ended_too:
        rows += _ended_rows({r["run"] for r in rows}, run_id)
    if run_id is not None and not rows and engines.several:
        raise errors.ConfigError(f"no run {housekeeping.safe(run_id)!r} on any of these hosts")
    rows = [r for r in rows if _kept(r, wanted)]
    _show(rows, ids_only, as_json, template)
    engines.finish()


def _ended_rows(present: set[str], run_id: str | None) -> list[dict[str, Any]]:
    """A row per stage of each run whose output this user keeps, that no engine here lists and no launcher
    keeps writing: it ended."""
    import time

    now, rows = time.time(), []
    for run, stages, last in run_logs.ended():
        if run in present or (run_id is not None and not run.startswith(run_id)):
            continue
        for k in stages:
            rows.append(
                {
                    "run": run,
                    "stage": k,
                    "role": "stage",
                    "container": "-",
                    "id": "",
                    "image": "-",
                    "gpus": [],
                    "owner": "-",
                    "owner_status": "ended: output kept ('pp-launch logs RUN')",
                    "state": "ended",
                    "age_s": max(0, int(now - last)),
                    "address": None,
                    "uptime_s": None,
                }
            )
    return rows


def _show(rows: list[dict[str, Any]], ids_only: bool, as_json: bool, template: str | None) -> None:
    shape = None if template is None else go_template.Template(template, PS_FIELDS)
    if ids_only:
        for r in sorted({row["run"] for row in rows}):
            click.echo(r)
        return
    rows.sort(key=lambda r: (r["run"], r["stage"] if r["stage"] is not None else -1, r.get("host") or ""))
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
    if ray_address is not None:
        _down_ray(ray_address, run_ids, all_runs, grace)
        return
    failed = False
    for run_id in run_ids or (None,):
        try:
            _down(run_id, all_runs, grace, yes, host_names, all_hosts)
        except SystemExit as stop:
            if stop.code not in (None, 0) and len(run_ids) <= 1:
                raise
            failed = failed or stop.code not in (None, 0)
        except errors.PpLaunchError as exc:
            if len(run_ids) <= 1:
                raise
            click.echo(f"pp-launch: error: {exc}", err=True)
            failed = True
    if failed:
        sys.exit(errors.EXIT_FAILURE)


def _down_ray(address: str, run_ids: tuple[str, ...], all_runs: bool, grace: float) -> None:
    from pp_launch.app import on_ray

    streams.set_aside_ray_output()
    if all_runs:
        raise click.UsageError("--all and --ray do not go together: name the runs ('pp-launch ps --ray ADDRESS -q')")
    for run in run_ids:
        run_id, removed = on_ray.down(address, run, grace)
        click.echo(
            f"pp-launch: run {run_id} on the Ray cluster: {count(len(removed), 'container')} removed, its "
            "actors and GPUs released",
            err=True,
        )


def _down(
    run_id: str | None, all_runs: bool, grace: float, yes: bool, host_names: tuple[str, ...], all_hosts: bool
) -> None:
    engines = Engines(host_names, all_hosts, run_id)
    if not engines.several:
        _down_on(engines.reached[0][1], run_id, all_runs, grace, yes, None)
        engines.finish()
        return
    found_any = False
    for name, engine in engines.reached:
        try:
            found_any = _down_on(engine, run_id, all_runs, grace, yes, name or "local") or found_any
        except SystemExit as stop:
            if stop.code not in (None, 0):
                engines.failed = True
        except errors.ConfigError as exc:
            if all_runs or "no run" not in str(exc):
                raise
    if run_id and not found_any and not engines.failed:
        raise errors.ConfigError(f"no run {housekeeping.safe(run_id)!r} on any of these hosts")
    if run_id and not engines.failed:
        host_state.RunHosts().forget_prefix(run_id)
    engines.finish()


def _down_on(engine: Engine, run_id: str | None, all_runs: bool, grace: float, yes: bool, host: str | None) -> bool:
    """down on one engine: only what a running guard of the run recorded (adapters/guard.py); False when it had
    nothing to stop. Exits 1 when something stays."""
    on = f" on host {host}" if host else ""
    found = engine.containers(labels.run_selector()) if all_runs else housekeeping.find_run(engine, run_id or "")[1]
    vouched = housekeeping.vouch(engine, found)
    targets = list(vouched.ours)
    if all_runs and (targets or vouched.guards) and not yes:
        runs = sorted({c.labels.get(labels.RUN, "?") for c in targets} | {g.run for g in vouched.guards})
        question = (
            f"stop {count(len(targets), 'container')} of {len(runs)} runs ({', '.join(runs)}), whoever owns them?"
        )
        if not sys.stdin.isatty():
            raise errors.ConfigError(f"--all would {question[:-1]}: add --yes to confirm")
        click.confirm(f"pp-launch: {question}", abort=True, err=True)
    for c in vouched.unrecorded:
        click.echo(
            f"pp-launch: not touched{on}: {housekeeping.describe(c)} carries the run's labels, but no guard "
            "of the run recorded it (not made by that run, or its guard was removed)",
            err=True,
        )
    if not targets and not vouched.guards:
        click.echo(f"pp-launch: nothing to stop{on} (no pp-launch run that a guard vouches for)", err=True)
        return False
    names = ", ".join(sorted(c.name for c in targets)) or "none yet (still placing)"
    click.echo(f"pp-launch: stopping {count(len(targets), 'container')}{on}: {names}", err=True)
    outcomes = housekeeping.stop_runs(engine, targets, grace, guards=vouched.guards)
    left = [ref for o in outcomes for ref in o.orphans]
    problems = [o.message for o in outcomes if o.exit_code != 0]
    if left or problems:
        by_id = {c.id: c.name for c in targets}
        still = ", ".join(by_id.get(ref, ref[:12]) for ref in left)
        tail = f"; still present: {still}" if still else ""
        click.echo(f"pp-launch: error{on}: {'; '.join(problems)}{tail}", err=True)
        sys.exit(errors.EXIT_FAILURE)
    click.echo(f"pp-launch: stopped and removed {count(len(targets), 'container')}{on}", err=True)
    housekeeping.forget_ended([engine])
    return True


def _inventory() -> GpuInventory | None:
    try:
        return read_inventory()
    except NvmlUnavailable:
        return None


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
    if ray_address is not None:
        from pp_launch.app import on_ray

        streams.set_aside_ray_output()
        said = on_ray.gc(ray_address, dry_run)
        for line in said:
            click.echo(f"{'would release' if dry_run else 'released'} {line}")
        if not said:
            click.echo("nothing to collect", err=True)
        return
    engines = Engines(host_names, all_hosts)
    anything = False
    for name, engine in engines.reached:
        on = f" on host {name or 'local'}" if engines.several else ""
        dead = housekeeping.left_by_the_dead(engine)
        for c in dead:
            click.echo(
                f"{'would remove' if dry_run else 'removing'} {housekeeping.describe(c)}{on}: its run's "
                "guard and launcher are gone"
            )
        if dead and not dry_run:
            outcomes = housekeeping.stop_runs(engine, dead, 1.0, reason="launcher gone")
            for ref in (r for o in outcomes for r in o.orphans):
                click.echo(f"pp-launch: error: could not remove {ref[:12]}{on}", err=True)
                engines.failed = True
        for c in housekeeping.unrecorded(engine):
            why = "no guard of its run recorded it (not made by that run, or its guard was removed)"
            click.echo(f"not touched{on}: {housekeeping.describe(c)}: {why}; remove it yourself if it is yours")
        anything = anything or bool(dead) or bool(housekeeping.unrecorded(engine))
    if not dry_run:
        housekeeping.forget_ended([e for _, e in engines.reached])
    if not anything:
        click.echo("nothing to collect", err=True)
    engines.finish()
