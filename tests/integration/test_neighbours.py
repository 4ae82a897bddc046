"""Beside hostile neighbours: another client of the same engine forges our labels, prunes, removes our guard or
lock, and calls `down` while a run is still placing. What is ours is only what a run's guard recorded at create."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid

import pytest

from pp_launch.adapters.docker_engine import Engine
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import GUARD_IMAGE

from ..helpers import (
    Launcher,
    Relay,
    docker,
    forged,
    guard_of,
    remember_run,
    run_containers,
    running,
    unique,
    wait_until,
    watchdogs,
)

pytestmark = pytest.mark.docker
HOLD = ["--json", "--gpus", "none", "--env", "STUB_MODE=hold", "--grace", "1"]


def test_a_container_forging_a_live_runs_labels_survives_its_teardown_down_and_gc(engine, stub_image) -> None:
    chain = Launcher("chain", "--stages", "2", *HOLD)
    chain.wait_event("pp_stage_roster")
    run = chain.run_id
    someone = forged(run, unique("someone-elses-db"))
    try:
        assert wait_until(lambda: running(someone), 20)
        chain.signal(signal.SIGINT)
        assert chain.wait(30) == 130
        stopped = chain.events_named("chain_stopped")[-1]
        assert someone not in stopped["removed"] and stopped["orphans"] == []
        assert running(someone)  # the teardown acted on the ids it created, never on a label match
        down = Launcher("down", run, "--grace", "1")
        assert down.wait(30) == 1  # asked to stop a run of which nothing is provably ours: said, and not done
        said = down.stderr_text()
        assert "not touched" in said and f"nothing stopped: no guard of run {run} recorded" in said
        assert f"remove it with: docker rm -f {someone[:12]}" in said and running(someone)
        gc = Launcher("gc")
        assert gc.wait(30) == 0 and running(someone)
        assert any(someone[:12] in line or "someone-elses-db" in line for line in gc.stdout_lines)
        assert wait_until(lambda: guard_of(engine, run) == [], 10)
    finally:
        docker("rm", "-f", someone)


def test_prune_at_every_phase_of_a_detached_run_loses_nothing_and_leaves_nothing(engine, stub_image) -> None:
    """`docker container prune`, `system prune -f` and `network prune` while a detached run lives: its guard runs,
    so nothing of it is pruned; `ps` still says whose it is, `down` still ends it, and nothing is left."""
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "STUB_MODE=hold", "-d", "-q")
    assert up.wait(60) == 0, up.stderr_text()
    run = up.stdout_lines[-1].strip()
    remember_run(run)
    # each prune scoped to this run's label (what a neighbour's would hit of it is all of it), never the whole engine:
    # the suite's other workers share this engine, and a container of theirs made but not yet started is pruned too
    mine = ("--filter", f"label=pp-launch.run={run}")
    for prune in (
        ["container", "prune", "-f", *mine],
        ["system", "prune", "-f", *mine],
        ["network", "prune", "-f", *mine],
    ):
        assert docker(*prune).returncode == 0
        assert len(run_containers(engine, run)) == 2 and len(guard_of(engine, run)) == 1
    ps = Launcher("ps", "--json", "--run", run)
    assert ps.wait(30) == 0
    assert [(r["stage"], r["owner_status"]) for r in ps.events if r["role"] == "stage"] == [
        (0, "detached"),
        (1, "detached"),
    ]
    plain = Launcher("chain", "--stages", "2", "--gpus", "none")  # the next plain chain sweeps nothing away
    assert plain.wait(60) == 0
    assert len(run_containers(engine, run)) == 2
    down = Launcher("down", run, "--grace", "1")
    assert down.wait(30) == 0, down.stderr_text()
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)


def test_down_of_a_run_still_placing_stops_it_for_good(engine, stub_image) -> None:
    """`down` while stage 0 has not announced yet (stages come up in turn): the launcher never brings the run
    up afterwards; it ends non-zero, and nothing of the run is left."""
    chain = Launcher(
        "chain",
        "--stages",
        "3",
        *HOLD,
        "--bring-up",
        "in-turn",
        "--stage-env",
        "0:STUB_ANNOUNCE_DELAY=4",
    )
    chain.wait_event("stage_started")
    run = chain.run_id
    down = Launcher("down", run, "--grace", "1")
    assert down.wait(30) == 0, down.stderr_text()
    code = chain.wait(30)
    assert code == 143, chain.stderr_text()  # as a SIGTERM: stopped, not failed
    assert "stopped by 'pp-launch down'" in chain.stderr_text()
    assert not chain.events_named("pp_stage_roster")  # never up
    assert all(e["stage"] == 0 for e in chain.events_named("stage_started"))
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)


def test_a_held_container_whose_entry_ends_is_not_held(engine, stub_image) -> None:
    """A lock or guard whose entry ends at once (an image without the tool it runs: tini then exits 127) is
    refused when it is seen ended at start, and otherwise seen dead by id at the holder's next look."""
    eng: Engine = engine
    try:
        held = eng.hold(None, GUARD_IMAGE, {labels.RUN: "0" * 12, labels.STAGE: "lock"}, entrypoint=("no-such-tool",))
    except errors.EngineError as exc:
        assert "no-such-tool" in str(exc) or "ended by itself as soon as it started" in str(exc)
    else:
        assert held is not None and wait_until(lambda: not held.alive(), 10)
        held.release()
    assert wait_until(lambda: engine.containers([f"{labels.RUN}={'0' * 12}"]) == [], 10)


def test_a_launcher_frozen_with_its_link_silent_loses_its_run_within_15_s(engine, stub_image) -> None:
    """As a launcher whose machine froze or whose network link was cut: nothing closes, nothing more is said.
    Over a network the guard expects a beat (PP_LAUNCH_GUARD_HEARTBEAT, 8 s by default; 3 s here, forced on a
    local socket); silence tears the run down, stages deaf to SIGTERM and to end of input included."""
    import os
    import time

    chain = Launcher(
        "chain",
        "--stages",
        "2",
        *HOLD,
        "--env",
        "STUB_IGNORE_SIGTERM=1",
        "--env",
        "STUB_IGNORE_LIFELINE=1",
        env={"PP_LAUNCH_GUARD_HEARTBEAT": "3"},
    )
    chain.wait_event("pp_stage_roster")
    run = chain.run_id
    watchdog = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True)
    os.kill(int(watchdog.stdout.split()[0]), signal.SIGSTOP)  # frozen with it: the same machine
    chain.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 30)
        took = time.monotonic() - t0
        assert took < 15, took  # 3 s of silence, one grace (1 s), SIGKILL, the removals
    finally:
        os.kill(int(watchdog.stdout.split()[0]), signal.SIGKILL)
        chain.signal(signal.SIGKILL)
        chain.wait(10)


class TcpToUnix(Relay):
    """The suite's engine reached as over a network (tcp://127.0.0.1:PORT), by a small relay to its socket."""

    def __init__(self, path: str) -> None:
        server = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        super().__init__(server, path)


def test_an_engine_over_the_network_gets_a_guard_that_checks_its_socket_and_hears_a_heartbeat(
    engine, side_engine
) -> None:
    """Over tcp:// the guard reaches its engine through PP_LAUNCH_GUARD_SOCKET (default /var/run/docker.sock) and
    checks it is the same engine: pointed at another one (the side engine's socket), the launch is exit 2 naming the
    fix, nothing started; pointed right, the chain runs and its guard expects the launcher's heartbeat."""
    local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    relay, first = TcpToUnix(local), TcpToUnix(local)
    try:
        wrong = Launcher(
            "chain",
            "--stages",
            "2",
            "--gpus",
            "none",
            env={"DOCKER_HOST": first.url, "PP_LAUNCH_GUARD_SOCKET": str(side_engine.sock)},
        )
        assert wrong.wait(60) == 2
        first.close()  # the engine unreachable from here on: nothing may need it
        assert "is another engine" in wrong.stderr_text() and "PP_LAUNCH_GUARD_SOCKET" in wrong.stderr_text()
        # its guard was removed, and nothing else of the run was made: its watchdog was told so, and ends without
        # asking the engine (else it would try a gone engine for PP_WATCHDOG_PATIENCE)
        assert wait_until(lambda: watchdogs(DOCKER_HOST=first.url) == [], 10), watchdogs(DOCKER_HOST=first.url)
        right = Launcher(
            "chain",
            "--stages",
            "2",
            "--gpus",
            "none",
            *HOLD[:1],
            "--env",
            "STUB_MODE=hold",
            env={"DOCKER_HOST": relay.url, "PP_LAUNCH_GUARD_SOCKET": local},
        )
        right.wait_event("pp_stage_roster")
        (guard,) = guard_of(engine, right.run_id)
        env = engine.inspect(guard)["Config"]["Env"]
        assert "PP_GUARD_HEARTBEAT=8" in env  # over a network: silence is the end of the lifeline
        right.signal(signal.SIGINT)
        assert right.wait(30) == 130
        assert run_containers(engine, right.run_id) == [] and guard_of(engine, right.run_id) == []
        # the runs' watchdogs reach the engine through the relay: each has ended (its sweep done) before it closes
        assert wait_until(lambda: watchdogs(DOCKER_HOST=relay.url) == [], 60), watchdogs(DOCKER_HOST=relay.url)
    finally:
        relay.close()
        first.close()


def test_the_watchdog_removes_a_create_whose_answer_never_came_back_and_only_that(engine, stub_image) -> None:
    """A launcher killed between a create and reading its answer (the guard's own create included): the watchdog knew
    the name before the create; at EOF it removes that name only when it carries the run's label and never started.
    A same-named neighbour of another run, or one that runs, is not touched; `done` means nothing is asked at all."""
    from pp_launch.adapters import watchdog
    from pp_launch.adapters.guard import guard_name

    run, other = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    remember_run(run)

    def create(name: str, run_id: str, start: bool) -> str:
        out = docker(
            "run" if start else "create",
            *(["-d"] if start else []),
            "--name",
            name,
            "--network",
            "none",
            "--label",
            f"{labels.RUN}={run_id}",
            "--label",
            f"{labels.STAGE}=0",
            "--label",
            f"{labels.OWNER}=x",
            "--label",
            f"{labels.GPUS}=",
            "-e",
            "STUB_MODE=hold",
            "pp-launch/stub-worker:latest",
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    name = guard_name(run)
    unanswered = create(name, run, start=False)  # the guard's create, its answer never read
    foreign = create(unique("not-started-other-run"), other, start=False)
    live = create(unique("running-same-run"), run, start=True)
    try:
        keeper = watchdog.spawn(run, 1.0)
        assert keeper.stdin is not None
        for told in (
            name,
            docker("inspect", "-f", "{{.Name}}", foreign).stdout.strip("/\n"),
            docker("inspect", "-f", "{{.Name}}", live).stdout.strip("/\n"),
        ):
            keeper.stdin.write(f"expect {told}\n".encode())
        keeper.stdin.close()  # the launcher is gone
        assert keeper.wait(30) == 0
        assert engine.inspect(unanswered) is None  # ours: this run's label, its name told, never started
        assert engine.inspect(foreign) is not None and running(live)  # another run's; a running one: untouched

        done = watchdog.spawn(run, 1.0)
        assert done.stdin is not None
        done.stdin.write(f"own {live}\ndone\n".encode())  # a clean end: the launcher saw its ids gone
        done.stdin.close()
        assert done.wait(30) == 0 and running(live)  # it believed the launcher and asked nothing
    finally:
        for ref in (unanswered, foreign, live):
            docker("rm", "-f", ref)
