"""The chain's backend over several Docker engines: each stage on its host's engine, one scope over all.

Every container is known by the id its own engine returned (ids are 64 random hex digits: one id names one
container on one engine). Each engine has its own connections, so each stage's stdin lifeline runs over its
host's own connection: a launcher that dies, or an SSH session that drops, closes it there.

A host that stops answering is that host's problem alone: it is marked lost and asked nothing more (each call
would wait out its timeout), while the other hosts are torn down as usual. What was created there and never
seen gone is reported as possibly left, with the `down` command to run when the host is back.

How a lost host is noticed: a call to it fails; a stage's wait on it breaks (no exit code); a stage there ends
and a fresh connection to its engine then fails (an engine that is stopping stops its containers first, and
they may exit 0); or the heartbeat, a fresh connection to each host every PP_HOST_HEARTBEAT seconds (5), fails
(a network that drops packets without a reset). Each of these ends that host's stages with "lost the
connection to host H", which fails the chain.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pp_launch.adapters.docker_engine import DockerStageBackend
from pp_launch.adapters.runtime import Nursery, map_all
from pp_launch.core import errors
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import PlaceLost, Sink, StageGone

HostLost = errors.HostLost


class MultiHostBackend:
    def __init__(
        self,
        backends: Mapping[str, DockerStageBackend],
        check: Callable[[str], str | None] | None = None,
        heartbeat: float | None = None,
        expected: int = 0,
        on_all_created: Callable[[], None] = lambda: None,
    ) -> None:
        """expected/on_all_created: called once when that many stages exist, or teardown begins (the hosts'
        GPU locks are released then: the stages' labels now say which GPUs they hold)."""
        self.backends = dict(backends)
        self._host_of: dict[str, str] = {}
        self._gone: set[str] = set()
        self._sinks: dict[str, tuple[int, Sink]] = {}
        self.lost: dict[str, errors.EngineLost] = {}
        self._lock = threading.Lock()
        # whether a host's engine still takes a connection made now (a stopping one no longer does)
        self._check = check or (lambda host: self.backends[host].engine.answers_anew())
        self._heartbeat = float(os.environ.get("PP_HOST_HEARTBEAT", "5")) if heartbeat is None else heartbeat
        self._stopping = threading.Event()
        self._beating = False
        self._threads = Nursery("the hosts' heartbeat")
        self._expected = expected
        self._on_all_created: Callable[[], None] | None = on_all_created

    # ------------------------------------------------------------------------------ dispatch
    def _call(self, host: str, what: str, fn: Any, *args: Any) -> Any:
        if host in self.lost:
            raise HostLost(f"host {host} is unreachable ({self.lost[host]}); not asked to {what}")
        try:
            return fn(*args)
        except errors.EngineLost as exc:
            with self._lock:
                self.lost.setdefault(host, exc)
            raise HostLost(f"host {host}: {exc}") from None

    def _on(self, ref: str) -> tuple[str, DockerStageBackend]:
        host = self._host_of[ref]
        return host, self.backends[host]

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        return self._created(spec, self._call(spec.host, "create", self.backends[spec.host].create, spec, env))

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        made = self._call(spec.host, "create", self.backends[spec.host].create_waiting, spec, env)
        return self._created(spec, made)

    def _created(self, spec: StageSpec, ref: Any) -> str:
        with self._lock:
            self._host_of[str(ref)] = spec.host
            done = len(self._host_of) >= self._expected
        if done:
            self._all_created()
        return str(ref)

    def _all_created(self) -> None:
        with self._lock:
            call, self._on_all_created = self._on_all_created, None
        if call is not None:
            call()

    def _sink(self, ref: str, host: str, stage: int, sink: Sink) -> Sink:
        """Marks the stage gone, and says which host when the engine's wait broke (no exit code: the
        connection to that host ended, not the stage), or when the host no longer answers after the stage
        ended (its engine stopped it)."""
        self._sinks[ref] = (stage, sink)

        def put(event: Any) -> None:
            if isinstance(event, StageGone):
                with self._lock:
                    if ref in self._gone:
                        return  # already ended for it (its host was lost)
                    self._gone.add(ref)
                if event.exit_code is None:
                    why = f": {event.detail}" if event.detail else ""
                    event = StageGone(event.stage, None, f"lost the connection to host {host}{why}")
                elif not self._stopping.is_set() and (reason := self._check(host)) is not None:
                    self._mark_lost(host, reason)
                    sink(PlaceLost(lost_host(host, reason)))  # the cause first: its engine stopped the stage
                    event = StageGone(event.stage, None, f"lost the connection to host {host} ({reason})")
            sink(event)

        return put

    def _mark_lost(self, host: str, why: str) -> None:
        with self._lock:
            self.lost.setdefault(host, errors.EngineLost(why))

    def _end_host(self, host: str, why: str) -> None:
        """The host is lost: each of its stages not yet gone ends now, as far as the chain knows (the loss said
        first, through the first of them)."""
        self._mark_lost(host, why)
        told = False
        for ref, (stage, sink) in list(self._sinks.items()):
            with self._lock:
                if self._host_of.get(ref) != host or ref in self._gone:
                    continue
                self._gone.add(ref)
            if not told:
                sink(PlaceLost(lost_host(host, why)))
                told = True
            sink(StageGone(stage, None, f"lost the connection to host {host} ({why})"))

    def _beat(self) -> None:
        while not self._stopping.wait(self._heartbeat):
            for host in self.backends:
                if host in self.lost or self._stopping.is_set():
                    continue
                why = self._check(host)
                if why is not None and not self._stopping.is_set():
                    self._end_host(host, why)

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        host, backend = self._on(ref)
        if not self._beating and self._heartbeat > 0:
            self._beating = True
            self._threads.start(self._beat, name="host-heartbeat")
        self._call(host, "start", backend.start, ref, stage, self._sink(ref, host, stage, sink))

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        host, backend = self._on(ref)
        self._call(host, "watch", backend.watch, ref, stage, self._sink(ref, host, stage, sink))

    def deliver(self, ref: str, data: bytes) -> None:
        host, backend = self._on(ref)
        self._call(host, "hand off", backend.deliver, ref, data)

    def signal(self, ref: str, signum: int) -> None:
        host, backend = self._on(ref)
        self._call(host, "signal", backend.signal, ref, signum)

    def kill(self, ref: str) -> None:
        host, backend = self._on(ref)
        self._call(host, "kill", backend.kill, ref)

    def remove(self, ref: str) -> None:
        host, backend = self._on(ref) if ref in self._host_of else (None, None)
        if host is None or backend is None:
            return  # not created by this chain: never touched
        self._call(host, "remove", backend.remove, ref)

    def tearing_down(self) -> None:
        self._stopping.set()
        self._all_created()
        for backend in self.backends.values():
            backend.tearing_down()

    def close(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._threads.join(timeout)
        for host, backend in self.backends.items():
            if host not in self.lost:  # a lost host's waits end with the process: never waited on again
                backend.close(timeout)

    def hand_over(self, ref: str) -> None:
        _, backend = self._on(ref)
        backend.hand_over(ref)

    def leftovers(self, run_id: str) -> list[str]:
        """Asked of every host at once; a lost host's share is every stage created there and not seen gone."""

        def ask(host: str) -> list[str]:
            if host not in self.lost:
                try:
                    found = self._call(host, "list", self.backends[host].leftovers, run_id)
                except HostLost:
                    pass
                else:
                    for ref in found:
                        self._host_of.setdefault(ref, host)
                    return list(found)
            return sorted(ref for ref, h in self._host_of.items() if h == host and ref not in self._gone)

        return [ref for refs in map_all(ask, list(self.backends), "leftovers") for ref in refs]

    def where(self, ref: str) -> str:
        return self._host_of.get(ref, "?")


def lost_host(host: str, why: str) -> str:
    """How a lost host is first said (app/docker_site.py adds what may be left there and what to run)."""
    return f"host {host} could not be reached ({why})"
