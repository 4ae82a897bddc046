"""A run's guard on each engine it uses, in the manner of testcontainers' Ryuk (docs/chain.md, "The guard").

The guard is a running container of the run (`pp-launch/guard`, built offline; tini as init, auto-remove, no
network, no stdin) that reaches its own engine through the engine's socket. Its lifeline is an exec session this
process alone holds (`docker exec -i`): the launcher writes to it the id the engine returned for each of the run's
creates, before that container starts, and the guard checks each is a container of this run; the guard's record is
the only list of what is the run's own on that engine. No `docker attach` (the container has no stdin) or
`docker logs` of anyone else reaches the session. Labels only help people find things: `down`, `ps` and the guard
itself act on recorded ids alone, never on a container that merely carries the run's labels.

- The launcher ends, however it ends: the engine closes the session's stdin; the guard stops every recorded
  container (SIGTERM, the grace, SIGKILL, removal confirmed) and exits. Nothing on the engine depends on the
  launcher's machine still being there.
- A detached run: once it is up the launcher writes `detach`; the guard is the run's owner from then on, until
  `pp-launch down` (SIGUSR1 to the guard, which tears the run down) or the run's last container ends.
- The guard says `alive` on the session four times a second. A guard that someone else stops, kills, removes or
  pauses falls silent: within a second this side removes it (a paused one too: it is no longer the run's guard),
  starts a new guard holding the same ids, and says so; if no new guard can be had, the run is ended (`when_lost`).
- The guard's stderr (`owned <id>`, `detached`) is the record that `down` and `ps` read back from the engine.

The launcher's local watchdog (adapters/watchdog.py) gets the same ids on its own stdin: a second layer, for
when the guard is removed by someone else while its launcher dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters import host_state, identity, watchdog
from pp_launch.adapters.docker_engine import (
    GUARD_RECORD_AT,
    RECORD_INSIDE,
    ContainerInfo,
    DockerStageBackend,
    Engine,
    Session,
    VolumeInfo,
    engine_time,
)
from pp_launch.adapters.runtime import Nursery
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import GUARD_IMAGE

HEARTBEAT_ENV = "PP_LAUNCH_GUARD_HEARTBEAT"  # seconds; 0: none. Default: HEARTBEAT over a network, none on a socket
HEARTBEAT = 8.0
SOCKET_ENV = "PP_LAUNCH_GUARD_SOCKET"  # the engine's socket on its own machine, when it is not reached over one
DEFAULT_SOCKET = "/var/run/docker.sock"
INSIDE = "/var/run/docker.sock"
PROGRAM = "/usr/local/lib/pp-guard/pp_guard.py"
ENTRY = ("python3", "-u", PROGRAM)
SESSION = ("python3", "-I", "-S", "-u", PROGRAM, "session")  # a relay: the standard library's sockets, nothing more
READY_PATIENCE = 15.0  # seconds a new guard may take to say it is ready
REPLACEMENT_PATIENCE = 10.0  # seconds a guard put in another's place waits for its launcher's session
LOST_AFTER = 1.0  # seconds without a word from the guard before it counts as lost (paused, frozen, gone)
KILL_SEEN_WITHIN = 3.0  # seconds a busy engine may take to say a killed guard died, once its session has ended
LISTEN_SLICE = 0.25


def socket_path(engine: Engine) -> str:
    """Where the engine listens on its own machine: the unix socket we reach it by, else the usual one."""
    if engine.url.startswith("unix://"):
        return engine.url.removeprefix("unix://")
    return os.environ.get(SOCKET_ENV, DEFAULT_SOCKET)


def heartbeat(engine: Engine) -> float:
    """How often the guard must hear from the launcher: a local socket closes when the launcher dies, a network
    link that is cut (or a machine that freezes) closes nothing, so there silence must count as the end."""
    configured = os.environ.get(HEARTBEAT_ENV, "").strip()
    if configured:
        try:
            return max(0.0, float(configured))
        except ValueError:
            raise errors.ConfigError(f"{HEARTBEAT_ENV}={configured!r}: give seconds (0 turns it off)") from None
    return 0.0 if engine.url.startswith("unix://") else HEARTBEAT


RECORD_PREFIX = "pp-launch-record-"
READER = "pp-launch.reader"  # the one label of a helper that reads records (no run's: `ps` never lists it)
RECORD_AT = GUARD_RECORD_AT  # where the guard keeps the run's record (its volume)


def record_volume(run_id: str, token: str) -> str:
    """A record of the run on an engine: a named volume its guards append to and its stages mount (read-only). One
    per line of guards (a run's first guard and those put in its place); a run of several launchers on one engine
    (`chain --gpu-node`: a pp-gpu-node per stage) has one per launcher."""
    return f"{RECORD_PREFIX}{run_id}-{token}"


def is_record_of(name: str, run_id: str) -> bool:
    token = name.removeprefix(f"{RECORD_PREFIX}{run_id}-")
    return bool(run_id) and token != name and len(token) == 8 and all(ch in "0123456789abcdef" for ch in token)


def record_labels(run_id: str, owner: str) -> dict[str, str]:
    """A record volume's labels: its run, and whose it was (the run's owner; the process that made it)."""
    made_by = identity.current_owner().label()
    return {labels.RUN: run_id, labels.STAGE: labels.STAGE_RECORD, labels.OWNER: owner, labels.LAUNCHER: made_by}


def guard_labels(run_id: str, owner: str) -> dict[str, str]:
    """A guard is made before its run's first attempt and stays to its last: its attempt is the first."""
    return {
        labels.RUN: run_id,
        labels.STAGE: labels.STAGE_GUARD,
        labels.OWNER: owner,
        labels.GPUS: "",
        labels.ATTEMPT: "1",
    }


class RunGuard:
    """The launcher's end of one engine's guard (replaced when someone else ends it), and of the local watchdog that
    keeps the same record."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        owner: str,
        grace: float,
        keeper: subprocess.Popen[bytes] | None,
        ids: host_state.RunIds | None = None,
    ) -> None:
        self.engine, self.run_id, self.owner, self.grace = engine, run_id, owner, grace
        self.keeper, self.ids = keeper, ids
        self._lock = threading.RLock()  # creates run on several threads at once: one line at a time; a restore too
        self.owned: list[str] = []
        self.ref = ""  # the guard container now
        self.session: Session | None = None
        self.since = 0.0  # when the run's first guard started (the engine's clock): what a new one may own
        self.beat = heartbeat(engine)
        self.replaced = 0  # how many times another client ended the guard and a new one took over
        self.record = ""  # the record volume every guard of this line keeps (and every stage mounts)
        self._closing = False
        self._down = False
        self._gone = ""  # why the run has no guard any more ("" while it has one)
        self._stopping = ""  # the guard that said it was stopping (SIGTERM)
        self._quiet = threading.Event()
        self._heard = time.monotonic()
        self._on_down: Callable[[], None] = lambda: None
        self._say: Callable[[str], None] = lambda text: None
        self._on_gone: Callable[[str], None] = lambda why: None
        self._threads = Nursery(f"run {run_id}'s guard")  # its listener and heartbeat, joined by close()

    def when_down(self, call: Callable[[], None]) -> None:
        """`call` (once) when the guard says it was told to stop (`pp-launch down`), from the listener's thread."""
        self._on_down = call

    def when_lost(self, say: Callable[[str], None], gone: Callable[[str], None]) -> None:
        """When someone else ends the guard: `say` what happened and that a new guard took over; `gone(why)` when
        none could (the run has no guard: it must end), from the listener's thread."""
        self._say, self._on_gone = say, gone

    @classmethod
    def start(
        cls,
        engine: Engine,
        run_id: str,
        owner: str,
        grace: float,
        host: str | None = None,
        orphan: bool = False,
    ) -> RunGuard:
        """The guard on `engine`, running before any container of the run is created there. The watchdog comes
        first, and learns the guard's name before its create and its id before its start: a launcher killed in
        between leaves no guard that never started (nothing else would ever end it). orphan: the watchdog is not
        this process's child (a Ray actor's children are killed with it)."""
        keeper = watchdog.spawn(run_id, grace, host=host, orphan=orphan)
        guard = cls(engine, run_id, owner, grace, keeper, host_state.RunIds())
        try:
            guard._bring_up()
        except BaseException:
            _close(keeper)
            raise
        guard._spawn(guard._listen, "guard-listener")
        if guard.beat > 0:
            guard._spawn(guard._beats, "guard-heartbeat")
        return guard

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self._threads.start(target, name=name)

    def _bring_up(self) -> None:
        """A guard container for this run, its session ready, told every id the run owns that still exists."""
        name = guard_name(self.run_id)
        self._tell_keeper(f"expect {name}\n".encode())

        def created(ref: str) -> None:
            self._tell_keeper(f"own {ref}\n".encode())
            if self.ids is not None:
                with contextlib.suppress(errors.PpLaunchError):
                    self.ids.add(self.run_id, ref)

        if not self.record:  # the run's first guard: its record is made first, and kept by every guard after it
            self.record = record_volume(self.run_id, secrets.token_hex(4))
            self._make_record(self.record)
        record = self.record
        env = _guard_env(self.engine, self.run_id, self.grace, self.beat)
        if self.since:
            env["PP_GUARD_SINCE"] = f"{self.since:.3f}"
        if self.owned:  # a guard in another's place owns the run's ids from its start: this process may die next
            env["PP_GUARD_OWN"] = ",".join(self.owned)
            # and, should it die before its session, the new guard tears the run down soon, not after 30 s
            env["PP_GUARD_SESSION_PATIENCE"] = f"{REPLACEMENT_PATIENCE:g}"
        ref = self.engine.keep(
            name, GUARD_IMAGE, guard_labels(self.run_id, self.owner), ENTRY,
            {socket_path(self.engine): INSIDE, record: RECORD_AT}, env, created,
        )  # fmt: skip
        if ref is None:
            raise errors.EngineError(
                f"the engine at {self.engine.address} already has a container named {name}: the run's guard must be "
                "its own (someone created that name first); launch again"
            )
        try:
            session = self.engine.session(ref, SESSION)
            said = session.line(READY_PATIENCE)
        except errors.EngineError:
            said = None
            session = None
        except BaseException:
            self.engine.remove(ref)
            raise
        if said != b"ready":
            if session is not None:
                session.close()
            state = (self.engine.inspect(ref) or {}).get("State") or {}
            self.engine.remove(ref)
            if not self.owned:  # the run's first guard, removed: nothing of the run is left for the watchdog
                self._tell_keeper(b"done\n")
            if not state.get("Running"):
                raise errors.EngineError(self.engine.why_not_running(f"the run's guard {name}", GUARD_IMAGE, state))
            text = (said or b"").decode("utf-8", "backslashreplace") or f"nothing within {READY_PATIENCE:g} s"
            if text.startswith("record: "):  # the run's record cannot be written: a fault of the engine's disk
                raise errors.EngineError(
                    f"the run's record on the engine at {self.engine.address} cannot be written "
                    f"({text.removeprefix('record: ')}): nothing was started; free space on the engine's disk "
                    "('docker system df' there), then launch again"
                )
            raise errors.ConfigError(f"the run's guard on the engine at {self.engine.address} is not ready: {text}")
        assert session is not None  # said ready
        self.ref, self.session, self._heard = ref, session, time.monotonic()
        if not self.since:
            self.since = _started(self.engine, ref)
        for known in self.owned:
            if self.engine.inspect(known) is not None:
                session.write(f"own {known}\n".encode())

    def _make_record(self, name: str) -> None:
        make_record(self.engine, name, self.run_id, self.owner)

    # ------------------------------------------------------------------------------------------ the session
    def _listen(self) -> None:
        """The guard's lines: `alive`, `down`, `refused`. Silence or the session's end: the guard is lost."""
        while not self._closing:
            session = self.session
            if session is None:
                return
            line = session.line(LISTEN_SLICE)
            if self._closing or self._down:
                return
            if line is None or (line == b"" and time.monotonic() - self._heard > LOST_AFTER):
                if session is not self.session:
                    continue  # replaced meanwhile (a write found it gone first)
                if not self._lost(ended=line is None):
                    return  # no guard any more (the run is told, when_lost), or its engine is lost (the run's own)
                continue
            if line:
                self._heard = time.monotonic()
            if line == b"down":
                self._down = True
                self._on_down()
                return
            if line == b"stopping":
                self._stopping = self.ref  # said by the guard itself on SIGTERM: `docker stop`
            if line.startswith(b"refused "):
                self._say(f"the run's guard refused to own {line.decode('ascii', 'replace')[8:]}")
            if line.startswith(b"record-fault "):
                why = line.decode("utf-8", "replace").removeprefix("record-fault ")
                self._say(
                    f"warning: the run's record on the engine at {self.engine.address} cannot be written ({why}): "
                    "once the run ends, 'wait', 'ps -a' and 'logs' cannot tell how its stages ended"
                )

    def _lost(self, ended: bool = True) -> bool:
        """The guard fell silent (`ended`: its session ended). Someone else ended it (stopped, killed, removed,
        paused): it is removed by its id first (a paused one can do nothing more for the run; a live one whose session
        ended first would tear the run down), then its session is let go, a new guard holds the run's ids, and that
        is said. A guard that runs and is not paused is only slow (a busy machine): heard again, not replaced.
        False: no new guard could be started (`gone` is told why), or the engine itself does not answer (a lost
        engine is the run's to see and say: nothing here acts on it)."""
        with self._lock:
            if self._closing or self._down or self._gone:
                return not self._gone
            old = self.ref
            try:  # asked even after the guard said `stopping`: an engine shutting down stops it, then answers no more
                seen = _what_happened(self.engine, old, ended)
            except errors.PpLaunchError:
                return False
            what = "stopped (docker stop)" if self._stopping == old else seen
            if not what:
                self._heard = time.monotonic()
                return True
            with contextlib.suppress(errors.PpLaunchError):
                self.engine.remove(old)
            if self.session is not None:
                self.session.close()
            where = f"the run's guard on the engine at {self.engine.address} (container {old[:12]})"
            try:
                self._bring_up()
            except (errors.EngineLost, errors.HostLost):
                self.session = None
                return False  # the engine went meanwhile (a stopping engine stops its guard first): the run's to say
            except errors.PpLaunchError as exc:
                self._gone = f"{where} was {what} by another client, and no new guard could be started ({exc})"
                self.session = None
            else:  # said once the new guard holds the run's ids and the lifeline, never before
                self.replaced += 1
                self._say(f"{where} was {what} by another client: a new guard (container {self.ref[:12]}) holds "
                          f"the run's {len(self.owned)} containers")  # fmt: skip
                return True
        self._on_gone(self._gone)
        return False

    def _beats(self) -> None:
        """A line to the guard every quarter of its heartbeat until close(): the launcher is alive and reachable."""
        while not self._quiet.wait(self.beat / 4):
            with contextlib.suppress(OSError, errors.PpLaunchError):
                self._write(b"beat\n")

    def _write(self, line: bytes) -> None:
        """A line to the guard; a session that is gone is the guard lost: a new one is put in place first (GuardLost
        when none can be)."""
        with self._lock:
            for _ in range(2):
                session = self.session
                if session is None:
                    break
                try:
                    session.write(line)
                    return
                except OSError:
                    if not self._lost():
                        break
            raise errors.GuardLost(self.lost_message())

    def own(self, ref: str) -> None:
        """Record a container the engine just created for the run (the guard, the watchdog, this user's state):
        GuardLost when the run has no guard any more."""
        with self._lock:
            self.owned.append(ref)
            if self.ids is not None:
                with contextlib.suppress(errors.PpLaunchError):
                    self.ids.add(self.run_id, ref)  # a state directory that fails is no reason to stop the run
            self._tell_keeper(f"own {ref}\n".encode())
            self._write(f"own {ref}\n".encode())

    def stage_backend(self, **options: Any) -> DockerStageBackend:
        """The run's stages on this guard's engine: each name told (to the watchdog) before its create, each id
        recorded right after it, before the stage starts. The one way a run's containers are made, whoever makes
        them (a chain, a Ray node's agent, pp-gpu-node, the testing kit)."""
        return DockerStageBackend(
            self.engine, record=self.own, expect=self.expect, record_volume=self.record, **options
        )

    def expect(self, name: str) -> None:
        """Before a create: the watchdog learns the name, so that a create whose answer this process never read
        (killed in between) is still found: by that exact name, this run's label, never started."""
        with self._lock:
            self._tell_keeper(f"expect {name}\n".encode())

    def lost_message(self) -> str:
        if self._gone:
            return self._gone
        return (
            f"the run's guard on the engine at {self.engine.address} (container {self.ref[:12]}) is gone: "
            "stopped by 'pp-launch down'"
        )

    def alive(self) -> bool:
        """The run still has its guard (none was told `down`, or lost for good)."""
        if self._down or self._gone:
            return False
        try:
            info = self.engine.inspect(self.ref) or {}
        except errors.PpLaunchError:
            return False
        return bool((info.get("State") or {}).get("Running"))

    @property
    def down_heard(self) -> bool:
        return self._down

    @property
    def gone(self) -> str:
        """Why the run has no guard any more: another client ended it and none could take over ("" otherwise)."""
        return self._gone

    def detach(self) -> None:
        """The run is up and detached: the guard owns it from now on (the watchdog lets it be)."""
        with self._lock:
            self._tell_keeper(b"detach\n")
            self._write(b"detach\n")

    def close(self, wait: float = 0.0) -> None:
        """The launcher's end: the guard tears down what is left (nothing, after a clean teardown) and exits,
        unless the run is detached. wait: seconds to wait for it to be gone (a chain says "nothing left" only
        once its guard is gone too). The watchdog is let go last: what is left then (the guard included, when it
        did not go in time) is its to remove."""
        with self._lock:
            self._closing = True
            self._quiet.set()
            if self.session is not None:
                self.session.close()
        self._threads.join(None)  # the session closed: the listener's read ends, and the heartbeat sees _closing
        clean = wait > 0 and bool(self.ref) and self._gone_within(wait) and self._none_left()
        if clean:
            self._tell_keeper(b"done\n")  # nothing for it to do: it ends without asking the engine anything
        if self.keeper is not None:
            _close(self.keeper)
        if clean and self.ids is not None:
            with contextlib.suppress(errors.PpLaunchError):
                self.ids.forget(self.run_id)  # a clean end: nothing of the run is left to record

    def _gone_within(self, seconds: float) -> bool:
        """Until the engine no longer has the guard (it found nothing left, exited, was auto-removed), at most
        `seconds`: asked by id, every 50 ms (the engine's wait has no clock of its own here). False: still there,
        or the engine did not answer."""
        deadline = time.monotonic() + seconds
        try:
            while self.engine.inspect(self.ref) is not None:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
        except (errors.PpLaunchError, OSError):
            return False
        return True

    def _none_left(self) -> bool:
        """The engine has none of the containers recorded for the run (asked by id)."""
        try:
            return all(self.engine.inspect(ref) is None for ref in self.owned)
        except (errors.PpLaunchError, OSError):
            return False

    def _tell_keeper(self, data: bytes) -> None:
        if self.keeper is not None:
            _tell(self.keeper, data)


def _what_happened(engine: Engine, ref: str, ended: bool) -> str:
    """What became of a guard that fell silent without saying it was stopped, as the engine says: paused, or killed
    or removed (auto-removed once killed: the two look alike); "" when it runs, unpaused, with its session open (only
    slow). A guard being killed may still run a moment after its session ended: waited for, KILL_SEEN_WITHIN at most
    (a session is cut with its whole container at once, but a busy engine says the container died later: 1 s apart
    in CI under load; a guard that runs with its session cut tears its run down whatever is said here).
    PpLaunchError when the engine does not answer."""
    deadline = time.monotonic() + (KILL_SEEN_WITHIN if ended else 0.0)
    info = engine.inspect(ref)
    while info is not None and _running(info) and time.monotonic() < deadline:
        time.sleep(0.05)
        info = engine.inspect(ref)
    state = (info or {}).get("State") or {}
    if state.get("Paused"):
        return "paused"
    if info is None or not state.get("Running"):
        return "killed or removed"
    return "silenced (its session ended)" if ended else ""


def _running(info: dict[str, Any]) -> bool:
    state = info.get("State") or {}
    return bool(state.get("Running")) and not state.get("Paused")


def _started(engine: Engine, ref: str) -> float:
    """When a container started, on the engine's clock (seconds since the epoch; 0 when unknown)."""
    return engine_time(str(((engine.inspect(ref) or {}).get("State") or {}).get("StartedAt", "")))


def guard_name(run_id: str) -> str:
    """A guard's container name: known before its create, so that the watchdog can find a create whose answer
    never came back; unique, since one run may have several guards on one engine (each `pp-gpu-node` stage of a
    `--gpu-node` chain holds its own)."""
    return f"pp-guard-{run_id}-{secrets.token_hex(4)}"


def _tell(keeper: subprocess.Popen[bytes], data: bytes) -> None:
    if keeper.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            keeper.stdin.write(data)
            keeper.stdin.flush()


def _close(keeper: subprocess.Popen[bytes]) -> None:
    if keeper.stdin is not None:
        with contextlib.suppress(OSError):
            keeper.stdin.close()


@dataclass(frozen=True)
class GuardRecord:
    """What one running guard says is its run's own on its engine."""

    id: str
    run: str
    owned: tuple[str, ...]
    detached: bool
    ends: tuple[StageEnd, ...] = ()  # each owned container that ended, as the engine said it (its events)
    volume: str = ""  # read from the run's record volume: no running guard holds the run ("" : its guard's log)
    over: bool = False  # the guard recorded the run's end (torn down, or every container gone)
    keeps: str = ""  # the record volume this running guard mounts (a look-alike mounts none of its run's)
    ended_by: str = ""  # a detached run its guard ended as one: which stage ended it and how ("stage K (NAME), ...")
    fault: str = ""  # why the guard could not append to the run's record (its log says `record-fault: WHY`)


@dataclass(frozen=True)
class StageEnd:
    """How a container of the run ended, as its guard recorded it from the engine's events."""

    id: str
    stage: str
    attempt: int
    exit_code: int | None
    at: int  # the engine's time, seconds since the epoch
    name: str
    oom: bool = False


def records(engine: Engine, run: str | None = None, among: set[str] | None = None) -> list[GuardRecord]:
    """Every running guard of pp-launch's own image on this engine (or of `run`, or of the runs `among`) that keeps
    a record of its run, read back from its output. A container that calls itself a guard from another image, or
    that mounts no record volume of its run, records nothing; which guards a launcher made is `vouch`'s to say."""
    out = []
    for c in _guards(engine, run):
        if among is None or c.labels.get(labels.RUN, "") in among:
            found = read_record(c.id, c.labels.get(labels.RUN, ""), engine.log_lines(c.id))
            out.append(dataclasses.replace(found, keeps=c.keeps))
    return out


def guarded_runs(engine: Engine) -> set[str]:
    """The runs a running guard of ours holds on this engine (nothing of their logs is read)."""
    return {c.labels.get(labels.RUN, "") for c in _guards(engine, None)}


def _guards(engine: Engine, run: str | None) -> list[ContainerInfo]:
    ours = engine.image_id(GUARD_IMAGE)
    if ours is None:
        return []
    found = [
        c
        for c in engine.containers([*labels.run_selector(run), f"{labels.STAGE}={labels.STAGE_GUARD}"])
        if c.state == "running"
    ]
    return [
        c
        for c in found
        if is_record_of(c.keeps, c.labels.get(labels.RUN, ""))
        and (c.image_id or (engine.inspect(c.id) or {}).get("Image")) == ours
    ]


def read_record(ref: str, run: str, lines: Iterable[bytes], volume: str = "") -> GuardRecord:
    """A guard's record from its lines (its log, or the run's record volume): what it owned, whether the run
    was detached, each owned container's end, whether the run's end was recorded. A line said twice (by a guard
    and the one put in its place) counts once."""
    owned: dict[str, None] = {}
    detached = over = False
    ended_by = fault = ""
    ends: dict[str, StageEnd] = {}
    oom: set[str] = set()
    for line in lines:
        words = line.decode("ascii", "replace").split()
        if len(words) == 2 and words[0] == "owned" and ID.fullmatch(words[1]):
            owned[words[1]] = None
        elif words == ["detached"]:
            detached = True
        elif len(words) == 2 and words[0] == "oom":
            oom.add(words[1])
        elif len(words) >= 7 and words[0] == "ended" and words[1] in owned:
            ends.setdefault(words[1], _end(words, words[1] in oom))
        elif words in (["torn", "down"], ["every", "container", "of", "the", "run", "is", "gone"]):
            over = True
        elif words[:3] == ["run", "ended", "by"] and not ended_by:
            ended_by = " ".join(words[3:]).split(":", 1)[0]
        elif words[:1] == ["record-fault:"] and not fault:
            fault = " ".join(words[1:])
    return GuardRecord(
        ref, run, tuple(owned), detached, tuple(ends.values()), volume, over, ended_by=ended_by, fault=fault
    )


ID = re.compile(r"[0-9a-f]{64}")


def dead_records(
    engine: Engine,
    run: str | None = None,
    among: set[str] | None = None,
    live: set[str] | None = None,
    seen: Iterable[ContainerInfo] = (),
) -> list[GuardRecord]:
    """The records of runs on this engine that no running guard holds: a guard someone else removed (its run may
    still be there), or a run that ended. Read from each run's record volume in one short helper container of the
    guard's image; a volume someone made under a taken-looking name records nothing of anyone else's (a container
    counts as a run's only when it mounts that run's volume: housekeeping.vouch). among: only these runs;
    live: the runs whose guards run (read here when not given). seen: containers already listed; a record that
    one of them mounts where a stage sees it is read from that container (`docker cp`: no helper to start)."""
    if live is None:
        live = guarded_runs(engine)
    volumes = [
        v
        for v in engine.volumes([*labels.run_selector(run), f"{labels.STAGE}={labels.STAGE_RECORD}"])
        if is_record_of(v.name, v.labels.get(labels.RUN, ""))
        and v.labels.get(labels.RUN) not in live
        and (among is None or v.labels.get(labels.RUN) in among)
    ]
    holders = {c.record: c.id for c in seen if c.record}
    out: list[GuardRecord] = []
    unread = []
    for v in volumes:
        text = engine.read_file(holders[v.name], f"{RECORD_INSIDE}/log") if v.name in holders else None
        if text is None:
            unread.append(v)
        else:
            out.append(read_record("", v.labels.get(labels.RUN, ""), text.splitlines(), v.name))
    return out + _read_volumes(engine, unread)


def _read_volumes(engine: Engine, volumes: list[VolumeInfo]) -> list[GuardRecord]:
    """Records read in one short helper container of the guard's image that mounts them all (read-only)."""
    script = 'for d in /records/*; do echo "=== $1 ${d#/records/}"; cat "$d/log" 2>/dev/null; done; exit 0'
    chunks = {labels.ascii_int(name): lines for name, lines in _in_records(engine, [v.name for v in volumes], script)}
    return [read_record("", v.labels.get(labels.RUN, ""), chunks.get(n, []), v.name) for n, v in enumerate(volumes)]


def _in_records(engine: Engine, volumes: list[str], script: str) -> list[tuple[str, list[bytes]]]:
    """What `script` prints of these record volumes, mounted read-only at /records/N in one short helper container
    of the guard's image, in the parts it opens with `echo "=== $1 NAME"` ([] when there is no guard image). `$1`
    is a token made for this read: a record's own lines (anyone can write a volume under a run's record name)
    cannot open a part, and so cannot pass for another record's."""
    if not volumes or engine.image_id(GUARD_IMAGE) is None:
        return []
    token = secrets.token_hex(8)
    binds = {name: f"/records/{n}" for n, name in enumerate(volumes)}
    argv = ["sh", "-c", script, "reader", token]
    code, out, err = engine.run_helper(GUARD_IMAGE, argv, {}, {READER: "record"}, {}, [], binds=binds)
    if code != 0:
        raise errors.EngineError(
            f"the engine at {engine.address} did not let its run records be read: "
            f"{err.decode('utf-8', 'replace').strip() or f'exit {code}'}"
        )
    parts: list[tuple[str, list[bytes]]] = []
    opening = f"=== {token} ".encode()
    for line in out.splitlines():
        if line.startswith(opening):
            parts.append((line[len(opening) :].decode("ascii", "replace"), []))
        elif parts:
            parts[-1][1].append(line)
    return parts


def kept_lines(engine: Engine, run: str, only: set[str]) -> dict[int, list[bytes]]:
    """Each stage's last lines as the guard of a detached run kept them in its record (`stage-K.log.1`, then
    `stage-K.log`: `<time> <stream> <text>` lines), from the record volumes of `run` among `only` (this user's
    own: a neighbour can make a volume under a run's record name), read in one short helper container."""
    volumes = [
        v.name
        for v in engine.volumes([*labels.run_selector(run), f"{labels.STAGE}={labels.STAGE_RECORD}"])
        if v.name in only and is_record_of(v.name, run)
    ]
    script = 'for f in /records/*/stage-*.log.1 /records/*/stage-*.log; do echo "=== $1 ${f##*/}"; cat "$f"; echo; done'
    return stage_files(_in_records(engine, volumes, script))


def stage_files(files: Iterable[tuple[str, list[bytes]]]) -> dict[int, list[bytes]]:
    """The lines of a record's `stage-K.log.1` and `stage-K.log` files (name, lines), by stage, the older file's
    first; any other file, and empty lines, left out."""
    lines: dict[int, list[bytes]] = {}
    for name, part in sorted(files, key=lambda f: (f[0].split(".")[0], f[0].endswith(".log"))):
        stage = labels.ascii_int(name.removeprefix("stage-").split(".")[0]) if name.startswith("stage-") else None
        if stage is not None and name.endswith((".log", ".log.1")):
            lines.setdefault(stage, []).extend(line for line in part if line)
    return lines


def _end(words: list[str], oom: bool) -> StageEnd:
    """`ended <id> <stage> <attempt> <exit code> <time> <name>`, its numbers read strictly."""
    attempt, code, at = (labels.ascii_int(w) for w in words[3:6])
    return StageEnd(words[1], words[2], attempt or 1, code, at or 0, " ".join(words[6:]), oom)


def record_volumes(engine: Engine, run: str | None = None) -> list[VolumeInfo]:
    """The engine's record volumes (of one run, or every run's), as their labels say: anyone can make such a one."""
    return engine.volumes([*labels.run_selector(run), f"{labels.STAGE}={labels.STAGE_RECORD}"])


def stale_records(
    engine: Engine, keep: float, listed: list[VolumeInfo], only: set[str] | None = None
) -> list[VolumeInfo]:
    """Of the record volumes `listed`, those older than `keep` seconds that no container mounts any more: their run
    is gone (its stages and guards all mount it), so `gc` may remove them (`only`: of these volumes)."""
    now = time.time()
    return [
        v
        for v in listed
        if is_record_of(v.name, v.labels.get(labels.RUN, ""))
        and (only is None or v.name in only)
        and now - v.created >= keep
        and not _kept_by(engine, v.name)
    ]


def _kept_by(engine: Engine, name: str, ended_keeps: bool = True) -> bool:
    """Whether a container keeps the record: one that runs and is not a record reader of pp-launch's (a reader,
    anyone's `ps -a`, mounts every record it reads for a moment); `ended_keeps`: also one that ended and is not
    being removed (a stage an engine crash left Dead is still the run's)."""
    for ref in engine.volume_users(name):
        info = engine.inspect(ref)
        if info is None:
            continue  # gone meanwhile
        if _running(info):
            if READER not in ((info.get("Config") or {}).get("Labels") or {}):
                return True
        elif ended_keeps and (info.get("State") or {}).get("Status") != "removing":
            return True
    return False


def release_record(engine: Engine, name: str, patience: float, ended_keeps: bool = True) -> bool:
    """A record volume removed, asked again for `patience` seconds while only containers that let go of it by
    themselves mount it (a reader; a removal under way: the engine lets go of a removed container's volumes a
    moment after it says it is gone); False: it stays (kept by a container, `_kept_by`, or in use to the end)."""
    deadline = time.monotonic() + patience
    while not engine.remove_volume(name):
        if not engine.has_volume(name):
            return True
        if _kept_by(engine, name, ended_keeps) or time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def sweep_own_records(engine: Engine) -> list[str]:
    """At the end of a run: the records this user's runs made that are past the keep (PP_LAUNCH_RECORD_KEEP, a week;
    or older than the newest PP_LAUNCH_RECORD_COUNT, 50) and whose runs are gone, removed from the engine and from
    the user's list, as `gc` removes them, so that daily use piles none up; and the user's entries of this engine
    whose volumes it no longer has, forgotten. Asks the engine nothing while the user's list holds none past it."""
    keep, runs = host_state.record_keep(), host_state.RunRecords()
    old = set(runs.past(keep, host_state.record_count()))
    if not old:
        return []
    listed = record_volumes(engine)
    gone = [v.name for v in stale_records(engine, 0.0, listed, only=old) if release_record(engine, v.name, 5.0)]
    for name in gone:
        runs.forget(name)
    forget_lost_records(engine, runs, keep, listed)
    return gone


RECORD_LOST_AFTER = 3600.0  # seconds an entry must be old before its volume's absence counts (made after the volume)


def forget_lost_records(engine: Engine, runs: host_state.RunRecords, keep: float, listed: list[VolumeInfo]) -> None:
    """This user's entries for records made on this engine (their note: its identity) whose volumes are not among
    the engine's record volumes `listed` (a `docker volume prune`, another client removed them): forgotten, once
    past the keep and an hour old, so that no run's end asks the engine about them again. Entries of other engines,
    and those an older pp-launch wrote with no note, are left."""
    if not runs.listed():  # `gc` of a user with no state: none is made
        return
    there = {v.name for v in listed}
    for name in runs.every(older_than=max(keep, RECORD_LOST_AFTER), note=engine.engine_id()):
        if name not in there:
            runs.forget(name)


def _guard_env(engine: Engine, run_id: str, grace: float, beat: float) -> dict[str, str]:
    return {
        "PP_GUARD_RECORD": f"{RECORD_AT}/log",
        "PP_GUARD_GRACE": f"{grace:g}",
        "PP_GUARD_HEARTBEAT": f"{beat:g}",
        "PP_GUARD_ENGINE": engine.engine_id(),
        "PP_GUARD_RUN": run_id,
    }


def make_record(engine: Engine, name: str, run_id: str, owner: str) -> None:
    """A run's record volume on this engine, labelled with a mark of this launcher's own: a volume of that name
    someone else made first (the engine answers such a create with the volume that is there) is refused."""
    mark = secrets.token_hex(16)
    made = engine.make_volume(name, {**record_labels(run_id, owner), labels.RECORD_MARK: mark})
    if made.get(labels.RECORD_MARK) != mark:
        raise errors.EngineError(
            f"the engine at {engine.address} already has a volume named {name}: the run's record must be its "
            "own (someone made that name first); launch again"
        )
    made_on = ""  # the engine's identity (asked once per connection): how its entries are told from another's
    with contextlib.suppress(errors.PpLaunchError):
        made_on = engine.engine_id()
    with contextlib.suppress(errors.PpLaunchError):  # a state directory that fails is no reason to stop the run
        host_state.RunRecords().add(name, note=made_on)


def image_check(engine: Engine, where: str) -> None:
    """The guard's image must be on every engine a run uses (nothing is pulled)."""
    if engine.image_labels(GUARD_IMAGE) is None:
        raise errors.ImageMissing(
            f"pp-launch's guard image {GUARD_IMAGE} is not on {where}: run 'pp-launch images build' there, or "
            f"load it (docker save {GUARD_IMAGE} | docker -H ENGINE load)"
        )
