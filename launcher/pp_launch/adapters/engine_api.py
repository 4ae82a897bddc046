"""The Docker Engine API over a unix socket, for the calls a chain makes, without docker-py (fast start).

Importing docker-py (and `requests`, `urllib3`, `charset_normalizer` under it) costs a launcher about 0.15-0.2 s of
its bring-up; `http.client` and `socket` are most of the way there already. `SocketApi` answers the calls the chain
makes on a local engine (`unix://`) with docker-py's own method names, arguments and answers: version, info, ping,
inspect_image, containers, create_container_from_config, attach_socket, start, inspect_container, kill,
remove_container, and the streamed wait for a container's removal. The engine's refusals are `APIError`,
`NotFound` and `ImageNotFound` as docker-py tells them apart (status_code, explanation); docker_engine catches these
and docker-py's alike. Anything else (build, import, logs, put_archive...) goes to a docker-py APIClient that the
caller makes (`fallback`) on first use.

`host_config` and `container_config` build the JSON docker-py's create_host_config/create_container_config build for
the arguments pp-launch passes (a contract test compares them), for either client.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

MAX_HEAD = 64 * 1024  # an attach answer's status line and headers
# docker-py's test for an ImageNotFound among the 404s (docker/errors.py)
_IMAGE_NOT_FOUND = (
    "no such image",
    "not found: does not exist or no pull access",
    "repository does not exist",
    "was found but does not match the specified platform",
)


class APIError(Exception):
    """The engine refused a call (its answer's status and message), as docker-py's APIError."""

    def __init__(self, status_code: int, reason: str, url: str, explanation: str) -> None:
        kind = "Client" if status_code < 500 else "Server"
        text = f"{status_code} {kind} Error for {url}: {reason}" + (f' ("{explanation}")' if explanation else "")
        super().__init__(text)
        self.status_code, self.explanation = status_code, explanation


class NotFound(APIError):
    pass


class NotAnEngine(http.client.HTTPException):
    """The socket answered, but not as a Docker engine does (not JSON, or not the shape the call has): a transport
    failure as docker_engine sees it (one line, never a traceback)."""


class CallTimeout(TimeoutError):
    """A whole call (connect, send, every read of its answer) took longer than the client's timeout."""


class ImageNotFound(NotFound):
    pass


def refusal(status: int, reason: str, url: str, body: bytes) -> APIError:
    """The error for an engine's refusal: its JSON message, the class as docker-py picks it."""
    try:
        explanation = str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        explanation = body.decode("utf-8", "replace").strip()
    kind = APIError
    if status == 404:
        kind = ImageNotFound if any(f in explanation.lower() for f in _IMAGE_NOT_FOUND) else NotFound
    return kind(status, reason, url, explanation)


# ---------------------------------------------------------------------------------------------- the JSON of a create
def host_config(
    *,
    init: bool | None = None,
    auto_remove: bool = False,
    network_mode: str | None = None,
    binds: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """docker-py's create_host_config(init=, auto_remove=, network_mode=, binds={host: {bind, mode}})."""
    out: dict[str, Any] = {}
    if network_mode:
        out["NetworkMode"] = network_mode
    if binds:
        out["Binds"] = [f"{host}:{b['bind']}:{b.get('mode', 'rw')}" for host, b in binds.items()]
    if auto_remove:
        out["AutoRemove"] = True
    if init is not None:
        out["Init"] = init
    return out


def container_config(
    *,
    image: str,
    command: Sequence[str] | None = None,
    entrypoint: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    host_config: Mapping[str, Any] | None = None,
    stdin_open: bool = False,
) -> dict[str, Any]:
    """docker-py's create_container_config for these arguments (the rest at docker-py's defaults)."""
    return {
        "Hostname": None, "Domainname": None, "ExposedPorts": None, "User": None, "Tty": False,
        "OpenStdin": stdin_open, "StdinOnce": stdin_open, "AttachStdin": stdin_open,
        "AttachStdout": True, "AttachStderr": True,
        "Env": [f"{k}={v}" for k, v in environment.items()] if environment is not None else None,
        "Cmd": list(command) if command is not None else None,
        "Image": image, "Volumes": None, "NetworkDisabled": False,
        "Entrypoint": list(entrypoint) if entrypoint is not None else None,
        "WorkingDir": None, "HostConfig": dict(host_config) if host_config is not None else None,
        "NetworkingConfig": None, "MacAddress": None, "Labels": dict(labels) if labels is not None else None,
        "StopSignal": None, "Healthcheck": None, "StopTimeout": None, "Runtime": None,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- the client
class _Connection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = _unix_socket(self._path, self.timeout)


class _Bounded(socket.socket):
    """A socket whose every send and read shares one deadline: a call is bounded as a whole, so an engine that
    answers a byte at a time cannot keep it going past the timeout (each read alone would be within it)."""

    deadline: float | None = None

    def bound(self, seconds: float | None) -> None:
        """From now on every operation shares `seconds` in all (None: no clock, e.g. an attach's stream)."""
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.settimeout(seconds)

    def _left(self) -> None:
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CallTimeout("timed out: the engine's answer did not come whole in time")
        self.settimeout(left)

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self._left()
        super().sendall(*args, **kwargs)


def _unix_socket(path: str, timeout: float | None) -> _Bounded:
    sock = _Bounded(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bound(timeout)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


class PendingWait:
    """A wait the engine has registered (its answer's headers came); `content` is its body, once it comes."""

    def __init__(self, connection: _Connection, response: http.client.HTTPResponse) -> None:
        self._connection, self._response = connection, response
        self._body: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._body is None:
            try:
                self._body = self._response.read()
            finally:
                self._connection.close()
        return self._body


class SocketApi:
    """docker-py's APIClient for a unix socket engine, for the calls a chain makes (see the module's text)."""

    def __init__(self, path: str, timeout: float, fallback: Callable[[str], Any]) -> None:
        self.path, self.timeout = path, timeout
        self._make_fallback = fallback
        self._prefix = ""  # /vX.Y once the engine said its API version (as docker-py's version="auto")
        self.api_version = ""
        self._fallback: Any = None
        self._lock = threading.Lock()

    def negotiate(self) -> None:
        """Ask the engine its API version (docker-py's version="auto"); also the first sign that it answers, and
        that what answers is a Docker engine."""
        version = _shaped(self._json("GET", "/version", versioned=False), dict, "/version").get("ApiVersion")
        if not isinstance(version, str) or not version.replace(".", "").isdigit():
            raise NotAnEngine(
                f"the socket at {self.path} answered /version without an API version: not a Docker engine"
            )
        self.api_version = version
        self._prefix = f"/v{self.api_version}"

    # ------------------------------------------------------------------------------------------ plumbing
    def _url(self, path: str, params: Mapping[str, Any] | None = None, versioned: bool = True) -> str:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return (self._prefix if versioned else "") + path + (f"?{urlencode(query)}" if query else "")

    def _send(self, method: str, url: str, body: Any, timeout: float | None) -> tuple[_Connection, Any]:
        connection = _Connection(self.path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            connection.request(method, url, body=data, headers=headers)
            response = connection.getresponse()
            if response.status >= 400:
                raise refusal(response.status, response.reason, url, response.read())
        except BaseException:
            connection.close()
            raise
        return connection, response

    def _call(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None, versioned: bool = True
    ) -> bytes:
        connection, response = self._send(method, self._url(path, params, versioned), body, self.timeout)
        try:
            return bytes(response.read())
        finally:
            connection.close()

    def _json(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None, versioned: bool = True
    ) -> Any:
        data = self._call(method, path, params, body, versioned)
        try:
            return json.loads(data) if data.strip() else None
        except ValueError:
            shown = data[:60].decode("utf-8", "replace").replace("\n", " ")
            raise NotAnEngine(
                f"the socket at {self.path} answered {path} with something that is not JSON "
                f"({shown!r}): not a Docker engine"
            ) from None

    def __getattr__(self, name: str) -> Any:
        """What this client does not do: docker-py's APIClient does it, made on first use."""
        if name.startswith("_"):
            raise AttributeError(name)
        with self._lock:
            if self._fallback is None:
                self._fallback = self._make_fallback(self.api_version)
        return getattr(self._fallback, name)

    def close(self) -> None:
        with self._lock:
            fallback, self._fallback = self._fallback, None
        if fallback is not None:
            fallback.close()

    # ------------------------------------------------------------------------------------------ docker-py's calls
    def ping(self) -> bool:
        return self._call("GET", "/_ping") == b"OK"

    def version(self) -> dict[str, Any]:
        return _object(self._json("GET", "/version"), "/version")

    def info(self) -> dict[str, Any]:
        return _object(self._json("GET", "/info"), "/info")

    def inspect_image(self, image: str) -> dict[str, Any]:
        return _object(self._json("GET", f"/images/{_q(image)}/json"), "an image's inspect")

    def inspect_container(self, container: str) -> dict[str, Any]:
        return _object(self._json("GET", f"/containers/{_q(container)}/json"), "a container's inspect")

    def containers(self, all: bool = False, filters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        params = {"all": 1 if all else 0, "filters": _filters(filters) if filters else None}
        found = _shaped(self._json("GET", "/containers/json", params), list, "the container list")
        return [_object(c, "a container in the list") for c in found]

    def create_container_from_config(self, config: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
        body = {k: v for k, v in config.items() if v is not None}  # as docker-py's _post_json sends it
        made = _object(self._json("POST", "/containers/create", {"name": name}, body=body), "a create")
        if not isinstance(made.get("Id"), str):
            raise NotAnEngine(f"the engine's answer to a create has no container id: {str(made)[:80]}")
        return made

    def start(self, container: str) -> None:
        self._call("POST", f"/containers/{_q(container)}/start")

    def kill(self, container: str, signal: int | str | None = None) -> None:
        self._call("POST", f"/containers/{_q(container)}/kill", {"signal": signal})

    def remove_container(self, container: str, v: bool = False, link: bool = False, force: bool = False) -> None:
        params = {"v": _flag(v), "link": _flag(link), "force": _flag(force)}
        self._call("DELETE", f"/containers/{_q(container)}", params)

    def attach_socket(self, container: str, params: Mapping[str, Any] | None = None) -> socket.socket:
        """The hijacked connection of an attach (the engine's "101 UPGRADED"): its socket, nothing read past the
        answer's headers (the stage's output starts right after them)."""
        params = params or {"stdout": 1, "stderr": 1, "stream": 1}
        url = self._url(f"/containers/{_q(container)}/attach", params)
        sock = _unix_socket(self.path, self.timeout)
        try:
            sock.sendall(
                f"POST {url} HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            status, reason, length = _head(sock)
            if status >= 400:
                raise refusal(status, reason, url, _body(sock, length))
        except BaseException:
            sock.close()
            raise
        sock.bound(self.timeout)  # the stream that follows is the stage's: each read bounded, not the whole
        sock.deadline = None
        return sock

    def wait_for_removal(self, container: str) -> PendingWait:
        """Register a wait for the container's removal: returns when the engine has (its answer's headers came);
        the body, with the exit code, comes when the container is gone."""
        url = self._url(f"/containers/{_q(container)}/wait", {"condition": "removed"})
        connection, response = self._send("POST", url, None, self.timeout)
        if isinstance(connection.sock, _Bounded):
            connection.sock.bound(None)  # the body comes when the container is gone: no clock on it
        return PendingWait(connection, response)


def _shaped(value: Any, kind: type, what: str) -> Any:
    """An answer of the shape the call has (an object, a list), else NotAnEngine naming the call."""
    if not isinstance(value, kind):
        shape = "an object" if kind is dict else "a list"
        raise NotAnEngine(
            f"the engine answered {what} with {type(value).__name__} where {shape} belongs: not a Docker "
            "engine, or one that is broken"
        )
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    return dict(_shaped(value, dict, what))


def _q(part: str) -> str:
    return quote(part, safe="/:")


def _flag(value: bool) -> int:
    return 1 if value else 0


def _filters(filters: Mapping[str, Any]) -> str:
    """docker-py's convert_filters: every value a list of strings, booleans as "true"/"false"."""
    out: dict[str, list[str]] = {}
    for key, value in filters.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        items = value if isinstance(value, list) else [value]
        out[key] = [item if isinstance(item, str) else str(item) for item in items]
    return json.dumps(out)


def _head(sock: socket.socket) -> tuple[int, str, int]:
    """An HTTP answer's status, reason and Content-Length (-1: none), read a byte at a time: whatever follows the
    headers on this socket is the container's, not ours to buffer."""
    data = bytearray()
    while not data.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise http.client.RemoteDisconnected("the engine closed the attach before answering")
        data += byte
        if len(data) > MAX_HEAD:
            raise http.client.LineTooLong("the engine's answer to an attach")
    status_line, *lines = data.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise http.client.BadStatusLine(status_line)
    length = -1
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-length" and value.strip().isdigit():
            length = int(value.strip())
    return int(parts[1]), parts[2] if len(parts) > 2 else "", length


def _body(sock: socket.socket, length: int) -> bytes:
    """A refusal's body (a JSON message), as much as comes."""
    data = b""
    while length < 0 or len(data) < length:
        try:
            chunk = sock.recv(4096 if length < 0 else length - len(data))
        except OSError:
            break
        if not chunk:
            break
        data += chunk
        if length < 0:
            break
    return data
