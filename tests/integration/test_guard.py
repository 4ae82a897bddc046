"""The run's guard beside other clients of its engine (docs/chain.md, "The guard"): nothing another client does
to the guard ends or feeds the run by accident. An attach (the guard has no stdin) and its end, a second session,
`docker logs`: nothing changes. Stopped, killed, removed or paused by someone else: the launcher notices within a
second, says so in one line, and a new guard holds the run's containers (a launcher killed after that still leaves
nothing); when no new guard can be had, the run ends with the one teardown, exit 1, naming why."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time

import pytest

from ..helpers import BUSY_SLACK, Launcher, docker, guard_of, run_containers, running, wait_until

pytestmark = pytest.mark.docker
DEAF = ("--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1")


def held(*extra: str, env: dict[str, str] | None = None) -> tuple[Launcher, str, str]:
    """A held 2-stage chain, up: the launcher, its run, its guard's id."""
    chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", "--env", "STUB_MODE=hold",
                     *extra, env=env)  # fmt: skip
    run = chain.wait_event("pp_stage_roster", timeout=60)["run"]
    return chain, run, _guard(run, (env or {}).get("DOCKER_HOST", ""))


def _guard(run: str, host: str = "") -> str:
    argv = ["-H", host] if host else []
    found = docker(*argv, "ps", "-q", "--no-trunc", "--filter", f"label=pp-launch.run={run}",
                   "--filter", "label=pp-launch.stage=guard").stdout.split()  # fmt: skip
    assert len(found) == 1, found
    return found[0]


def _watchdog_of(run: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True).stdout
    return int(out.split()[0])


def test_an_attach_to_the_guard_its_logs_and_a_second_session_change_nothing(engine, stub_image) -> None:
    """An operator looking at the guard, then leaving, in every way docker allows; another session into it: the
    run goes on, with the same guard, which owns nothing it was not told by its launcher."""
    chain, run, guard = held()
    try:
        for args in (["attach", guard], ["attach", "--no-stdin", guard], ["attach", "--sig-proxy=false", guard]):
            attach = subprocess.Popen(["docker", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)  # fmt: skip
            time.sleep(0.5)  # attached a while, as an operator would be
            attach.send_signal(signal.SIGINT)  # ^C: passed on to the guard (sig-proxy), or the attach ends
            try:
                attach.wait(2)
            except subprocess.TimeoutExpired:
                attach.send_signal(signal.SIGHUP)  # the terminal closes: passed on too
                time.sleep(0.3)
                attach.kill()  # and the attach is gone
                attach.wait(10)
        assert docker("logs", guard).returncode == 0
        second = subprocess.run(
            ["docker", "exec", "-i", guard, "python3", "/usr/local/lib/pp-guard/pp_guard.py", "session"],
            input=f"own {'f' * 64}\ndetach\n", capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert second.stdout.startswith("taken: this guard has its session"), second.stdout
        time.sleep(LOST_WINDOW)
        assert chain.proc.poll() is None and running(guard), chain.stderr_text()
        assert len(run_containers(engine, run)) == 2 and _guard(run) == guard
        assert "another client" not in chain.stderr_text()
    finally:
        chain.signal(signal.SIGTERM)
        assert chain.wait(30) == 143, chain.stderr_text()
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 10)
    logged = docker("logs", guard).stderr
    assert "detached" not in logged and "f" * 64 not in logged


LOST_WINDOW = 1.0 + BUSY_SLACK  # the promise (noticed within a second) plus what a busy machine adds


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (["stop", "-t", "1"], "stopped (docker stop)"),
        (["kill"], "killed or removed"),
        (["rm", "-f"], "killed or removed"),
        (["pause"], "paused"),
    ],
    ids=["stop", "kill", "rm", "pause"],
)
def test_a_guard_another_client_ends_is_replaced_within_a_second_and_said(
    engine, stub_image, how: list[str], said: str
) -> None:
    chain, run, guard = held()
    try:
        began = time.monotonic()
        assert docker(*how, guard).returncode == 0
        line = re.compile(
            rf"\(container {guard[:12]}\) was {re.escape(said)} by another client: a new guard \(container "
            r"([0-9a-f]{12})\) holds the run's 2 containers"
        )
        assert wait_until(lambda: line.search(chain.stderr_text()), LOST_WINDOW), (line, chain.stderr_text())
        assert time.monotonic() - began < LOST_WINDOW  # said within the second (and the slack)
        new = line.search(chain.stderr_text())
        assert new is not None and running(new[1]), chain.stderr_text()  # said once the new guard runs, not before
        assert wait_until(lambda: [g for g in guard_of(engine, run) if g != guard and running(g)], 30)
        assert not running(guard) and chain.proc.poll() is None and len(run_containers(engine, run)) == 2
    finally:
        chain.signal(signal.SIGTERM)
        code = chain.wait(30)
    assert code == 143, chain.stderr_text()
    assert not any(e["reason"] == "completed" for e in chain.events_named("chain_stopped"))
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 10)
    assert docker("inspect", guard).returncode != 0  # the paused one too: removed by its id


@pytest.mark.parametrize("when", ["as-it-starts", "once-it-holds-the-session"])
def test_a_launcher_and_watchdog_killed_after_the_guard_was_removed_leave_nothing_within_15_s(
    engine, stub_image, when: str
) -> None:
    """Stages deaf to SIGTERM and to the end of their stdin: only a guard (or the watchdog) can remove them. The
    neighbour's `docker rm -f` of the guard, then SIGKILL of the launcher and of its watchdog: the new guard does,
    whether its launcher was stopped the moment the new guard started (before its session, mostly: it holds the
    run's ids from its start, and tears the run down when no session comes) or once it held the session."""
    chain, run, guard = held(*DEAF)
    started = subprocess.Popen(
        ["docker", "events", "--format", "{{.ID}}", "--filter", "type=container", "--filter", "event=start",
         "--filter", f"label=pp-launch.run={run}", "--filter", "label=pp-launch.stage=guard"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert docker("rm", "-f", guard).returncode == 0
        assert started.stdout is not None
        seen = select.select([started.stdout], [], [], 30)[0]  # the new guard started (nothing within 30 s: "")
        new = started.stdout.readline().strip() if seen else ""
        if when == "as-it-starts":
            chain.signal(signal.SIGSTOP)  # frozen right there, its session to the new guard most likely not yet open
    finally:
        started.kill()
        started.wait()
    assert new and new != guard, chain.stderr_text()
    if when == "once-it-holds-the-session":
        assert wait_until(lambda: "session: the launcher holds" in docker("logs", new).stderr, 30), chain.stderr_text()
    began = time.monotonic()
    os.kill(_watchdog_of(run), signal.SIGKILL)
    chain.signal(signal.SIGKILL)
    chain.wait(10)
    gone = wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)
    assert gone and time.monotonic() - began < 15, (run_containers(engine, run), chain.stderr_text())


@pytest.mark.parametrize("how", [["kill"], ["rm", "-f"], ["pause"], ["stop", "-t", "1"]])
def test_a_launcher_and_watchdog_killed_the_moment_a_guard_is_said_replaced_leave_nothing(
    engine, stub_image, how: list[str]
) -> None:
    """The line comes after the guarding: once the launcher says a new guard holds the run's containers, SIGKILL of
    the launcher and its watchdog at that very moment leaves nothing (stages deaf to SIGTERM and end of input: only
    the new guard can remove them), whatever another client did to the old guard."""
    chain, run, guard = held(*DEAF)
    said = re.compile(r"a new guard \(container ([0-9a-f]{12})\) holds the run's 2 containers")
    assert docker(*how, guard).returncode == 0
    assert wait_until(lambda: said.search(chain.stderr_text()), 10, interval=0.01), chain.stderr_text()
    os.kill(_watchdog_of(run), signal.SIGKILL)
    chain.signal(signal.SIGKILL)
    began = time.monotonic()
    chain.wait(10)
    if how == ["pause"]:
        docker("unpause", guard)  # the old guard, paused: the launcher removed it by id (nothing to unpause then)
    gone = wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)
    assert gone and time.monotonic() - began < 15, (run_containers(engine, run), chain.stderr_text())


def test_with_no_new_guard_to_be_had_the_run_ends_exit_1_naming_why(broken_engine) -> None:
    """The guard image untagged on the engine (a neighbour's `docker rmi -f`), then the guard removed: no new one
    can start, so the run is ended by the chain's one teardown, exit 1, `place_lost`, never "completed"."""
    side = broken_engine
    image = side.docker("inspect", "-f", "{{.Id}}", "pp-launch/guard:latest").stdout.strip()
    env = {"DOCKER_HOST": side.host}
    chain, run, guard = held(env=env)
    try:
        assert side.docker("rmi", "-f", "pp-launch/guard:latest").returncode == 0
        assert side.docker("rm", "-f", guard).returncode == 0
        assert chain.wait(30) == 1, chain.stderr_text()
    finally:
        side.docker("tag", image, "pp-launch/guard:latest")
    (stopped,) = chain.events_named("chain_stopped")
    assert stopped["reason"] == "place_lost" and stopped["exit_code"] == 1
    text = chain.stderr_text()
    assert (
        f"(container {guard[:12]}) was killed or removed by another client, and no new guard could be started" in text
    )
    assert "the run is ended rather than left unguarded" in text
    assert wait_until(lambda: side.docker("ps", "-aq", "--filter", f"label=pp-launch.run={run}").stdout == "", 15)
