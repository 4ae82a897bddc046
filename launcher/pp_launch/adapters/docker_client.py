"""docker-py's APIClient as pp-launch uses it (docs/architecture.md, "One Docker client").

Three things docker-py leaves to its caller:

- **A call bounded as a whole.** docker-py's `timeout` bounds each socket operation, so an engine that answers a
  byte at a time keeps one call going for ever. Here every call in `BOUNDED` (the ones that answer at once) shares
  one deadline across its connect, send and every read: the sockets under the client are `_Bounded`, and read the
  deadline the calling thread set (`within`). Streams (an attach's output, a wait for a removal's answer, logs,
  build) run without it, as their length is the container's. Over a unix socket and plain tcp://; over TLS and
  ssh:// each read is bounded by docker-py's timeout, as docker-py does.
- **One connection pool per engine** (`ONE_POOL`), where docker-py keeps one per request URL.
- **An answer of the shape its call has.** A socket that is not a Docker engine answers HTML, `{}` or a list; docker-py
  then raises `JSONDecodeError`, `KeyError` or hands the odd value on. `checked` names the call instead
  (`NotAnEngine`, which docker_engine reports in one line like a lost connection).

Only this module and docker_engine import `docker`; nothing else in the package does.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.abc
import json
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

SSH_TRANSPORT = "docker.transport.sshconn"


class _SshLater(importlib.abc.MetaPathFinder):
    """While docker-py is first imported: its ssh transport (and paramiko, 0.1 s, which docker-py imports whenever it
    is installed) is not loaded; docker-py treats that as "no ssh". `ssh_transport()` loads it for an ssh:// engine.
    Nothing stands in for either module: once docker is imported this finder is gone, and find_spec and every
    import see paramiko and the transport as they are."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == SSH_TRANSPORT:
            raise ImportError(f"{SSH_TRANSPORT} is loaded when an ssh:// engine is used (adapters/docker_client.py)")
        return None


def _import_docker() -> None:
    if "docker" in sys.modules:
        return
    later = _SshLater()
    sys.meta_path.insert(0, later)
    try:
        import docker.api.client  # noqa: F401
    finally:
        sys.meta_path.remove(later)


_import_docker()

import docker as docker  # noqa: E402  (after the above, on purpose; docker_engine takes it from here)
import docker.constants  # noqa: E402
import docker.errors  # noqa: E402
import docker.utils  # noqa: E402
import requests.adapters  # noqa: E402
import urllib3.connection  # noqa: E402
import urllib3.connectionpool  # noqa: E402
from docker.transport.unixconn import (  # noqa: E402
    UnixHTTPAdapter,
    UnixHTTPConnection,
    UnixHTTPConnectionPool,
)


class NotAnEngine(http.client.HTTPException):
    """The socket answered, but not as a Docker engine does (not JSON, or not the shape the call has)."""


class CallTimeout(TimeoutError):
    """A whole call (connect, send, every read of its answer) took longer than the client's timeout."""


# What answers at once, so is bounded as a whole; and the shape of its answer (None: none to check).
BOUNDED: dict[str, tuple[type, str] | None] = {
    "ping": None,
    "version": (dict, "/version"),
    "info": (dict, "/info"),
    "inspect_image": (dict, "an image's inspect"),
    "inspect_container": (dict, "a container's inspect"),
    "containers": (list, "the container list"),
    "create_container_from_config": (dict, "a create"),
    "start": None,
    "kill": None,
    "remove_container": None,
    "remove_image": None,
    "put_archive": None,
    "attach_socket": None,  # its answer's headers; the stream after them is the container's
    "exec_create": (dict, "an exec's create"),
    "exec_start": None,  # with socket=True: its answer's headers; the stream after them is the process's
    "create_volume": (dict, "a volume's create"),
    "remove_volume": None,
}

_call = threading.local()  # .deadline: when the calling thread's current call must be answered whole


@contextlib.contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """The calling thread's engine calls inside share `seconds` in all (None: no whole-call clock)."""
    before = getattr(_call, "deadline", None)
    _call.deadline = None if seconds is None else time.monotonic() + seconds
    try:
        yield
    finally:
        _call.deadline = before


def checked(name: str, value: Any) -> Any:
    """The answer of call `name`, if it has the shape that call's answer has; else NotAnEngine naming the call."""
    shape = BOUNDED.get(name)
    if shape is None:
        return value
    kind, what = shape
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise NotAnEngine(
            f"the engine answered {what} with {type(value).__name__} where {expected} belongs: not a Docker "
            "engine, or one that is broken"
        )
    if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
        raise NotAnEngine(f"the engine answered {what} with an entry that is not an object: not a Docker engine")
    if name == "create_container_from_config" and isinstance(value, dict) and not isinstance(value.get("Id"), str):
        raise NotAnEngine(f"the engine's answer to a create has no container id: {str(value)[:80]}")
    return value


def not_json(name: str, exc: ValueError) -> NotAnEngine:
    what = (BOUNDED.get(name) or (None, name))[1]
    return NotAnEngine(f"the engine answered {what} with something that is not JSON ({exc}): not a Docker engine")


class _Bounded(socket.socket):
    """A socket whose operations, inside `within`, share the calling thread's deadline; outside it, each has the
    timeout its owner set (urllib3's read timeout, None for a stream)."""

    _own: float | None = None

    @classmethod
    def adopt(cls, sock: socket.socket) -> _Bounded:
        """The same connected socket, bounded (urllib3 and docker-py make theirs; we take it over by its fd)."""
        timeout = sock.gettimeout()
        bounded = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        bounded.settimeout(timeout)
        return bounded

    def settimeout(self, value: float | None) -> None:
        self._own = value
        super().settimeout(value)

    def _left(self) -> None:
        deadline = getattr(_call, "deadline", None)
        if deadline is None:
            super().settimeout(self._own)
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise CallTimeout("timed out: the engine's answer did not come whole in time")
        super().settimeout(left if self._own is None else min(left, self._own))

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self._left()
        return super().recv(*args, **kwargs)

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self._left()
        return super().recv_into(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> int:
        self._left()
        return super().send(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self._left()
        super().sendall(*args, **kwargs)


class _UnixConnection(UnixHTTPConnection):  # type: ignore[misc]
    def connect(self) -> None:
        sock = _Bounded(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock._left()  # the connect counts against the call too
            sock.connect(self.unix_socket)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _UnixPool(UnixHTTPConnectionPool):  # type: ignore[misc]
    def _new_conn(self) -> _UnixConnection:
        return _UnixConnection(self.base_url, self.socket_path, self.timeout)


# docker-py keys its unix and ssh adapters' connection pools by each request's whole URL (docker/docker-py#2970), so
# every new path (a container's id, a query) opened a connection of its own: over ssh:// a new channel, its own
# shell and `docker system dial-stdio` on the host (46 for a 2-stage chain). The engine is one origin: one pool.
ONE_POOL = "http+docker://localhost"


class _UnixAdapter(UnixHTTPAdapter):  # type: ignore[misc]
    def get_connection(self, url: str, proxies: Any = None) -> _UnixPool:
        with self.pools.lock:
            pool = self.pools.get(ONE_POOL)
            if pool is None:
                pool = _UnixPool(ONE_POOL, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                self.pools[ONE_POOL] = pool
        return pool  # type: ignore[no-any-return]


class _TcpConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _Bounded.adopt(super()._new_conn())


class _TcpPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _TcpConnection


class _TcpAdapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {**self.poolmanager.pool_classes_by_scheme, "http": _TcpPool}


def api_client(url: str, timeout: float, tls: Any = False) -> Any:
    """docker-py's APIClient for the engine at `url`, its API version asked (as docker-py's version="auto"), every
    call in BOUNDED bounded by `timeout` as a whole where the transport allows (see the module's text)."""
    seconds = max(1, int(timeout))
    if url.startswith("unix://") or (url.startswith("tcp://") and not tls):
        api = docker.APIClient(base_url=url, version=docker.constants.DEFAULT_DOCKER_API_VERSION, timeout=seconds)
        if url.startswith("unix://"):
            api._custom_adapter = _UnixAdapter(api._custom_adapter.socket_path, seconds)
            api.mount("http+docker://", api._custom_adapter)
            api.trust_env = False  # no proxy or .netrc applies to a socket: a third of each call's time, not read
        else:
            api.mount("http://", _TcpAdapter())
        api._version = negotiate(api, timeout)
        return api
    one_pool = ssh_transport() if url.startswith("ssh://") else None
    api = docker.APIClient(base_url=url, tls=tls, version="auto", timeout=seconds, use_ssh_client=False)
    if one_pool is not None and type(api._custom_adapter) is one_pool.__base__:
        api._custom_adapter.__class__ = one_pool  # the same adapter and SSH session, its connections in one pool
    return api


def fresh_get(api: Any, path: str, params: Mapping[str, Any], timeout: float) -> Any | None:
    """GET `path` of the engine over a connection made for this one call, never one of the client's pool (a stopping
    engine has closed its listener but still serves the connections already open: only a new one tells it is going
    away); its JSON answer. Over ssh:// the connection is a new channel of the client's SSH session (its own `docker
    system dial-stdio`, so its own connection to the engine's socket there), not a new session with its key
    exchange. None where the transport has no such connection of its own (tcp://: the caller makes a client)."""
    url = api._url(path)
    adapter = api.get_adapter(url)
    if not isinstance(adapter, _UnixAdapter) and type(adapter) not in _ssh_pool:
        return None
    conn = adapter.get_connection(url, None)._new_conn()
    conn.timeout = timeout  # each read of an ssh channel too (`within` bounds the unix socket's call as a whole)
    try:
        with within(timeout):
            conn.request("GET", f"{urllib.parse.urlsplit(url).path}?{urllib.parse.urlencode(params)}")
            answer = conn.getresponse()
            body = answer.data  # read whole (urllib3 preloads it)
    finally:
        conn.close()
    if answer.status >= 400:
        raise docker.errors.APIError(f"{answer.status} from GET {path}: {body[:200]!r}")
    return json.loads(body)


_ssh_pool: list[type] = []  # the one-pool ssh adapter, made once the transport is loaded


def ssh_transport() -> type | None:
    """docker-py's ssh transport (and paramiko), loaded now, for an ssh:// engine: where docker-py looks for it; and
    its adapter with one connection pool (ONE_POOL), or None without paramiko (a plain install: docker-py says so, as
    it always did; the `ssh` extra installs it)."""
    import docker.api.client as client

    try:
        from docker.transport.sshconn import SSHHTTPAdapter
    except ImportError:
        return None
    if getattr(client, "SSHHTTPAdapter", None) is None:
        client.SSHHTTPAdapter = SSHHTTPAdapter
    if not _ssh_pool:

        class OneSshPool(SSHHTTPAdapter):  # type: ignore[misc]
            def get_connection(self, url: str, proxies: Any = None) -> Any:
                return SSHHTTPAdapter.get_connection(self, ONE_POOL, proxies)

        _ssh_pool.append(OneSshPool)
    return _ssh_pool[0]


def negotiate(api: Any, timeout: float) -> str:
    """The engine's API version (docker-py's version="auto"): also the first sign that it answers, and that what
    answers is a Docker engine."""
    try:
        with within(timeout):
            answer = checked("version", api.version(api_version=False))
    except ValueError as exc:
        raise not_json("version", exc) from None
    version = answer.get("ApiVersion")
    if not isinstance(version, str) or not version.replace(".", "").isdigit():
        raise NotAnEngine("the engine answered /version without an API version: not a Docker engine")
    return version
