"""Chains across hosts on three engines of this machine (tests/multi_host.py): `local` (the suite's
engine, no GPU), `gpu-a` (4 fake GPUs, named by a Docker context) and `gpu-b` (8 fake GPUs, reached over
ssh://root@127.0.0.1:PORT through an sshd of the test's own). Stages of a and b share a network namespace and
reach each other on 127.0.0.1, as stages of two real hosts reach each other over the network."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ..gpu_host import DATA
from ..helpers import Launcher, remember_run, spawn, wait_until, watchdogs
from ..multi_host import ThreeHosts

pytestmark = [pytest.mark.docker, pytest.mark.full]  # three engines, one over ssh: the full tier


@pytest.fixture(scope="module")
def bed(our_images: tuple[str, ...]) -> Iterator[ThreeHosts]:
    testbed = ThreeHosts(our_images)
    try:
        yield testbed
    finally:
        left = testbed.close()
        if left:
            pytest.fail(f"the hosts testbed left {left}", pytrace=False)


@pytest.fixture
def clean(bed: ThreeHosts) -> Iterator[ThreeHosts]:
    """Each test starts and ends with no container of ours on any of the three engines."""
    assert bed.ours() == {"local": [], "a": [], "b": []}
    yield bed
    # the run's watchdogs finish their sweep before the next test (or the testbed's end) takes a host away
    assert wait_until(lambda: not watchdogs(PP_LAUNCH_STATE_DIR=str(bed.state_dir)), 60, 0.5), "watchdogs left"
    left = bed.ours()
    for name, ids in left.items():
        if ids:
            subprocess.run(["docker", "-H", bed.engines()[name], "rm", "-f", *ids], capture_output=True, check=False)
    assert left == {"local": [], "a": [], "b": []}, f"left behind: {left}"


def pp(
    bed: ThreeHosts, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **bed.env(), **(env or {})}
    proc = spawn([sys.executable, "-m", "pp_launch", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def chain(bed: ThreeHosts, *args: str, **env: str) -> Launcher:
    return Launcher("chain", "--json", "--env", "STUB_MODE=hold", *args, env=bed.env(**env))


def seen_gpus(text: str) -> dict[int, list[str]]:
    found = re.findall(r"\[stage (\d+)\] PP_STAGE_GPUS (\S+)", text)
    return {int(k): ([] if v == "-" else v.split(",")) for k, v in found}


def gone_everywhere(bed: ThreeHosts, timeout: float = 30) -> bool:
    return wait_until(lambda: bed.ours() == {"local": [], "a": [], "b": []}, timeout, 0.3)


# ---------------------------------------------------------------------------------------------------- runs
def test_the_demo_runs_over_two_hosts_one_reached_over_ssh(clean: ThreeHosts) -> None:
    bed = clean
    done = pp(bed, "chain", "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2")
    assert done.returncode == 0, done.stderr
    assert re.search(r"\[stage 0\] PP_DEMO_RESULT tokens=\[.*\] match=true", done.stdout + done.stderr)
    seen = seen_gpus(done.stdout + done.stderr)
    a = {g.uuid for g in bed.gpu_a.inventory.gpus}
    b = {g.uuid for g in bed.gpu_b.inventory.gpus}  # type: ignore[union-attr]
    assert set(seen) == {0, 1, 2, 3}
    assert all(len(seen[k]) == 1 for k in seen)
    assert {seen[0][0], seen[1][0]} <= a and {seen[2][0], seen[3][0]} <= b  # each stage sees its host's GPU
    assert f"{bed.a}: stages 0, 1; {bed.b}: stages 2, 3" in done.stderr
    assert "nothing left behind" in done.stderr


def test_a_stage_that_fails_once_across_hosts_is_restarted_on_every_host(clean: ThreeHosts) -> None:
    """--max-restarts across --host engines: the first attempt torn down on both hosts, the second completes."""
    bed = clean
    done = pp(
        bed,
        "chain",
        "--stages",
        "4",
        "--host",
        f"{bed.a},{bed.b}",
        "--stages-per-host",
        "2",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
        "--stage-env",
        "2:STUB_EXIT_AFTER=0",
        "--stage-env",
        "2:STUB_EXIT_CODE=3",
        "--stage-env",
        "2:STUB_EXIT_ATTEMPTS=1",
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"\[stage 0\] PP_DEMO_RESULT tokens=\[.*\] match=true", done.stdout + done.stderr)
    assert "completed on attempt 2 of at most 2; before it: attempt 1: stage 2 (" in done.stderr
    assert gone_everywhere(bed)


def test_an_xid_on_a_hosts_gpu_fails_its_stage_and_the_next_attempt_passes_that_gpu_over(clean: ThreeHosts) -> None:
    """GPUs on --host engines are watched as this machine's are: a watcher container on each host (the probe's kind,
    owned by the run's guard there) waits on that host's NVML. Xid 79 on stage 2's GPU on b (delivered by the fake
    driver to every container given that GPU) fails stage 2 naming it; the next attempt runs on other GPUs, until
    SIGTERM ends it."""
    bed = clean
    assert bed.gpu_b is not None
    run = chain(bed, "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2", "--grace", "1",
                "--max-restarts", "1", "--restart-backoff", "0")  # fmt: skip
    run.wait_event("pp_stage_roster", timeout=120)
    started = {e["stage"]: e["gpus"] for e in run.events_named("stage_started")}
    bad = started[2][0]
    watchers = ["docker", "-H", bed.b_host, "ps", "-q", "--filter", "label=pp-launch.stage=gpu-watch"]

    def watching() -> bool:  # the watcher registered its event set: an Xid from now on reaches it
        ids = subprocess.run(watchers, capture_output=True, text=True, check=False).stdout.split()
        logs = [subprocess.run(["docker", "-H", bed.b_host, "logs", i], capture_output=True, text=True) for i in ids]
        return len(ids) == 1 and "watching" in logs[0].stdout

    assert wait_until(watching, 30), run.stderr_text()
    bed.gpu_b.inject_xid(bad, 79)
    run.wait_event("chain_restarting", timeout=120)
    assert wait_until(lambda: len(run.events_named("pp_stage_roster")) == 2, 120), run.stderr_text()
    run.signal(signal.SIGTERM)  # the stages hold until told: no timer races the Xid on a busy machine
    assert run.wait(120) == 128 + signal.SIGTERM, run.stderr_text()
    failed = run.events_named("chain_stopped")[0]
    index = [g.uuid for g in bed.gpu_b.inventory.gpus].index(bad)
    assert failed["reason"] == "stage_failed" and failed["message"].startswith(
        f"stage 2 (pp-{failed['run']}-2 on host {bed.b}) failed: its GPU {index} ({bad}) reported Xid 79"
    ), failed
    second = run.events_named("stage_started")[4:]
    assert len(second) == 4 and all(bad not in e["gpus"] for e in second), second
    assert gone_everywhere(bed)


def test_unhealthy_gpus_on_a_host_are_shown_passed_over_and_refused_naming_them(clean: ThreeHosts) -> None:
    """GPU health before placement on --host engines, read by the probe through the host's NVML: the same column,
    refusals and words as for this machine's GPUs."""
    bed = clean
    assert bed.gpu_b is not None
    b = bed.gpu_b
    sick = [dataclasses.replace(g, ecc_uncorrected=2) if g.index < 2 else g for g in b.inventory.gpus]
    original = b.inventory_path.read_text()
    b.inventory_path.write_text(json.dumps(dataclasses.replace(b.inventory, gpus=tuple(sick)).to_json()))
    try:
        shown = pp(bed, "gpus", "--host", bed.b)
        six = pp(bed, "chain", "--stages", "6", "--host", bed.b, "--dry-run", "--json")
        seven = pp(bed, "chain", "--stages", "7", "--host", bed.b, "--dry-run")
    finally:
        b.inventory_path.write_text(original)
    assert shown.returncode == 0 and shown.stdout.count("UNHEALTHY: 2 uncorrected ECC errors") == 2, shown.stdout
    assert six.returncode == 0, six.stderr
    placed = {g for s in json.loads(six.stdout)["stages"] for g in s["gpus"]}
    assert len(placed) == 6 and not placed & {g.uuid for g in sick[:2]}, placed
    assert seven.returncode == 2, seven.stderr
    assert "unhealthy: 2 uncorrected ECC errors since the driver loaded" in seven.stderr, seven.stderr
    assert "--allow-unhealthy" in seven.stderr


def test_the_dry_run_places_consecutive_blocks_and_marks_hops_between_hosts(clean: ThreeHosts, tmp_path) -> None:
    bed = clean
    hosts = f"{bed.local},{bed.a},{bed.b}"
    done = pp(bed, "chain", "--stages", "8", "--host", hosts, "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    where = [s["host"] for s in doc["stages"]]
    # pack: local has no GPU (no NVIDIA toolkit there), a has 3 free (its GPU 0 is busy), b takes the rest
    assert where == [bed.a] * 3 + [bed.b] * 5, doc
    assert [h["topology_level"] == "host" for h in doc["hops"]] == [
        False,
        False,
        True,
        False,
        False,
        False,
        False,
        True,
    ]
    a = {g.uuid for g in bed.gpu_a.inventory.gpus}
    assert all(set(s["gpus"]) <= a for s in doc["stages"][:3])
    assert "no GPU can be attached there" in doc["note"] and bed.local in doc["note"]
    # --gpu-inventory HOST=FILE replaces that host's probe: the default engine gets 4 (fake) GPUs of its own, UUIDs
    # of this test alone (the suite's engine is shared: another test's stages may hold plain-4gpu.json's GPUs there)
    plain = tmp_path / "plain-4gpu.json"
    mine = os.urandom(4).hex()
    plain.write_text(re.sub(r"GPU-(\w{8})-", lambda m: f"GPU-{mine}-", (DATA / "plain-4gpu.json").read_text()))
    given = json.loads(
        pp(
            bed,
            "chain",
            "--stages",
            "8",
            "--host",
            hosts,
            "--dry-run",
            "--json",
            "--gpu-inventory",
            f"{bed.local}={plain}",
        ).stdout
    )
    assert [s["host"] for s in given["stages"]] == [bed.local] * 4 + [bed.a] * 3 + [bed.b], given
    local = {g["uuid"] for g in json.loads(plain.read_text())["gpus"]}
    assert {u for s in given["stages"][:4] for u in s["gpus"]} == local
    spread = json.loads(
        pp(
            bed,
            "chain",
            "--stages",
            "6",
            "--host",
            hosts,
            "--gpus",
            "none",
            "--placement",
            "spread",
            "--dry-run",
            "--json",
        ).stdout
    )
    assert [s["host"] for s in spread["stages"]] == [bed.local] * 2 + [bed.a] * 2 + [bed.b] * 2
    text = pp(bed, "chain", "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2", "--dry-run")
    assert f"host {bed.b}" in text.stdout and "hop 1 -> 2: host: across hosts" in text.stdout, text.stdout


def test_gpus_of_a_host_are_read_through_its_engine(clean: ThreeHosts) -> None:
    bed = clean
    shown = pp(bed, "gpus", "--host", bed.b, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [g["uuid"] for g in json.loads(shown.stdout)["gpus"]] == [g.uuid for g in bed.gpu_b.inventory.gpus]  # type: ignore[union-attr]
    local = pp(bed, "gpus", "--host", bed.local)
    assert local.returncode == 0 and "no GPU can be attached there" in local.stderr


def test_exclusivity_holds_per_host_and_down_all_hosts_ends_the_run_everywhere(clean: ThreeHosts) -> None:
    bed = clean
    first = pp(bed, "chain", "--detach", "--stages", "6", "--host", f"{bed.a},{bed.b}", "--env", "STUB_MODE=hold")
    assert first.returncode == 0, first.stderr
    run = first.stdout.strip()
    remember_run(run)
    try:
        listed = pp(bed, "ps", "--all-hosts", "--json")
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        mine = [r for r in rows if r["run"] == run]
        assert sorted((r["stage"], r["host"]) for r in mine) == [(k, bed.a) for k in range(3)] + [
            (k, bed.b) for k in range(3, 6)
        ]
        held = {u for r in mine for u in r["gpus"]}
        # a second chain: a is full (3 free GPUs, all held), b has 5 left
        refused = pp(bed, "chain", "--stages", "6", "--host", f"{bed.a},{bed.b}", "--dry-run", "--json")
        assert refused.returncode == 2 and f"{bed.a}: 0; {bed.b}: 5" in refused.stderr, refused.stderr
        second = json.loads(
            pp(bed, "chain", "--stages", "5", "--host", f"{bed.a},{bed.b}", "--dry-run", "--json").stdout
        )
        assert [s["host"] for s in second["stages"]] == [bed.b] * 5
        assert not held & {u for s in second["stages"] for u in s["gpus"]}
        only_a = pp(bed, "ps", "--host", bed.a, "--run", run)
        assert only_a.stdout.count(f"pp-{run}-") == 3 and bed.b not in only_a.stdout, only_a.stdout
        waited = pp(bed, "wait", run[:6], "--until", "announced", "--all-hosts", "--timeout", "30")
        assert waited.returncode == 0 and waited.stdout.count("127.0.0.1:") == 6, waited.stdout + waited.stderr
        logged = pp(bed, "logs", run, "--host", bed.a, "--host", bed.b)
        assert [f"[stage {k}] PP_GPU_NODE_ADDR" in logged.stdout for k in range(6)] == [True] * 6, logged.stdout
    finally:
        down = pp(bed, "down", run, "--all-hosts", "--grace", "1")
    assert down.returncode == 0, down.stderr
    assert f"on host {bed.a}" in down.stderr and f"on host {bed.b}" in down.stderr
    assert bed.ours() == {"local": [], "a": [], "b": []}


# ---------------------------------------------------------------------------------------------------- faults
def test_sigkill_of_the_launcher_leaves_nothing_on_any_host(clean: ThreeHosts) -> None:
    bed = clean
    launcher = chain(
        bed, "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2", "--env", "STUB_IGNORE_SIGTERM=1"
    )
    for k in range(4):
        launcher.wait_event("stage_announced", stage=k, timeout=60)
    assert bed.ours()["a"] and bed.ours()["b"]
    launcher.signal(signal.SIGKILL)
    launcher.wait(10)
    assert gone_everywhere(bed, 20), bed.ours()


def test_an_ssh_connection_cut_mid_run_ends_that_hosts_stages_and_fails_the_chain_naming_it(clean: ThreeHosts) -> None:
    bed = clean
    assert bed.sshd is not None
    launcher = chain(bed, "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2", "--grace", "2")
    for k in range(4):
        launcher.wait_event("stage_announced", stage=k, timeout=60)
    assert bed.sshd.cut(), "no ssh session to cut"
    assert launcher.wait(60) == 1, launcher.stderr_text()
    text = launcher.stderr_text()
    assert f"on host {bed.b}" in text and f"lost the connection to host {bed.b}" in text, text
    assert gone_everywhere(bed, 30), bed.ours()  # b's stages ended through their lifeline; a's were torn down


def test_a_host_engine_stopped_mid_run_fails_the_chain_and_leaves_nothing_on_the_others(clean: ThreeHosts) -> None:
    bed = clean
    side_b = bed.gpu_b.engine("request")  # type: ignore[union-attr]
    launcher = chain(bed, "--stages", "4", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "2", "--grace", "2")
    try:
        for k in range(4):
            launcher.wait_event("stage_announced", stage=k, timeout=60)
        side_b.stop()
        assert launcher.wait(90) == 1, launcher.stderr_text()
        said = [line for line in launcher.stderr_text().splitlines() if line.startswith("pp-launch: error: ")]
        assert len(said) == 1 and said[0].startswith(f"pp-launch: error: host {bed.b} could not be reached"), said
        assert launcher.wait_event("chain_stopped")["reason"] == "place_lost"  # the host is the cause, said first
        assert wait_until(lambda: bed.ours()["a"] == [], 20), bed.ours()
    finally:
        side_b.ensure_running()  # joins gpu-a's network namespace again (netns_of)
    assert gone_everywhere(bed, 30), bed.ours()


def test_unreachable_hosts_missing_images_and_unknown_contexts_stop_before_anything_starts(clean: ThreeHosts) -> None:
    bed = clean
    closed = "ssh://root@127.0.0.1:1"
    down = pp(bed, "chain", "--host", f"{bed.a},{closed}")
    assert down.returncode == 2 and f"host {closed}" in down.stderr and "Traceback" not in down.stderr, down.stderr
    nosuch = pp(bed, "chain", "--host", "nosuch-context")
    assert nosuch.returncode == 2 and "no Docker context of that name" in nosuch.stderr
    tag = "pp-launch/only-local:test"
    subprocess.run(["docker", "-H", bed.local, "tag", "pp-launch/stub-worker:latest", tag], check=True)
    try:
        missing = pp(bed, "chain", "--image", tag, "--host", f"{bed.local},{bed.a}", "--gpus", "none")
    finally:
        subprocess.run(["docker", "-H", bed.local, "rmi", tag], capture_output=True, check=False)
    assert missing.returncode == 2, missing.stderr
    assert f"not present on host {bed.a}" in missing.stderr
    assert f"docker save {tag} | docker --context {bed.a} load" in missing.stderr
    twice = pp(bed, "chain", "--host", f"{bed.a},unix://{bed.a_host.removeprefix('unix://')}")
    assert twice.returncode == 2 and "reach the same Docker engine" in twice.stderr


def test_a_lost_launcher_machine_leaves_nothing_on_any_host_its_guards_clean_up(clean: ThreeHosts) -> None:
    """The launcher and its watchdogs die together (its machine lost), stages deaf to their lifeline and to
    SIGTERM: each host's guard tears its stages down on that engine, over ssh as over a local socket."""
    bed = clean
    launcher = chain(
        bed,
        "--stages",
        "2",
        "--host",
        f"{bed.a},{bed.b}",
        "--stages-per-host",
        "1",
        "--grace",
        "1",
        "--env",
        "STUB_IGNORE_LIFELINE=1",
        "--env",
        "STUB_IGNORE_SIGTERM=1",
    )
    for k in range(2):
        launcher.wait_event("stage_announced", stage=k, timeout=60)
    run = launcher.run_id
    watchdogs = subprocess.run(["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True)
    pids = [int(p) for p in watchdogs.stdout.split()]
    assert len(pids) == 2, watchdogs.stdout  # one per host
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    launcher.signal(signal.SIGKILL)
    launcher.wait(10)
    assert gone_everywhere(bed, 15), bed.ours()
    for host in (bed.a, bed.b):
        assert pp(bed, "gc", "--host", host).returncode == 0


# ---------------------------------------------------------------------------------------------------- host locks
def lock_on(bed: ThreeHosts, host: str, owner: str, *how: str) -> str:
    """A container named as the GPU lock, with our labels, made with `docker run` and `how` (-d: running)."""
    argv = [
        "docker",
        "-H",
        host,
        "run",
        *how,
        "--name",
        "pp-launch-gpu-lock",
        "--label",
        "pp-launch.run=ffffffffffff",
        "--label",
        f"pp-launch.owner={owner}",
        "--label",
        "pp-launch.stage=lock",
        "--network",
        "none",
        "-e",
        "STUB_MODE=hold",
        "pp-launch/stub-worker:latest",
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def test_a_running_lock_is_waited_for_never_taken_and_an_ended_one_is_cleared(clean: ThreeHosts) -> None:
    """A lock was judged stale by its age and taken over (one GPU then held by two runs). A running lock
    is now never removed, whatever its age or owner: the launch waits, says on whom, gives up after
    PP_LOCK_TIMEOUT with exit 2 and nothing started. A lock container that is not running holds nothing."""
    bed = clean
    foreign = lock_on(bed, bed.a_host, "otherbox:1:1:boot-0", "-d")
    try:
        held = pp(
            bed,
            "chain",
            "--stages",
            "2",
            "--host",
            f"{bed.a},{bed.b}",
            "--stages-per-host",
            "1",
            env={"PP_LOCK_TIMEOUT": "2"},
        )
        assert held.returncode == 2, held.stderr
        assert f"waiting for the GPU lock on {bed.a}, held by run ffffffffffff of otherbox:1:1:boot-0" in held.stderr
        assert held.stderr.count("waiting for the GPU lock") == 1, held.stderr  # said once
        assert f"the GPU lock on {bed.a} is still held by run ffffffffffff" in held.stderr
        state = subprocess.run(
            ["docker", "-H", bed.a_host, "inspect", "-f", "{{.State.Running}}", foreign],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert state == "true", "the running lock holder was touched"
    finally:
        subprocess.run(["docker", "-H", bed.a_host, "rm", "-f", foreign], capture_output=True, check=False)
    ended = lock_on(bed, bed.a_host, "otherbox:1:1:boot-0", "--entrypoint", "true")  # ran and exited: holds nothing
    done = pp(bed, "chain", "--stages", "2", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "1")
    assert done.returncode == 0, done.stderr
    assert "match=true" in done.stdout + done.stderr
    assert subprocess.run(["docker", "-H", bed.a_host, "inspect", ended], capture_output=True).returncode != 0


def test_a_killed_launchers_lock_goes_with_it(clean: ThreeHosts) -> None:
    """The lock is tied to its launcher by the stdin lifeline: SIGKILL the holder mid bring-up, and the lock is
    gone (no clock), so the next launch proceeds."""
    bed = clean
    first = Launcher(
        "chain",
        "--json",
        "--env",
        "STUB_MODE=hold",
        "--stages",
        "2",
        "--host",
        bed.a,
        "--grace",
        "1",
        "--bring-up",
        "in-turn",
        "--env",
        "STUB_ANNOUNCE_DELAY=60",
        env=bed.env(),
    )
    first.wait_event("stage_started", stage=0, timeout=60)
    lock = ["docker", "-H", bed.a_host, "ps", "-q", "--filter", "name=^pp-launch-gpu-lock$"]
    assert subprocess.run(lock, capture_output=True, text=True).stdout.strip(), "the first launch holds a's lock"
    first.signal(signal.SIGKILL)
    first.wait(10)
    assert wait_until(lambda: not subprocess.run(lock, capture_output=True, text=True).stdout.strip(), 15)
    done = pp(bed, "chain", "--stages", "2", "--host", f"{bed.a},{bed.b}", "--stages-per-host", "1")
    assert done.returncode == 0, done.stderr


def test_a_fresh_look_at_an_ssh_host_is_a_new_channel_never_a_new_session(clean: ThreeHosts) -> None:
    """The looks that need a connection made now (each host's heartbeat, a host's answer after a stage ends, the
    last look for what a run left) open a channel of the launcher's SSH session: one key exchange per launcher, not
    one per look."""
    bed = clean
    assert bed.sshd is not None
    code = (
        "from pp_launch.adapters.docker_engine import connect\n"
        f"e = connect(timeout=10, host={bed.b!r})\n"
        "answered = sum(e.answers_anew() is None for _ in range(5))\n"
        "listed = sum(e.listed_anew(['nothing=here']) == [] for _ in range(5))\n"
        "print(answered, listed)\n"
    )
    log = bed.sshd.root / "sshd.log"

    def sessions() -> int:
        return log.read_text(errors="replace").count("Accepted publickey")

    before = sessions()
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **bed.env()}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "5"], done.stdout  # each look answered
    assert sessions() - before == 1  # connect()'s own session: the ten looks were channels of it


def test_a_chain_on_an_ssh_host_opens_a_channel_per_stream_not_per_call(clean: ThreeHosts) -> None:
    """Each channel of an ssh:// engine is a shell and a `docker system dial-stdio` on that host. The calls that answer
    at once share the client's pooled connections whatever their path (docker-py pools them per URL: 47 channels for
    this chain, one per new container path or query); what needs a channel of its own is each stream (a stage's
    output, its stdin, its removal wait; the GPU watch's; the guard's session) and each fresh look."""
    bed = clean
    assert bed.sshd is not None
    before = bed.sshd.channels()
    done = pp(bed, "chain", "--stages", "2", "--host", bed.b)
    assert done.returncode == 0, done.stderr
    opened = bed.sshd.channels() - before
    # 2 stages x 3 streams, the guard's session, the GPU watch's 2 and the probe's 2, the looks anew, and the pool's
    # connections when calls overlap (stages come up together): about 16 here
    assert 6 <= opened <= 24, f"{opened} channels for a 2-stage chain"
