"""The chain's backend over several Docker engines: each stage on its host's engine, one scope over all.

Every container is known by the id its own engine returned (ids are 64 random hex digits: one id names one
container on one engine). Each engine has its own connections, so each stage's stdin lifeline runs over its
host's own connection: a launcher that dies, or an SSH session that drops, closes it there.

A host that stops answering is that host's problem alone: it is marked lost and asked nothing more (each call
would wait out its timeout), while the other hosts are torn down as usual. What was created there and never
seen gone is reported as possibly left, with the `down` command to run when the host is back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pp_launch.adapters.docker_engine import DockerStageBackend
from pp_launch.core import errors
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import Sink, StageGone

HostLost = errors.HostLost


class MultiHostBackend:
    def __init__(self, backends: Mapping[str, DockerStageBackend]) -> None:
        self.backends = dict(backends)
        self._host_of: dict[str, str] = {}
        self._gone: set[str] = set()
        self.lost: dict[str, errors.EngineLost] = {}
        self._lock = threading.Lock()

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
        ref = str(self._call(spec.host, "create", self.backends[spec.host].create, spec, env))
        self._host_of[ref] = spec.host
        return ref

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        ref = str(self._call(spec.host, "create", self.backends[spec.host].create_waiting, spec, env))
        self._host_of[ref] = spec.host
        return ref

    def _sink(self, ref: str, host: str, sink: Sink) -> Sink:
        """Marks the stage gone, and says which host when the engine's wait broke (no exit code: the
        connection to that host ended, not the stage)."""

        def put(event: Any) -> None:
            if isinstance(event, StageGone):
                self._gone.add(ref)
                if event.exit_code is None:
                    why = f": {event.detail}" if event.detail else ""
                    event = StageGone(event.stage, None, f"lost the connection to host {host}{why}")
            sink(event)

        return put

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        host, backend = self._on(ref)
        self._call(host, "start", backend.start, ref, stage, self._sink(ref, host, sink))

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        host, backend = self._on(ref)
        self._call(host, "watch", backend.watch, ref, stage, self._sink(ref, host, sink))

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
        for backend in self.backends.values():
            backend.tearing_down()

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

        with ThreadPoolExecutor(max_workers=min(len(self.backends), 16) or 1, thread_name_prefix="leftovers") as pool:
            return [ref for refs in pool.map(ask, self.backends) for ref in refs]

    def where(self, ref: str) -> str:
        return self._host_of.get(ref, "?")
