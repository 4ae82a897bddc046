"""Threads with owners: every command path run in this process, on a real engine, ends with the threads it began
with. Each path is the CLI's own (`main` with the command's argv), so what a user's program gets when it calls
pp-launch in-process is what is counted: a chain, a detached chain and its `down`, `logs -f` interrupted, `wait`,
`worker check`, and a chain whose engine is lost mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
import pytest

from ..helpers import remember_run, unique, wait_until

pytestmark = pytest.mark.docker


def run_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The CLI in this process (as `pp-launch ARGV`): its exit code and what it wrote on stdout."""
    from click.testing import CliRunner

    from pp_launch.cli import main as cli_main

    runner = CliRunner()
    with _environ(env or {}):
        result = runner.invoke(cli_main.main, list(argv), catch_exceptions=False)
    return result.exit_code, result.stdout


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """The command installs its own signal handlers (as the console entry does): pytest's come back after."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)


def ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t is not threading.main_thread()}


def left_after(path: Callable[[], Any]) -> list[str]:
    """The threads a command path left running once it returned (the names of those it started and never
    joined); a thread that is ending is given 2 s, never more."""
    before = ours()
    with signals_kept():
        path()
    wait_until(lambda: not (ours() - before), 2)
    return sorted(t.name for t in ours() - before)


def test_a_chain_leaves_no_thread(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    def path() -> None:
        code, out = run_cli("chain", "--stages", "3", "--gpus", "none", "--json")
        assert code == 0 and '"reason":"completed"' in out, out[-2000:]

    assert left_after(path) == []


def test_a_detached_chain_its_wait_and_its_down_leave_no_thread(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    run: list[str] = []

    def detach() -> None:
        code, out = run_cli("chain", "--stages", "2", "--gpus", "none", "--detach", "--env", "STUB_MODE=hold")
        assert code == 0, out
        run.append(out.strip())
        remember_run(run[0])  # the suite's own: its leak check counts it

    try:
        assert left_after(detach) == []
        assert left_after(lambda: run_cli("wait", run[0], "--until", "announced", "--timeout", "60")) == []
        assert left_after(lambda: run_cli("down", run[0], "--grace", "1")) == []
    finally:
        if run:
            run_cli("down", run[0], "--grace", "1")  # a no-op once it went above; never left behind


def test_logs_follow_interrupted_leaves_no_thread(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    code, out = run_cli("chain", "--stages", "2", "--gpus", "none", "--detach", "--env", "STUB_MODE=hold")
    assert code == 0, out
    run = out.strip()
    remember_run(run)

    def follow_then_ctrl_c() -> None:
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 2.0)  # Ctrl-C 2 s into the follow (no thread of the test's own)
        try:
            with contextlib.suppress(KeyboardInterrupt, SystemExit, click.exceptions.Abort):
                run_cli("logs", run, "-f")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    try:
        assert left_after(follow_then_ctrl_c) == []
    finally:
        run_cli("down", run, "--grace", "1")


def test_worker_check_leaves_no_thread(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    def path() -> None:
        code, out = run_cli("worker", "check", stub_image)
        assert code == 0, out

    assert left_after(path) == []


def test_a_lost_engine_leaves_no_thread(broken_engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """The engine is killed mid-run: the chain ends (exit 1) and every thread it started ended with it. (Its
    watchdog, a process of its own, removes what is left once the engine is back, then ends: waited for here.)"""
    side = broken_engine
    prefix = unique("thr")
    env = {"DOCKER_HOST": side.host, "PP_ENGINE_TIMEOUT": "5"}
    said: list[str] = []

    def path() -> None:
        def kill_when_up() -> None:
            up = wait_until(lambda: len(side.docker("ps", "-q", "--filter", f"name={prefix}-").stdout.split()) == 2, 60)
            assert up
            side.kill()

        killer = threading.Thread(target=kill_when_up, name="test-engine-killer")
        killer.start()
        try:
            argv = ("chain", "--stages", "2", "--gpus", "none", "--name", prefix, "--env", "STUB_MODE=hold", "--json")
            code, out = run_cli(*argv, env=env)
        finally:
            killer.join(90)
        said.append(out)
        assert code == 1

    began = time.monotonic()
    assert left_after(path) == []
    assert time.monotonic() - began < 120
    side.ensure_running()
    run = json.loads(said[0].splitlines()[0])["run"]
    assert wait_until(lambda: not watchdogs_of(run), 60), "the run's watchdog still runs with its engine back"


def watchdogs_of(run: str) -> list[str]:
    pattern = f"pp_launch.adapters.watchdog {run}"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
