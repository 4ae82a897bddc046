"""Each run's output, kept after the run ended: `pp-launch logs RUN` reads it when the engine
no longer has the run's containers.

Per stage, bounded: `logs/<run>/stage-K.log` in this user's private state directory (or `--log-dir DIR`, held to
the same rules: yours, not writable by others, never through a symbolic link), each line as
`<UTC time> <stream> <text>`. A file that reaches LIMIT bytes is moved to `stage-K.log.1` (the one before it
dropped), so a stage keeps at most 2 x LIMIT. The newest KEEP_RUNS runs are kept; older ones are removed when
a new run starts, but only runs that ended: a launcher holds an advisory lock (flock) on its run's `.live` file
while it keeps that run's output, and a run whose `.live` is locked is never pruned, however many runs came after
it (the bound is then exceeded, and said).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pp_launch.adapters.host_state import NOFOLLOW, StateDir
from pp_launch.core import errors

LIMIT = 1 << 20
KEEP_RUNS = 50
RUNS = "logs"
LIVE = ".live"
FACTS = "stages.jsonl"  # each stage's container, image and end


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class KeptLine:
    stage: int
    time: str
    stream: str
    text: str


class RunLog:
    """The launcher's side: every stage line appended as it is shown. Never fails the chain: a write that fails
    (no space, a read-only disk) stops the keeping and is said once, in `problem`."""

    def __init__(self, run_id: str, root: str | Path | None = None, limit: int = LIMIT) -> None:
        self.limit = limit
        self.problem = ""
        self._files: dict[int, tuple[int, int]] = {}  # stage -> (fd, size)
        self.note = ""
        with StateDir.open(_root(root)) as base, base.sub(RUNS) as runs:
            self._dir = runs.sub(run_id)
            self._live = os.open(LIVE, os.O_WRONLY | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=self._dir.fd)
            fcntl.flock(self._live, fcntl.LOCK_EX)  # ours until close(), or until this process ends
            kept = _prune(runs, KEEP_RUNS)
        if kept > KEEP_RUNS:
            self.note = f"{kept} runs' output kept (more than {KEEP_RUNS}): the runs beyond are still live"

    def line(self, stage: int, stream: str, text: str) -> None:
        if self.problem:
            return
        data = f"{_now()} {stream} {text}\n".encode("utf-8", "backslashreplace")
        try:
            fd, size = self._files.get(stage) or self._open(stage)
            if size + len(data) > self.limit and size > 0:
                os.close(fd)
                os.replace(
                    f"stage-{stage}.log", f"stage-{stage}.log.1", src_dir_fd=self._dir.fd, dst_dir_fd=self._dir.fd
                )
                fd, size = self._open(stage)
            os.write(fd, data)
            self._files[stage] = (fd, size + len(data))
        except OSError as exc:
            self.problem = f"the run's output is no longer kept in {self._dir.path}: {exc.strerror}"

    def stage(self, stage: int, **facts: object) -> None:
        """What is known of a stage (its container and image when it starts, its exit code when it ends): a JSON
        line of `stages.jsonl`, which `ps -a` and `wait` read once the engine has nothing of the run."""
        self._fact({"stage": stage, "at": _now(), **facts})

    def place(self, **where: object) -> None:
        """Where the run's stages run (its engines, or its Ray cluster): a line of `stages.jsonl`, so that `ps -a`
        shows an ended run only for the engines it is asked about. The engine DOCKER_HOST or DOCKER_CONTEXT names
        is kept with it."""
        self._fact({"place": {**default_engine(), **where}})

    def _fact(self, fact: dict[str, object]) -> None:
        if self.problem:
            return
        data = (json.dumps(fact, separators=(",", ":")) + "\n").encode()
        try:
            fd = os.open(FACTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600, dir_fd=self._dir.fd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            self.problem = f"the run's output is no longer kept in {self._dir.path}: {exc.strerror}"

    def _open(self, stage: int) -> tuple[int, int]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW
        fd = os.open(f"stage-{stage}.log", flags, 0o600, dir_fd=self._dir.fd)
        return fd, os.fstat(fd).st_size

    def close(self) -> None:
        for fd, _ in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()
        with contextlib.suppress(OSError):
            os.close(self._live)  # the run ended: its output may be pruned from now on
        self._dir.close()


def _prune(runs: StateDir, keep: int) -> int:
    """Only the newest `keep` runs' logs stay (by their directory's time), and every live one: how many stay."""
    try:
        names = [n for n in os.listdir(runs.fd) if not n.startswith(".")]
        dated = sorted(names, key=lambda n: os.stat(n, dir_fd=runs.fd, follow_symlinks=False).st_mtime)
    except OSError:
        return 0
    stay = len(dated)
    for name in dated[: max(0, len(dated) - keep)]:
        with contextlib.suppress(OSError), runs.sub(name) as old:
            if _live(old):
                continue
            for f in os.listdir(old.fd):
                os.unlink(f, dir_fd=old.fd)
            os.rmdir(name, dir_fd=runs.fd)
            stay -= 1
    return stay


def _live(run: StateDir) -> bool:
    """A launcher holds this run's `.live` lock: it is still keeping the run's output."""
    try:
        fd = os.open(LIVE, os.O_RDONLY | NOFOLLOW, dir_fd=run.fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _root(root: str | Path | None) -> Path | None:
    return Path(root) if root else None


def kept_runs(root: str | Path | None = None) -> list[str]:
    with StateDir.open(_root(root)) as base, base.sub(RUNS) as runs:
        return sorted(n for n in os.listdir(runs.fd) if not n.startswith("."))


@dataclass(frozen=True)
class StageFacts:
    """What the launcher kept of a stage of an ended run (its last attempt's)."""

    stage: int
    container: str = "-"
    image: str = "-"
    exit_code: int | None = None
    ended_at: str = ""
    refused: str = ""  # why it never started (the engine refused it, or the chain stopped first)


def _kept_facts(run_id: str, root: str | Path | None) -> bytes:
    """The run's facts file as its launcher wrote it (b"" when it kept none)."""
    with StateDir.open(_root(root)) as base, base.sub(RUNS) as runs:
        try:
            fd = os.open(run_id, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=runs.fd)
        except OSError:
            return b""
        with StateDir(runs.path / run_id, fd) as d:
            return d.read(FACTS) or b""


def facts(run_id: str, root: str | Path | None = None) -> dict[int, StageFacts]:
    """Each stage's container, image and exit code, as the launcher kept them ({} when it kept none)."""
    out: dict[int, StageFacts] = {}
    for raw in _kept_facts(run_id, root).splitlines():
        try:
            item = json.loads(raw)
            k = int(item["stage"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a launcher that died while writing it
        was = out.get(k, StageFacts(k))
        if "container" in item:  # a new attempt's stage: what it had before no longer counts
            refused = str(item.get("refused", ""))
            was = StageFacts(k, str(item["container"]), str(item.get("image", "-")), refused=refused)
        if "exit_code" in item:
            code = item["exit_code"]
            was = StageFacts(k, was.container, was.image, code if isinstance(code, int) else None, str(item["at"]))
        out[k] = was
    return out


def default_engine() -> dict[str, str | None]:
    """What names the engine a command reaches when it is given no --host: DOCKER_HOST, DOCKER_CONTEXT."""
    env = os.environ
    return {"docker_host": env.get("DOCKER_HOST") or None, "docker_context": env.get("DOCKER_CONTEXT") or None}


def place(run_id: str, root: str | Path | None = None) -> dict[str, Any] | None:
    """Where the run ran, as its launcher kept it (RunLog.place); None when it kept nothing of it (an older run)."""
    for raw in _kept_facts(run_id, root).splitlines():
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("place"), dict):
            return dict(item["place"])
    return None


def ended(root: str | Path | None = None) -> list[tuple[str, list[int], float]]:
    """The kept runs whose launcher is gone (not live): (run id, its stages, when its output was last written),
    without reading their lines."""
    out = []
    with StateDir.open(_root(root)) as base, base.sub(RUNS) as runs:
        for name in sorted(n for n in os.listdir(runs.fd) if not n.startswith(".")):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=runs.fd)
            except OSError:
                continue
            with StateDir(runs.path / name, fd) as d:
                if _live(d):
                    continue
                files = [n for n in os.listdir(d.fd) if n.startswith("stage-")]
                stages = sorted({int(n.split("-")[1].split(".")[0]) for n in files if n.split("-")[1][:1].isdigit()})
                last = max((os.stat(n, dir_fd=d.fd, follow_symlinks=False).st_mtime for n in files), default=0.0)
                out.append((name, stages, last))
    return out


def read(run_id: str, root: str | Path | None = None) -> list[KeptLine]:
    """Every kept line of the run, stage by stage, oldest first."""
    out: list[KeptLine] = []
    with StateDir.open(_root(root)) as base, base.sub(RUNS) as runs:
        try:
            fd = os.open(run_id, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=runs.fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return []
            raise errors.StateFault(f"cannot read {runs.path / run_id}: {exc.strerror}") from None
        with StateDir(runs.path / run_id, fd) as d:
            stages = sorted({int(n.split("-")[1].split(".")[0]) for n in os.listdir(d.fd) if n.startswith("stage-")})
            for k in stages:
                for name in (f"stage-{k}.log.1", f"stage-{k}.log"):
                    out += [parse(k, raw) for raw in _lines(d, name)]
    return out


def _lines(d: StateDir, name: str) -> list[str]:
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=d.fd)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8", "backslashreplace").splitlines()


def parse(stage: int, raw: str) -> KeptLine:
    """A kept line, `<time> <stream> <text>` (as a launcher keeps it, and a detached run's guard in its record)."""
    when, _, rest = raw.partition(" ")
    stream, _, text = rest.partition(" ")
    return KeptLine(stage, when, stream, text)
