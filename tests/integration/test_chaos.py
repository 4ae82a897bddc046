"""The chaos suite: try to make the launcher leave something behind, and fail if it does.

Each no-orphan layer is tested on its own; then every stop signal at every phase; then random kills;
then ps/down/gc/detach acting on our containers alone; then stages that print garbage.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from pp_launch.adapters import identity
from pp_launch.core import labels

from ..chaos import Case, matrix, random_kill, run_case
from ..helpers import Launcher, guard_of, remember_run, run_containers, spawn, unique, wait_until

pytestmark = pytest.mark.docker
HOLD = ["--json", "--gpus", "none", "--env", "STUB_MODE=hold"]


def watchdog_pid(run: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True).stdout
    return int(out.split()[0])


# ------------------------------------------------------------------------------------------- the layers
def test_layer_lifeline_alone(engine, stub_image) -> None:
    """Launcher and watchdog killed together: stages that read their stdin lifeline still exit at once."""
    launcher = Launcher("chain", "--stages", "3", *HOLD, "--env", "STUB_IGNORE_SIGTERM=1")
    launcher.wait_event("pp_stage_roster")
    run = launcher.run_id
    os.kill(watchdog_pid(run), signal.SIGKILL)
    launcher.signal(signal.SIGKILL)
    t0 = time.monotonic()
    assert wait_until(lambda: run_containers(engine, run) == [], 10)
    assert time.monotonic() - t0 < 3


def test_layer_watchdog_alone(engine, stub_image) -> None:
    """Stages that never read stdin and ignore SIGTERM: only the watchdog can remove them."""
    launcher = Launcher(
        "chain", "--stages", "3", *HOLD, "--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1"
    )
    launcher.wait_event("pp_stage_roster")
    launcher.signal(signal.SIGKILL)
    assert wait_until(lambda: run_containers(engine, launcher.run_id) == [], 10)


def _deaf_chain() -> tuple[Launcher, str]:
    """Two stages deaf to SIGTERM and to end of input, up, with one second of grace."""
    launcher = Launcher(
        "chain",
        "--stages",
        "2",
        *HOLD,
        "--grace",
        "1",
        "--env",
        "STUB_IGNORE_SIGTERM=1",
        "--env",
        "STUB_IGNORE_LIFELINE=1",
    )
    launcher.wait_event("pp_stage_roster")
    return launcher, launcher.run_id


def test_layer_guard_alone(engine, stub_image) -> None:
    """Launcher and watchdog both killed, stages deaf to both: the run's guard on the engine removes them (SIGTERM,
    the grace, SIGKILL), then goes itself; `gc` has nothing to collect."""
    launcher, run = _deaf_chain()
    assert len(guard_of(engine, run)) == 1
    os.kill(watchdog_pid(run), signal.SIGKILL)
    launcher.signal(signal.SIGKILL)
    launcher.wait(10)
    t0 = time.monotonic()
    assert wait_until(lambda: run_containers(engine, run) == [] and guard_of(engine, run) == [], 15)
    assert time.monotonic() - t0 < 1 + 5  # one grace, then SIGKILL and the removals
    gc = Launcher("gc")
    assert gc.wait(30) == 0 and all(run not in line for line in gc.stdout_lines)


def test_layer_watchdog_when_the_guard_is_removed_by_another_client(engine, stub_image) -> None:
    """A neighbour removes the run's guard (docker rm -f), then the launcher dies: the launcher's local watchdog
    still removes the stages, by the ids it was told (never by label)."""
    launcher, run = _deaf_chain()
    (guard,) = guard_of(engine, run)
    subprocess.run(["docker", "rm", "-f", guard], check=True, capture_output=True)
    launcher.signal(signal.SIGKILL)
    launcher.wait(10)
    assert wait_until(lambda: run_containers(engine, run) == [], 15)


# ------------------------------------------------------------------------------------------- the matrix
@pytest.mark.full  # the whole matrix; the quick tier has one layer test each
@pytest.mark.parametrize("case", matrix(), ids=lambda c: c.name)
def test_stop_signal_at_every_phase(engine, stub_image, case: Case) -> None:
    result = run_case(engine, case)
    assert result.left == [], result.detail
    assert result.exit_code == result.expected_exit, result.detail
    if case.signum != signal.SIGKILL:
        assert result.teardown_s < 1.0 + 3.0  # one grace (1 s) and the engine's removals


@pytest.mark.full  # a soak
def test_thirty_chains_killed_at_random(engine, stub_image) -> None:
    seed = int(os.environ.get("PP_CHAOS_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    failures = []
    for i in range(30):
        r = random_kill(engine, rng)
        if not r.ok:
            failures.append(f"#{i} {r.case.name}: exit {r.exit_code} (expected {r.expected_exit}), left {r.left}")
    assert failures == [], f"PP_CHAOS_SEED={seed}\n" + "\n".join(failures)


# ------------------------------------------------------------------------------------------- only our own
def test_detach_then_ps_gc_and_down(engine, stub_image) -> None:
    up = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "STUB_MODE=hold", "--detach")
    assert up.wait(60) == 0, up.stderr_text()
    run = up.stdout_lines[-1].strip()
    remember_run(run)
    assert len(run) == 12 and f"pp-launch down {run}" in up.stderr_text()
    found = engine.containers([f"{labels.RUN}={run}"])
    ids = [c.id for c in found if c.labels[labels.STAGE] != labels.STAGE_GUARD]
    assert len(found) == 3 and len(ids) == 2  # two stages and the run's guard, its owner now
    for cid in ids:  # each stage took the hand-over: the launcher's exit closing its stdin did not stop it
        assert wait_until(lambda cid=cid: b"no longer a lifeline" in bytes(engine.api.logs(cid, stderr=True)), 10)
    assert len(run_containers(engine, run)) == 2 and len(guard_of(engine, run)) == 1  # the launcher is gone
    assert all(c.labels[labels.OWNER] == "detached" for c in engine.containers([f"{labels.RUN}={run}"]))
    assert Launcher("gc").wait(30) == 0
    assert len(run_containers(engine, run)) == 2  # gc never touches a run
    ps = Launcher("ps", "--json")
    assert ps.wait(30) == 0
    rows = [r for r in ps.events if r["run"] == run]
    assert [(r["stage"], r["owner_status"], r["state"]) for r in rows] == [
        (0, "detached", "running"),
        (1, "detached", "running"),
    ]
    down = Launcher("down", run, "--grace", "2")
    assert down.wait(30) == 0
    assert f"stopping 2 containers: pp-{run}-0, pp-{run}-1" in down.stderr_text()
    assert run_containers(engine, run) == [] and guard_of(engine, run) == []


def test_down_of_one_run_leaves_the_other(engine, stub_image) -> None:
    a, b = Launcher("chain", "--stages", "2", *HOLD), Launcher("chain", "--stages", "2", *HOLD)
    a.wait_event("pp_stage_roster")
    b.wait_event("pp_stage_roster")
    assert Launcher("down", a.run_id, "--grace", "1").wait(30) == 0
    assert a.wait(30) == 143  # stopped, as by SIGTERM: its guard told it `down` asked
    assert "stopped by 'pp-launch down'" in a.stderr_text()
    assert run_containers(engine, a.run_id) == []
    assert len(run_containers(engine, b.run_id)) == 2
    b.signal(signal.SIGINT)
    assert b.wait(30) == 130


@pytest.mark.full  # a private side engine
def test_gc_and_down_all_touch_only_our_containers(side_engine) -> None:
    """On a private engine: `down --all` stops every run a guard vouches for, so never on the suite's engine, where a
    real user's runs may live. Containers that only carry pp-launch labels are named and never touched."""
    side = side_engine
    env = {"DOCKER_HOST": side.host}
    me = identity.current_owner().label()

    def run(*argv: str) -> str:
        return side.docker(
            "run", "-d", "--network", "host", "-e", "STUB_MODE=hold", *argv, "pp-launch/stub-worker:latest"
        ).stdout.strip()

    def ours(run_id: str, owner: str) -> list[str]:
        return [
            "--label",
            f"{labels.RUN}={run_id}",
            "--label",
            f"{labels.STAGE}=0",
            "--label",
            f"{labels.OWNER}={owner}",
            "--label",
            f"{labels.GPUS}=",
        ]

    decoys = [run("--name", "pp-stage-3"), run("--name", unique("decoy"))]
    live_owner = run(*ours(uuid.uuid4().hex[:12], me))
    other_host = run(*ours(uuid.uuid4().hex[:12], f"elsewhere-{socket.gethostname()}:1:1"))
    started = [*decoys, live_owner, other_host]

    def running(cid: str) -> bool:
        return side.docker("inspect", "-f", "{{.State.Running}}", cid, check=False).stdout.strip() == "true"

    real = Launcher("chain", "--stages", "2", "--gpus", "none", "--env", "STUB_MODE=hold", "-d", "-q", env=env)
    try:
        assert real.wait(60) == 0, real.stderr_text()
        run_id = real.stdout_lines[-1].strip()
        assert all(wait_until(lambda c=c: running(c), 30) for c in started)
        gc = Launcher("gc", env=env)
        assert gc.wait(30) == 0
        assert all(running(c) for c in started)
        assert sum("not touched" in line for line in gc.stdout_lines) == 2  # the two forged ones, named
        unconfirmed = Launcher("down", "--all", "--grace", "1", env=env)  # no terminal to ask on, no --yes: refused
        assert unconfirmed.wait(30) == 2 and "add --yes to confirm" in unconfirmed.stderr_text()
        assert all(running(c) for c in started)
        down = Launcher("down", "--all", "--yes", "--grace", "1", env=env)
        assert down.wait(30) == 0, down.stderr_text()
        assert all(running(c) for c in started)  # labels alone make nothing ours: never touched
        assert "stopping 2 containers" in down.stderr_text()
        assert wait_until(lambda: not side.docker("ps", "-aq", "--filter", f"label={labels.RUN}={run_id}").stdout, 20)
    finally:
        for cid in started:
            side.docker("rm", "-f", cid, check=False)


# ------------------------------------------------------------------------------------------- bad output
def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _flood_run(engine, flood: str | None, megabytes: int) -> tuple[int, int, bytes]:  # type: ignore[no-untyped-def]
    """(launcher exit code, its peak RSS in KiB, a sample of what it forwarded)."""
    prefix = unique("flood")
    args = [
        sys.executable,
        "-m",
        "pp_launch",
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--name",
        prefix,
        "--env",
        "STUB_MODE=hold",
        "--grace",
        "1",
    ]
    if flood:
        args += ["--stage-env", f"1:STUB_FLOOD={flood}", "--stage-env", f"1:STUB_FLOOD_MB={megabytes}"]
    proc = spawn(args, {**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    done = threading.Event()
    sample = bytearray()

    def drain() -> None:
        assert proc.stdout is not None
        tail = b""
        for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):  # type: ignore[union-attr]
            if len(sample) < 1 << 20:
                sample.extend(chunk)
            window = tail + chunk  # the marker may sit anywhere in a chunk, with the flood's own bytes after it
            tail = window[-200:]
            if (b"flood of" in window) if flood else (sample.count(b"holding") >= 2):
                done.set()

    threading.Thread(target=drain, daemon=True).start()
    assert done.wait(120), "the flood never finished"
    peak = _peak_rss_kib(proc.pid)  # a high-water mark: the flood has passed through the launcher
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(30)
    assert [c for c in engine.containers([labels.RUN]) if c.name.startswith(prefix)] == []
    return rc, peak, bytes(sample)


def test_an_endless_line_keeps_the_launcher_small(engine, stub_image) -> None:
    _, baseline, _ = _flood_run(engine, None, 0)
    rc, peak, sample = _flood_run(engine, "endless", 100)
    assert rc == 143
    growth_mib = (peak - baseline) / 1024
    print(f"launcher peak RSS: {baseline / 1024:.1f} MiB idle, {peak / 1024:.1f} MiB with a 100 MB line")
    assert growth_mib < 5, f"a 100 MB line grew the launcher by {growth_mib:.1f} MiB"
    assert b"[stage 1] xxxx" in sample


def test_random_bytes_are_forwarded_escaped(engine, stub_image) -> None:
    rc, _, sample = _flood_run(engine, "random", 4)
    assert rc == 143
    text = sample.decode("utf-8")  # valid UTF-8: invalid bytes arrive as \\xNN
    assert "\\x" in text
    assert not any(ord(c) < 32 and c not in "\n\t" for c in text)
    assert all(line.startswith("[stage ") for line in text.splitlines()[:-1])


def _stage_processes(run: str) -> list[int]:
    """pp-gpu-node children of a `chain --gpu-node` run: they carry the run in their environment."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"PP_LAUNCH_RUN={run}".encode() in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.full  # pp-gpu-node children: the full tier
@pytest.mark.parametrize("deaf", [False, True], ids=["stages-honour-sigterm", "stages-deaf-to-sigterm-and-stdin"])
def test_gpu_node_children_die_with_launcher_and_watchdog(engine, stub_image, deaf: bool) -> None:
    """`chain --gpu-node`: the launcher and its watchdog SIGKILLed together. Each pp-gpu-node child (own session,
    reparented to init) gets SIGTERM from the kernel (parent-death signal) and sees its stdin lifeline end, and
    tears its container down within its grace. Before, the children and their containers lived on forever."""
    gpu_node = os.path.join(os.path.dirname(sys.executable), "pp-gpu-node")
    knobs = ["--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1"] if deaf else []
    launcher = Launcher("chain", "--stages", "3", *HOLD, "--grace", "1", "--gpu-node", gpu_node, *knobs)
    launcher.wait_event("pp_stage_roster", timeout=60)
    run = launcher.run_id
    assert len(_stage_processes(run)) >= 3
    os.kill(watchdog_pid(run), signal.SIGKILL)
    launcher.signal(signal.SIGKILL)
    t0 = time.monotonic()
    assert wait_until(lambda: run_containers(engine, run) == [] and _stage_processes(run) == [], 15)
    assert time.monotonic() - t0 < 10


@pytest.mark.full  # a soak on a side engine
def test_randomized_adversarial_mixes_on_a_breakable_engine(broken_engine, stub_image) -> None:
    """Random faults (kills of launcher, watchdog and children; engine kill, freeze and stop; floods; name
    collisions) against chains on the side engine. After each: nothing of ours left (after gc where the README
    says so), the decoy and any name holder untouched, the documented exit code, no traceback."""
    from ..chaos import adversarial

    side = broken_engine
    seed = int(os.environ.get("PP_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"PP_CHAOS_SEED={seed} reproduces this mix")  # shown with a failure, its teardown's included
    gpu_node = os.path.join(os.path.dirname(sys.executable), "pp-gpu-node")
    decoy = side.docker(
        "run",
        "-d",
        "--restart",
        "always",
        "--name",
        unique("decoy"),
        "--network",
        "host",
        "-e",
        "STUB_MODE=hold",
        "pp-launch/stub-worker:latest",
    ).stdout.strip()
    failures = []
    try:
        for i in range(int(os.environ.get("PP_CHAOS_MIXES", "8"))):
            mix, problems = adversarial(side, rng, gpu_node, decoy)
            failures += [f"#{i} {mix.name}: {p}" for p in problems]
    finally:
        side.docker("rm", "-f", decoy, check=False)
    assert failures == [], f"PP_CHAOS_SEED={seed}\n" + "\n".join(failures)
