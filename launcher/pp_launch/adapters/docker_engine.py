"""The Docker adapter: every engine is spoken to through docker-py's APIClient (made by adapters/docker_client.py,
which bounds each call as a whole and checks the shape of each answer); no other module speaks to an engine.

Order that loses nothing (as docker/cli's `run` does): create; attach (the engine has registered the
attach when the upgrade answers); register the wait for "removed" (the engine has registered it when the
response headers arrive); only then start. Under daemon-side auto-remove a container may be gone at any
moment after it exits, so "no such container" always means "already removed", never an error.
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import http.client
import importlib.util
import json
import os
import re
import signal as _signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests

from pp_launch.adapters import docker_client
from pp_launch.adapters.docker_client import docker  # imported there first: its ssh transport only when used
from pp_launch.adapters.runtime import Nursery
from pp_launch.core import errors, labels
from pp_launch.core.chain import handoff
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import HANDED_OVER, Sink, StageGone, StageOutput
from pp_launch.core.lines import LineSplitter
from pp_launch.core.stage_env import LIFELINE

T = TypeVar("T")


@dataclass(frozen=True)
class Watcher:
    """A long-lived helper container (Engine.watcher): its image, command, labels, environment and GPUs."""

    image: str
    argv: list[str]
    labels: Mapping[str, str]
    env: Mapping[str, str]
    device_requests: list[Mapping[str, Any]]


_STREAMS = {1: "stdout", 2: "stderr"}


# docker-py's private parts we rely on (pinned in pyproject.toml; tests/unit/test_docker_private_api.py fails when
# a release changes them): APIClient._url and ._raise_for_status (the SDK has no public call for a streamed
# `wait?condition=removed`), and the raw socket under attach_socket's SocketIO (`_sock`: shutdown and timeouts).


def _tar(files: Mapping[str, bytes]) -> bytes:
    """A tar archive of `files` (path: content, mode 0644), for put_archive."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            entry = tarfile.TarInfo(path)
            entry.size, entry.mode = len(data), 0o644
            tar.addfile(entry, io.BytesIO(data))
    return buf.getvalue()


def engine_time(text: str) -> float:
    """An engine's RFC 3339 time (`2026-12-06T04:47:07.123456789Z`, or with an offset; no zone: UTC) as seconds
    since the epoch; 0.0 when unreadable or the zero time (a container never started)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", text or "")
    if not m or text.startswith("0001"):
        return 0.0
    at = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + float(m.group(2) or 0)
    if (zone := m.group(3) or "Z") != "Z":
        at -= (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return at


def removal_wait(api: Any, ref: str, timeout: float) -> Any:
    """Register a wait for the container's removal; returns once the engine has registered it (the response
    headers arrived, within `timeout`), the body (`.content`) comes when the container is gone (no clock on it)."""
    with docker_client.within(timeout):  # docker-py has no public call for it
        response = api.post(
            api._url("/containers/{0}/wait", ref), params={"condition": "removed"}, stream=True, timeout=None
        )
    api._raise_for_status(response)
    return response


def raw_socket(attached: Any) -> socket.socket:
    """The socket under attach_socket's answer (a SocketIO over a unix socket, or the socket itself)."""
    raw = getattr(attached, "_sock", attached)
    return raw  # type: ignore[no-any-return]


def read_ahead(attached: Any, raw: socket.socket) -> bytes:
    """What the engine sent right behind its answer's headers, read with them into the HTTP response's buffer
    (docker-py hands on the socket under that buffer, and those bytes would be lost): the first frames of a stream
    whose process wrote at once, and a client that read late (a busy machine, a relay that joins packets). Taken
    from the buffer without waiting for more."""
    response = getattr(attached, "_response", None)
    fp = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if fp is None or not hasattr(fp, "peek"):
        return b""
    timeout = raw.gettimeout()
    raw.setblocking(False)
    try:
        early = fp.peek(_READ_CHUNK)  # what is buffered (a read that would wait gives nothing)
        return bytes(fp.read(len(early))) if early else b""
    except (OSError, ValueError):
        return b""
    finally:
        raw.settimeout(timeout)


_READ_CHUNK = 64 * 1024

TOOLKIT_MISSING = (
    "the engine cannot attach GPUs: the NVIDIA container toolkit is missing or not configured. "
    "Check with 'docker info | grep -i runtime' and 'nvidia-ctk --version'; install nvidia-container-toolkit "
    "and run 'nvidia-ctk runtime configure --runtime=docker'"
)
NVIDIA_TOOLKIT_HINT = f"{TOOLKIT_MISSING}, or use --gpu-attach env on hosts whose default runtime is NVIDIA's"
NODE_TOOLKIT_HINT = f"{TOOLKIT_MISSING}, or leave PP_GPUS unset to run this stage on CPU"


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def lost(exc: BaseException, address: str | None = None) -> errors.EngineLost:
    """One typed error for every way an engine can go away under us."""
    address = address or engine_address()
    text = str(exc)
    if "timed out" in text or isinstance(exc, (TimeoutError, requests.exceptions.Timeout)):
        what = "stopped answering (no reply before the timeout: frozen or overloaded)"
    elif "Connection refused" in text or "No such file" in text or "FileNotFoundError" in text:
        what = "stopped (its socket refuses connections)"
    else:
        what = f"stopped answering ({_reason(exc)})"
    return errors.EngineLost(f"the Docker engine at {address} {what}")


# The network of pp-launch's own containers (guards, GPU locks, probes, watchers, record readers): the host's. None of
# them listens on a network (a guard's socket is a unix socket in its own filesystem) or needs one; a namespace of
# their own ("none") costs the engine a network namespace and a `set-ipv6` process per container: 0.1 s of each
# start and 0.1 CPU-seconds (docs/benchmarks.md, "Our own containers' network").
OWN_NETWORK = "host"


class _Guarded:
    """docker-py's APIClient with every call guarded: the calls that answer at once bounded as a whole and their
    answers' shapes checked (docker_client.BOUNDED); a connection error, a timeout or an answer no engine gives
    becomes EngineLost, so no `requests` traceback reaches a user. The engine's own refusals (APIError) pass through
    unchanged."""

    def __init__(self, api: Any, address: str, timeout: float) -> None:
        self._api = api
        self._address = address
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._api, name)
        if not callable(attr):
            return attr
        bounded = name in docker_client.BOUNDED

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                if not bounded:
                    return attr(*args, **kwargs)
                with docker_client.within(self._timeout):
                    return docker_client.checked(name, attr(*args, **kwargs))
            except Exception as exc:
                if bounded and isinstance(exc, ValueError) and not _refusal(exc):
                    exc = docker_client.not_json(name, exc)
                if _transport_error(exc):  # the engine's own refusals (APIError) pass through unchanged
                    raise lost(exc, self._address) from None
                raise

        return call


def _refusal(exc: BaseException) -> bool:
    """The engine's own answer to a call (docker-py's APIError), not a lost connection."""
    return isinstance(exc, docker.errors.APIError)


def _transport_error(exc: BaseException) -> bool:
    """The connection to the engine failed (socket, HTTP, docker-py, or paramiko for ssh:// hosts)."""
    if _refusal(exc):
        return False
    if isinstance(exc, (OSError, EOFError, http.client.HTTPException)):
        return True
    if isinstance(exc, (requests.exceptions.RequestException, docker.errors.DockerException)):
        return True
    return type(exc).__module__.split(".")[0] == "paramiko"


def connect(timeout: float | None = None, host: str | None = None) -> Engine:
    """timeout: seconds one engine call may take before the engine counts as lost (PP_ENGINE_TIMEOUT, 30).
    host: a Docker context name or an engine URL (--host); None for DOCKER_HOST or the default socket."""
    if timeout is None:
        timeout = float(os.environ.get("PP_ENGINE_TIMEOUT", "30"))
    if host is None and (chosen := chosen_context()) is not None:
        name, source = chosen
        try:
            return connect(timeout, name)
        except errors.EngineUnavailable as exc:
            raise errors.EngineUnavailable(str(exc).replace(f"host {name}:", f"{source}:", 1)) from None
    if host is not None:
        context = _context(host)
        api, close = _host_api(host, context, timeout)
        return Engine(api, close, timeout, host, context.url)
    address = engine_address()
    try:  # DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH as docker-py reads them
        found = docker.utils.kwargs_from_env()
        api = docker_client.api_client(found.get("base_url") or address, timeout, found.get("tls", False))
    except Exception as exc:
        if not (_transport_error(exc) or _refusal(exc)):
            raise
        why = _unreachable(exc)
        fix = (
            "The engine runs, but this user may not use it: add the user to the 'docker' group (and log in again), "
            "or run as one who may; 'docker info' says the same."
            if why.startswith("permission denied")
            else "Set DOCKER_HOST to a Docker engine's socket; 'docker info' says what answers where."
            if "not a Docker engine" in why
            else "Start it (or set DOCKER_HOST to the engine you mean) and check that 'docker info' works."
        )
        raise errors.EngineUnavailable(f"cannot reach the Docker engine at {address}: {why}. {fix}") from None
    return Engine(api, api.close, timeout)


def chosen_context() -> tuple[str, str] | None:
    """The Docker context the docker CLI would use when DOCKER_HOST is not set: DOCKER_CONTEXT, else the
    config's currentContext; (name, where it was chosen) or None for the default engine."""
    if os.environ.get("DOCKER_HOST"):
        return None
    if name := os.environ.get("DOCKER_CONTEXT"):
        return None if name == "default" else (name, f"DOCKER_CONTEXT={name}")
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        current = json.loads(config.read_text()).get("currentContext")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(current, str) and current and current != "default":
        return current, f"the current Docker context {current} ({config})"
    return None


@dataclass(frozen=True)
class _Context:
    url: str
    tls: Any  # docker.tls.TLSConfig, or False


def _context(host: str) -> _Context:
    """A Docker context as the docker CLI stores it: DOCKER_CONFIG (else ~/.docker)/contexts/meta/<sha256 of the
    name>/meta.json for the endpoint, contexts/tls/<same>/docker/{ca,cert,key}.pem for its TLS material."""
    if "://" in host:
        return _Context(host, False)
    if host == "default":
        return _Context(engine_address(), False)
    import hashlib

    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    digest = hashlib.sha256(host.encode()).hexdigest()
    try:
        meta = json.loads((config / "contexts" / "meta" / digest / "meta.json").read_text())
        endpoint = meta["Endpoints"]["docker"]
        url = str(endpoint["Host"])
    except (OSError, ValueError, KeyError, TypeError):
        raise errors.EngineUnavailable(
            f"host {host}: no Docker context of that name in {config}/contexts ('docker context ls' lists them; "
            f"'docker context create {host} --docker host=ssh://USER@HOST:PORT' makes one), and it is not an "
            "engine URL (unix://, tcp://, ssh://)"
        ) from None
    tls_dir = config / "contexts" / "tls" / digest / "docker"
    tls: Any = False
    if tls_dir.is_dir() or url.startswith("https://"):
        import docker.tls

        files = {name: tls_dir / f"{name}.pem" for name in ("ca", "cert", "key")}
        present = {name: str(path) for name, path in files.items() if path.exists()}
        cert = (present["cert"], present["key"]) if "cert" in present and "key" in present else None
        tls = docker.tls.TLSConfig(
            client_cert=cert, ca_cert=present.get("ca"), verify=not endpoint.get("SkipTLSVerify", False)
        )
        url = url.replace("tcp://", "https://", 1)
    return _Context(url, tls)


def _host_api(host: str, context: _Context, timeout: float) -> tuple[Any, Callable[[], None]]:
    url, tls = context.url, context.tls
    where = host if url == host else f"{host} ({url})"
    if url.startswith("ssh://") and importlib.util.find_spec("paramiko") is None:
        raise errors.EngineUnavailable(
            f"host {where}: ssh:// engines need paramiko, which a plain install leaves out: "
            "pip install 'pp-launch[ssh]'"
        )
    try:
        api = docker_client.api_client(url, timeout, tls)
    except Exception as exc:  # docker-py, requests, paramiko (ssh://) and socket errors alike: say why, in words
        hint = ""
        if url.startswith("ssh://"):
            hint = (
                " For ssh://, key authentication must work without a prompt ('ssh -p PORT USER@HOST docker version'"
                " answers), the host key must be in ~/.ssh/known_hosts, and docker must be on the remote PATH."
            )
        raise errors.EngineUnavailable(
            f"cannot reach the Docker engine of host {where}: {_unreachable(exc)}.{hint}"
        ) from None
    return api, api.close


def _unreachable(exc: BaseException) -> str:
    """Why an engine does not answer, in words (never a `requests` repr)."""
    text = str(exc)
    if "No such file" in text or "FileNotFoundError" in text:
        return "no engine socket there (is the engine running?)"
    if "Connection refused" in text:
        return "nothing answers on it (is the engine running?)"
    if "Permission denied" in text or "PermissionError" in text:
        return "permission denied on its socket"
    if "timed out" in text.lower():
        return "it did not answer in time"
    return _reason(exc)


def _reason(exc: BaseException) -> str:
    if _refusal(exc):
        return str(getattr(exc, "explanation", None) or exc)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    state: str
    created: int
    labels: Mapping[str, str]
    volumes: tuple[str, ...] = ()  # the named volumes it mounts (a run's record among them)
    record: str = ""  # the named volume it mounts where a stage sees its run's record (RECORD_INSIDE), if any
    keeps: str = ""  # the named volume it mounts where a guard keeps its run's record (GUARD_RECORD_AT), if any
    image_id: str = ""  # the image's id as the engine lists it ("sha256:...")


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    labels: Mapping[str, str]
    created: int  # seconds since the epoch, the engine's clock


class Engine:
    """Thin, typed wrapper over docker-py's low-level API."""

    def __init__(
        self,
        api: Any,
        close: Callable[[], None],
        timeout: float = 30.0,
        host: str | None = None,
        url: str | None = None,
    ) -> None:
        self._close = close
        self.timeout = timeout
        self.host = host  # as the user named it (--host); None: DOCKER_HOST or the default socket
        self.address = engine_address() if host is None else f"{url or host} (host {host})"
        self.url = engine_address() if host is None else (url or host)  # where the engine listens
        self.api: Any = _Guarded(api, self.address, timeout)
        self._engine_id: str | None = None  # engine_id(), once asked
        self._api_version: str | None = None

    def engine_id(self) -> str:
        """The engine's identity, which tells two names of one engine from two engines: its id with its host name and
        data root (engines of one machine, and cloned machines, can share an id). Asked once per connection (each
        /info makes the engine run its runtimes to ask their versions)."""
        if self._engine_id is None:
            info = self._what_it_is(self.api.info)
            self._engine_id = "|".join(str(info.get(k, "")) for k in ("ID", "Name", "DockerRootDir"))
        return self._engine_id

    def identity(self) -> tuple[str, str]:
        """(engine_id(), API version), each asked once per connection."""
        engine_id = self.engine_id()
        if self._api_version is None:
            self._api_version = str(self._what_it_is(self.api.version).get("ApiVersion", ""))
        return engine_id, self._api_version

    def _what_it_is(self, ask: Callable[[], Any]) -> Any:
        try:
            return ask()
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"the engine at {self.address} does not say what it is: {_reason(exc)}") from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._close()

    # ------------------------------------------------------------------------------ images
    def image_config(self, name: str) -> Mapping[str, Any] | None:
        """The image's Config (Entrypoint, Cmd, Labels...); None when the image is not present locally."""
        try:
            info = self.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot inspect image {name}: {_reason(exc)}") from None
        return dict(info.get("Config") or {})

    def image_labels(self, name: str) -> Mapping[str, str] | None:
        """None when the image is not present locally."""
        config = self.image_config(name)
        return None if config is None else dict(config.get("Labels") or {})

    def import_rootfs(self, tar_path: str, repository: str, tag: str, changes: list[str]) -> None:
        try:
            self.api.import_image_from_file(tar_path, repository=repository, tag=tag, changes=changes)
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"docker import of {repository}:{tag} failed: {_reason(exc)}") from None

    def build(
        self,
        context: str,
        tag: str,
        buildargs: Mapping[str, str],
        labels: Mapping[str, str],
        progress: Callable[[str], None],
    ) -> None:
        """Build from a local context; never pulls (the FROM image must be local)."""
        try:
            for chunk in self.api.build(
                path=context,
                tag=tag,
                buildargs=dict(buildargs),
                labels=dict(labels),
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
            ):
                if "error" in chunk:
                    raise errors.EngineError(f"building {tag} failed: {chunk['error'].strip()}")
                if text := chunk.get("stream", "").strip():
                    progress(text)
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"building {tag} failed: {_reason(exc)}") from None

    def save_images(self, names: Sequence[str], path: str) -> int:
        """`docker save NAME... -o PATH`: one archive of the images (written beside, then moved in place); its size."""
        part = f"{path}.part{os.getpid()}"
        try:
            response = self.api.get(self.api._url("/images/get"), params={"names": list(names)}, stream=True)
            self.api._raise_for_status(response)
            with open(part, "wb") as out:
                for chunk in response.iter_content(_READ_CHUNK):
                    out.write(chunk)
            os.replace(part, path)
        except docker.errors.APIError as exc:
            what = ", ".join(names)
            raise errors.EngineError(f"the engine at {self.address} could not save {what}: {_reason(exc)}") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
        return os.path.getsize(path)

    def load_images(self, path: str) -> list[str]:
        """`docker load -i PATH`: the images the archive holds, as the engine names them."""
        loaded: list[str] = []
        try:
            with open(path, "rb") as f:
                for chunk in self.api.load_image(f):
                    if "error" in chunk:
                        raise errors.EngineError(f"the engine at {self.address} refused {path}: {chunk['error']}")
                    text = str(chunk.get("stream", "")).strip()
                    if text.startswith("Loaded image: "):
                        loaded.append(text.removeprefix("Loaded image: "))
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"the engine at {self.address} could not load {path}: {_reason(exc)}") from None
        return loaded

    def remove_image(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.api.remove_image(name, force=True)

    def untag_image(self, name: str) -> bool:
        """`docker rmi NAME` (no force): False when a container uses it, so the engine keeps it."""
        try:
            self.api.remove_image(name, force=False)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 409:
                return False
            raise errors.EngineError(f"the engine at {self.address} could not remove {name}: {_reason(exc)}") from None
        return True

    def image_id(self, name: str) -> str | None:
        try:
            return str(self.api.inspect_image(name).get("Id", "")) or None
        except docker.errors.ImageNotFound:
            return None

    def drop_replaced_image(self, old_id: str | None, tag: str) -> None:
        """After a rebuild under `tag`: the image it replaced goes too, unless a container still uses it (a detached
        run's guard of the old image) or someone tagged it again."""
        if old_id is not None and old_id != self.image_id(tag):
            self.drop_untagged_image(old_id)

    def drop_untagged_image(self, image_id: str) -> str:
        """An image we replaced, removed by its id if it has no tag and no container uses it: "gone" (removed, or
        not there), "in use" (kept: try again later), or "tagged" (someone tagged it again: theirs now, kept)."""
        try:
            tags = [t for t in self.api.inspect_image(image_id).get("RepoTags") or [] if t != "<none>:<none>"]
        except docker.errors.ImageNotFound:
            return "gone"
        except docker.errors.APIError:
            return "in use"
        if tags:
            return "tagged"
        try:
            self.api.remove_image(image_id, force=False)
        except docker.errors.ImageNotFound:
            return "gone"
        except docker.errors.APIError:  # in use by a container (409)
            return "in use"
        return "gone"

    # ------------------------------------------------------------------------------ containers
    def answers_anew(self, timeout: float = 5.0) -> str | None:
        """None when the engine answers a connection made now (a stopping engine has closed its listener, though it
        still serves the connections already open), else why, in words. Over ssh:// that connection is a new
        channel of the SSH session already open, not a new session (docker_client.fresh_get)."""
        try:
            if docker_client.fresh_get(self.api._api, "/version", {}, timeout) is not None:
                return None
        except Exception as exc:  # docker-py, paramiko (ssh://), socket and HTTP errors alike: said in words
            where = self.host if self.url == self.host or self.host is None else f"{self.host} ({self.url})"
            return f"cannot reach the Docker engine of host {where}: {_unreachable(exc)}"
        try:  # a transport with no connection of its own to make (tcp://): a new client
            fresh = connect(timeout=timeout, host=self.host)
        except errors.PpLaunchError as exc:
            return str(exc)
        fresh.close()
        return None

    def listed_anew(self, label_filters: list[str]) -> list[str]:
        """The ids of the containers carrying these labels, asked over a connection made now (as `answers_anew`):
        EngineLost when the engine does not take it."""
        params = {"all": 1, "filters": json.dumps({"label": label_filters})}
        try:
            rows = docker_client.fresh_get(self.api._api, "/containers/json", params, self.timeout)
        except Exception as exc:
            if isinstance(exc, docker.errors.APIError):
                raise errors.EngineError(f"cannot list containers: {_reason(exc)}") from None
            raise errors.EngineLost(f"the Docker engine at {self.address} stopped ({_unreachable(exc)})") from None
        if rows is not None:
            return [str(r.get("Id", "")) for r in rows if isinstance(r, dict)]
        try:  # a transport with no connection of its own to make (tcp://): a new client
            fresh = connect(timeout=self.timeout, host=self.host)
        except errors.EngineUnavailable as exc:
            raise errors.EngineLost(f"the Docker engine at {self.address} stopped ({exc})") from None
        try:
            return [c.id for c in fresh.containers(label_filters)]
        finally:
            fresh.close()

    def containers(self, label_filters: list[str]) -> list[ContainerInfo]:
        try:
            rows = self.api.containers(all=True, filters={"label": label_filters})
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot list containers: {_reason(exc)}") from None
        return [
            ContainerInfo(
                id=r["Id"],
                name=(r.get("Names") or ["/?"])[0].lstrip("/"),
                image=r.get("Image", ""),
                state=r.get("State", ""),
                created=int(r.get("Created", 0)),
                labels=r.get("Labels") or {},
                image_id=r.get("ImageID", "") or "",
                volumes=tuple(m.get("Name", "") for m in r.get("Mounts") or () if m.get("Type") == "volume"),
                record=_volume_at(r, RECORD_INSIDE),
                keeps=_volume_at(r, GUARD_RECORD_AT),
            )
            for r in rows
        ]

    # ------------------------------------------------------------------------------ volumes
    def make_volume(self, name: str, labels: Mapping[str, str]) -> Mapping[str, str]:
        """A named volume with these labels; the labels it has (an existing volume of that name keeps its own:
        the engine answers a create of a taken name with the volume that is there)."""
        try:
            made = self.api.create_volume(name=name, driver="local", labels=dict(labels))
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"the engine at {self.address} refused volume {name}: {_reason(exc)}") from None
        return made.get("Labels") or {}

    def volumes(self, label_filters: list[str]) -> list[VolumeInfo]:
        try:
            rows = self.api.volumes(filters={"label": label_filters}).get("Volumes") or []
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot list volumes: {_reason(exc)}") from None
        return [
            VolumeInfo(r.get("Name", ""), r.get("Labels") or {}, int(engine_time(r.get("CreatedAt", "")))) for r in rows
        ]

    def has_path(self, ref: str, path: str) -> bool:
        """Whether a container (started or not) has `path` in its filesystem, as `docker cp` would find it (a HEAD of
        its archive: nothing is read)."""
        try:
            res = self.api.head(self.api._url("/containers/{0}/archive", ref), params={"path": path})
        except OSError as exc:
            raise errors.EngineError(f"cannot look for {path} in {ref[:12]}: {exc}") from None
        if res.status_code not in (200, 404):
            raise errors.EngineError(f"cannot look for {path} in {ref[:12]}: the engine answered {res.status_code}")
        return bool(res.status_code == 200)

    def read_file(self, ref: str, path: str, limit: int = 16 * 1024 * 1024) -> bytes | None:
        """A file of a container (running or not), as `docker cp` reads it; None when it has none there (or it is
        gone, or the file is larger than `limit`)."""
        files = self.read_files(ref, path, limit)
        return next(iter(files.values())) if files else None

    def read_files(self, ref: str, path: str, limit: int = 16 * 1024 * 1024) -> dict[str, bytes]:
        """The files at `path` in a container (running or not: a file, or a folder's files, by name), as `docker
        cp` reads them; none when it has none there, is gone, or they take more than `limit` bytes."""
        import io
        import tarfile

        try:
            stream, stat = self.api.get_archive(ref, path)
            if int((stat or {}).get("size", 0)) > limit:
                return {}
            data = bytearray()
            for chunk in stream:
                data += chunk
                if len(data) > limit + 1024 * 1024:  # a folder's size is not its files' (tar headers: 512 each)
                    return {}
        except docker.errors.NotFound:
            return {}
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot read {path} of {ref[:12]}: {_reason(exc)}") from None
        out: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    out[member.name.rsplit("/", 1)[-1]] = handle.read()
        return out

    def volume_users(self, name: str) -> list[str]:
        """The ids of the containers (any state) that mount this volume."""
        try:
            return [r["Id"] for r in self.api.containers(all=True, filters={"volume": name})]
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot list containers: {_reason(exc)}") from None

    def has_volume(self, name: str) -> bool:
        try:
            self.api.inspect_volume(name)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot inspect volume {name}: {_reason(exc)}") from None
        return True

    def remove_volume(self, name: str) -> bool:
        """Removed; False when a container still uses it (or it is gone already: nothing to do)."""
        try:
            self.api.remove_volume(name)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return False
            raise errors.EngineError(f"the engine at {self.address} refused to remove {name}: {_reason(exc)}") from None
        return True

    def hold(
        self, name: str | None, image: str, labels: Mapping[str, str], entrypoint: Sequence[str] = ("cat",)
    ) -> Held | None:
        """A running container held by this process alone (a GPU lock of its own): tini as init, auto-remove,
        OWN_NETWORK, its stdin ours alone. When this process ends, however it ends, the kernel closes the attach and
        the engine closes the container's stdin: the container sees it end. It counts as held only once the
        engine says it runs. None when the name is taken."""
        ref = self._create_own(name, image, labels, entrypoint, None, None, stdin=True)
        if ref is None:
            return None
        try:
            sock = self.api.attach_socket(ref, params={"stdin": 1, "stream": 1})
            raw = raw_socket(sock)
            self.api.start(ref)
            state = (self.inspect(ref) or {}).get("State") or {}
        except BaseException as exc:
            self.remove(ref)
            if _refusal(exc):
                raise errors.EngineError(
                    f"the engine at {self.address} could not start {name or 'a lock'} from {image}: {_reason(exc)}"
                ) from None
            raise
        if not state.get("Running"):
            self.remove(ref)
            raise errors.EngineError(self.why_not_running(name or "the lock", image, state))
        return Held(self, ref, name or ref[:12], (sock, raw))

    def why_not_running(self, name: str, image: str, state: Mapping[str, Any]) -> str:
        """Why a container of ours that just started is not running, as the engine tells it: gone or killed is
        another client's doing (docker rm -f, pp-launch down --all), never the image's fault; an exit of its
        own is the image's."""
        where = f"on the engine at {self.address}"
        if not state:
            return f"{name} was removed by another client as it started {where} (docker rm, or pp-launch down --all)"
        code = state.get("ExitCode")
        if code == 137 or state.get("OOMKilled"):
            return f"{name} was killed as it started {where} (by another client, or out of memory)"
        return (
            f"{name} ({image}) ended by itself as soon as it started {where} (exit code {code}): its image may be "
            "broken; rebuild it with 'pp-launch images build'"
        )

    def keep(
        self,
        name: str,
        image: str,
        labels: Mapping[str, str],
        entrypoint: Sequence[str],
        binds: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        created: Callable[[str], None] | None = None,
    ) -> str | None:
        """A running container of ours with no stdin (a run's guard): tini as init, auto-remove, OWN_NETWORK. Nothing
        of it is held by an attach: its lifeline is an exec session (`session`). None when the name is taken.
        created: told the engine's id before the container starts (see hold)."""
        ref = self._create_own(name, image, labels, entrypoint, binds, env, stdin=False)
        if ref is None:
            return None
        try:
            if created is not None:
                created(ref)
            self.api.start(ref)
        except BaseException as exc:
            self.remove(ref)
            if _refusal(exc):
                raise errors.EngineError(
                    f"the engine at {self.address} could not start {name} from {image}: {_reason(exc)}"
                ) from None
            raise
        return ref

    def _create_own(
        self,
        name: str | None,
        image: str,
        labels: Mapping[str, str],
        entrypoint: Sequence[str],
        binds: Mapping[str, str] | None,
        env: Mapping[str, str] | None,
        stdin: bool,
        mode: str = "rw",
        device_requests: Sequence[Mapping[str, Any]] = (),
    ) -> str | None:
        """A container of pp-launch's own (a lock, a guard, a helper) created, not started: tini as init, auto-remove,
        no network, binds (host path or volume -> path inside) mounted `mode`; stdin: open, closed by the engine when
        its one attach ends. Its id; None when the name is taken."""
        host_config = self.api.create_host_config(
            init=True,
            auto_remove=True,
            network_mode=OWN_NETWORK,
            binds={h: {"bind": c, "mode": mode} for h, c in (binds or {}).items()} or None,
        )
        if device_requests:
            host_config["DeviceRequests"] = [dict(r) for r in device_requests]
        config = self.api.create_container_config(
            image=image,
            command=None,
            entrypoint=list(entrypoint),
            labels=dict(labels),
            host_config=host_config,
            stdin_open=stdin,
            environment=dict(env or {}),
        )
        if stdin:
            config["StdinOnce"] = True
        try:
            return str(self.api.create_container_from_config(config, name)["Id"])
        except docker.errors.ImageNotFound:
            raise errors.ImageMissing(
                f"image {image} is not present on the engine at {self.address}: run 'pp-launch images build' "
                f"there, or load it (pp-launch images save, then pp-launch images load there)"
            ) from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return None
            what = name or f"a container of {image}"
            raise errors.EngineError(f"the engine at {self.address} refused {what}: {_reason(exc)}") from None

    def session(self, ref: str, argv: Sequence[str]) -> Session:
        """`docker exec -i REF ARGV...` held by this process alone: its stdin is ours to write and to end (when this
        process ends, however it ends, the engine closes it), its stdout ours to read. No other client of the
        engine can attach to it."""
        try:
            made = self.api.exec_create(ref, list(argv), stdout=True, stderr=False, stdin=True, tty=False)
            sock = self.api.exec_start(made["Id"], socket=True)
        except docker.errors.APIError as exc:
            raise errors.EngineError(
                f"the engine at {self.address} could not exec in {ref[:12]}: {_reason(exc)}"
            ) from None
        raw = raw_socket(sock)
        early = read_ahead(sock, raw)
        raw.settimeout(None)
        return Session(raw, sock, early)

    def clock(self) -> str:
        """The engine's own time (RFC 3339): ages of its containers are judged on its clock, never ours."""
        return str(self.api.info().get("SystemTime", ""))

    def container_owner(self, name: str) -> str | None:
        """The owner label of the container with this exact name, '' if it has none, None if absent."""
        try:
            info = self.api.inspect_container(name)
        except docker.errors.NotFound:
            return None
        return str((info.get("Config", {}).get("Labels") or {}).get(labels.OWNER, ""))

    def inspect(self, ref: str) -> dict[str, Any] | None:
        try:
            return dict(self.api.inspect_container(ref))
        except docker.errors.NotFound:
            return None

    def log_lines(
        self,
        ref: str,
        follow: bool = False,
        since: int | None = None,
        tail: int | None = None,
        timestamps: bool = False,
        opened: Callable[[Callable[[], None]], None] | None = None,
    ) -> Iterator[bytes]:
        """The container's output (stdout and stderr, as the engine kept it), line by line; with follow, until
        the container is gone. Nothing when it is gone already. tail: only the last lines; timestamps: each line
        starts with the engine's time (RFC 3339) and a space, as docker logs -t. opened: told, once the stream is
        open, how to end it from another thread (its socket closed: the reading ends as if the container had)."""
        try:
            stream = self.api.logs(
                ref,
                stream=True,
                follow=follow,
                since=since,
                stdout=True,
                stderr=True,
                tail="all" if tail is None else tail,
                timestamps=timestamps,
            )
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "dead or marked for removal": going, as good as gone (auto-remove, a rm)
                return
            raise errors.EngineError(f"cannot read the logs of {ref[:12]}: {_reason(exc)}") from None
        if opened is not None:
            opened(stream.close)  # docker-py's CancellableStream: shuts its socket down, from any thread
        pending = b""
        try:
            for chunk in stream:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                yield from lines
        except (docker.errors.NotFound, requests.exceptions.RequestException, OSError, ValueError):
            pass  # removed while we read, or the stream was closed: what came is what there is
        if pending:
            yield pending

    def wait_removed(self, ref: str, timeout: float | None = None, condition: str = "removed") -> int | None:
        """Block until the container is gone (auto-remove) and return its exit code; None if it was gone already
        or the engine could not say. condition "not-running": until it exited (a container that is kept, as
        Compose keeps its services')."""
        try:
            resp = self.api.wait(ref, timeout=timeout, condition=condition)
        except docker.errors.NotFound:
            return None
        except requests.exceptions.ReadTimeout:
            raise errors.EngineError(f"container {ref[:12]} still runs after {timeout:g} s") from None
        code = resp.get("StatusCode") if isinstance(resp, dict) else None
        return int(code) if isinstance(code, int) else None

    def signal(self, ref: str, signum: int) -> None:
        try:
            self.api.kill(ref, signal=int(signum))
        except docker.errors.NotFound:
            pass  # already removed
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running (exited, or never started)
                raise errors.EngineError(f"cannot signal container {ref}: {_reason(exc)}") from None

    def _create_helper(
        self,
        image: str,
        argv: list[str],
        labels: Mapping[str, str],
        env: Mapping[str, str],
        device_requests: list[Mapping[str, Any]],
        binds: Mapping[str, str] | None = None,
        stdin: bool = False,
    ) -> str:
        """A nameless container of ours, its binds read-only; stdin: open, closed by the engine when its one attach
        ends."""
        ref = self._create_own(None, image, labels, argv, binds, env, stdin, "ro", device_requests)
        assert ref is not None  # no name: nothing for it to collide with
        return ref

    def run_helper(
        self,
        image: str,
        argv: list[str],
        files: Mapping[str, bytes],
        labels: Mapping[str, str],
        env: Mapping[str, str],
        device_requests: list[Mapping[str, Any]],
        timeout: float = 60.0,
        binds: Mapping[str, str] | None = None,
    ) -> tuple[int | None, bytes, bytes]:
        """Run a short-lived helper container (`--rm`, OWN_NETWORK) with `files` put under /tmp first; its exit
        code (None: it never started or did not end in time), stdout and stderr. Its removal is the engine's
        (auto-remove), or ours by force when it did not start or end: nothing of it is left either way.
        binds: volumes (or host paths) mounted read-only, source -> path inside."""
        ref = self._create_helper(image, argv, labels, env, device_requests, binds)
        out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

        def attach() -> tuple[Any, Any]:
            stream = self.api.attach(ref, stdout=True, stderr=True, stream=True, demux=True)
            return stream, removal_wait(self.api, ref, self.timeout)

        stream, wait = self._start_helper(ref, files, attach, "the helper")

        def read() -> None:
            with contextlib.suppress(Exception):  # the stream ends (or breaks) when the helper is gone
                for chunk_out, chunk_err in stream:
                    out["stdout"] += chunk_out or b""
                    out["stderr"] += chunk_err or b""

        helper = Nursery(f"the helper {ref[:12]} on {self.address}")
        reader = helper.start(read, name="helper-output")
        reader.join(timeout)
        code = None
        if reader.is_alive():
            self.remove(ref)  # the helper gone, its stream ends, and so does the reader: joined, never abandoned
            helper.join(GONE_PATIENCE)
        else:
            with contextlib.suppress(Exception):
                status = json.loads(wait.content or b"{}").get("StatusCode")
                code = int(status) if isinstance(status, int) else None
        return code, bytes(out["stdout"]), bytes(out["stderr"])

    def watcher(self, spec: Watcher, files: Mapping[str, bytes], created: Callable[[str], None]) -> tuple[str, Session]:
        """A long-lived helper container (`--rm`, OWN_NETWORK, tini as init) with `files` put under /tmp: its id,
        told to `created` before it starts (the run's guard owns it), and a session on its stdout. Its stdin is this
        process's alone: when this process ends, however it ends, the engine closes it. The caller removes it."""
        ref = self._create_helper(spec.image, spec.argv, spec.labels, spec.env, spec.device_requests, stdin=True)

        def attach() -> tuple[Any, socket.socket]:
            created(ref)
            sock = self.api.attach_socket(ref, params={"stdin": 1, "stdout": 1, "stream": 1})
            return sock, raw_socket(sock)

        sock, raw = self._start_helper(ref, files, attach, f"the watcher on the engine at {self.address}")
        raw.settimeout(None)
        return ref, Session(raw, sock)

    def _start_helper(self, ref: str, files: Mapping[str, bytes], attach: Callable[[], T], what: str) -> T:
        """A helper made by _create_helper: `files` put under /tmp, `attach()` (what it returns is returned), then
        started; removed (and EngineError said) when any of it fails."""
        try:
            if files:  # each archive is a `docker-untar` process the engine starts: none for nothing
                self.api.put_archive(ref, "/tmp", _tar(files))
            attached = attach()
            self.api.start(ref)
        except docker.errors.APIError as exc:
            self.remove(ref)
            raise errors.EngineError(f"{what} did not start: {_reason(exc)}") from None
        except BaseException:
            self.remove(ref)
            raise
        return attached

    def rename(self, ref: str, name: str) -> bool:
        """The container `ref` (by id) named `name`: False when another container has that name (names are unique
        per engine, so a rename is a test-and-set: the GPU lock, app/locks.py); EngineError when `ref` is gone."""
        try:
            self.api.rename(ref, name)
        except docker.errors.NotFound:
            raise errors.EngineError(f"cannot rename container {ref[:12]}: it is gone") from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return False
            raise errors.EngineError(f"cannot rename container {ref[:12]} to {name}: {_reason(exc)}") from None
        return True

    def remove(self, ref: str, patience: float = 5.0) -> None:
        """Removed by id (a running one killed first), its anonymous volumes too, as auto-remove does; returns once
        the engine no longer has it. A removal already under way (auto-remove got there first) is waited for; a
        container the engine left `Dead` (its removal failed, after a crash) is asked again, for `patience`
        seconds: then EngineError, never a removal said that did not happen."""
        deadline = time.monotonic() + patience
        while True:
            try:
                self.api.remove_container(ref, force=True, v=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: removal already in progress, or a dead one not yet removable
                    raise errors.EngineError(f"cannot remove container {ref}: {_reason(exc)}") from None
            info = self.inspect(ref)
            if info is None:
                return
            if time.monotonic() >= deadline:
                state = (info.get("State") or {}).get("Status", "?")
                raise errors.EngineError(f"container {ref[:12]} is still there ({state}) after its removal was asked")
            time.sleep(0.2)


GONE_PATIENCE = 15.0  # seconds a helper removed for being late may take to be gone


class Session:
    """An exec session of ours (Engine.session): lines in, the process's stdout lines out. Frames are read from a
    buffer of its own, so that a read that times out loses nothing and leaves the stream readable."""

    def __init__(self, raw: socket.socket, keep: Any, early: bytes = b"") -> None:
        self.raw, self._keep = raw, keep
        self._buf = early  # what the engine sent that is not yet a whole frame (read_ahead: what came first)
        self._pending = b""  # stdout that is not yet a whole line
        self._ended = False
        self._write = threading.Lock()

    def write(self, data: bytes) -> None:
        """To its stdin; OSError once it is gone."""
        with self._write:
            self.raw.sendall(data)

    def line(self, timeout: float | None) -> bytes | None:
        """Its next stdout line (without the newline): b"" when `timeout` seconds pass with nothing whole yet, None
        once it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._frames()
            if b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                return line.strip()
            if self._ended:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return b""
            try:
                self.raw.settimeout(left)
                chunk = self.raw.recv(65536)
            except TimeoutError:
                return b""
            except OSError:
                chunk = b""
            if not chunk:
                self._ended = True
            self._buf += chunk

    def _frames(self) -> None:
        """Whole frames out of the buffer: 8-byte header (stream, 0, 0, 0, size), then size bytes; stdout kept."""
        while len(self._buf) >= 8:
            size = struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                return
            stream, data, self._buf = self._buf[0], self._buf[8 : 8 + size], self._buf[8 + size :]
            if stream == 1:
                self._pending += data

    def close(self) -> None:
        """Its stdin ended and the connection let go (wakes a reader blocked on it)."""
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_RDWR)
        for part in (self.raw, self._keep):
            with contextlib.suppress(Exception):
                part.close()


READER_PATIENCE = 300.0  # seconds an exit waits for its stage's last lines to be read (not while stopping)


class Held:
    """A container `Engine.hold` keeps running, by the id the engine gave for our create."""

    def __init__(self, engine: Engine, ref: str, name: str, keep: tuple[Any, ...]) -> None:
        self.engine, self.id, self.name, self._keep = engine, ref, name, keep

    def alive(self) -> bool:
        """The engine says this very container (by id) still runs: removed, or ended, it holds nothing."""
        try:
            return bool(((self.engine.inspect(self.id) or {}).get("State") or {}).get("Running"))
        except Exception:
            return False

    def lost(self) -> str:
        """How it stopped holding what it held (a lock), in words: whoever removed it, or it ended, it is gone."""
        return "removed"

    @property
    def stream(self) -> socket.socket:
        """Its attach socket (stdout comes back on it when the hold asked for `ready`)."""
        return self._keep[1]  # type: ignore[no-any-return]

    def write(self, data: bytes) -> None:
        """To its stdin; OSError once it is gone (or let go)."""
        if not self._keep:
            raise BrokenPipeError(f"{self.name} was let go")
        self._keep[1].sendall(data)

    def let_go(self) -> None:
        """End its stdin and leave it to end by itself (a guard then tears down what it holds; idempotent)."""
        keep, self._keep = self._keep, ()
        if keep:
            with contextlib.suppress(OSError):
                keep[1].shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it (close alone does not)
        for part in keep:
            with contextlib.suppress(Exception):
                part.close()

    def release(self) -> None:
        """End its stdin and remove it now (a lock; idempotent)."""
        had = bool(self._keep)
        self.let_go()
        if had:
            with contextlib.suppress(errors.PpLaunchError):
                self.engine.remove(self.id)


def _refused(spec: StageSpec, engine: Engine, exc: BaseException) -> errors.PpLaunchError:
    """The engine's refusal of a stage's create, in words that say what to do: a host path it lacks names the flag
    that asked for it and the folder to create."""
    reason = _reason(exc)
    missing = re.search(r"bind source path does not exist: (\S+)", reason)
    if missing is not None:
        path = missing.group(1)
        flag = next((m.flag for m in spec.options.mounts if m.source == path), "--volume")
        where = f"host {spec.host}" if spec.host else f"the engine's machine ({engine.address})"
        return errors.HostPathMissing(
            f"{flag}: {path} does not exist on {where}, for {spec.where()}: create it there first "
            f"(mkdir -p {path}); pp-launch never lets the engine create it empty and owned by root"
        )
    return errors.EngineError(f"the engine refused to create {spec.name}: {reason}")


RECORD_INSIDE = "/run/pp-launch-record"  # where a stage sees its run's record (read-only)
GUARD_RECORD_AT = "/record"  # where a run's guard keeps its run's record (its volume, written)


def _volume_at(row: Mapping[str, Any], destination: str) -> str:
    """The named volume a listed container mounts at `destination` ("" : none)."""
    for m in row.get("Mounts") or ():
        if m.get("Type") == "volume" and m.get("Destination") == destination:
            return str(m.get("Name", ""))
    return ""


class DockerStageBackend:
    """The chain's StageBackend on a Docker engine: tini as init, daemon-side auto-remove, host labels."""

    def __init__(
        self,
        engine: Engine,
        max_line: int = 64 * 1024,
        split_lines: bool = True,
        expected: int = 0,
        on_all_created: Callable[[], None] | None = None,
        toolkit_hint: str = "",
        record: Callable[[str], None] = lambda ref: None,
        expect: Callable[[str], None] = lambda name: None,
        record_volume: str = "",
    ) -> None:
        """split_lines=False passes output on as it comes (pp-gpu-node: byte for byte, any line length).
        record: told each id the engine returns for a create, before anything else (the run's guard); when it
        raises, the container it was told of is removed and the create fails.
        toolkit_hint: what to do when the engine cannot attach GPUs (the caller's own flags; the chain's by default).
        expected/on_all_created: called once when that many containers exist, or teardown begins (the engine's
        GPU lock is released then: the stages' labels now say which GPUs they hold)."""
        self.engine = engine
        self._expected = expected
        self._on_all_created = on_all_created
        self._made = 0
        self.api = engine.api
        self.max_line = max_line
        self.split_lines = split_lines
        self._stdin: dict[str, tuple[Any, socket.socket]] = {}  # each stage's stdin attach (an open stdin only)
        self._open_stdin: set[str] = set()  # created with an open stdin (PP_LIFELINE=stdin)
        self._reading: dict[str, tuple[socket.socket, Any]] = {}  # each started stage's attach and removal wait
        self._handed: list[str] = []  # stages handed over (a detached run): let go at close()
        self._toolkit_hint = toolkit_hint or NVIDIA_TOOLKIT_HINT
        self._tearing_down = threading.Event()
        self._threads = Nursery(f"the stages on {engine.address}")  # every reader and wait, joined by close()
        self._image_configs: dict[str, Mapping[str, Any] | None] = {}  # one inspect per image, not per stage
        self._has_shell: dict[str, bool] = {}  # per image: whether the hand-off entry's /bin/sh is there
        self._unhealthy: dict[str, str] = {}  # a stage its health check failed, and how: said with its end
        self._health: Any = None  # the engine's event stream of the run's health, once a stage has a check
        self._health_lock = threading.Lock()
        self._checked: dict[str, float] = {}  # a stage with a health check: how long it may go unchecked (paused)
        self._paused: set[str] = set()
        self._unwatched = threading.Event()  # teardown or close(): no stage is watched for its health any more
        self._record = record
        self._expect = expect  # told each name before its create: a create whose answer never came back is found
        self.created: list[str] = []  # every id the engine returned for our creates: what is ours, and only that
        self._record_volume = record_volume  # the run's record, mounted read-only in each stage (adapters/guard.py)

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        lifeline = env.get(LIFELINE) == "stdin"
        host_config = self.api.create_host_config(init=True, auto_remove=True, network_mode=spec.network)
        host_config.update(self._options_host_config(spec))
        if self._record_volume:  # in use while any stage is there: no prune removes the run's record before its end
            host_config["Mounts"] = [
                *host_config.get("Mounts", []),
                {"Type": "volume", "Source": self._record_volume, "Target": RECORD_INSIDE, "ReadOnly": True},
            ]
        if spec.device_requests:
            # The engine's own JSON, as the docker CLI sends it (docker-py's DeviceRequest turns null into []).
            host_config["DeviceRequests"] = [dict(r) for r in spec.device_requests]
        config = self.api.create_container_config(
            image=spec.image,
            command=list(spec.command) if spec.command else None,
            environment=dict(env),
            labels={**dict(spec.options.labels), **dict(spec.labels)},
            host_config=host_config,
            stdin_open=lifeline,
            entrypoint=list(spec.entrypoint) if spec.entrypoint is not None else None,
        )
        config.update(spec.options.config())
        # StdinOnce: the engine closes the stage's stdin when our attach ends, i.e. when this process dies.
        config["StdinOnce"] = lifeline
        self._expect(spec.name)
        try:
            created = self.api.create_container_from_config(config, spec.name)
        except docker.errors.ImageNotFound:
            raise errors.ImageMissing(
                f"image {spec.image} is not present on this engine, and pp-launch never pulls. Build it "
                "('pp-launch images build' for the built-in image) or load it ('docker load -i FILE')."
            ) from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise errors.NameInUse(
                    f"container name {spec.name} is already in use; pick another --name, or remove the old "
                    "container if it is yours ('pp-launch gc' removes those whose launcher is gone)"
                ) from None
            raise _refused(spec, self.engine, exc) from None
        ref = str(created["Id"])
        self.created.append(ref)
        if lifeline:
            self._open_stdin.add(ref)
        try:
            self._record(ref)
            self._made += 1
            if self._made >= self._expected:
                self._all_created()
            if self._checks_health(spec):
                self._checked[ref] = self._unchecked_for(spec)
                self._watch_health(spec.labels.get(labels.RUN, ""))
        except BaseException:
            with contextlib.suppress(Exception):
                self.engine.remove(ref)  # ours by id, never started
            raise
        return ref

    # ------------------------------------------------------------------------------------------ health
    def _checks_health(self, spec: StageSpec) -> bool:
        """Whether the stage has a health check: docker run's --health-cmd, else the image's HEALTHCHECK."""
        check = spec.options.healthcheck
        if check is not None:
            return not check.disabled and (bool(check.test) or self._image_checks(spec.image))
        return self._image_checks(spec.image)

    def _image_checks(self, image: str) -> bool:
        if image not in self._image_configs:
            self._image_configs[image] = self.engine.image_config(image)
        test = ((self._image_configs[image] or {}).get("Healthcheck") or {}).get("Test") or []
        return bool(test) and test[0] != "NONE"

    def _unchecked_for(self, spec: StageSpec) -> float:
        """How long the stage's checks may fail before it is unhealthy (interval x retries + timeout, docker's
        defaults where neither the flags nor the image say): a stage paused that long, which docker runs no check
        in, counts as unhealthy."""
        image = ((self._image_configs.get(spec.image) or {}).get("Healthcheck")) or {}
        given = spec.options.healthcheck
        interval = (given.interval if given else 0.0) or image.get("Interval", 0) / 1e9 or 30.0
        timeout = (given.timeout if given else 0.0) or image.get("Timeout", 0) / 1e9 or 30.0
        retries = (given.retries if given else 0) or image.get("Retries", 0) or 3
        return float(interval * retries + timeout)

    def _watch_health(self, run: str) -> None:
        """One event stream for the run's health on this engine, read on a thread of its own until close()."""
        with self._health_lock:
            if self._health is not None or not run:
                return
            events = ["health_status", "pause", "unpause"]
            filters = {"type": ["container"], "label": [f"{labels.RUN}={run}"], "event": events}
            try:
                self._health = self.api.events(filters=filters, decode=True)
            except docker.errors.APIError as exc:
                raise errors.EngineError(f"cannot follow the stages' health: {_reason(exc)}") from None
        self._threads.start(self._on_health, self._health, name="stages-health")

    def _on_health(self, stream: Any) -> None:
        """A stage of ours that turns unhealthy is killed, its end said with the check's last output: it fails the
        chain as a stage that exited does (docker itself only marks it)."""
        with contextlib.suppress(Exception):  # the stream ends when close() closes it, or the engine goes
            for event in stream:
                ref = str((event.get("Actor") or {}).get("ID") or event.get("id") or "")
                action = str(event.get("Action") or event.get("status") or "")
                if action == "pause" and ref in self._checked:
                    self._paused.add(ref)
                    self._threads.start(self._paused_too_long, ref, name="stage-paused")
                elif action == "unpause":
                    self._paused.discard(ref)
                elif action.endswith("unhealthy"):
                    self._ill(ref, self._health_said(ref))

    def _ill(self, ref: str, said: str) -> None:
        if ref not in self._reading or ref in self._unhealthy or self._tearing_down.is_set():
            return
        self._unhealthy[ref] = said
        with contextlib.suppress(docker.errors.APIError):
            self.api.kill(ref, "SIGKILL")

    def _paused_too_long(self, ref: str) -> None:
        """Docker runs no health check in a paused container: paused for as long as its checks may fail, the stage
        is unhealthy all the same (a frozen rank is a hung one)."""
        limit = self._checked.get(ref, 0.0)
        if self._unwatched.wait(limit) or ref not in self._paused:
            return
        self._ill(ref, f"unhealthy: paused for {limit:g} s, its health check could not run")

    def _health_said(self, ref: str) -> str:
        """How the check failed, in one line: how many times in a row, and its last output."""
        with contextlib.suppress(docker.errors.APIError):
            health = (self.api.inspect_container(ref).get("State") or {}).get("Health") or {}
            log = health.get("Log") or [{}]
            last = " ".join(str(log[-1].get("Output") or "").split())[:200] or "nothing"
            streak = health.get("FailingStreak", "?")
            return f"unhealthy: its health check failed {streak} times in a row; last output: {last}"
        return "unhealthy: its health check failed"

    def _options_host_config(self, spec: StageSpec) -> dict[str, Any]:
        """docker run's options of the stage (core/container.py). The folders pp-launch makes for a stage (its caches)
        are created here first with this user's ownership, when the engine is on this machine; on an engine reached
        over the network they go as `-v` binds, which that engine creates, as `docker -H ENGINE run -v` would. Any
        other host path goes as `--mount type=bind`: the engine refuses a missing one, never creating it as root."""
        out = spec.options.host_config()
        ensured = [m for m in spec.options.mounts if m.ensure]
        if not ensured:
            return out
        if self.engine.url.startswith("unix://"):
            for m in ensured:
                os.makedirs(m.source, exist_ok=True)
            return out
        kept = dataclasses.replace(spec.options, mounts=tuple(m for m in spec.options.mounts if not m.ensure))
        out = kept.host_config()
        out["Binds"] = [*out.get("Binds", []), *(m.bind_text() for m in ensured)]
        return out

    def _all_created(self) -> None:
        call, self._on_all_created = self._on_all_created, None
        if call is not None:
            call()

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        sock: Any = None
        try:
            # Two hijacked connections. The output comes back on one. The stage's open stdin (PP_LIFELINE=stdin)
            # is the other, alone: the engine closes the stage's stdin when it ends, i.e. when this process dies
            # or hands the run over. Apart, because the engine drops whatever it has not yet copied from an
            # attach's stdin as soon as the output on that same attach fails: a detached run's launcher, exiting
            # right behind HANDED_OVER, would race its own line (docs/chain.md, "The guard").
            sock = self.api.attach_socket(ref, params={"stdout": 1, "stderr": 1, "stream": 1})
            raw = raw_socket(sock)
            raw.settimeout(None)  # a quiet stage must not time the stream out
            if ref in self._open_stdin:
                feed = self.api.attach_socket(ref, params={"stdin": 1, "stream": 1})
                self._stdin[ref] = (feed, raw_socket(feed))
            wait = removal_wait(self.api, ref, self.engine.timeout)
        except docker.errors.APIError as exc:
            if sock is not None:
                sock.close()
            self._end_stdin(ref)
            raise errors.EngineError(f"cannot attach to {ref[:12]}: {_reason(exc)}") from None
        reader = self._threads.start(self._pump_output, ref, sock, raw, stage, sink, name=f"stage-{stage}-output")
        self._threads.start(self._wait_removed, wait, reader, stage, sink, ref, name=f"stage-{stage}-wait")
        self._reading[ref] = (raw, wait)
        try:
            self.api.start(ref)
        except docker.errors.APIError as exc:
            reason = _reason(exc)
            if "could not select device driver" in reason:
                raise errors.GpuAttachUnavailable(f"{reason}: {self._toolkit_hint}") from None
            raise errors.EngineError(f"the engine could not start it: {reason}") from None

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        try:
            wait = removal_wait(self.api, ref, self.engine.timeout)
        except docker.errors.NotFound:
            sink(StageGone(stage, None, "already gone"))
            return
        except docker.errors.APIError as exc:
            raise errors.EngineError(f"cannot wait for {ref[:12]}: {_reason(exc)}") from None
        # no output to wait for: the stage's lines are not ours to read
        done = self._threads.start(lambda: None, name=f"stage-{stage}-no-output")
        self._threads.start(self._wait_removed, wait, done, stage, sink, name=f"stage-{stage}-wait")

    def _pump_output(self, ref: str, sock: Any, raw: socket.socket, stage: int, sink: Sink) -> None:
        splitters = {1: LineSplitter(self.max_line), 2: LineSplitter(self.max_line)}
        try:
            # read to the end, teardown or not (a stalled stream holds up the container's exit): the sink never
            # blocks while the chain stops (its inbox keeps each stage's last lines, and counts what it drops)
            for stream, data in _frames(raw):
                if not self.split_lines:
                    sink(StageOutput(stage, _STREAMS[stream], data))  # type: ignore[arg-type]
                    continue
                for line in splitters[stream].feed(data):
                    sink(StageOutput.of(stage, _STREAMS[stream], line))  # type: ignore[arg-type]
        except OSError:
            pass
        finally:
            for stream, splitter in splitters.items():
                for line in splitter.close():
                    sink(StageOutput.of(stage, _STREAMS[stream], line))  # type: ignore[arg-type]
            sock.close()
            self._end_stdin(ref)

    def _end_stdin(self, ref: str) -> None:
        """The stage's output ended (it ended, or was let go): so does our end of its stdin, as the engine ends
        a shared attach's stdin with its output. A write after it is an OSError, never a wait on a stage that
        is gone; what was sent before is still copied to the stage, in order, then the end of its stdin."""
        feed = self._stdin.get(ref)
        if feed is None:
            return
        with contextlib.suppress(OSError):
            feed[1].shutdown(socket.SHUT_RDWR)  # wakes a writer blocked on it
        for part in feed:
            with contextlib.suppress(Exception):
                part.close()

    def _wait_removed(self, response: Any, reader: threading.Thread, stage: int, sink: Sink, ref: str = "") -> None:
        try:
            body = json.loads(response.content or b"{}")
            code = body.get("StatusCode")
            error = body.get("Error")
            detail = str(error.get("Message", "")) if isinstance(error, dict) else ""
            gone = StageGone(stage, None if code is None else int(code), self._unhealthy.get(ref) or detail)
        except Exception as exc:  # the wait broke (engine restart...): report it; teardown confirms by label
            gone = StageGone(stage, None, f"lost the engine's wait: {exc}")
        # The stage's last lines must reach the inbox before its exit does (while stopping, they need not): the
        # reader ends when the engine closes the stream, after the last line; a flood may take a while to read.
        deadline = time.monotonic() + READER_PATIENCE
        while reader.is_alive() and time.monotonic() < deadline and not self._tearing_down.is_set():
            reader.join(timeout=0.1)
        sink(gone)

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        """The stage under the hand-off entry: /bin/sh waits for its peers on stdin, then execs what the engine
        would have run (the user's or the image's entrypoint, then the command)."""
        if spec.image not in self._image_configs:
            self._image_configs[spec.image] = self.engine.image_config(spec.image)
        config = self._image_configs[spec.image]
        if config is None:
            return self.create(spec, env)  # the engine says the image is missing, in its words
        entry = list(spec.entrypoint) if spec.entrypoint is not None else list(config.get("Entrypoint") or [])
        default_cmd = [] if spec.entrypoint is not None else list(config.get("Cmd") or [])
        command = list(spec.command) if spec.command else default_cmd
        argv = tuple(handoff.wrapped_command(entry, command))
        ref = self.create(dataclasses.replace(spec, entrypoint=handoff.ENTRYPOINT, command=argv), env)
        if spec.image not in self._has_shell:  # asked of the first container of each image, before any starts
            self._has_shell[spec.image] = self.engine.has_path(ref, handoff.ENTRYPOINT[0])
        if not self._has_shell[spec.image]:
            with contextlib.suppress(errors.EngineError):  # never started: removed here (its guard owns it too)
                self.engine.remove(ref)
            raise errors.ConfigError(
                f"image {spec.image} has no {handoff.ENTRYPOINT[0]}, which the hand-off of --handoff env runs before "
                "the stage's own command: use --bring-up in-turn (each stage created once its peers are known) or "
                "--handoff stdin"
            )
        return ref

    def deliver(self, ref: str, data: bytes) -> None:
        if ref not in self._stdin:
            raise errors.EngineError(f"stage {ref[:12]} has no open stdin to hand off on")
        self.write_stdin(ref, data)

    def _feed(self, ref: str) -> socket.socket:
        feed = self._stdin.get(ref)
        if feed is None:
            raise BrokenPipeError(f"container {ref[:12]} has no open stdin (it was created without one)")
        return feed[1]

    def write_stdin(self, ref: str, data: bytes) -> None:
        """To a stage created with an open stdin (PP_LIFELINE=stdin). OSError once it is gone."""
        self._feed(ref).sendall(data)

    def close_stdin(self, ref: str) -> None:
        """End of stdin for the stage; its output still comes back."""
        self._feed(ref).shutdown(socket.SHUT_WR)

    def signal(self, ref: str, signum: int) -> None:
        self.engine.signal(ref, signum)

    def kill(self, ref: str) -> None:
        self.engine.signal(ref, _signal.SIGKILL)

    def remove(self, ref: str) -> None:
        self.engine.remove(ref)

    def tearing_down(self) -> None:
        self._tearing_down.set()
        self._unwatched.set()
        with contextlib.suppress(errors.PpLaunchError):
            self._all_created()

    def close(self, timeout: float = 5.0) -> None:
        """Every thread of this backend ended: the handed-over stages let go first (a detached run's), then each
        joined, at most `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        self._unwatched.set()
        with self._health_lock:
            if self._health is not None:
                with contextlib.suppress(Exception):
                    self._health.close()
        for ref in self._handed:
            self._copied(ref, deadline)
            self._let_go(ref)
        self._threads.join(max(deadline - time.monotonic(), 0.0))

    def _copied(self, ref: str, deadline: float) -> None:
        """Until the engine has copied the stage's HANDED_OVER and the end of its stdin (it ends its side of the stdin
        attach once it has; seen as the end of our read), at most until `deadline`: this process lets go of nothing,
        and does not exit, while the line may still be on its way (under load a stage took its stdin's end for the
        launcher's death, every stage of a run at once)."""
        feed = self._stdin.get(ref)
        if feed is None:
            return
        with contextlib.suppress(OSError, ValueError):
            feed[1].settimeout(max(deadline - time.monotonic(), 0.01))
            while feed[1].recv(4096):
                pass

    def hand_over(self, ref: str) -> None:
        """The stage's stdin stops being the lifeline: HANDED_OVER, then the end of stdin right behind it, on the
        stage's stdin attach (a connection of its own: the engine copies both to the stage, in order, however soon
        this process exits after). `close()` lets the stage's output go, later."""
        with contextlib.suppress(OSError):
            feed = self._feed(ref)
            feed.sendall(HANDED_OVER)
            feed.shutdown(socket.SHUT_WR)
            self._handed.append(ref)

    def _let_go(self, ref: str) -> None:
        """A handed-over stage is its guard's: its attach and its removal wait are closed (as this process's exit
        would close them), which ends the two threads that read them; close() joins them."""
        reading = self._reading.pop(ref, None)
        if reading is None:
            return
        raw, wait = reading
        sockets = [raw]
        with contextlib.suppress(Exception):  # the wait's socket, as docker-py finds a streamed answer's socket
            sockets.append(raw_socket(self.api._get_raw_response_socket(wait)))
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it (close alone does not)

    def leftovers(self, run_id: str) -> list[str]:
        """The containers this backend created that the engine still has, by id: a container that only carries
        the run's labels is someone else's and never counted. Asked over a new connection: an engine that is
        stopping has closed its listener but still serves the connections already open, and only a new one tells
        that it is going away."""
        mine = set(self.created)
        return sorted(ref for ref in self.engine.listed_anew(labels.run_selector(run_id)) if ref in mine)


def _recv_exact(raw: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = raw.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _frames(raw: socket.socket) -> Iterator[tuple[int, bytes]]:
    """The engine's multiplexed attach stream: 8-byte header (stream, 0, 0, 0, size) then size bytes.
    A large frame is passed on in pieces, so memory stays bounded whatever a stage prints."""
    while True:
        header = _recv_exact(raw, 8)
        if header is None:
            return
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        while size > 0:
            chunk = raw.recv(min(size, _READ_CHUNK))
            if not chunk:
                return
            size -= len(chunk)
            if stream in _STREAMS:
                yield stream, chunk
