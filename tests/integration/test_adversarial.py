"""On the real engine: what is not ours is never touched, and bad input is refused, not crashed on.
Each test here failed on the code before the fix it names."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from pp_launch.adapters import identity
from pp_launch.core import labels

from ..helpers import BUSY_SLACK, NOBODY, Launcher, guard_of, remember_run, run_containers, unique, wait_until

pytestmark = pytest.mark.docker


def held(stub_image: str, name: str) -> DockerContainer:
    c = DockerContainer(stub_image, name=name, network_mode="host").with_env("STUB_MODE", "hold")
    c.waiting_for(LogMessageWaitStrategy("holding")).start()
    return c


def test_a_name_held_by_a_foreign_container_is_exit_2_and_the_holder_is_untouched(engine, stub_image) -> None:
    prefix = unique("coll")
    decoy = held(stub_image, f"{prefix}-0")
    try:
        launcher = Launcher("chain", "--name", prefix, "--gpus", "none", "--json")
        assert launcher.wait(60) == 2
        text = launcher.stderr_text()
        assert f"container name {prefix}-0 is held by a container not made by pp-launch" in text
        assert "left untouched" in text
        assert engine.inspect(decoy.get_container_id())["State"]["Running"]
        assert not launcher.events_named("stage_started")  # nothing of the run started
    finally:
        decoy.stop()


def test_a_name_held_by_a_live_chain_is_exit_2_naming_its_run_and_that_chain_lives_on(engine, stub_image) -> None:
    prefix = unique("coll")
    first = Launcher("chain", "--name", prefix, "--gpus", "none", "--json", "--env", "STUB_MODE=hold")
    roster = first.wait_event("pp_stage_roster", timeout=60)
    try:
        second = Launcher("chain", "--name", prefix, "--stages", "3", "--gpus", "none", "--json")
        assert second.wait(60) == 2
        text = second.stderr_text()
        assert f"container name {prefix}-0 is held by stage 0 of pp-launch run {roster['run']}" in text
        assert f"pp-launch down {roster['run']}" in text
        assert len(run_containers(engine, roster["run"])) == 2  # the first chain is whole
    finally:
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 143
    assert run_containers(engine, roster["run"]) == []


def test_malformed_labels_on_a_foreign_container_crash_nothing_and_it_is_untouched(engine, stub_image) -> None:
    host = socket.gethostname()
    bad = DockerContainer(
        stub_image,
        network_mode="host",
        labels={labels.RUN: unique("bad"), labels.STAGE: "²", labels.OWNER: f"{host}:²:1", labels.GPUS: "\x1b[2J"},
    ).with_env("STUB_MODE", "hold")
    bad.waiting_for(LogMessageWaitStrategy("holding")).start()
    remember_run(bad._kwargs["labels"][labels.RUN])
    try:
        for args in (("gc",), ("ps",), ("ps", "--json")):
            cmd = Launcher(*args)
            assert cmd.wait(30) == 0, cmd.stderr_text()
            assert "Traceback" not in cmd.stderr_text()
            assert all("\x1b" not in line for line in cmd.stdout_lines)
        ps = Launcher("ps")
        assert ps.wait(30) == 0
        row = next(line for line in ps.stdout_lines if bad._kwargs["labels"][labels.RUN] in line)
        assert "unrecorded: no guard of its run made it (never touched)" in row
        chain = Launcher("chain", "--gpus", "none", "--json")  # its sweep and its GPU pick read the same labels
        assert chain.wait(60) == 0, chain.stderr_text()
        assert engine.inspect(bad.get_container_id())["State"]["Running"]
    finally:
        bad.stop()


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs util-linux unshare as root")
def test_a_launcher_in_another_pid_namespace_is_not_judged_by_the_hosts_gc(engine, stub_image) -> None:
    """A launcher with its own PID namespace (as in a container or a pod on the host network) writes a pid that
    means nothing here. The old sweep judged it gone and removed a live chain."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM", sys.executable, "-m", "pp_launch"]
    argv += ["chain", "--gpus", "none", "--json", "--env", "STUB_MODE=hold"]
    inner = Launcher.from_argv(argv)
    roster = inner.wait_event("pp_stage_roster", timeout=60)
    run = roster["run"]
    owner = engine.containers([f"{labels.RUN}={run}"])[0].labels[labels.OWNER]
    assert f":pidns-{identity.pid_namespace()}" not in owner and ":pidns-" in owner
    gc = Launcher("gc")
    assert gc.wait(30) == 0
    assert len(run_containers(engine, run)) == 2  # a live chain: never removed
    ps = Launcher("ps")
    assert ps.wait(30) == 0
    assert all("owner in another PID namespace: not judged" in line for line in ps.stdout_lines if run in line)
    # unshare ignores SIGTERM while it waits; killed, it has the kernel send SIGTERM to the launcher
    # (--kill-child), whose own teardown then cleans up inside its namespace
    inner.signal(signal.SIGKILL)
    inner.wait(30)
    assert wait_until(lambda: run_containers(engine, run) == [], 30)


def test_an_announcement_longer_than_64_kib_is_rejected_never_passed_on(engine, stub_image) -> None:
    line = "PP_GPU_NODE_ADDR " + "ab" * 32 + " " + ",".join(f"10.1.{i // 250}.{i % 250}:9" for i in range(6000))
    launcher = Launcher("chain", "--gpus", "none", "--json", "--stage-env", f"0:STUB_ANNOUNCE_LINE={line}")
    assert launcher.wait(60) == 1
    assert "stage 0 (" in launcher.stderr_text()
    assert "an announcement longer than the line limit was rejected" in launcher.stderr_text()
    # every stage starts at once; stage 1's worker never started: it never got a hand-off, cut or whole
    assert [e["stage"] for e in launcher.events_named("stage_started")] == [0, 1]
    assert not any(line.startswith("[stage 1]") for line in launcher.stderr_lines)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_pp_stop_grace_must_be_a_finite_non_negative_number(engine, stub_image, value: str) -> None:
    node = Launcher("node", env={"STAGE": "0", "PP_IMAGE": stub_image, "PP_STOP_GRACE": value})
    assert node.wait(30) == 2
    assert "PP_STOP_GRACE" in node.stderr_text()


def test_env_reaches_gpu_node_stages_without_pp_forward_env(engine, stub_image) -> None:
    gpu_node = shutil.which("pp-gpu-node", path=os.path.dirname(sys.executable))
    assert gpu_node is not None
    launcher = Launcher(
        "chain", "--gpus", "none", "--json", "--gpu-node", gpu_node, "--env", "STUB_MODE=hold", "--env", "MY_KNOB=42"
    )
    roster = launcher.wait_event("pp_stage_roster", timeout=60)
    try:
        for name in run_containers(engine, roster["run"]):
            env = engine.inspect(name)["Config"]["Env"]
            assert "MY_KNOB=42" in env and "STUB_MODE=hold" in env
    finally:
        launcher.signal(signal.SIGTERM)
        assert launcher.wait(30) == 143
    assert run_containers(engine, roster["run"]) == []


def _detached_while_coming_up(*knobs: str) -> tuple[Launcher, str]:
    """A --detach run killed while stage 1 is still starting (it takes 30 s to announce)."""
    up = Launcher(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--detach",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "1:STUB_ANNOUNCE_DELAY=30",
        *knobs,
    )
    assert wait_until(lambda: "bringing up 2 stages" in up.stderr_text(), 30), up.stderr_text()
    run = up.stderr_text().split("pp-launch: run ", 1)[1][:12]
    remember_run(run)
    assert wait_until(lambda: "stage 1 started" in up.stderr_text(), 30), up.stderr_text()
    return up, run


def _watchdog_of(run: str) -> int:
    import subprocess

    out = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True).stdout
    return int(out.split()[0])


def test_a_detached_run_killed_during_bring_up_is_removed_by_its_watchdog(engine, stub_image) -> None:
    up, run = _detached_while_coming_up("--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1")
    up.signal(signal.SIGKILL)
    assert wait_until(lambda: run_containers(engine, run) == [], 15)  # before: a half-chain nobody collects


def test_a_detached_run_killed_with_its_watchdog_during_bring_up_goes_by_its_lifeline(engine, stub_image) -> None:
    up, run = _detached_while_coming_up()
    os.kill(_watchdog_of(run), signal.SIGKILL)
    up.signal(signal.SIGKILL)
    assert wait_until(lambda: run_containers(engine, run) == [], 10)


def test_a_detached_run_deaf_to_all_killed_while_coming_up_goes_with_its_guard(engine, stub_image, tmp_path) -> None:
    """Stages deaf to SIGTERM and to their lifeline, the watchdog killed with the launcher before the run was handed
    over: the run's guard on the engine removes them; ps and gc need no state directory to say so."""
    up, run = _detached_while_coming_up("--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1")
    os.kill(_watchdog_of(run), signal.SIGKILL)
    up.signal(signal.SIGKILL)
    up.wait(10)
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 20)
    stateless = {"PP_LAUNCH_STATE_DIR": str(tmp_path / "never-made")}
    ps = Launcher("ps", "--json", env=stateless)
    assert ps.wait(30) == 0, ps.stderr_text()
    assert [r for r in ps.events if r["run"] == run] == []
    gc = Launcher("gc", env=stateless)
    assert gc.wait(30) == 0, gc.stderr_text()
    assert not (tmp_path / "never-made").exists()


def test_a_detached_run_once_up_outlives_its_launcher_lifeline_and_watchdog(engine, stub_image) -> None:
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--detach", "--env", "STUB_MODE=hold")
    assert up.wait(60) == 0, up.stderr_text()
    run = up.stdout_lines[0]
    remember_run(run)
    assert up.stdout_lines == [run]  # stdout is the run id alone; stage lines went to stderr
    assert "[stage 0] PP_GPU_NODE_ADDR" in up.stderr_text()
    found = engine.containers([f"pp-launch.run={run}"])
    ids = [c.id for c in found if c.labels["pp-launch.stage"] != labels.STAGE_GUARD]
    assert len(ids) == 2 and len(found) == 3  # the hand-over is on the engine: the run's guard owns it now
    # the handed-over stages were told their stdin is no lifeline now: the launcher's exit did not stop them
    for cid in ids:
        assert wait_until(lambda cid=cid: b"detached: stdin is no longer a lifeline" in _logs(engine, cid), 10)
    assert Launcher("gc").wait(30) == 0
    assert all(engine.inspect(cid)["State"]["Running"] for cid in ids)
    assert Launcher("down", run, "--grace", "2").wait(30) == 0
    assert run_containers(engine, run) == [] and guard_of(engine, run) == []


def _logs(engine, cid: str) -> bytes:  # type: ignore[no-untyped-def]
    return bytes(engine.api.logs(cid, stdout=True, stderr=True))


@pytest.mark.parametrize("sigterm", ["honoured", "ignored"])
def test_ctrl_c_ends_a_flooding_chain_within_its_grace_plus_a_second(engine, stub_image, sigterm: str) -> None:
    """4 stages at 20,000 lines/s: before, 32 s of silence, a ReadTimeout traceback and exit 1 (our readers
    stopped draining the engine, whose kill then waited on the stalled output)."""
    knobs = ["--env", "STUB_IGNORE_SIGTERM=1"] if sigterm == "ignored" else []
    launcher = Launcher(
        "chain",
        "--stages",
        "4",
        "--gpus",
        "none",
        "--grace",
        "2",
        "--env",
        "STUB_MODE=hold",
        "--env",
        "STUB_LOG_RATE=20000",
        *knobs,
    )
    assert wait_until(lambda: "roster of run" in launcher.stderr_text(), 60), launcher.stderr_text()[-2000:]
    run = launcher.stderr_text().split("roster of run ", 1)[1][:12]
    t0 = time.monotonic()
    launcher.signal(signal.SIGINT)
    assert launcher.wait(30) == 130
    assert time.monotonic() - t0 < 2 + BUSY_SLACK  # the grace, not the 32 s of silence it was
    assert "Traceback" not in launcher.stderr_text()
    assert run_containers(engine, run) == []


def test_a_watchdog_starts_whatever_the_launchers_working_directory_holds(engine, stub_image, tmp_path, monkeypatch):
    """Item 4: `python -m` put the launcher's working directory first on the watchdog's path, so a
    planted logging.py kept it from starting and a killed launcher left its stages running."""
    marker = tmp_path / "imported"
    for name in ("logging", "docker", "pp_launch", "subprocess", "json", "signal"):
        (tmp_path / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise SystemExit(42)\n"
        )
    monkeypatch.chdir(tmp_path)
    program = str(Path(sys.executable).parent / "pp-launch")  # the console script: its own path is not the cwd
    up = Launcher.from_argv(
        [
            program,
            "chain",
            "--stages",
            "2",
            "--gpus",
            "none",
            "--json",
            "--env",
            "STUB_MODE=hold",
            "--env",
            "STUB_IGNORE_LIFELINE=1",
            "--env",
            "STUB_IGNORE_SIGTERM=1",
        ]
    )
    roster = up.wait_event("pp_stage_roster", 60)
    run = roster["run"]
    remember_run(run)
    assert len(run_containers(engine, run)) == 2
    up.signal(signal.SIGKILL)
    assert wait_until(lambda: run_containers(engine, run) == [], 30), "the watchdog did not remove the stages"
    assert not marker.exists(), marker.read_text()


def as_nobody(*argv: str) -> None:
    subprocess.run([*NOBODY, *argv], check=True, capture_output=True)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="pp-tests-users-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_state_directory_another_user_planted_is_refused_never_followed(engine, stub_image, open_dir) -> None:
    """As a second, unprivileged user: the shared /tmp state directory let `nobody` make root
    chmod a directory of its choice 1777. Now the state is private: a planted link or a directory of another
    owner is refused in one line (exit 2), and nothing it points at is touched."""
    tmp_path = open_dir
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    as_nobody("ln", "-s", str(victim), str(shared / "state"))  # nobody plants a link where root's state would be
    as_nobody("mkdir", "-m", "0755", str(shared / "theirs"))  # and a directory of its own
    for planted, why in ((shared / "state", "is a symbolic link"), (shared / "theirs", "is owned by uid 65534")):
        ps = Launcher("ps", "--all-hosts", env={"PP_LAUNCH_STATE_DIR": str(planted)})
        assert ps.wait(30) == 2, ps.stderr_text()
        (line,) = [x for x in ps.stderr_lines if x.strip()]
        assert why in line and "PP_LAUNCH_STATE_DIR" in line, line
    assert (victim.stat().st_mode & 0o7777) == 0o700 and list(victim.iterdir()) == []
    assert list((shared / "theirs").iterdir()) == []


def test_a_log_dir_another_user_planted_is_never_written_and_the_chain_still_runs(engine, stub_image, open_dir) -> None:
    """As a second user: --log-dir under a shared directory where `nobody` planted a link (to a
    directory of root's) or a directory of its own. The chain runs to its end and says its output is not kept;
    nothing is written through the link or into the other user's directory; `logs` refuses both in one line."""
    shared = open_dir / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = open_dir / "victim"
    victim.mkdir(mode=0o700)
    as_nobody("ln", "-s", str(victim), str(shared / "logs-link"))
    as_nobody("mkdir", "-m", "0777", str(shared / "logs-theirs"))
    for planted in (shared / "logs-link", shared / "logs-theirs"):
        run = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "MAX_TOKENS=2", "--log-dir", str(planted))
        assert run.wait(60) == 0, run.stderr_text()
        assert "will not be kept for 'pp-launch logs'" in run.stderr_text()
        logs = Launcher("logs", "deadbeef0000", "--log-dir", str(planted))
        assert logs.wait(30) == 2
        err = logs.stderr_text()
        assert str(planted) in err and ("nothing in it is trusted" in err or "symbolic link" in err), err
    assert list(victim.iterdir()) == [] and list((shared / "logs-theirs").iterdir()) == []


def test_the_old_shared_state_path_is_no_longer_touched(engine, stub_image, tmp_path) -> None:
    """A chain with the default state (no PP_LAUNCH_STATE_DIR) goes nowhere near /tmp/pp-launch-state, where
    another user may have planted links and a lock (`flock -s gpu.lock` used to block every GPU launch)."""
    planted = Path("/tmp/pp-launch-state")
    if planted.exists() or planted.is_symlink():
        pytest.skip("/tmp/pp-launch-state exists on this machine: not ours to replace")  # never in CI's clean run
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    as_nobody("ln", "-s", str(victim), str(planted))
    try:
        env = {"PP_LAUNCH_STATE_DIR": "", "HOME": str(tmp_path / "home")}
        run = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "MAX_TOKENS=2", env=env)
        assert run.wait(60) == 0, run.stderr_text()
        assert (victim.stat().st_mode & 0o7777) == 0o700 and list(victim.iterdir()) == []
    finally:
        planted.unlink()


def _orphan(engine, stub_image: str) -> tuple[DockerContainer, str]:
    """A running container of ours whose launcher is gone (a dead pid on this host): what the sweep removes."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = identity.current_owner()
    owner = labels.Owner(me.host, dead.pid, "1", me.pidns, me.boot).label()
    run = uuid.uuid4().hex[:12]
    remember_run(run)
    c = (
        DockerContainer(stub_image)
        .with_env("STUB_MODE", "hold")
        .with_kwargs(labels={labels.RUN: run, labels.STAGE: "0", labels.OWNER: owner, labels.GPUS: ""})
    )
    c.waiting_for(LogMessageWaitStrategy("holding")).start()
    return c, run


def test_labels_claiming_a_dead_launcher_of_this_host_make_nothing_ours(engine, stub_image) -> None:
    """A running container labelled as a chain of a launcher that died here, but that no guard recorded: no chain
    (sweep or not) and no gc touches it; gc names it, with how to remove it."""
    c, run = _orphan(engine, stub_image)
    try:
        for env in ({"PP_LAUNCH_SWEEP": "1"}, {"PP_LAUNCH_SWEEP": "0"}):
            chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "MAX_TOKENS=2", env=env)
            assert chain.wait(60) == 0, chain.stderr_text()
            assert run_containers(engine, run), "a label match was swept"
        gc = Launcher("gc")
        assert gc.wait(30) == 0
        said = "\n".join(gc.stdout_lines)
        assert f"(run {run}," in said and "not touched" in said and "no guard of its run recorded it" in said
        assert f"if it is yours, remove it with: docker rm -f {c.get_wrapped_container().id[:12]}" in said
        assert run_containers(engine, run)
    finally:
        with contextlib.suppress(Exception):
            c.stop()


def test_a_user_the_engine_refuses_is_told_so_never_to_start_it(engine, open_dir, as_nobody_argv) -> None:
    """As `nobody`, beside the suite's running engine (its socket is not theirs): `ps` and `chain` say the engine
    runs and this user may not use it (the docker group), never "start it"; `gpus` warns with the same reason."""
    sock = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(open_dir),
        "DOCKER_HOST": sock,
        "PP_LAUNCH_STATE_DIR": str(open_dir / "state"),
        "PP_LAUNCH_GPU_INVENTORY": "",
        **as_nobody_argv[1],
    }
    for argv in (["ps"], ["chain", "--gpus", "none", "--stages", "1"], ["chain", "--gpus", "none", "--dry-run"]):
        done = subprocess.run([*as_nobody_argv[0], *argv], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "permission denied on its socket. The engine runs, but this user may not use it" in done.stderr
        assert "'docker' group" in done.stderr and "Start it" not in done.stderr
    gpus = subprocess.run([*as_nobody_argv[0], "gpus"], capture_output=True, text=True, env=env, timeout=60)
    assert "which run holds each GPU is not shown: cannot reach the Docker engine" in gpus.stderr
    assert "permission denied on its socket" in gpus.stderr


def test_a_dry_run_fails_where_the_launch_would_on_a_missing_image(engine) -> None:
    """The dry run asks the engine for the stage image: absent, it is exit 2 as a launch's is (nothing pulled)."""
    image = f"pp-launch-tests/{unique('absent')}:1"
    done = subprocess.run(
        [sys.executable, "-m", "pp_launch", "chain", "--image", image, "--gpus", "none", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"image {image} is not present on the engine" in done.stderr, done.stderr
    assert "a launch would stop here" in done.stderr and done.stdout == ""
