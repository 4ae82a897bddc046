"""Test helpers: run the real launcher as a child process and follow its JSON events."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from testcontainers.core.labels import SESSION_ID

from pp_launch.adapters.identity import process_start_time

TESTCONTAINERS_LABEL = f"org.testcontainers.session-id={SESSION_ID}"
FAILED = pytest.StashKey[bool]()  # a test failed so far (setup or call): its fixtures' teardowns may tell more
# What a busy 2-core machine (a CPU hog on both cores beside the suite) may add to a timed guarantee, on top of the
# guarantee itself (a grace, a 2 s notice): bounds are the promise plus this, never a tight measured number.
BUSY_SLACK = float(os.environ.get("PP_TESTS_BUSY_SLACK", "5"))
_launchers: list[subprocess.Popen[bytes]] = []
_runs: set[str] = set()  # runs whose owner is not one of our processes (detached, compose)
_started: dict[int, str] = {}  # each spawned process's start time (/proc/PID/stat), as its owner label says it


def live_launchers() -> list[subprocess.Popen[bytes]]:
    return [p for p in _launchers if p.poll() is None]


def spawned() -> list[subprocess.Popen[bytes]]:
    """Every process a test started through spawn(), in order."""
    return _launchers


LAUNCHERS: list[Launcher] = []  # every Launcher, in order: a failed test's story tells its own (tests/story.py)


def spawn(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Every process a test starts goes through here, so the end of the suite can check it is gone and
    recognise the containers it owned."""
    proc = subprocess.Popen(argv, env=env, **kwargs)
    _launchers.append(proc)
    _started[proc.pid] = process_start_time(proc.pid) or ""
    return proc


def watchdogs(**environ: str) -> list[int]:
    """The pids of watchdog processes (`python -m pp_launch.adapters.watchdog`, started by launchers in sessions
    of their own, so not among the processes a test started) whose environment has every one of `environ`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if b"pp_launch.adapters.watchdog" not in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                continue
            items = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        env = dict(item.split(b"=", 1) for item in items if b"=" in item)
        if all(env.get(k.encode()) == v.encode() for k, v in environ.items()):
            found.append(int(entry))
    return found


def remember_run(run_id: str) -> None:
    _runs.add(run_id)


def ours(labels: dict[str, str]) -> bool:
    """A pp-launch container this test session made: owned by pytest itself or by a launcher process a test
    started, or of a run a test recorded. Never anyone else's: the suite may run beside real chains."""
    if labels.get("pp-launch.run") in _runs:
        return True
    owner = labels.get("pp-launch.owner", "")
    host, pid, start = [*owner.split(":"), "", ""][:3]
    if host != socket.gethostname() or not (pid.isascii() and pid.isdigit()):
        return False
    # by pid and start time: pids come round again (pid_max is 32768 here), and a process that is not ours (the real
    # work beside the suite, a user's launcher) may have had the pid a test's launcher has now
    known = {os.getpid(): process_start_time(os.getpid()) or "", **_started}
    return int(pid) in known and known[int(pid)] in ("", start)


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Launcher:
    """`python -m pp_launch ARGS` with its stdout JSON events and stderr lines collected as they come."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, new_session: bool = False, argv: list[str] | None = None
    ) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.args = args if argv is None else tuple(argv)
        self.docker_host = full_env.get("DOCKER_HOST", "") if env and "DOCKER_HOST" in env else ""
        LAUNCHERS.append(self)
        self.proc = spawn(
            argv or [sys.executable, "-m", "pp_launch", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=new_session,
        )
        self.events: list[dict[str, Any]] = []
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def from_argv(cls, argv: list[str], env: dict[str, str] | None = None) -> Launcher:
        """The launcher under another program (unshare, a wrapper), its output followed the same way."""
        return cls(env=env, argv=argv)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "backslashreplace").rstrip("\n")
            with self._cond:
                self.stdout_lines.append(line)
                if line.startswith("{") and line.endswith("}"):
                    self.events.append(json.loads(line))
                self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self.stderr_lines.append(raw.decode("utf-8", "backslashreplace").rstrip("\n"))
                self._cond.notify_all()

    def wait_event(self, name: str, timeout: float = 60.0, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if e.get("event") == name and all(e.get(k) == v for k, v in match.items()):
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._cond.wait(0.2)):
                    raise AssertionError(f"no {name} {match} within {timeout}s; stderr:\n" + self.stderr_text())
                self._cond.wait(min(left, 0.2))

    def events_named(self, name: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("event") == name]

    @property
    def run_id(self) -> str:
        return str(self.wait_event("stage_started", timeout=60)["run"])

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"launcher still running after {timeout}s; stderr:\n" + self.stderr_text()) from None
        for reader in self._readers:  # everything it wrote is read once its pipes close
            reader.join(timeout=10)
        return rc

    def stderr_text(self) -> str:
        with self._cond:
            return "\n".join(self.stderr_lines)


def run_containers(engine: Any, run_id: str) -> list[str]:
    """The run's stages (and lock) on the engine; its guard is `guard_of`'s."""
    found = engine.containers([f"pp-launch.run={run_id}"])
    return [c.name for c in found if c.labels.get("pp-launch.stage") != "guard"]


def guard_of(engine: Any, run_id: str) -> list[str]:
    """The ids of the run's guard containers on the engine (adapters/guard.py)."""
    return [c.id for c in engine.containers([f"pp-launch.run={run_id}", "pp-launch.stage=guard"])]


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# What the launcher says on the suite's own host, whose NVML (the fake, without config) has no driver loaded.
NO_DRIVER = "NVML found, but the NVIDIA kernel driver is not loaded (check 'nvidia-smi' and 'lsmod | grep nvidia')"


NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]  # a second, unprivileged user


def readable_install(dest: Path) -> Path:
    """pp-launch and the distributions it needs at run time, copied into `dest` (world-readable), so that another user
    can run it although the checkout and its venv are not theirs to read (a checkout in a 0700 folder): run
    `python -s -m pp_launch` with PYTHONPATH=dest. Dependencies are read from the installed metadata, markers
    evaluated, extras left out."""
    import importlib.metadata as metadata
    import re
    import shutil

    from packaging.requirements import Requirement

    import pp_launch

    seen: set[str] = set()
    todo = ["pp-launch"]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        if key == "pp-launch":  # an editable install: the package is the checkout's own folder
            shutil.copytree(Path(pp_launch.__file__).parent, dest / "pp_launch", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            continue
        for file in dist.files or []:
            if str(file).startswith("..") or "__pycache__" in file.parts:
                continue
            src = Path(str(dist.locate_file(file)))
            if src.is_file():
                (dest / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / file)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def docker(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=False)


def forged(run: str, name: str, stage: int = 0) -> str:
    """A neighbour's container carrying run `run`'s labels (run ids are public through `ps`): never ours."""
    labels = {"pp-launch.run": run, "pp-launch.stage": str(stage), "pp-launch.owner": "detached", "pp-launch.gpus": ""}
    flags = [part for key, value in labels.items() for part in ("--label", f"{key}={value}")]
    out = docker(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        *flags,
        "-e",
        "STUB_MODE=hold",
        "-e",
        "STUB_IGNORE_LIFELINE=1",
        "pp-launch/stub-worker:latest",
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def running(ref: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", ref).stdout.strip() == "true"


DESCRIBE = (  # one line per container: enough to say which part of which run was left, and in what state
    '{{.Name}} {{.State.Status}} stage={{index .Config.Labels "pp-launch.stage"}} '
    'run={{index .Config.Labels "pp-launch.run"}} created={{.Created}} finished={{.State.FinishedAt}} '
    "error={{.State.Error}}"
)


class Relay:
    """A relay to the engine's unix socket `upstream`, listening on `server` (a bound, listening socket): every
    connection's bytes passed on both ways. mute(first request bytes) -> True: from that request on, what the engine
    answers on that connection is dropped (the engine acts, its client never hears)."""

    def __init__(self, server: socket.socket, upstream: str, mute: Any = lambda data: False) -> None:
        self.server, self.upstream, self.mute = server, upstream, mute
        self.conns: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.upstream)
            self.conns += [client, upstream]
            muted = threading.Event()
            for args in ((client, upstream, muted, True), (upstream, client, muted, False)):
                t = threading.Thread(target=self._pipe, args=args, daemon=True)
                t.start()
                self.threads.append(t)

    def _pipe(self, src: socket.socket, dst: socket.socket, muted: threading.Event, asking: bool) -> None:
        try:
            while data := src.recv(65536):
                if asking and self.mute(data):
                    muted.set()
                if asking or not muted.is_set():
                    dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()
        self.accepting.join(5)
        for t in self.threads:
            t.join(5)


def records_made_under(*places: Path) -> list[str]:
    """The record volumes that runs whose state directory lies under `places` made (each state directory lists
    its runs' records, as a user's does: docs/chain.md, "The record")."""
    return sorted(
        {
            entry.name
            for place in places
            for folder in place.rglob("records")
            if folder.is_dir()
            for entry in folder.iterdir()
            if entry.name.startswith("pp-launch-record-")
        }
    )


def suite_engine() -> str:
    """The engine the suite's own runs use, as a testbed made now should name it (DOCKER_HOST, else the local
    socket): a testbed keeps it, and acts on it alone, whatever the environment names later."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def drop_records(host: str, *places: Path) -> None:
    """A testbed's runs' record volumes, removed from the engine `host` (the suite's, as the testbed was given it)
    before its folders go (on its own engines they go with the engines)."""
    names = records_made_under(*places)
    if names:
        docker("-H", host, "volume", "rm", *names)
