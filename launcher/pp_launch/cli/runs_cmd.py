"""`pp-launch logs` and `pp-launch wait`: a run's output and its state, for runs of any owner (detached too)."""

from __future__ import annotations

import contextlib
import queue
import re
import sys
import threading
import time
from typing import Any

import click
from click.shell_completion import CompletionItem

from pp_launch.adapters import run_logs
from pp_launch.adapters.docker_engine import Engine
from pp_launch.app import housekeeping
from pp_launch.cli import streams
from pp_launch.cli.engines import RAY_OPTION, Engines, host_choice
from pp_launch.cli.main import main
from pp_launch.cli.options import Seconds
from pp_launch.core import errors, labels
from pp_launch.core.lines import count, display


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of run ids, from the engine's labels (nothing when no engine answers)."""
    try:
        runs = housekeeping.run_ids(timeout=3)
    except Exception:
        return []
    return [CompletionItem(r) for r in sorted(runs) if r and r.startswith(incomplete)]


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
@click.option("-f", "--follow", is_flag=True, help="Keep printing until every stage of the run is gone.")
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
    its stages' output (bounded) in your state directory (or chain --log-dir). RUN_ID may be a unique prefix.
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
    if ray_address is not None:
        _ray_logs(ray_address, run_id, stages, tail, follow)
        return
    engines = Engines(host_names, all_hosts, run_id)
    try:
        run, found = engines.find_run(run_id)
    except errors.ConfigError:
        if follow or not _print_kept(run_id, stages, tail, timestamps, log_dir):
            raise
        engines.finish()
        return
    found = [(e, c) for e, c in found if housekeeping.is_stage(c)]  # not its lock or guard
    if stages:
        found = [(e, c) for e, c in found if labels.ascii_int(c.labels.get(labels.STAGE, "")) in stages]
        if not found:
            raise errors.ConfigError(f"run {run} has no stage {', '.join(map(str, stages))}")
    when = _since(since)
    out = sys.stdout

    def prefix(c: Any) -> str:
        return f"[stage {display(c.labels.get(labels.STAGE, '?').encode())}] "

    if not follow:  # every stage's lines (its last `tail`), merged in the order the engine timed them
        rows = []
        for engine, c in found:
            for line in engine.log_lines(c.id, since=when, tail=tail, timestamps=True):
                stamp, _, text = line.partition(b" ")
                rows.append((_instant(stamp.decode("ascii", "replace")), prefix(c), line if timestamps else text))
        for _, head, line in sorted(rows, key=lambda row: row[0]):  # stable: a stage's own order is kept
            out.write(head + display(line) + "\n")
        out.flush()
        engines.finish()
        return
    lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=10000)
    closers: list[Any] = []  # each stream's close, once open: an interrupted follow ends every pump by them

    def pump(engine: Engine, c: Any) -> None:
        try:
            for line in engine.log_lines(
                c.id, follow=True, since=when, tail=tail, timestamps=timestamps, opened=closers.append
            ):
                lines.put((prefix(c), line))
        finally:
            lines.put(None)

    pumps = [threading.Thread(target=pump, args=(e, c), daemon=True, name=f"logs-{c.name}") for e, c in found]
    for t in pumps:
        t.start()
    try:
        running = len(found)
        while running:
            item = lines.get()
            if item is None:
                running -= 1
                continue
            out.write(item[0] + display(item[1]) + "\n")
            out.flush()
    finally:  # every stage ended, or Ctrl-C: each stream closed, the queue drained until each pump ended, joined
        _end_pumps(pumps, closers, lines)
    engines.finish()


def _end_pumps(pumps: list[threading.Thread], closers: list[Any], lines: queue.Queue[Any]) -> None:
    """Close every log stream (a pump still opening one closes it as soon as it is open) and take what the pumps
    still put, until each has ended; then join them: none is left behind, interrupted or not."""
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in pumps) and time.monotonic() < deadline:
        for close in list(closers):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(queue.Empty):
            lines.get(timeout=0.05)
    for t in pumps:
        t.join(max(0.0, deadline - time.monotonic()))


def _ray_logs(address: str, run_id: str, stages: tuple[int, ...], tail: int | None, follow: bool) -> None:
    """Each stage's last lines as its node's agent kept them (up to 2000 a stage); with -f, then each new line
    until every stage is gone (-t and --since are the engines' alone)."""
    from pp_launch.app import on_ray

    def show(lines: list[tuple[int, str, str]]) -> None:
        for stage, stream, text in lines:
            if not stages or stage in stages:
                click.echo(f"[stage {stage}] {text}", err=stream == "stderr")

    streams.set_aside_ray_output()
    _, lines = on_ray.logs(address, run_id, tail or 0, show if follow else None)
    show(lines)


def _wait_ray(address: str, run_id: str, until: str, timeout: float | None) -> None:
    """A detached run on Ray is up once every stage announced, so --until announced holds at once; --until exit
    waits for every container to be gone and prints each stage's exit code as its node's agent saw it."""
    from pp_launch.app import on_ray

    streams.set_aside_ray_output()
    if until == "announced":
        run, _, _ = on_ray.wait_gone(address, run_id, 0.0)
        click.echo(f"run {run}: up (a detached run on Ray is handed over once every stage announced)")
        return
    run, left, exits = on_ray.wait_gone(address, run_id, timeout)
    if left:
        click.echo(f"pp-launch: error: run {run}: {count(left, 'container')} still there after {timeout:g} s", err=True)
        sys.exit(errors.EXIT_FAILURE)
    for stage, (name, code) in exits.items():
        click.echo(f"stage {stage} {name} exited {'with an unknown code' if code is None else code}")
    click.echo(f"run {run}: every stage is gone ('pp-launch gc --ray' releases its GPUs)")
    if any(code != 0 for _, code in exits.values()):
        sys.exit(errors.EXIT_FAILURE)


def _instant(stamp: str) -> str:
    """An RFC 3339 time (the engine's, or ours) in a form that sorts as time does: the fraction to 9 digits (Go
    drops trailing zeros)."""
    whole, dot, rest = stamp.rstrip("Z").partition(".")
    return f"{whole}.{(rest if dot else '').ljust(9, '0')[:9]}"


def _print_kept(prefix: str, stages: tuple[int, ...], tail: int | None, timestamps: bool, log_dir: str | None) -> bool:
    """A run the engine no longer has, from what its launcher kept; False when nothing was kept for it."""
    kept = run_logs.kept_runs(log_dir)
    matches = [r for r in kept if r.startswith(prefix)]
    if len(matches) != 1:
        if len(matches) > 1:
            raise errors.ConfigError(f"run {housekeeping.safe(prefix)!r} is ambiguous: {', '.join(matches)}")
        return False
    lines = [k for k in run_logs.read(matches[0], log_dir) if not stages or k.stage in stages]
    by_stage: dict[int, list[run_logs.KeptLine]] = {}
    for k in lines:
        by_stage.setdefault(k.stage, []).append(k)
    shown = []
    for stage in sorted(by_stage):
        shown += by_stage[stage] if tail is None else by_stage[stage][len(by_stage[stage]) - tail :] if tail else []
    for k in sorted(shown, key=lambda k: _instant(k.time)):  # in time order, as the engine's are
        click.echo(f"[stage {k.stage}] " + (f"{k.time} " if timestamps else "") + display(k.text.encode()))
    return True


@main.command()
@click.argument("run_id", shell_complete=complete_runs)
@click.option(
    "--until",
    type=click.Choice(["announced", "exit"]),
    default="exit",
    show_default=True,
    help="announced: until every stage printed its address (prints them); exit: until every stage is gone "
    "(prints each exit code).",
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

    Exit 0 when the condition is met (for --until exit: when every stage exited 0), 1 when a stage failed,
    ended before announcing, or the timeout passed; 2 when there is no such run. RUN_ID may be a unique prefix.

    \b
    Examples:
      RUN=$(pp-launch chain --stages 4 --detach) && pp-launch wait "$RUN" --until announced
      pp-launch wait 3f2a --timeout 600
      pp-launch wait 3f2a --ray 10.0.0.1:6379   (a detached run on a Ray cluster: until its stages are gone)
    """
    if ray_address is not None:
        _wait_ray(ray_address, run_id, until, timeout)
        return
    engines = Engines(host_names, all_hosts, run_id)
    run, every = engines.find_run(run_id)
    found = [(e, c) for e, c in every if housekeeping.is_stage(c)]  # not its lock or guard
    deadline = None if timeout is None else time.monotonic() + timeout
    if until == "announced":
        _wait_announced(run, found, deadline)
    else:
        _wait_exit(run, found, deadline)
    engines.finish()


def _stage(c: Any) -> str:
    """A stage as `wait` names it: its index, and its attempt once its run was restarted (--max-restarts)."""
    attempt = labels.ascii_int(c.labels.get(labels.ATTEMPT, ""))
    again = f" (attempt {attempt})" if attempt is not None and attempt > 1 else ""
    return display(c.labels.get(labels.STAGE, "?").encode()) + again


def _wait_announced(run: str, found: list[tuple[Engine, Any]], deadline: float | None) -> None:
    addresses: dict[str, str] = {}
    while True:
        for engine, c in found:
            if c.id in addresses:
                continue
            if engine.inspect(c.id) is None:
                raise errors.PpLaunchError(f"run {run}: stage {_stage(c)} ({c.name}) ended before it announced")
            addr = housekeeping.announced(engine, c.id)
            if addr is not None:
                addresses[c.id] = addr
                click.echo(f"stage {_stage(c)} {c.name} {addr}")
        if len(addresses) == len(found):
            return
        if deadline is not None and time.monotonic() > deadline:
            missing = ", ".join(_stage(c) for _, c in found if c.id not in addresses)
            raise errors.PpLaunchError(f"run {run}: stages {missing} did not announce within the timeout")
        time.sleep(0.25)


def _wait_exit(run: str, found: list[tuple[Engine, Any]], deadline: float | None) -> None:
    codes: dict[str, int | None] = {}

    def one(engine: Engine, c: Any) -> None:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        kept = c.labels.get(labels.OWNER, "").startswith(labels.OWNER_COMPOSE_PREFIX)  # compose keeps its stages
        with contextlib.suppress(errors.PpLaunchError):
            codes[c.id] = engine.wait_removed(c.id, left, "not-running" if kept else "removed")

    threads = [threading.Thread(target=one, args=(e, c), daemon=True) for e, c in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worst = 0
    for _, c in found:
        if c.id not in codes:
            raise errors.PpLaunchError(f"run {run}: stage {_stage(c)} ({c.name}) still runs after the timeout")
        code = codes[c.id]
        click.echo(f"stage {_stage(c)} {c.name} exited {'with an unknown code' if code is None else code}")
        if code != 0 and worst == 0:
            worst = 1
    sys.exit(worst)
