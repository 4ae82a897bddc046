"""A run's guard on each engine it uses, in the manner of testcontainers' Ryuk (docs/chain.md, "The guard").

The guard is a running container of the run (`pp-launch/guard`, built offline; tini as init, auto-remove, no
network) that reaches its own engine through the engine's socket. The launcher holds its stdin, and writes to it
the id the engine returned for each of the run's creates, before that container starts: the guard's record is
the only list of what is the run's own on that engine. Labels only help people find things: `down`, `ps` and
the guard itself act on recorded ids alone, never on a container that merely carries the run's labels.

- The launcher ends, however it ends: the engine closes the guard's stdin; the guard stops every recorded
  container (SIGTERM, the grace, SIGKILL, removal confirmed) and exits. Nothing on the engine depends on the
  launcher's machine still being there.
- A detached run: once it is up the launcher writes `detach`; the guard is the run's owner from then on, until
  `pp-launch down` (SIGUSR1 to the guard, which tears the run down) or the run's last container ends.
- The guard's own output (`owned <id>`, `detached`) is the record that `down` and `ps` read back from the engine.

The launcher's local watchdog (adapters/watchdog.py) gets the same ids on its own stdin: a second layer, for
when the guard is removed by someone else while its launcher dies.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters import host_state, watchdog
from pp_launch.adapters.docker_engine import DockerStageBackend, Engine, Held, _first_line
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import GUARD_IMAGE

HEARTBEAT_ENV = "PP_LAUNCH_GUARD_HEARTBEAT"  # seconds; 0: none. Default: HEARTBEAT over a network, none on a socket
HEARTBEAT = 8.0
SOCKET_ENV = "PP_LAUNCH_GUARD_SOCKET"  # the engine's socket on its own machine, when it is not reached over one
DEFAULT_SOCKET = "/var/run/docker.sock"
INSIDE = "/var/run/docker.sock"
ENTRY = ("python3", "-u", "/usr/local/lib/pp-guard/pp_guard.py")


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
    """The launcher's end of one engine's guard, and of the local watchdog that keeps the same record."""

    def __init__(
        self,
        engine: Engine,
        held: Held,
        keeper: subprocess.Popen[bytes] | None,
        run_id: str = "",
        ids: host_state.RunIds | None = None,
    ) -> None:
        self.engine, self.held, self.keeper, self.run_id, self.ids = engine, held, keeper, run_id, ids
        self._lock = threading.Lock()  # creates run on several threads at once: one line at a time
        self.owned: list[str] = []
        self._quiet = threading.Event()
        self._beat: threading.Thread | None = None
        self._on_down: Callable[[], None] = lambda: None
        self._stream = held.stream  # taken now: letting go empties the Held
        self._listener = threading.Thread(target=self._listen, name="guard-listener", daemon=True)

    def when_down(self, call: Callable[[], None]) -> None:
        """`call` (once) when the guard says it was told to stop (`pp-launch down`), from the listener's thread."""
        self._on_down = call

    def _listen(self) -> None:
        """The guard's stdout after `ready`: a `down` line, then nothing (the stream ends with the guard, or when
        this side lets go)."""
        line = _first_line(self._stream, None)
        if line == b"down":
            self._on_down()

    def _beats(self, every: float) -> None:
        """A line to the guard every `every` seconds until close(): the launcher is alive and reachable."""
        while not self._quiet.wait(every):
            with self._lock:
                try:
                    self.held.write(b"beat\n")
                except OSError:
                    return  # gone: the next own() says so

    @classmethod
    def start(
        cls, engine: Engine, run_id: str, owner: str, grace: float, host: str | None = None, orphan: bool = False
    ) -> RunGuard:
        """The guard on `engine`, running before any container of the run is created there. The watchdog comes
        first, and learns the guard's name before its create and its id before its start: a launcher killed in
        between leaves no guard that never started (nothing else would ever end it). orphan: the watchdog is not
        this process's child (a Ray actor's children are killed with it)."""
        beat = heartbeat(engine)
        keeper = watchdog.spawn(run_id, grace, host=host, orphan=orphan)
        ids = host_state.RunIds()
        name = guard_name(run_id)
        _tell(keeper, f"expect {name}\n".encode())

        def created(ref: str) -> None:
            _tell(keeper, f"own {ref}\n".encode())
            with contextlib.suppress(errors.PpLaunchError):
                ids.add(run_id, ref)

        try:
            held = engine.hold(
                name,
                GUARD_IMAGE,
                guard_labels(run_id, owner),
                ENTRY,
                binds={socket_path(engine): INSIDE},
                env={
                    "PP_GUARD_GRACE": f"{grace:g}",
                    "PP_GUARD_HEARTBEAT": f"{beat:g}",
                    "PP_GUARD_ENGINE": engine.identity()[0],
                },
                ready=True,
                created=created,
            )
        except BaseException:
            _close(keeper)
            raise
        if held is None:
            _close(keeper)
            raise errors.EngineError(
                f"the engine at {engine.address} already has a container named {name}: the run's guard must be "
                "its own (someone created that name first); launch again"
            )
        guard = cls(engine, held, keeper, run_id, ids)
        guard._listener.start()
        if beat > 0:
            guard._beat = threading.Thread(target=guard._beats, args=(beat / 4,), name="guard-heartbeat", daemon=True)
            guard._beat.start()
        return guard

    def own(self, ref: str) -> None:
        """Record a container the engine just created for the run (the guard, the watchdog, this user's state):
        GuardLost when the guard is gone."""
        line = f"own {ref}\n".encode()
        with self._lock:
            self.owned.append(ref)
            if self.ids is not None:
                with contextlib.suppress(errors.PpLaunchError):
                    self.ids.add(self.run_id, ref)  # a state directory that fails is no reason to stop the run
            self._tell_keeper(line)
            try:
                self.held.write(line)
            except OSError:
                raise errors.GuardLost(self.lost_message()) from None

    def stage_backend(self, **options: Any) -> DockerStageBackend:
        """The run's stages on this guard's engine: each name told (to the watchdog) before its create, each id
        recorded right after it, before the stage starts. The one way a run's containers are made, whoever makes
        them (a chain, a Ray node's agent, pp-gpu-node, the testing kit)."""
        return DockerStageBackend(self.engine, record=self.own, expect=self.expect, **options)

    def expect(self, name: str) -> None:
        """Before a create: the watchdog learns the name, so that a create whose answer this process never read
        (killed in between) is still found: by that exact name, this run's label, never started."""
        with self._lock:
            self._tell_keeper(f"expect {name}\n".encode())

    def lost_message(self) -> str:
        return (
            f"the run's guard on the engine at {self.engine.address} (container {self.held.id[:12]}) is gone: "
            "stopped by 'pp-launch down', or removed by another client"
        )

    def alive(self) -> bool:
        return self.held.alive()

    def detach(self) -> None:
        """The run is up and detached: the guard owns it from now on (the watchdog lets it be)."""
        with self._lock:
            self._tell_keeper(b"detach\n")
            try:
                self.held.write(b"detach\n")
            except OSError:
                raise errors.GuardLost(self.lost_message()) from None

    def close(self, wait: float = 0.0) -> None:
        """The launcher's end: the guard tears down what is left (nothing, after a clean teardown) and exits,
        unless the run is detached. wait: seconds to wait for it to be gone (a chain says "nothing left" only
        once its guard is gone too). The watchdog is let go last: what is left then (the guard included, when it
        did not go in time) is its to remove."""
        self._quiet.set()
        if self._beat is not None:
            self._beat.join()
        with self._lock:
            self.held.let_go()
        self._listener.join()
        clean = wait > 0 and self._gone_within(wait) and self._none_left()
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
            while self.engine.inspect(self.held.id) is not None:
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


def records(engine: Engine, run: str | None = None) -> list[GuardRecord]:
    """Every running guard of pp-launch's own image on this engine (or of `run`), read back from its output.
    A container that calls itself a guard from another image records nothing."""
    ours = engine.image_id(GUARD_IMAGE)
    if ours is None:
        return []
    found = [
        c
        for c in engine.containers([*labels.run_selector(run), f"{labels.STAGE}={labels.STAGE_GUARD}"])
        if c.state == "running"
    ]
    out = []
    for c in found:
        info = engine.inspect(c.id) or {}
        if info.get("Image") != ours:
            continue
        owned: list[str] = []
        detached = False
        for line in engine.log_lines(c.id):
            words = line.decode("ascii", "replace").split()
            if len(words) == 2 and words[0] == "owned" and len(words[1]) == 64:
                owned.append(words[1])
            elif words == ["detached"]:
                detached = True
        out.append(GuardRecord(c.id, c.labels.get(labels.RUN, ""), tuple(owned), detached))
    return out


def image_check(engine: Engine, where: str) -> None:
    """The guard's image must be on every engine a run uses (nothing is pulled)."""
    if engine.image_labels(GUARD_IMAGE) is None:
        raise errors.ImageMissing(
            f"pp-launch's guard image {GUARD_IMAGE} is not on {where}: run 'pp-launch images build' there, or "
            f"load it (docker save {GUARD_IMAGE} | docker -H ENGINE load)"
        )
