"""`pp-launch logs`, `wait` and `ps` (-q, --run, addresses, uptime) on the real engine, on detached runs as users
drive them from scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pp_launch.app.docker_runs import instant as _instant

from ..helpers import Launcher, guard_of, remember_run, run_containers, wait_until

pytestmark = pytest.mark.docker


CALL_LOG = os.environ.get("PP_TESTS_CALL_LOG")  # a file: how long each command of these tests took, and in which


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pp_launch", *args], capture_output=True, text=True, timeout=timeout)
    if CALL_LOG:
        with open(CALL_LOG, "a") as log:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
            log.write(f"{time.monotonic() - began:.2f}\t{time.time():.1f}\t{test}\t{' '.join(args)[:120]}\n")
    return done


@pytest.fixture
def detached(engine, stub_image):  # type: ignore[no-untyped-def]
    up = cli(
        "chain", "--stages", "2", "--gpus", "none", "--detach", "--env", "STUB_MODE=hold", "--env", "STUB_LOG_RATE=5"
    )
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    remember_run(run)
    yield run
    cli("down", run, "--grace", "1")
    assert run_containers(engine, run) == []
    assert wait_until(lambda: guard_of(engine, run) == [], 30)  # its guard goes a moment after, by itself


def test_logs_prints_every_stage_prefixed_and_takes_a_prefix_of_the_run(detached: str) -> None:
    done = cli("logs", detached[:6])
    assert done.returncode == 0, done.stderr
    for k in range(2):
        assert any(line.startswith(f"[stage {k}] PP_GPU_NODE_ADDR ") for line in done.stdout.splitlines())
    only = cli("logs", detached, "--stage", "1")
    assert only.stdout and all(line.startswith("[stage 1] ") for line in only.stdout.splitlines())
    # --since 1s: once the announcements are more than a second old they are no longer among the lines
    assert wait_until(lambda: "PP_GPU_NODE_ADDR" not in cli("logs", detached, "--since", "1s").stdout, 15)
    assert "PP_GPU_NODE_ADDR" in cli("logs", detached, "--since", "1h").stdout
    bad = cli("logs", detached, "--since", "soon")
    assert bad.returncode == 2 and "is not a duration" in bad.stderr
    # -n: each stage's last lines, merged in the order they were printed (as the engine timed them), not by stage
    assert wait_until(lambda: len(cli("logs", detached, "-n", "3").stdout.splitlines()) == 6, 15)
    timed = cli("logs", detached, "-n", "3", "-t").stdout.splitlines()
    stamps = [line.split("] ", 1)[1].split(" ", 1)[0] for line in timed]
    assert len(timed) == 6 and {line[:9] for line in timed} == {"[stage 0]", "[stage 1]"}
    assert [_instant(t) for t in stamps] == sorted(_instant(t) for t in stamps), timed


def test_logs_follow_streams_until_the_run_ends(engine, detached: str) -> None:
    interrupted = Launcher("logs", detached, "-f")
    assert wait_until(lambda: len(interrupted.stdout_lines) > 3, 30)
    interrupted.signal(signal.SIGINT)  # Ctrl-C: 130, as docker logs -f, and no "Aborted!"
    assert interrupted.wait(30) == 130 and "Abort" not in interrupted.stderr_text()
    # as docker logs -f: what is there first, in the order the engine timed it (not stage by stage), then the new
    # lines as they come; each stage's numbered chatter once each, none missing where the replay turns to following
    assert wait_until(lambda: cli("logs", detached, "-n", "5").stdout.count("log line") >= 10, 30)
    began = time.time()
    follow = Launcher("logs", detached, "-f", "-t")
    assert wait_until(lambda: sum("log line" in line for line in follow.stdout_lines) > 30, 30)
    cli("down", detached, "--grace", "1")
    assert follow.wait(30) == 0  # ends by itself once every stage is gone
    shown = [line for line in follow.stdout_lines if "log line" in line]
    when = [(_instant(line.split("] ", 1)[1].split(" ", 1)[0]), line) for line in shown]
    cut = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began - 0.3)) + f".{int((began - 0.3) % 1 * 1e9):09d}"
    replayed = [at for at, _ in when if at < cut]
    assert len(replayed) >= 6 and replayed == sorted(replayed), shown[:20]
    for k in (0, 1):
        numbers = [int(line.rsplit(" ", 1)[1]) for line in shown if line.startswith(f"[stage {k}] ")]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers


def test_wait_until_announced_prints_each_address_and_until_exit_each_code(engine, stub_image) -> None:
    up = cli(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--detach",
        "--env",
        "STUB_MODE=hold",
        "--stage-env",
        "1:STUB_EXIT_AFTER=10",  # time for `wait --until announced` to find it there under load (3 s was not)
        "--stage-env",
        "1:STUB_EXIT_CODE=3",
    )
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    remember_run(run)
    announced = cli("wait", run, "--until", "announced")
    assert announced.returncode == 0, announced.stderr
    assert [line.split()[:2] for line in announced.stdout.splitlines()] == [["stage", "0"], ["stage", "1"]]
    assert all("127.0.0.1:" in line for line in announced.stdout.splitlines())
    # stage 1 ends, and with it the run (a pipeline ends as one: the guard stops stage 0), before `wait` looks: the
    # codes come from the run's guard, which saw each end
    assert wait_until(lambda: run_containers(engine, run) == [], 30), run_containers(engine, run)
    ended = cli("wait", run, timeout=60)
    assert ended.returncode == 0, ended.stderr  # docker wait's habit: every code known, whatever they are
    lines = sorted(ended.stdout.splitlines())
    assert lines == [f"stage 0 pp-{run}-0 exited 0", f"stage 1 pp-{run}-1 exited 3"], ended.stdout
    assert f"was ended as one by stage 1 (pp-{run}-1), which exited 3" in ended.stderr, ended.stderr
    assert run_containers(engine, run) == []
    # the run is over and its guard gone; its launcher left when it detached, so it kept no end: the engine's
    # record of the run (its guard's) gives each code, as during the run
    assert wait_until(lambda: guard_of(engine, run) == [], 30)
    after = cli("wait", run)
    assert after.returncode == 0 and sorted(after.stdout.splitlines()) == lines, after
    gone = cli("down", run)  # an ended run: nothing to stop, said as such (not "no run here")
    assert gone.returncode == 0 and f"run {run} has ended: nothing of it is left to stop" in gone.stderr, gone
    shown = cli("ps", "-a", "--filter", f"run={run}", "--format", "json")
    rows = [__import__("json").loads(line) for line in shown.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r["ID"]) == 12 for r in rows), rows  # each container's id, from the record
    assert wait_until(lambda: guard_of(engine, run) == [], 30)  # its guard ends once the run's last stage is gone


def test_logs_of_a_detached_run_tell_the_stage_that_crashed_and_ended_it(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """Auto-remove takes a crashed stage's log on the engine with it, and the run ends as one (its guard stops the
    other stage); the guard kept every stage's lines in the record (the run is detached): `logs RUN` shows them,
    the crashed stage's last line the crash's."""
    up = cli("chain", "--stages", "2", "--gpus", "none", "--detach", "--grace", "1", "--env", "STUB_MODE=hold",
             "--stage-env", "1:STUB_EXIT_AFTER=2", "--stage-env", "1:STUB_EXIT_CODE=3")  # fmt: skip
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    remember_run(run)
    try:
        assert wait_until(lambda: run_containers(engine, run) == [], 30), run_containers(engine, run)
        crash = ["[stage 1] stub[1/2] STUB_EXIT_AFTER=2: exiting with 3"]  # once the guard has written it out
        assert wait_until(lambda: cli("logs", run, "--stage", "1", "-n", "1").stdout.splitlines() == crash, 15)
        shown = cli("logs", run)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert any(line.startswith("[stage 0] PP_GPU_NODE_ADDR ") for line in lines), lines  # the record's
        assert any(line.startswith("[stage 1] PP_GPU_NODE_ADDR ") for line in lines), lines
        timed = cli("logs", run, "--stage", "1", "-n", "1", "-t").stdout
        assert timed.startswith("[stage 1] 20") and timed.rstrip().endswith("exiting with 3"), timed
    finally:
        cli("down", run, "--grace", "1")
    assert run_containers(engine, run) == []


def test_wait_gives_up_after_its_timeout_and_names_no_such_run(detached: str) -> None:
    t0 = time.monotonic()
    done = cli("wait", detached, "--timeout", "1")
    assert done.returncode == 1 and "still runs after the timeout" in done.stderr
    assert time.monotonic() - t0 < 20
    missing = cli("wait", "zzzzzz")
    assert missing.returncode == 2 and "no run 'zzzzzz'" in missing.stderr


def test_ps_quiet_lists_run_ids_and_run_filters_and_shows_addresses(detached: str) -> None:
    quiet = cli("ps", "-q")
    assert detached in quiet.stdout.split()
    one = cli("ps", "--run", detached[:6], "--json")
    rows = [__import__("json").loads(line) for line in one.stdout.splitlines()]
    assert {r["run"] for r in rows} == {detached} and sorted(r["stage"] for r in rows) == [0, 1]
    assert all(r["address"].startswith("127.0.0.1:") and r["uptime_s"] is not None for r in rows)
    table = cli("ps", "--run", detached)
    assert "address" in table.stdout.splitlines()[0] and "127.0.0.1:" in table.stdout


def test_a_docker_context_chosen_by_docker_context_reaches_its_engine(detached: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A context whose endpoint is the suite's engine, chosen by DOCKER_CONTEXT alone: ps sees the run there."""
    import hashlib
    import json
    import os

    from pp_launch.adapters.docker_engine import engine_address

    meta = tmp_path / "contexts" / "meta" / hashlib.sha256(b"suite").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "suite", "Endpoints": {"docker": {"Host": engine_address()}}}))
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    env.update(DOCKER_CONTEXT="suite", DOCKER_CONFIG=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "pp_launch", "ps", "-q"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert detached in done.stdout.split()


def test_detach_quiet_prints_the_run_id_alone_and_nothing_else(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    up = cli("chain", "--stages", "1", "--gpus", "none", "-d", "-q", "--env", "STUB_MODE=hold", "--no-sweep")
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    remember_run(run)
    try:
        assert len(run) == 12 and up.stderr == ""
    finally:
        assert cli("down", run, "--grace", "1", "-q").returncode == 0
    assert run_containers(engine, run) == []


def test_ps_filter_and_format_and_down_of_two_runs_at_once(engine, stub_image, detached: str) -> None:  # type: ignore[no-untyped-def]
    other = cli("chain", "--stages", "1", "--gpus", "none", "-d", "-q", "--env", "STUB_MODE=hold", "--no-sweep")
    assert other.returncode == 0, other.stderr
    second = other.stdout.strip()
    remember_run(second)
    # docker's own filter keys, as docker ps means them, beside ours; a key repeated is any of its values
    filters = (
        ([f"name=^pp-{detached}-1$"], [(detached, 1)]),
        ([f"label=pp-launch.run={second}", "status=running"], [(second, 0)]),
        ([f"label=pp-launch.run={second}", "status=exited"], []),
        (
            [f"name=pp-{second}", f"name=pp-{detached}-0", "ancestor=pp-launch/stub-worker"],
            [(detached, 0), (second, 0)],
        ),
        ([f"id={engine.inspect(f'pp-{second}-0')['Id'][:8]}"], [(second, 0)]),
    )
    wrong_formats = (
        ("{{.Nope}}", "no field 'Nope'"),
        ("{{.run", "an unclosed action"),
        ("{{index .gpus 0}}", "is not something ps can print"),
    )
    asked = [  # every look at once (each is a process of its own): the answers are checked in this order below
        ("ps", "--filter", f"run={detached}", "--filter", "stage=1", "--format", "{{.run}}|{{.stage}}|{{.state}}"),
        ("ps", "--filter", f"run={second}", "--format", "{{json .}}"),
        ("ps", "--filter", "colour=red"),
        *(("ps", *[x for f in fs for x in ("--filter", f)], "--format", "{{.run}} {{.stage}}") for fs, _ in filters),
        ("ps", "--filter", "status=sleeping"),
        ("ps", "--filter", f"run={detached[:5]}", "--format", "{{.Names}} {{.Run}} {{.State}}"),
        ("ps", "--filter", f"run={second}", "--format", "table {{.ID}}\t{{.Names}}\t{{.Status}}"),
        ("ps", "--filter", f"run={second}", "--format", "json"),
        ("ps", "--filter", f"run={second}", "--format", '{{.Label "pp-launch.stage"}}|{{.Label "nope"}}'),
        *(("ps", "--format", wrong) for wrong, _ in wrong_formats),
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = iter(list(pool.map(lambda argv: cli(*argv), asked)))
    shown = next(answers)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"{detached}|1|running"]
    as_json = next(answers)
    assert [json.loads(line)["run"] for line in as_json.stdout.splitlines()] == [second]
    bad = next(answers)
    assert bad.returncode == 1 and "use KEY=VALUE with KEY one of docker's name, status, label" in bad.stderr
    for given, stages in filters:
        kept = next(answers)
        assert kept.returncode == 0, kept.stderr
        mine = [(r, int(k)) for r, k in (line.split() for line in kept.stdout.splitlines()) if r in (detached, second)]
        assert sorted(mine) == sorted(stages), (given, kept.stdout)
    assert next(answers).returncode == 1  # as docker ps, whose engine refuses the filter
    # docker's habits: its field names, a prefix for the run, `table` with a header, `json`, errors for the rest
    docker_names = next(answers)
    assert docker_names.stdout.splitlines() == [
        f"pp-{detached}-0 {detached} running",
        f"pp-{detached}-1 {detached} running",
    ], docker_names.stderr
    table = next(answers)
    head, row = table.stdout.splitlines()
    assert head.split() == ["CONTAINER", "ID", "NAMES", "STATUS"] and row.split()[1] == f"pp-{second}-0"
    assert row.split()[2] == "Up" and engine.inspect(row.split()[0]) is not None  # a short id the engine knows
    whole = next(answers)
    rows = [json.loads(line) for line in whole.stdout.splitlines()]
    assert [(r["Names"], r["run"], r["State"]) for r in rows] == [(f"pp-{second}-0", second, "running")]
    assert f"pp-launch.run={second}" in rows[0]["Labels"].split(",")  # docker's habit: k=v, comma-separated
    label = next(answers)
    assert label.stdout.splitlines() == ["0|"], label.stderr
    for _, said in wrong_formats:
        refused = next(answers)
        # as docker ps: a template it cannot run is exit 1, and so is a filter
        assert refused.returncode == 1 and said in refused.stderr and refused.stdout == "", refused.stderr
    both = cli("down", detached, second, "--grace", "1")
    assert both.returncode == 0, both.stderr
    assert run_containers(engine, detached) == [] and run_containers(engine, second) == []


def test_gc_names_a_labelled_container_no_guard_recorded_and_never_removes_it(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """A container planted with our labels and a launcher that is gone: gc (dry run or not) names it and leaves it."""
    from pp_launch.adapters import identity
    from pp_launch.core import labels

    me = identity.current_owner()
    gone_owner = labels.Owner(me.host, 2**22 + 5, "1", me.pidns, me.boot).label()
    run = "gcdry" + identity.new_run_id()[:7]
    ref = engine.api.create_container(
        stub_image,
        ["sleep", "60"],
        name=f"pp-{run}-0",
        labels={labels.RUN: run, labels.STAGE: "0", labels.OWNER: gone_owner, labels.GPUS: ""},
    )["Id"]
    try:
        for argv in (("gc", "--dry-run"), ("gc",)):
            said = cli(*argv)
            assert said.returncode == 0, said.stderr
            assert f"not touched: pp-{run}-0 (run {run}," in said.stdout
            assert engine.inspect(ref) is not None  # named, never touched: labels alone make nothing ours
    finally:
        engine.remove(ref)


def test_logs_of_a_foreground_run_after_it_ended_come_from_what_its_launcher_kept(engine, stub_image, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The engine no longer has the run (auto-remove); `logs` reads what the launcher kept, -n and -t as docker."""
    where = str(tmp_path / "kept")
    done = cli("chain", "--stages", "2", "--gpus", "none", "--json", "--log-dir", where, "--no-sweep")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[0])["run"]
    assert run_containers(engine, run) == []
    everything = cli("logs", run[:8], "--log-dir", where)
    assert everything.returncode == 0, everything.stderr
    assert any(
        line.startswith("[stage 0] PP_DEMO_RESULT") and "match=true" in line for line in everything.stdout.splitlines()
    )
    last = cli("logs", run, "--log-dir", where, "-n", "1", "-t", "--stage", "1")
    lines = last.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[stage 1] 20") and "Z " in lines[0]
    gone = cli("logs", "ffffffffff", "--log-dir", where)
    assert gone.returncode == 2 and "no run" in gone.stderr


def test_ps_all_lists_an_ended_run_whose_output_is_kept_and_plain_ps_does_not(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    done = cli("chain", "--stages", "2", "--gpus", "none", "--json", "--stage-env", "1:STUB_EXIT_CODE=3",
               "--env", "STUB_MODE=hold", "--env", "STUB_EXIT_AFTER=1")  # fmt: skip
    assert done.returncode == 1, done.stderr
    run = json.loads(done.stdout.splitlines()[0])["run"]
    assert run not in cli("ps", "-q").stdout.split()
    ended = cli("ps", "-a", "--json", "--filter", f"run={run[:6]}")
    rows = [json.loads(line) for line in ended.stdout.splitlines()]
    assert [(r["run"], r["stage"], r["state"], r["status"], r["exit_code"]) for r in rows] == [
        (run, 0, "exited", "Exited (0)", 0),
        (run, 1, "exited", "Exited (3)", 3),
    ], ended.stderr
    assert rows[1]["container"] == f"pp-{run}-1" and rows[1]["image"] == stub_image
    table = cli("ps", "-a", "--filter", f"run={run[:6]}").stdout
    assert "Exited (3)" in table and f"pp-{run}-1" in table
    named = cli("ps", "-a", "--json", "--run", run[:6])  # named as `wait` and `logs` name it
    by_name = [json.loads(line) for line in named.stdout.splitlines()]
    assert named.returncode == 0 and [(r["run"], r["stage"], r["exit_code"]) for r in by_name] == [
        (run, 0, 0),
        (run, 1, 3),
    ], named
    live_only = cli("ps", "--run", run[:6])
    assert live_only.returncode == 2 and f"no run {run[:6]!r}" in live_only.stderr, live_only
    waited = cli("wait", run)  # the run is over: the codes its launcher kept, as docker wait gives them
    assert waited.returncode == 0 and waited.stdout.splitlines() == [
        f"stage 0 pp-{run}-0 exited 0",
        f"stage 1 pp-{run}-1 exited 3",
    ], waited
    shown = cli("logs", run, "--stage", "1")
    assert shown.returncode == 0 and "[stage 1]" in shown.stdout


HEARD = b"detached: stdin is no longer a lifeline"


def _hand_over_story(engine, run: str, launcher_said: str, since: float) -> str:  # type: ignore[no-untyped-def]
    """What each stage of a run that failed the hand-over check said (its chatter left out), its state, and what
    the launcher and `pp-launch logs` say: enough to tell a stage that ended from a line the engine has not logged."""
    told = [f"run {run}: a stage did not hear the hand-over", f"launcher's stderr: {launcher_said!r}"]
    for c in engine.containers([f"pp-launch.run={run}"]):
        said = [line for line in engine.log_lines(c.id) if b"log line" not in line]
        told.append(f"{c.name} {c.state} stage={c.labels.get('pp-launch.stage')}: {said[-12:]!r}")
    kept = cli("logs", run)
    told.append("pp-launch logs: " + repr([line for line in kept.stdout.splitlines() if "log line" not in line][-30:]))
    told.append(f"pp-launch logs stderr: {kept.stderr!r}")
    for volume in engine.volumes([f"pp-launch.run={run}"]):  # what its guards recorded: every end, a teardown
        read = subprocess.run(
            [
                *("docker", "run", "--rm", "--network", "none", "-v", f"{volume.name}:/r:ro"),
                "pp-launch/guard",
                "cat",
                "/r/log",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        told.append(f"record {volume.name}: {read.stdout!r} {read.stderr!r}")
    events = subprocess.run(
        [
            *("docker", "events", "--since", f"{since:.0f}", "--until", f"{time.time():.0f}"),
            "--filter",
            f"label=pp-launch.run={run}",
            "--format",
            "{{.Time}} {{.Action}} {{.Actor.Attributes.name}}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    told.append("events: " + repr([line for line in events.stdout.splitlines() if "exec_" not in line]))
    return "\n".join(told)


def test_every_stage_of_a_detached_run_hears_the_hand_over_before_its_stdin_ends(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """The launcher's end of each stage's stdin ends right behind HANDED_OVER, in order: no stage may take the end
    of its stdin for the launcher's death. Under load, with stdin and output on one attach, the engine dropped the
    line about once in fifteen 3-stage runs when the whole attach closed at once, about once in thirty when its stdin
    was half-closed first (every stage ended, exit 137, no kill; found by the full tier): here, eight runs beside two
    busy CPUs, every stage's stdin on an attach of its own. Beside the parallel run's other workers, which keep the
    machine busy themselves, the two hogs run at the lowest priority: the CPUs stay busy, and the hogs take only
    what the other tests leave idle (at full priority they took a core of the suite for a minute)."""
    began = time.time()
    nice = 19 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 0
    hog = f"import os\nos.nice({nice})\nwhile True: pass"
    busy = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    # output flowing as the attach closes (the engine's side of the race): a line every 5 ms per stage. (1000 a
    # second each, 24 stages, kept the suite's engine writing logs flat out for the whole test: every other test's
    # engine call took 15-20 s meanwhile in CI)
    LOUD = ("--env", "STUB_LOG_RATE=200")
    runs: list[str] = []
    launched: dict[str, str] = {}

    def launch(_: int) -> subprocess.CompletedProcess[str]:
        return cli("chain", "--stages", "3", "--gpus", "none", "--detach", "-q", "--env", "STUB_MODE=hold", *LOUD)

    try:
        failed: list[str] = []
        with ThreadPoolExecutor(max_workers=4) as pool:  # four launches at a time: more load, less waiting
            for up in pool.map(launch, range(8)):
                if up.returncode == 0:
                    runs.append(up.stdout.strip())
                    remember_run(runs[-1])
                    launched[runs[-1]] = up.stderr
                else:  # said in full: a failed launch explains itself
                    failed.append(f"exit {up.returncode}; stdout {up.stdout!r}; stderr {up.stderr!r}")
        assert len(runs) == 8, "a launch failed: " + "; ".join(failed)
        for run in runs:  # each stage says it heard the hand-over (the stub's line, early in its log), and runs on

            def heard(run: str = run) -> bool:
                found = engine.containers([f"pp-launch.run={run}"])
                stages = [c for c in found if c.labels["pp-launch.stage"] != "guard"]
                said = [any(HEARD in line for line in engine.log_lines(c.id)) for c in stages]  # stops at the line
                return len(stages) == 3 and all(said)

            assert wait_until(heard, 30), _hand_over_story(engine, run, launched[run], began)
            running = [c for c in engine.containers([f"pp-launch.run={run}"]) if c.state == "running"]
            assert len(running) == 4, [c.name for c in running]  # 3 stages and the guard
    finally:
        for p in busy:
            p.kill()
            p.wait()
        if runs:
            cli("down", *runs, "--grace", "1")
    assert all(run_containers(engine, run) == [] for run in runs)
