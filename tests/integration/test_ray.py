"""Chains on a real Ray cluster of this machine (tests/ray_cluster.py): a head and two worker nodes, each worker
node with its own Docker engine and fake GPUs, all in the tests' own loopback-only network namespace.

Every test ends with nothing of ours on any node's engine and no stage actor alive on the cluster (checked after
each one). Ray is an optional extra: CI installs it (make test-all) and these tests fail there, never skip, when
it is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pp_launch.testing import fake_nvml

from ..gpu_host import wait_for
from ..helpers import FAILED

pytestmark = [pytest.mark.docker, pytest.mark.full, pytest.mark.timeout(900)]

PP = str(Path(sys.executable).with_name("pp-launch"))
LIVE_GROUPS = (  # how many placement groups the cluster holds now
    "import ray; ray.init(address='auto', logging_level='ERROR'); from ray.util import placement_group_table as t; "
    "print(sum(1 for g in t().values() if g['state'] != 'REMOVED'))"
)
GPU_LINE = re.compile(r"^\[stage (\d+)\] PP_STAGE_GPUS (\S*)$", re.M)


@pytest.fixture(scope="module")
def cluster(engine, our_images):  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Ray is not installed: CI installs pp-launch[ray] (make test-all)", pytrace=False)
        pytest.skip("Ray is not installed: pip install -e '.[ray]' (make test-all installs it)")
    from ..ray_cluster import RayCluster

    c = RayCluster(our_images)
    try:
        yield c
    finally:
        left = c.close()
        if left:
            pytest.fail(f"the Ray cluster left {left}", pytrace=False)


@pytest.fixture(autouse=True)
def nothing_left(cluster, request):  # type: ignore[no-untyped-def]
    """Nothing of the test's left on the cluster; what is left fails this test alone: it is told (with Ray's own
    words from the test's launchers, as for any failed test), then swept, so the tests after it find the cluster
    clean."""
    began, log_from = time.time(), cluster.driver_log()
    yield
    gone = wait_for(lambda: not any(cluster.ours().values()), 30)
    actors = [a for a in cluster.actors() if "NodeAgent" in a or "RunRecord" in a] if cluster.head_up else []
    if gone and not actors:
        if request.node.stash.get(FAILED, False):
            print(f"Ray's own words while the test ran:\n{cluster.post_mortem(began, log_from)}")
        return
    told = f"containers left on the nodes' engines: {cluster.ours()}; node agents left: {actors}\n"
    told += cluster.post_mortem(began, log_from)
    cluster.sweep()
    pytest.fail(told, pytrace=False)


def uuids(cluster, node: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {g.uuid for g in cluster.hosts[node].inventory.gpus}


def stage_gpus(stdout: str) -> dict[int, list[str]]:
    return {int(k): [g for g in v.split(",") if g] for k, v in GPU_LINE.findall(stdout)}


def running(cluster) -> int:  # type: ignore[no-untyped-def]
    """Running stage containers of ours on the nodes (each node's guard of the run not counted)."""
    total = 0
    for host in cluster.hosts.values():
        side = host.engines["request"]
        out = side.docker(
            "ps",
            "--filter",
            "label=pp-launch.run",
            "--filter",
            "status=running",
            "--format",
            '{{.Label "pp-launch.stage"}}',
            check=False,
        )
        total += sum(1 for role in out.stdout.split() if role != "guard")
    return total


def stages_on(cluster, node: str) -> list[str]:  # type: ignore[no-untyped-def]
    side = cluster.hosts[node].engines["request"]
    out = side.docker(
        "ps", "-a", "--filter", "label=pp-launch.run", "--format", '{{.ID}} {{.Label "pp-launch.stage"}}', check=False
    )
    return [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] != ["guard"]]


# ------------------------------------------------------------------------------------------------ the chain
@pytest.mark.parametrize("handoff", ["env", "stdin"])
def test_demo_over_two_nodes(cluster, handoff) -> None:  # type: ignore[no-untyped-def]
    """spread: two stages on each node, each with exactly one GPU of its own node, the ring to match=true."""
    r = cluster.run(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        "4",
        "--gpus-per-stage",
        "1",
        "--placement",
        "spread",
        "--handoff",
        handoff,
    )
    assert r.returncode == 0, r.stderr
    assert "match=true" in r.stdout
    gpus = stage_gpus(r.stdout)
    assert sorted(gpus) == [0, 1, 2, 3]
    assert all(len(g) == 1 for g in gpus.values())
    assert {gpus[0][0], gpus[1][0]} <= uuids(cluster, "a")
    assert {gpus[2][0], gpus[3][0]} <= uuids(cluster, "b")
    assert len({g[0] for g in gpus.values()}) == 4
    assert "across 2 hosts: a: stages 0, 1; b: stages 2, 3" in r.stderr
    assert "nothing left behind" in r.stderr


def test_pack_takes_one_node_and_gpus_per_stage(cluster) -> None:  # type: ignore[no-untyped-def]
    """pack: both stages on one node (the one with the most free GPUs, a on a tie), two GPUs each, disjoint."""
    r = cluster.run(PP, "chain", "--ray", cluster.address, "--stages", "2", "--gpus-per-stage", "2")
    assert r.returncode == 0, r.stderr
    gpus = stage_gpus(r.stdout)
    assert all(len(g) == 2 for g in gpus.values())
    assert set(gpus[0]) | set(gpus[1]) <= uuids(cluster, "a")
    assert not set(gpus[0]) & set(gpus[1])


def test_cpu_stages(cluster) -> None:  # type: ignore[no-untyped-def]
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "3", "--gpus", "none", "--stages-per-host", "2")
    assert r.returncode == 0, r.stderr
    assert "match=true" in r.stdout
    assert "a: stages 0, 1; b: stages 2" in r.stderr


def test_dry_run_shows_nodes_and_hops_and_reserves_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    """A dry run reads what the cluster has free and places the blocks; it reserves nothing and starts nothing,
    even while another run holds GPUs (it then says a launch would wait)."""
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "4", "--placement", "spread", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["host"] for s in doc["stages"]] == ["a", "a", "b", "b"]
    assert [h["topology_level"] for h in doc["hops"]][1::2] == ["host", "host"]
    assert "nothing reserved" in doc["note"] and "a: 2 GPUs; b: 2 GPUs" in doc["note"], doc["note"]
    held = _hold(cluster)  # 4 of the 8 GPUs granted to a live run
    try:
        before = cluster.python(LIVE_GROUPS).stdout.strip()
        dry = cluster.run(PP, "chain", "--ray", "auto", "--stages", "8", "--dry-run", "--json", "--ray-timeout", "7")
        assert dry.returncode == 0, dry.stderr
        assert "not free now: a launch would wait up to 7 s" in json.loads(dry.stdout)["note"]
        assert cluster.python(LIVE_GROUPS).stdout.strip() == before == "1"  # the live run's group, and no other
        assert running(cluster) == 4
    finally:
        held.terminate()
        held.communicate(timeout=120)


def test_infeasible_is_refused_before_anything_starts(cluster) -> None:  # type: ignore[no-untyped-def]
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus-per-stage", "5")
    assert r.returncode == 2, r.stderr
    assert "a: 4 GPUs (4 free); b: 4 GPUs (4 free)" in r.stderr  # what each node has
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "9")
    assert r.returncode == 2
    assert "9 stages of 1 GPU each (in blocks per node) do not fit on the Ray cluster" in r.stderr


def test_through_ray_client(cluster) -> None:  # type: ignore[no-untyped-def]
    """ray://HOST:PORT: the launcher is a Ray Client of the head's client server (port 10001)."""
    r = cluster.run(PP, "chain", "--ray", "ray://127.0.0.1:10001", "--stages", "2", "--placement", "spread")
    assert r.returncode == 0, r.stderr
    assert "match=true" in r.stdout
    gpus = stage_gpus(r.stdout)
    assert set(gpus[0]) <= uuids(cluster, "a") and set(gpus[1]) <= uuids(cluster, "b")


def test_unreachable_cluster_is_exit_2(cluster) -> None:  # type: ignore[no-untyped-def]
    r = cluster.run(PP, "chain", "--ray", "127.0.0.1:1", "--stages", "1", timeout=120)
    assert r.returncode == 2, r.stderr
    assert "127.0.0.1:1" in r.stderr and "does not answer" in r.stderr


# ------------------------------------------------------------------------------------------------ sharing the GPUs
def test_two_runs_get_disjoint_gpus_a_third_is_refused_and_local_chains_see_them_held(cluster) -> None:  # type: ignore[no-untyped-def]
    runs = []
    try:
        for _ in range(2):
            r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "4", "--detach", "-e", "STUB_MODE=hold")
            assert r.returncode == 0, r.stderr
            runs.append(r.stdout.strip())
        ps = cluster.run(PP, "ps", "--ray", "auto", "--json")
        rows = [json.loads(line) for line in ps.stdout.splitlines()]
        assert sorted({row["run"] for row in rows}) == sorted(runs)
        held = [g for row in rows for g in row["gpus"]]
        assert len(held) == len(set(held)) == 8  # disjoint: every GPU of the cluster once
        assert {row["host"] for row in rows if row["run"] == runs[0]} == {"a"}  # pack: one node each
        assert {row["host"] for row in rows if row["run"] == runs[1]} == {"b"}
        table = cluster.run(PP, "ps", "--ray", "auto")  # the table shows what the rows say, as for engines
        assert table.returncode == 0, table.stderr
        body = table.stdout.splitlines()[1:]
        assert len(body) == 8 and {line.split()[0] for line in body} == set(runs), table.stdout
        assert all(" detached " in line for line in body), table.stdout

        t0 = time.monotonic()
        third = cluster.run(PP, "chain", "--ray", "auto", "--stages", "1", "--ray-timeout", "3")
        assert third.returncode == 2, third.stderr
        assert time.monotonic() - t0 < 60
        assert "a: 0 of 4 free" in third.stderr and "b: 0 of 4 free" in third.stderr

        # a local chain on node a (its engine, its NVML) sees the GPUs held by the Ray run's labels
        local = subprocess.run(
            [*cluster.netns(), PP, "chain", "--stages", "1", "--dry-run"],
            capture_output=True,
            text=True,
            env=cluster.hosts["a"].env("request"),
            timeout=120,
        )
        assert local.returncode == 2, local.stdout + local.stderr
        assert runs[0] in local.stderr
    finally:
        for run in runs:
            down = cluster.run(PP, "down", run, "--ray", "auto")
            assert down.returncode == 0, down.stderr
    assert not any(cluster.ours().values())


# ------------------------------------------------------------------------------------------------ nothing orphaned
def _hold(cluster, *extra: str, stages: int = 4) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """A chain of holding stages spread over the nodes, once all of them run."""
    proc = cluster.popen(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        str(stages),
        "--placement",
        "spread",
        "-e",
        "STUB_MODE=hold",
        *extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: running(cluster) == stages or proc.poll() is not None, 120), cluster.ours()
    assert proc.poll() is None, proc.communicate()
    return proc


def test_launcher_sigkill_leaves_nothing_on_any_node(cluster) -> None:  # type: ignore[no-untyped-def]
    proc = _hold(cluster)
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not any(cluster.ours().values()), 60), cluster.ours()
    print(f"launcher SIGKILL -> zero containers on both nodes: {time.monotonic() - t0:.2f} s")


def test_launcher_sigkill_with_stages_that_ignore_the_lifeline_leaves_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    """Only each node's watchdog can end these: it must outlive the actor that started it (Ray kills an actor's
    child processes with it)."""
    proc = _hold(cluster, "-e", "STUB_IGNORE_LIFELINE=1", "--grace", "1")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not any(cluster.ours().values()), 60), cluster.ours()


def test_a_node_agent_killed_fails_the_chain_naming_stage_and_node(cluster) -> None:  # type: ignore[no-untyped-def]
    proc = _hold(cluster)
    workers = subprocess.run(["pgrep", "-f", "^ray::NodeAgent"], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers  # one agent per node, each owning its node's two stages
    os.kill(int(workers[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    # the pump (its agent ended) or a call in flight (the hand-off to it) may see it first: both name stage and node
    assert re.search(r"stage \d+.*(agent on Ray node|agent of Ray node) [ab]", err), err
    assert "was lost" not in err, err  # its node is alive: only the agent ended


def test_ray_kill_of_a_detached_runs_agent_ends_its_nodes_stages_only(cluster) -> None:  # type: ignore[no-untyped-def]
    r = cluster.run(
        PP, "chain", "--ray", "auto", "--stages", "2", "--placement", "spread", "--detach", "-e", "STUB_MODE=hold"
    )
    assert r.returncode == 0, r.stderr
    run = r.stdout.strip()
    try:
        code = (
            "import ray, sys; ray.init(address='auto', namespace='pp-launch', logging_level='ERROR');"
            f"ray.kill(ray.get_actor('{run}-1'))"
        )
        assert cluster.python(code).returncode == 0
        assert wait_for(lambda: len(cluster.ours()["b"]) == 0, 30), cluster.ours()  # its stage, and its guard
        assert len(stages_on(cluster, "a")) == 1  # the other stage is the run's until `down`
    finally:
        down = cluster.run(PP, "down", run, "--ray", "auto")
        assert down.returncode == 0, down.stderr


def test_a_container_forging_a_ray_runs_labels_is_never_touched(cluster) -> None:  # type: ignore[no-untyped-def]
    """Ours by id only on Ray too: a neighbour's container on a node's engine carrying a live run's labels survives
    the run's teardown, `down --ray` and `gc --ray`; `ps --ray` does not list it."""
    r = cluster.run(
        PP, "chain", "--ray", "auto", "--stages", "2", "--placement", "spread", "--detach", "-e", "STUB_MODE=hold"
    )
    assert r.returncode == 0, r.stderr
    run = r.stdout.strip()
    side = cluster.hosts["a"].engines["request"]
    forged = side.docker(
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        f"pp-launch.run={run}",
        "--label",
        "pp-launch.stage=1",
        "--label",
        "pp-launch.owner=detached",
        "--label",
        "pp-launch.gpus=",
        "-e",
        "STUB_MODE=hold",
        "-e",
        "STUB_IGNORE_LIFELINE=1",
        "pp-launch/stub-worker:latest",
    ).stdout.strip()
    try:
        ps = cluster.run(PP, "ps", "--ray", "auto", "--json")
        assert ps.returncode == 0, ps.stderr
        rows = [json.loads(line) for line in ps.stdout.splitlines() if line.strip()]
        assert sorted(r["stage"] for r in rows if r["run"] == run) == [0, 1], ps.stdout
        assert all(r["id"] != forged[:12] for r in rows), ps.stdout
        down = cluster.run(PP, "down", run, "--ray", "auto", "--grace", "1")
        assert down.returncode == 0, down.stderr
        assert "2 containers removed" in down.stderr, down.stderr
        gc = cluster.run(PP, "gc", "--ray", "auto")
        assert gc.returncode == 0, gc.stderr
        state = side.docker("inspect", "-f", "{{.State.Running}}", forged, check=False).stdout.strip()
        assert state == "true"  # signalled by no one, removed by no one
    finally:
        side.docker("rm", "-f", forged, check=False)


def test_a_detached_run_is_never_held_back_and_its_last_lines_are_kept(cluster) -> None:  # type: ignore[no-untyped-def]
    """After the hand-over nobody pulls the actors' events: the stage must not block on its output (60000 lines,
    more than an actor queues), and `logs --ray` shows its last lines."""
    r = cluster.run(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--detach",
        "-e",
        "STUB_MODE=hold",
        "-e",
        "STUB_FLOOD=lines",
        "-e",
        "STUB_FLOOD_LINES=60000",
    )
    assert r.returncode == 0, r.stderr
    run = r.stdout.strip()
    try:

        def done() -> bool:
            out = cluster.run(PP, "logs", run[:6], "--ray", "auto", "-n", "5")
            return out.stdout.count("PP_FLOOD_DONE lines=60000") == 2

        assert wait_for(done, 120)
        one = cluster.run(PP, "logs", run, "--ray", "auto", "-n", "3", "--stage", "1")
        assert "[stage 1] PP_FLOOD_DONE lines=60000" in one.stdout.splitlines()
        assert len(one.stdout.splitlines()) == 3
        assert all(line.startswith("[stage 1] ") for line in one.stdout.splitlines())
    finally:
        down = cluster.run(PP, "down", run, "--ray", "auto")
        assert down.returncode == 0, down.stderr
    assert "2 containers removed" in down.stderr


def test_a_detached_run_that_ends_by_itself_is_followed_waited_for_and_gives_its_gpus_back(cluster) -> None:  # type: ignore[no-untyped-def]
    """`logs -f --ray` follows the stages until they are gone; `wait --ray` prints each stage's exit code (stage 1
    exits 3: exit 1); the run's GPUs go back to Ray by themselves; its record answers until `gc --ray`."""
    r = cluster.run(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        "2",
        "--placement",
        "spread",
        "--detach",
        "-e",
        "STUB_MODE=hold",
        "-e",
        "STUB_EXIT_AFTER=6",
        "--stage-env",
        "1:STUB_EXIT_CODE=3",
    )
    assert r.returncode == 0, r.stderr
    run = r.stdout.strip()
    try:
        up = cluster.run(PP, "wait", run, "--ray", "auto", "--until", "announced")
        assert up.returncode == 0, up.stderr
        follow = cluster.popen(PP, "logs", run, "--ray", "auto", "-f", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        done = cluster.run(PP, "wait", run, "--ray", "auto", "--timeout", "60")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"stage 0 pp-{run}-0 exited 0" in done.stdout and f"stage 1 pp-{run}-1 exited 3" in done.stdout
        out, err = follow.communicate(timeout=60)  # it ends by itself once every stage is gone
        assert follow.returncode == 0, err
        said = out + err
        assert "[stage 0] " in said and "exiting with 0" in said and "exiting with 3" in said, said
        assert len(said.splitlines()) == len(set(said.splitlines())), said  # no line shown twice
        assert not stages_on(cluster, "a") and not stages_on(cluster, "b")
        # its GPUs are given back by themselves: the last agent to see its stages end removes the run's group
        assert wait_for(lambda: cluster.python(LIVE_GROUPS).stdout.strip() == "0", 30)
        again = cluster.run(PP, "chain", "--ray", "auto", "--stages", "8", "--ray-timeout", "20")
        assert again.returncode == 0, again.stderr  # all eight granted at once, no gc needed
        kept = cluster.run(PP, "wait", run, "--ray", "auto")  # the run's record still answers
        assert f"stage 1 pp-{run}-1 exited 3" in kept.stdout, kept.stdout + kept.stderr
        last = cluster.run(PP, "logs", run, "--ray", "auto", "-n", "1", "--stage", "0")
        assert "exiting with 0" in last.stdout + last.stderr, last.stdout + last.stderr
        dry = cluster.run(PP, "gc", "--ray", "auto", "--dry-run")
        assert f"would release run {run}: every stage has ended" in dry.stdout
        gc = cluster.run(PP, "gc", "--ray", "auto")
        assert f"released run {run}: every stage has ended" in gc.stdout
        assert "nothing to collect" in cluster.run(PP, "gc", "--ray", "auto").stderr
    finally:
        cluster.run(PP, "down", run, "--ray", "auto")


RECORDS = (  # the detached runs' records the cluster holds now (actors in pp-launch's namespace)
    "import ray; ray.init(address='auto', logging_level='ERROR'); "
    "print(' '.join(a['name'] for a in ray.util.list_named_actors(all_namespaces=True) "
    "if a['namespace'] == 'pp-launch' and a['name'].endswith('-record')))"
)


def test_a_runs_end_releases_its_users_ended_detached_runs_past_the_keep(cluster) -> None:  # type: ignore[no-untyped-def]
    """A detached run that ends by itself leaves its record on the cluster (an actor answering `wait`), listed in its
    user's state: a later run's end leaves it while the keep (a week) lasts, and a dry run changes nothing; with a
    keep of 0 s, the next run's end releases it as `gc --ray` would, and forgets it."""
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus", "none", "--detach", "-e",
                    "STUB_MODE=hold", "-e", "STUB_EXIT_AFTER=1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = r.stdout.strip()
    try:
        done = cluster.run(PP, "wait", run, "--ray", "auto", "--timeout", "60")
        assert done.returncode == 0, done.stdout + done.stderr
        listed = cluster.state_dir / "ray-records" / run
        assert listed.is_file() and f"{run}-record" in cluster.python(RECORDS).stdout.split()
        kept = cluster.run(PP, "chain", "--ray", "auto", "--stages", "1", "--gpus", "none")
        assert kept.returncode == 0, kept.stderr
        assert listed.is_file() and f"{run}-record" in cluster.python(RECORDS).stdout.split()  # within the keep
        keep_none = cluster.env(PP_LAUNCH_RECORD_KEEP="0")
        dry = cluster.run(PP, "chain", "--ray", "auto", "--stages", "1", "--gpus", "none", "--dry-run", env=keep_none)
        assert dry.returncode == 0, dry.stderr
        assert listed.is_file() and f"{run}-record" in cluster.python(RECORDS).stdout.split()  # a dry run: nothing
        swept = cluster.run(PP, "chain", "--ray", "auto", "--stages", "1", "--gpus", "none", env=keep_none)
        assert swept.returncode == 0, swept.stderr
        assert f"{run}-record" not in cluster.python(RECORDS).stdout.split() and not listed.exists()
    finally:
        cluster.run(PP, "down", run, "--ray", "auto")


def test_a_stage_that_fails_once_on_ray_is_restarted_and_the_run_completes(cluster) -> None:  # type: ignore[no-untyped-def]
    """--max-restarts on the Ray site: attempt 1 torn down through the node agents, attempt 2 granted anew."""
    r = cluster.run(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        "3",
        "--gpus-per-stage",
        "1",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
        "--stage-env",
        "1:STUB_EXIT_AFTER=0",
        "--stage-env",
        "1:STUB_EXIT_CODE=3",
        "--stage-env",
        "1:STUB_EXIT_ATTEMPTS=1",
    )
    assert r.returncode == 0, r.stderr
    assert "match=true" in r.stdout
    assert "attempt 1 of run" in r.stderr and "attempt 2 of 2 in 0 s" in r.stderr
    assert "completed on attempt 2 of at most 2; before it: attempt 1: stage 1 (" in r.stderr


def _events_until(proc: subprocess.Popen[str], event: str, timeout: float) -> list[dict[str, object]]:
    """The launcher's --json events up to the first `event` (all of them, if it exits first). Read from the pipe's
    descriptor with a buffer of the test's own (kept on `proc` for the next call): a text stream's readline buffers
    lines that select() then no longer sees, and a burst of events would wait for the next write."""
    assert proc.stdout is not None
    fd, buf = proc.stdout.fileno(), getattr(proc, "pending", b"")
    seen: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            with contextlib.suppress(json.JSONDecodeError):
                seen.append(json.loads(line))
            if seen and seen[-1].get("event") == event:
                proc.pending = buf  # type: ignore[attr-defined]
                return seen
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0] or not (chunk := os.read(fd, 65536)):
            proc.pending = buf  # type: ignore[attr-defined]
            return seen
        buf += chunk


def test_an_xid_on_a_ray_stages_gpu_fails_it_and_the_next_attempt_never_uses_that_gpu(cluster) -> None:  # type: ignore[no-untyped-def]
    """Each node agent watches the GPUs Ray granted it through its node's NVML (the fake library, its Xid events
    delivered by nvmlEventSetWait): Xid 79 on stage 1's GPU fails that stage naming the GPU, the whole chain is torn
    down, and the next attempt passes the GPU over (Ray may grant it again: it is then asked for one more). The
    stages hold until told: no timer races the Xid on a busy machine; SIGTERM ends the second attempt."""
    a = cluster.hosts["a"]
    proc = cluster.popen(
        PP, "chain", "--ray", "auto", "--stages", "2", "--gpus-per-stage", "1", "--placement", "pack", "--json",
        "--grace", "1", "--max-restarts", "1", "--restart-backoff", "0", "-e", "STUB_MODE=hold",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        first = _events_until(proc, "pp_stage_roster", 120)
        started = {e["stage"]: e["gpus"] for e in first if e.get("event") == "stage_started"}
        assert len(started) == 2, (first, proc.poll())
        bad = str(started[1][0])  # type: ignore[index]
        assert bad in uuids(cluster, "a")
        fake_nvml.inject_xid(a.events, bad, 79)
        again = _events_until(proc, "pp_stage_roster", 120)  # the second attempt, up
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    events = first + again
    stopped = [e for e in events if e.get("event") == "chain_stopped"]
    assert stopped, f"no attempt ended on the Xid; the launcher said:\n{err}\nevents: {events}"
    failed = stopped[0]
    index = [g.uuid for g in a.inventory.gpus].index(bad)
    assert failed["reason"] == "stage_failed", (failed, err)
    assert str(failed["message"]).startswith(
        f"stage 1 (pp-{failed['run']}-1 on host a) failed: its GPU {index} ({bad}) reported Xid 79 "
        "(GPU has fallen off the bus); that GPU is not used again in this run"
    ), failed
    assert any(e.get("event") == "chain_restarting" for e in again), again
    second = [e for e in again if e.get("event") == "stage_started"]
    assert len(second) == 2 and all(bad not in e["gpus"] for e in second), second  # type: ignore[operator]
    out = getattr(proc, "pending", b"").decode() + out  # what the last look read past the roster
    last = [json.loads(line) for line in out.splitlines() if '"chain_stopped"' in line]
    assert [(e["reason"], e["exit_code"]) for e in last] == [("signal", 143)], out


@contextlib.contextmanager
def _unhealthy(cluster, node: str, count_: int):  # type: ignore[no-untyped-def]
    """The node's NVML says its first `count_` GPUs have uncorrected ECC errors, while the block runs."""
    host = cluster.hosts[node]
    sick = [dataclasses.replace(g, ecc_uncorrected=2) if i < count_ else g for i, g in enumerate(host.inventory.gpus)]
    fake_nvml.write_config(dataclasses.replace(host.inventory, gpus=tuple(sick)), host.config)
    try:
        yield [g.uuid for g in sick[:count_]]
    finally:
        fake_nvml.write_config(host.inventory, host.config)


def test_unhealthy_gpus_ray_grants_are_passed_over_or_refused_naming_them(cluster) -> None:  # type: ignore[no-untyped-def]
    """GPU health read before placement on Ray, by each node agent from its node's NVML, with the allocator's rule:
    of 4 GPUs on node b, 3 with uncorrected ECC errors. A stage there runs on the healthy one, whatever Ray grants
    first; two stages there (of four, two per node) are refused (exit 2) naming each GPU passed over and why, and
    --allow-unhealthy runs them anyway."""
    with _unhealthy(cluster, "b", 3) as sick:
        one = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus-per-stage", "1",
                          "--placement", "spread")  # fmt: skip
        assert one.returncode == 0, one.stderr
        gpus = stage_gpus(one.stdout)
        assert gpus[1][0] in uuids(cluster, "b") and gpus[1][0] not in sick, (gpus, sick)
        two = cluster.run(PP, "chain", "--ray", "auto", "--stages", "4", "--gpus-per-stage", "1",
                          "--stages-per-host", "2")  # fmt: skip
        allowed = cluster.run(PP, "chain", "--ray", "auto", "--stages", "4", "--gpus-per-stage", "1",
                              "--stages-per-host", "2", "--allow-unhealthy")  # fmt: skip
        dry_two = cluster.run(PP, "chain", "--ray", "auto", "--stages", "4", "--gpus-per-stage", "1",
                              "--stages-per-host", "2", "--dry-run")  # fmt: skip
        dry_one = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus-per-stage", "1",
                              "--placement", "spread", "--dry-run")  # fmt: skip
    # the dry run is the plan the launch makes: the same refusal, and what one stage on node b passes over
    assert dry_two.returncode == 2 and "uncorrected ECC error" in dry_two.stderr, dry_two.stderr
    assert all(u in dry_two.stderr for u in sick) and "--allow-unhealthy" in dry_two.stderr, dry_two.stderr
    assert dry_one.returncode == 0 and "passed over as a launch would" in dry_one.stdout + dry_one.stderr, dry_one
    assert two.returncode == 2, two.stderr
    said = [line for line in two.stderr.splitlines() if line.startswith("pp-launch: error: ")]
    assert said and "not enough GPUs on Ray node b" in said[0], two.stderr
    assert "uncorrected ECC error" in two.stderr and "--allow-unhealthy" in two.stderr
    assert allowed.returncode == 0, allowed.stderr


def test_sigterm_ends_a_ray_chain_with_128_plus_15_and_nothing_left(cluster) -> None:  # type: ignore[no-untyped-def]
    proc = _hold(cluster)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "nothing left behind" in err


def test_node_lost_mid_run(cluster) -> None:  # type: ignore[no-untyped-def]
    """Node b's raylet and workers SIGKILLed: the chain fails once Ray declares the node dead, its one error line
    naming the node first (the cause), `chain_stopped` carrying exit code 1, nothing left on either engine."""
    proc = _hold(cluster, "--json")
    t0 = time.monotonic()
    try:
        cluster.kill_node("b")
        out, err = proc.communicate(timeout=180)
        failed_after = time.monotonic() - t0
        assert proc.returncode == 1, err
        said = [line for line in err.splitlines() if line.startswith("pp-launch: error: ")]
        assert len(said) == 1 and said[0].startswith("pp-launch: error: Ray node b was lost"), err
        stopped = [json.loads(line) for line in out.splitlines() if '"chain_stopped"' in line]
        assert [(e["reason"], e["exit_code"]) for e in stopped] == [("place_lost", 1)], out  # as a lost head, an engine
        assert wait_for(lambda: not any(cluster.ours().values()), 60), cluster.ours()
        print(f"node b lost -> chain failed after {failed_after:.2f} s")
    finally:
        cluster.start_node("b")
        cluster.wait_nodes(3)


def test_everything_listens_on_loopback_only(cluster) -> None:  # type: ignore[no-untyped-def]
    r = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus", "none")
    assert r.returncode == 0, r.stderr
    local = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:", "127.0.0.53")
    assert all(a.startswith(local) for a in cluster.listeners()), cluster.listeners()
    assert all(a.startswith(local) for a in cluster.connections()), cluster.connections()


def test_a_missing_or_wrong_token_is_one_line_exit_2_naming_the_fix(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The test cluster runs with Ray's token authentication on: a launcher without its token (no mode, the mode but
    no token anywhere, a wrong token) is refused with one line naming where Ray takes the token from."""
    plain = {k: v for k, v in cluster.env().items() if not k.startswith("RAY_AUTH")}
    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    cases = {
        "no token, no mode": plain,
        "the mode, no token anywhere": {**plain, "RAY_AUTH_MODE": "token", "HOME": str(tmp_path)},
        "a wrong token": {**plain, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong)},
    }

    def launch(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus", "none", env=env, timeout=120)

    with ThreadPoolExecutor(len(cases)) as pool:  # each waits out Ray's refusal: at once, not one after another
        refused = dict(zip(cases, pool.map(launch, cases.values()), strict=True))
    for case, r in refused.items():
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (case, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("pp-launch: error: "), (case, r.stderr)
        assert "RAY_AUTH_TOKEN" in lines[0] and "ray get-auth-token" in lines[0], (case, r.stderr)
    ok = cluster.run(PP, "chain", "--ray", "auto", "--stages", "2", "--gpus", "none")  # the token, as Ray finds it
    assert ok.returncode == 0, ok.stderr


def test_a_frozen_agent_fails_the_chain_within_5_s_and_its_stages_still_go(cluster) -> None:  # type: ignore[no-untyped-def]
    """Node b's agent SIGSTOPped once the chain is up (Ray itself would wait on it without end: its node is alive):
    our own liveness check fails the chain within 5 s naming the node, ends that agent, and node b's stages go."""
    proc = cluster.popen(
        PP,
        "chain",
        "--ray",
        "auto",
        "--stages",
        "4",
        "--placement",
        "spread",
        "-e",
        "STUB_MODE=hold",
        "--grace",
        "1",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # until the chain is up
        lines.append(line)
        if "roster of run" in line:
            break
    engine_b = cluster.hosts["b"].engines["request"].host.encode()
    agents = subprocess.run(["pgrep", "-f", "^ray::NodeAgent"], capture_output=True, text=True).stdout.split()
    (frozen,) = [int(p) for p in agents if engine_b in Path(f"/proc/{p}/environ").read_bytes()]
    t0 = time.monotonic()
    os.kill(frozen, signal.SIGSTOP)
    try:
        failed = None
        for line in proc.stderr:
            lines.append(line)
            if failed is None and line.startswith("pp-launch: stopping "):  # the chain failed: its teardown begins
                failed = time.monotonic() - t0
        proc.wait(timeout=60)
        err = "".join(lines)
        assert proc.returncode == 1, err
        assert failed is not None and failed < 5.0, (failed, err)
        assert "Ray node b was lost (its agent did not answer for 4 s)" in err, err
        assert "chain stopped (place_lost)" in err, err  # the node is the cause, said first and once
        assert wait_for(lambda: not stages_on(cluster, "b") and not stages_on(cluster, "a"), 30), cluster.ours()
        print(f"agent frozen -> chain failed after {failed:.2f} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


ENTRYPOINT = """
import os, subprocess, sys
import ray
ray.init(address="auto", logging_level="ERROR")

@ray.remote(num_cpus=0)
def entrypoint(pp, state):
    # as Ray Jobs' supervisor runs an entrypoint: a shell command on a node of the cluster, RAY_ADDRESS set to the
    # cluster's GCS, nothing else said about the cluster
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST",)}
    env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    env["PP_LAUNCH_STATE_DIR"] = state  # the tests' own, not the node user's
    r = subprocess.run(f"{pp} chain --ray auto --stages 2 --gpus none", shell=True, env=env, capture_output=True,
                       text=True, timeout=180)
    return r.returncode, r.stderr

code, err = ray.get(entrypoint.remote(sys.argv[1], sys.argv[2]))
print(code)
print(err, file=sys.stderr)
"""


def test_chain_runs_as_a_ray_job_entrypoint_from_ray_address(cluster) -> None:  # type: ignore[no-untyped-def]
    """`--ray auto` takes the cluster from RAY_ADDRESS, as Ray's own tools do: run the way Ray Jobs runs an
    entrypoint (a command on a node, RAY_ADDRESS set by Ray), the chain runs and ends cleanly."""
    r = cluster.run(sys.executable, "-c", ENTRYPOINT, PP, str(cluster.state_dir), timeout=240)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0", r.stderr
    assert "chain stopped (completed)" in r.stderr and "nothing left behind" in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------------ last: the head lost
def test_a_torch_rendezvous_runs_across_two_nodes_with_the_master_on_stage_0s(cluster) -> None:  # type: ignore[no-untyped-def]
    """--rendezvous torch on Ray: stage 0's node is the master (its address as Ray knows it, a port its agent found
    free), every rank meets there with no announcement, each counts its LOCAL_RANK on its own node."""
    from .test_rendezvous_docker import PROGRAM

    r = cluster.run(PP, "chain", "--ray", cluster.address, "--stages", "3", "--gpus", "none", "--stages-per-host",
                    "2", "--rendezvous", "torch", "--grace", "1", "--entrypoint", "python3",
                    "--", "-c", PROGRAM)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "a: stages 0, 1; b: stages 2" in r.stderr, r.stderr
    for k, local in ((0, 0), (1, 1), (2, 0)):
        assert f"[stage {k}] rank {k}/3 local {local} sum 3 as python3" in r.stdout, r.stdout
    assert "nothing left behind" in r.stderr


def test_a_signal_while_waiting_for_rays_grant_ends_it_at_once_saying_what_it_removed(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A launch waiting for GPUs another run holds is stopped at once by SIGTERM (not at --ray-timeout): the line
    and --json's chain_stopped say what it had started (its placement group, removed), and no group of it is left."""
    holder = _hold(cluster, "--gpus-per-stage", "2")  # every GPU of the cluster
    try:
        out, err = tmp_path / "out", tmp_path / "err"
        with out.open("w") as o, err.open("w") as e:
            waiting = cluster.popen(PP, "chain", "--ray", "auto", "--stages", "1", "--json", "--ray-timeout", "120",
                                    stdout=o, stderr=e)  # fmt: skip
        assert wait_for(lambda: "asking the Ray cluster" in err.read_text(), 60), err.read_text()
        t0 = time.monotonic()
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(30) == 143, err.read_text()
        assert time.monotonic() - t0 < 10
        said = [line for line in err.read_text().splitlines() if "stopped by signal" in line]
        assert len(said) == 1 and said[0].startswith("pp-launch: stopped by signal 15 while placing run "), said
        assert said[0].endswith(
            "before any stage was created: its placement group on the Ray cluster was removed; nothing else was touched"
        ), said
        stopped = [json.loads(line) for line in out.read_text().splitlines() if '"chain_stopped"' in line]
        assert [(e["reason"], e["exit_code"]) for e in stopped] == [("signal", 143)], out.read_text()
        assert cluster.python(LIVE_GROUPS).stdout.strip() == "1"  # the holder's only
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=120)


def test_a_nodes_engine_stopped_gracefully_ends_the_chain_naming_the_node(cluster) -> None:  # type: ignore[no-untyped-def]
    """`systemctl stop docker` on node b: the engine stops b's stages (each exits 0) and goes. Those stages have not
    done their work: the chain ends at once, one line naming node b and its engine first, `chain_stopped`
    `place_lost`, exit 1; the other node's stages are torn down and nothing is left once the engine is back."""
    proc = _hold(cluster, "--json")
    side = cluster.hosts["b"].engine("request")
    assert proc.stdout is not None
    seen = []  # the chain up (every hand-off done) before the engine stops: not a fault of the bring-up
    for line in proc.stdout:
        seen.append(line)
        if '"pp_stage_roster"' in line:
            break
    t0 = time.monotonic()
    try:
        side.stop()
        rest, err = proc.communicate(timeout=120)
        out = "".join(seen) + rest
        took = time.monotonic() - t0
        assert proc.returncode == 1, err
        said = [line for line in err.splitlines() if line.startswith("pp-launch: error: ")]
        assert len(said) == 1 and said[0].startswith("pp-launch: error: Ray node b was lost (its Docker engine"), err
        stopped = [json.loads(line) for line in out.splitlines() if '"chain_stopped"' in line]
        assert [(e["reason"], e["exit_code"]) for e in stopped] == [("place_lost", 1)], out
        assert took < 20, took
    finally:
        side.ensure_running()
    assert wait_for(lambda: not any(cluster.ours().values()), 60), cluster.ours()


def test_the_head_lost_mid_run_ends_in_our_teardown_and_one_line(cluster) -> None:  # type: ignore[no-untyped-def]
    """The head's GCS killed while it also runs a stage (a head with CPUs, CPU stages spread over it and both
    nodes): the launcher's own look at the head sees it within seconds, its own node's stage is counted gone with
    it (its agent is never asked: Ray would wait 60 s), the rest is torn down through the node agents (they answer
    without the head); one `pp-launch:` line says so, `chain_stopped` carries the process's own exit code 1, nothing
    is left on any engine (guards included); Ray's own log lines stay off the terminal."""
    cluster.restart(head_cpus=2)  # the module's last test: the cluster ends with it (no restart after)
    proc = _hold(cluster, "--json", "--gpus", "none", stages=3)  # one stage on each node, the head's too
    try:
        t0 = time.monotonic()
        cluster.kill_head()
        out, err = proc.communicate(timeout=120)
        ended = time.monotonic() - t0
        assert proc.returncode == 1, err
        said = [line for line in err.splitlines() if line.startswith("pp-launch: error: ")]
        assert len(said) == 1 and "the Ray head at 127.0.0.1:" in said[0] and "stopped answering" in said[0], err
        assert "the head's own node" in said[0], err  # its stage went with it, said
        stopped = [json.loads(line) for line in out.splitlines() if '"chain_stopped"' in line]
        assert [e["exit_code"] for e in stopped] == [1], out
        assert ended < 10, f"ended {ended:.1f} s after the head was lost: {err}"
        assert wait_for(lambda: not any(cluster.ours().values()), 15), cluster.ours()  # its stage's guard too
        theirs = [line for line in err.splitlines() if line.strip() and not line.startswith(("pp-launch", "["))]
        assert theirs == [], err  # nothing of Ray's own logging on the terminal without -v
        print(f"head lost -> chain torn down and ended after {ended:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
