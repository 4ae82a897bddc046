"""The watchdog: removes a run's containers when its launcher dies, however it dies.

The launcher starts the watchdog (`python -I -c BOOT pp_launch.adapters.watchdog RUN_ID GRACE`) in its own process
session (so a signal to the launcher's process group does not reach it), from `/`, isolated from the working
directory and the user's Python environment (a `logging.py` or `docker.py` planted in the launcher's working
directory, or PYTHONPATH, cannot stop it starting), with a pipe as stdin. On that pipe the launcher writes
`expect <name>` before each create, `own <id>` for every container the engine creates for the run (the run's guard
and the ids it records: adapters/guard.py), `detach` once a detached run is handed to its guard, and `done` once
it has seen every one of them gone (a clean end: the watchdog ends without asking the engine anything). When the
launcher exits otherwise, by SIGKILL included, the kernel closes the pipe; the watchdog reads EOF, sends SIGTERM to
those containers (by id: never one that merely carries the run's labels; an expected name only when it carries the
run's label and never started), waits up to GRACE seconds, then removes what is left by force. It is the second
layer: the guard on the engine does the same on its own; this one covers a guard removed by someone else as its
launcher dies, and a guard created but not yet started.

When the engine does not answer (stopped, killed, frozen, restarting), the watchdog keeps trying, every few
seconds, for PP_WATCHDOG_PATIENCE seconds (default 900): an engine that comes back within that time finds
the run's containers removed. Past it, `pp-launch gc` and the sweep at every start are what is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable

import pp_launch

MODULE = "pp_launch.adapters.watchdog"  # in the child's argv: how a watchdog is recognised (ps, the leak guard)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pp_launch.__file__)))
# -I: no working directory, script directory, PYTHON* variables or user site on the path; ours is put there alone.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from pp_launch.adapters.watchdog import main; "
    "sys.exit(main(sys.argv[3:]))"
)

MAX_GRACE = 5.0  # the launcher's promise: gone within 10 s of its death
PATIENCE = 900.0  # how long it waits for a lost engine to come back (PP_WATCHDOG_PATIENCE)
RETRY = 2.0


def spawn(run_id: str, grace: float, host: str | None = None, orphan: bool = False) -> subprocess.Popen[bytes]:
    """Start the watchdog for `run_id`; keep the returned Popen (its stdin is the lifeline, and takes `own <id>`
    lines) until exit. `host`: the engine it watches (--host; a chain across hosts has one watchdog per host),
    None for DOCKER_HOST or the default. orphan: not a child of this process (`setsid -f`), for a parent whose
    children are killed with it (a Ray worker: Ray kills an actor's child processes when it ends it)."""
    extra = [f"--host={host}"] if host is not None else []
    fork = ["setsid", "-f"] if orphan and shutil.which("setsid") else []
    return subprocess.Popen(
        [*fork, sys.executable, "-I", "-c", BOOT, PACKAGE_ROOT, MODULE, run_id, str(grace), *extra],
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def sweep(run_id: str, grace: float, host: str | None, ids: list[str]) -> list[str]:
    """The chain's own teardown for the run's containers `ids` (recorded at their creates; a container that only
    carries the run's labels is never among them): SIGTERM, at most MAX_GRACE, SIGKILL, removal confirmed.
    Raises while anything of them is left, so that the caller tries again."""
    from pp_launch.adapters.docker_engine import DockerStageBackend, connect
    from pp_launch.adapters.inbox import QueueInbox
    from pp_launch.adapters.runtime import ThreadRuntime
    from pp_launch.core import labels
    from pp_launch.core.chain.scope import ChainScope, Found, QuietReporter

    engine = connect(timeout=5, host=host)
    found = [c for c in engine.containers(labels.run_selector(run_id)) if c.id in ids]
    if not found:
        return []
    adopted = [Found(c.id, c.name, c.state == "running") for c in found]
    backend = DockerStageBackend(engine)
    grace = min(grace, MAX_GRACE)
    quiet, runtime = QuietReporter(), ThreadRuntime()
    scope = ChainScope.adopt(run_id, adopted, backend, QueueInbox(), quiet, grace, runtime, kill_wait=5.0)
    outcome = scope.stop("launcher gone")
    if outcome.orphans or outcome.exit_code != 0:
        raise RuntimeError(f"run {run_id} not fully removed: {outcome.message}")
    return [c.name for c in found]


def _unanswered(run_id: str, names: list[str], ids: list[str], host: str | None) -> tuple[list[str], bool]:
    """Creates the launcher sent but never read the answer of (it died in between): by the exact name it was about
    to create, with this run's label, never started (so holding nothing) or left Dead by an engine that died under
    the create, and not already recorded. And whether the engine answered (if not, ask again once it is back)."""
    if not names:
        return [], True
    from pp_launch.adapters.docker_engine import connect
    from pp_launch.core import labels

    found = []
    try:
        engine = connect(timeout=5, host=host)
        for name in names:
            info = engine.inspect(name) or {}
            tagged = ((info.get("Config") or {}).get("Labels") or {}).get(labels.RUN)
            state = (info.get("State") or {}).get("Status")
            ref = str(info.get("Id", ""))
            if tagged == run_id and state in ("created", "dead") and ref and ref not in ids:
                found.append(ref)
    except Exception:  # the engine is lost: asked again when it answers, as the recorded ids are swept then
        return found, False
    return found, True


def _told(lines: Iterable[bytes]) -> tuple[list[str], list[str]] | None:
    """What the launcher told, until its end (EOF: it is gone): the ids it created (`own ID`) and the names it was
    about to create (`expect NAME`); None when it let go (`detach`: the run's guard owns it; `done`: it saw every
    recorded container gone, its guard too, so there is nothing to ask the engine)."""
    ids: list[str] = []
    expected: list[str] = []
    for raw in lines:
        words = raw.decode("ascii", "replace").split()
        if words in (["detach"], ["done"]):
            return None
        if len(words) == 2 and words[0] == "own" and len(words[1]) == 64:
            ids.append(words[1])
        elif len(words) == 2 and words[0] == "expect":
            expected.append(words[1])
    return ids, expected


def main(argv: list[str]) -> int:
    hosts = [a.removeprefix("--host=") for a in argv if a.startswith("--host=")]
    argv = [a for a in argv if not a.startswith("--host=")]
    host = hosts[0] if hosts else None
    run_id, grace = argv[0], float(argv[1]) if len(argv) > 1 else MAX_GRACE
    told = _told(sys.stdin.buffer)
    if told is None:
        return 0
    ids, expected = told
    patience = float(os.environ.get("PP_WATCHDOG_PATIENCE", PATIENCE))
    deadline = time.monotonic() + patience
    asked = False
    while True:
        if not asked:
            found, asked = _unanswered(run_id, expected, ids, host)
            ids += found
        if asked and not ids:
            return 0
        try:
            if not asked:
                raise ConnectionError("the engine does not answer yet")
            sweep(run_id, grace, host, ids)
            return 0
        except Exception:  # the engine is lost (or not back yet): try again while it may come back
            if time.monotonic() + RETRY > deadline:
                return 1  # past our patience: gc and the next start's sweep cover what is left
            time.sleep(RETRY)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
