"""`pp-launch logs` and `pp-launch wait`: a run's output and its state, for runs of any owner (detached too)."""

from __future__ import annotations

import re
import sys
import time

import click
from click.shell_completion import CompletionItem

from pp_launch.app import housekeeping, runs
from pp_launch.cli.engines import RAY_OPTION, host_choice, voice, where
from pp_launch.cli.main import main
from pp_launch.cli.options import Seconds
from pp_launch.core import errors


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of run ids, from the engine's labels (nothing when no engine answers)."""
    try:
        known = housekeeping.run_ids(timeout=3)
    except Exception:
        return []
    return [CompletionItem(r) for r in sorted(known) if r and r.startswith(incomplete)]


def _since(value: str | None) -> int | None:
    """--since: seconds ago (`90`, `90s`, `5m`, `2h`) -> a Unix time for the engine."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", value)
    if not m:
        raise click.BadParameter(f"{value!r} is not a duration: use 90, 90s, 5m or 2h", param_hint="--since")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    return int(time.time() - seconds)


@main.command()
@click.argument("run_id", shell_complete=complete_runs)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="What is there first (merged in time order, as the engine timed it), then each new line as it comes, "
    "until every stage of the run is gone (as docker logs -f).",
)
@click.option("--stage", "stages", type=int, multiple=True, metavar="K", help="Only stage K (repeatable).")
@click.option("--since", metavar="DURATION", help="Only lines of the last DURATION (90, 90s, 5m, 2h).")
@click.option("-n", "--tail", type=click.IntRange(min=0), metavar="N", help="Only each stage's last N lines.")
@click.option("-t", "--timestamps", is_flag=True, help="Each line with its time (UTC), as docker logs -t.")
@click.option("--log-dir", type=click.Path(file_okay=False), metavar="DIR", help="Where chain --log-dir kept it.")
@host_choice
@RAY_OPTION
def logs(
    run_id: str,
    follow: bool,
    stages: tuple[int, ...],
    since: str | None,
    tail: int | None,
    timestamps: bool,
    log_dir: str | None,
    host_names: tuple[str, ...],
    all_hosts: bool,
    ray_address: str | None,
) -> None:
    """Print a run's output, each line prefixed with its stage, as `docker compose logs` does.

    Works for any run the engine has (foreground, detached, compose), and after a run ended: every chain keeps
    its stages' output (bounded) in your state directory (or chain --log-dir), and a detached run's guard keeps
    what they print after the hand-over in the run's record on the engine (a stage that crashed while the others
    run is shown from there too). RUN_ID may be a unique prefix.
    Without -f, every stage's output so far (with -n, each stage's last N lines), in the order it was printed;
    with -f, every stage's lines as they come, until the run ends.

    \b
    Examples:
      pp-launch logs 3f2a
      pp-launch logs 3f2a -n 20 -t
      pp-launch logs 3f2a -f --stage 0 --since 5m
      pp-launch logs 3f2a --all-hosts
      pp-launch logs 3f2a --ray 10.0.0.1:6379 -n 50   (a detached run on a Ray cluster: its last lines)
    """
    view = runs.LogView(stages, _since(since), tail, timestamps, follow, log_dir)
    if not runs.logs(where(host_names, all_hosts, ray_address), run_id, view, voice()):
        sys.exit(errors.EXIT_FAILURE)


@main.command()
@click.argument("run_id", shell_complete=complete_runs)
@click.option(
    "--until",
    type=click.Choice(["announced", "exit"]),
    default="exit",
    show_default=True,
    help="announced: until every stage printed its address (prints them; a stage that has ended already is said "
    "on stderr with its exit code, exit 1); exit: until every stage is gone (prints each exit code).",
)
@click.option("--timeout", type=Seconds(), default=None, metavar="S", help="Give up after S seconds (exit 1).")
@host_choice
@RAY_OPTION
def wait(
    run_id: str,
    until: str,
    timeout: float | None,
    host_names: tuple[str, ...],
    all_hosts: bool,
    ray_address: str | None,
) -> None:
    """Wait for a run: until every stage announced, or until every stage ended.

    --until exit (the default) prints each stage's exit code, as `docker wait` does, and exits 0 once every code
    is known, whatever the codes are; 1 when a code cannot be told or the timeout passed. --until announced prints
    each stage's address and exits 0 when every stage announced; 1 when one ended first or the timeout passed.
    2 when there is no such run. RUN_ID may be a unique prefix.

    \b
    Examples:
      RUN=$(pp-launch chain --stages 4 --detach) && pp-launch wait "$RUN" --until announced
      pp-launch wait 3f2a --timeout 600
      pp-launch wait 3f2a --ray 10.0.0.1:6379   (a detached run on a Ray cluster: until its stages are gone)
    """
    sys.exit(runs.wait(where(host_names, all_hosts, ray_address), run_id, until, timeout, voice()))
