"""Chaos scenarios: kill the launcher with a signal at a chosen phase and count what it leaves behind.

Used by tests/integration/test_chaos.py (assertions) and bench/chaos_report.py (the README's table).
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from .helpers import Launcher, wait_until

PHASES = ("starting", "waiting", "roster", "logging", "teardown")  # waiting: stages 1-3 wait for their hand-off
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
GRACE = 1.0


@dataclass(frozen=True)
class Case:
    phase: str
    signum: int
    ignore_sigterm: bool = False

    @property
    def name(self) -> str:
        ignore = "-ignoring" if self.ignore_sigterm else ""
        return f"{self.phase}-{signal.Signals(self.signum).name}{ignore}"


@dataclass(frozen=True)
class Result:
    case: Case
    exit_code: int | None
    expected_exit: int
    left: list[str]
    teardown_s: float  # from the (first) signal until the launcher exited and, for SIGKILL, the engine was clean
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.left and self.exit_code == self.expected_exit


def _args(case: Case) -> list[str]:
    args = ["chain", "--stages", "4", "--json", "--gpus", "none", "--grace", str(GRACE), "--env", "STUB_MODE=hold"]
    if case.ignore_sigterm:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    if case.phase == "starting":
        args += ["--stage-env", "2:STUB_ANNOUNCE_DELAY=3"]
    if case.phase == "waiting":  # every container started; stage 0 not announced, so 1-3 wait in their entry
        args += ["--stage-env", "0:STUB_ANNOUNCE_DELAY=3"]
    if case.phase == "logging":
        args += ["--env", "STUB_LOG_RATE=1000"]
    if case.phase == "teardown" and not case.ignore_sigterm:
        args += ["--stage-env", "3:STUB_IGNORE_SIGTERM=1"]  # something for the teardown to be in the middle of
    return args


def run_case(engine: Any, case: Case) -> Result:
    launcher = Launcher(*_args(case))
    run = launcher.run_id
    if case.phase == "starting":
        launcher.wait_event("stage_started", stage=2, timeout=60)
    elif case.phase == "waiting":
        launcher.wait_event("stage_started", stage=3, timeout=60)
    else:
        launcher.wait_event("pp_stage_roster", timeout=60)
    if case.phase == "logging":
        time.sleep(1.0)
    t0 = time.monotonic()
    if case.phase == "teardown":
        launcher.signal(signal.SIGTERM)
        time.sleep(GRACE / 2)
    launcher.signal(case.signum)
    rc = launcher.wait(60)
    if case.signum == signal.SIGKILL:
        expected = -signal.SIGKILL
        wait_until(lambda: not _left(engine, run), 10)
    else:
        expected = 143 if case.phase == "teardown" else 128 + case.signum
    elapsed = time.monotonic() - t0
    return Result(case, rc, expected, _left(engine, run), elapsed, launcher.stderr_text()[-2000:])


def _left(engine: Any, run: str) -> list[str]:
    return [c.name for c in engine.containers([f"pp-launch.run={run}"])]


def matrix() -> list[Case]:
    return [Case(p, s, i) for i in (False, True) for p in PHASES for s in SIGNALS]


def random_kill(engine: Any, rng: random.Random) -> Result:
    """A chain killed at a random moment (from just after its start to well after its roster) with a random signal."""
    signum = rng.choice(SIGNALS)
    ignore = rng.random() < 0.5
    case = Case("random", signum, ignore)
    args = ["chain", "--stages", "4", "--json", "--gpus", "none", "--grace", str(GRACE), "--env", "STUB_MODE=hold"]
    if ignore:
        args += ["--env", "STUB_IGNORE_SIGTERM=1"]
    if rng.random() < 0.5:  # stage 0 slow to announce: the moment often falls while stages 1-3 wait for it
        args += ["--stage-env", "0:STUB_ANNOUNCE_DELAY=1.5"]
    launcher = Launcher(*args)
    time.sleep(rng.uniform(0.05, 2.5))
    t0 = time.monotonic()
    launcher.signal(signum)
    rc = launcher.wait(60)
    run = next((e["run"] for e in launcher.events), None)
    if run is None:  # killed before it said anything: find its containers by its owner label instead
        owner_pid = f":{launcher.proc.pid}:"

        def left_fn():
            return [
                c.name for c in engine.containers(["pp-launch.run"]) if owner_pid in c.labels.get("pp-launch.owner", "")
            ]
    else:
        left_fn = lambda: _left(engine, run)  # noqa: E731
    if signum == signal.SIGKILL:
        wait_until(lambda: not left_fn(), 10)
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
    if rc == -signum and not launcher.stderr_lines and not launcher.events:
        # The signal came while the interpreter was still starting (a busy machine stretches that to most of a
        # second), before pp-launch had a handler: the default action, which a shell reports as 128+N too.
        # Nothing was asked of the engine yet; the check of what is left below still holds it to nothing.
        rc = expected
    return Result(case, rc, expected, left_fn(), time.monotonic() - t0, launcher.stderr_text()[-2000:])


# ------------------------------------------------------------------------------------------ adversarial mixes
FAULTS = (
    "launcher",  # SIGKILL of the launcher: the watchdog
    "launcher+watchdog",  # both SIGKILLed: the lifeline, else (stages deaf to it) the next gc
    "child",  # chain --gpu-node: one pp-gpu-node child SIGKILLed
    "engine-kill",  # kill -9 dockerd, then it comes back
    "engine-freeze",  # SIGSTOP dockerd, Ctrl-C, then SIGCONT
    "engine-stop",  # a graceful engine stop, then it comes back
    "flood",  # 4 stages at 20,000 lines/s, then Ctrl-C
    "collision",  # a foreign container holds stage 1's name
)


@dataclass(frozen=True)
class Mix:
    fault: str
    deaf: bool  # stages ignore SIGTERM and their stdin lifeline
    intruder: bool = False  # a second, unprivileged user acts in the launcher's state meanwhile

    @property
    def name(self) -> str:
        return f"{self.fault}{'-deaf' if self.deaf else ''}{'-intruder' if self.intruder else ''}"


INTRUDER = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def intrude(state: str) -> list[str]:
    """As `nobody`: plant a link, a forged record and a lock file in the launcher's state directory, and take a
    shared flock on it. Each must fail (the directory is this user's alone); what succeeded is returned."""
    import subprocess

    tries = {
        "a link in place of a record": ["ln", "-s", "/etc", f"{state}/hosts/ffffffffffff.json"],
        "a forged record": ["sh", "-c", f'echo \'{{"hosts": ["ssh://evil"]}}\' > {state}/hosts/eeeeeeeeeeee.json'],
        "a file of its own": ["touch", f"{state}/gpu.lock"],
        "a shared lock on the directory": ["flock", "-s", "-n", state, "true"],
    }
    return [
        what for what, argv in tries.items() if subprocess.run([*INTRUDER, *argv], capture_output=True).returncode == 0
    ]


def adversarial(side: Any, rng: random.Random, gpu_node: str, decoy: str) -> tuple[Mix, list[str]]:
    """One random fault against a chain on the side engine; returns what went wrong (empty: nothing). The check
    afterwards: nothing of the run left (after `gc` where the README says gc is what is left), the decoy (a
    container without our labels) untouched, and the documented exit code."""
    import os
    import subprocess

    mix = Mix(rng.choice(FAULTS), rng.random() < 0.4, rng.random() < 0.5)
    env = {"DOCKER_HOST": side.host, "PP_ENGINE_TIMEOUT": "5", "PP_WATCHDOG_PATIENCE": "120"}
    prefix = f"adv{rng.randrange(16**8):08x}"
    args = ["chain", "--stages", "3", "--json", "--gpus", "none", "--grace", "1", "--name", prefix]
    args += ["--env", "STUB_MODE=hold"]
    if mix.deaf:
        args += ["--env", "STUB_IGNORE_SIGTERM=1", "--env", "STUB_IGNORE_LIFELINE=1"]
    if mix.fault == "flood":
        args += ["--env", "STUB_LOG_RATE=20000"]
    if mix.fault == "child":
        args += ["--gpu-node", gpu_node]
    problems: list[str] = []
    holder = None
    if mix.fault == "collision":
        holder = side.docker(
            "run",
            "-d",
            "--name",
            f"{prefix}-1",
            "--network",
            "host",
            "-e",
            "STUB_MODE=hold",
            "pp-launch/stub-worker:latest",
        ).stdout.strip()
    if mix.intruder:
        from pp_launch.adapters import host_state

        with host_state.state() as own:  # the launcher's state directory, made as the launcher makes it
            own.sub("hosts").close()
            problems += [f"the second user could make {what}" for what in intrude(str(own.path))]
    launcher = Launcher(*args, env=env)

    def left(status: str | None = None) -> list[str]:
        """The run's containers still on the engine: its stages (by name, before the run id is known) and, once it
        is, everything labelled with it (its guards, locks and probes too)."""
        extra = ["--filter", f"status={status}"] if status else []
        found = side.docker(
            "ps", "-aq", "--filter", f"name={prefix}-", "--filter", "label=pp-launch.run", *extra, check=False
        ).stdout.split()
        if run:
            found += side.docker(
                "ps", "-aq", "--filter", f"label=pp-launch.run={run}", *extra, check=False
            ).stdout.split()
        return sorted(set(found))

    expected: set[int]
    run = ""
    try:
        if mix.fault == "collision":
            expected = {2}
            rc = launcher.wait(60)
            run = next((str(e["run"]) for e in launcher.events if e.get("run")), "")
        else:
            launcher.wait_event("pp_stage_roster", timeout=90)
            run = launcher.run_id
            if mix.fault == "launcher":
                launcher.signal(signal.SIGKILL)
                expected = {-signal.SIGKILL}
            elif mix.fault == "launcher+watchdog":
                pattern = f"pp_launch.adapters.watchdog {run}"
                out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
                for pid in out.stdout.split()[:1]:
                    os.kill(int(pid), signal.SIGKILL)
                launcher.signal(signal.SIGKILL)
                expected = {-signal.SIGKILL}
            elif mix.fault == "child":
                children = [
                    int(p)
                    for p in subprocess.run(["pgrep", "-f", gpu_node], capture_output=True, text=True).stdout.split()
                ]
                mine = [p for p in children if f"PP_LAUNCH_RUN={run}".encode() in _environ(p)]
                os.kill(rng.choice(mine), signal.SIGKILL)
                expected = {1}
            elif mix.fault == "engine-kill":
                side.kill()
                expected = {1}
            elif mix.fault == "engine-freeze":
                side.freeze()
                launcher.signal(signal.SIGINT)
                expected = {1}
            elif mix.fault == "engine-stop":
                side.stop()
                expected = {1}
            else:  # flood
                time.sleep(rng.uniform(0.2, 1.5))
                launcher.signal(signal.SIGINT)
                expected = {130}
            rc = launcher.wait(90)
        if rc not in expected:
            problems.append(f"exit {rc}, expected {sorted(expected)}: {launcher.stderr_text()[-600:]}")
        if "Traceback" in launcher.stderr_text():
            problems.append("a traceback reached the user")
        side.ensure_running()
        if mix.fault == "launcher+watchdog" and mix.deaf:  # documented: only gc (or the next chain) is left
            gc = Launcher("gc", env=env)
            gc.wait(60)
        if not wait_until(lambda: set(left()) <= set(left("dead")), 60):  # nothing left but what the engine killed
            problems.append(f"left behind: {_describe(side, left())}")
        if left("dead") and mix.fault != "collision":  # the crashed engine's own failed removal: down removes it
            down = Launcher("down", run, "--grace", "1", env=env)
            if down.wait(60) != 0 or side.ghosts(left()) != left():  # a listing's ghost is gone (SideEngine.ghosts)
                problems.append(f"a Dead container of the run could not be removed: {down.stderr_text()[-300:]}")
            if left():  # only ghosts: the engine's restart lists them no more
                side.restart()
                if left():
                    problems.append(f"the engine's restart still lists {left()}")
        # the engine is back and nothing of the run is left (a Dead one removed above): the watchdog's next sweep
        # finds nothing and it ends; waited for here, so the side engine's teardown never races it
        if run and not wait_until(lambda: not _watchdogs_of(run), 60):
            problems.append("the run's watchdog still runs 60 s after its engine came back and its run was gone")
        if holder is not None and side.docker("inspect", "-f", "{{.State.Running}}", holder).stdout.strip() != "true":
            problems.append("the container holding the name was touched")
        # the engine's own faults stop every container; --restart always brings the decoy back: it must exist
        # (never removed) and run again (never killed for good)
        if not wait_until(
            lambda: side.docker("inspect", "-f", "{{.State.Running}}", decoy, check=False).stdout.strip() == "true", 30
        ):
            problems.append("the decoy was touched")
    finally:
        side.ensure_running()
        if holder is not None:
            side.docker("rm", "-f", holder, check=False)
        for cid in left():
            side.docker("rm", "-f", cid, check=False)
    return mix, problems


def _describe(side: Any, ids: list[str]) -> str:
    from .helpers import DESCRIBE

    return side.docker("inspect", "-f", DESCRIBE, *ids, check=False).stdout.strip() if ids else "nothing"


def _watchdogs_of(run: str) -> list[str]:
    import subprocess

    pattern = f"pp_launch.adapters.watchdog {run}"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""
