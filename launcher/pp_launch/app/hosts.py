"""Chains across hosts: reach and check every host's engine, and learn each host's GPUs through it.

No code of ours is installed on a host: the Docker API is the only channel. A host's GPUs are read by a short-lived
probe container (labelled, `--rm`, the host's network, no listener) of the chain's image, with every GPU attached as
the NVIDIA toolkit attaches them (`--gpus all`, CDI `nvidia.com/gpu=all`, or NVIDIA_VISIBLE_DEVICES=all); inside it,
our NVML reader (adapters/nvml.py with nvidia-ml-py's pynvml.py, copied in with the create call's archive) prints
the inventory of docs/formats.md. The GPUs held there are read from that engine's labels. While a chain's stages
run, a watcher container of the same kind on each host watches the run's GPUs there for Xid errors (`HostGpuWatch`),
as the launcher watches its own machine's."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pp_launch.adapters import inventory_file
from pp_launch.adapters.docker_engine import Engine, Session, Watcher, connect
from pp_launch.adapters.probe import PROBE_BOOT, WATCH_BOOT, WATCH_MODULES, probe_files
from pp_launch.adapters.runtime import Nursery, map_all
from pp_launch.app import gpus as gpu_select
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import BUILTIN_IMAGE
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.gpu.requests import gpu_request

MIN_API = (1, 40)  # DeviceRequests (--gpus) came with API 1.40 (Docker 19.03)


@dataclass
class Host:
    """One engine of a chain across hosts, reached and checked."""

    name: str  # as the user named it (--host)
    engine: Engine
    engine_id: str
    api_version: str


def load_hint(host: str, image: str) -> str:
    """How a user copies an image onto a host (pp-launch never pulls)."""
    target = f"--context {host}" if "://" not in host else f"-H {host}"
    return f"docker save {image} | docker {target} load"


def connect_all(names: Sequence[str], timeout: float | None = None) -> list[Host]:
    """Reach every host at once. EngineUnavailable (exit 2) names each one that does not answer; ConfigError
    when two names reach one engine (stages would share its GPUs' lock under two names)."""

    def reach(name: str) -> Host | errors.PpLaunchError:
        try:
            engine = connect(timeout, host=name)
            engine_id, api = engine.identity()
        except errors.PpLaunchError as exc:
            return exc
        return Host(name, engine, engine_id, api)

    reached = map_all(reach, names, "host-connect")
    failures = [str(r) for r in reached if isinstance(r, errors.PpLaunchError)]
    hosts = [r for r in reached if isinstance(r, Host)]
    if failures:
        close_all(hosts)
        raise errors.EngineUnavailable("; ".join(failures))
    old = [h for h in hosts if _api(h.api_version) < MIN_API]
    seen: dict[str, str] = {}
    for h in hosts:
        if h.engine_id and h.engine_id in seen:
            close_all(hosts)
            raise errors.ConfigError(
                f"--host {seen[h.engine_id]} and --host {h.name} reach the same Docker engine "
                f"(data root {h.engine_id.rsplit('|', 1)[-1]}): name each host once"
            )
        seen[h.engine_id] = h.name
    if old:
        close_all(hosts)
        named = ", ".join(f"{h.name} (API {h.api_version})" for h in old)
        raise errors.EngineUnavailable(f"hosts with a Docker engine older than API 1.40 (Docker 19.03): {named}")
    return hosts


def close_all(hosts: Sequence[Host]) -> None:
    for h in hosts:
        h.engine.close()


def _api(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (0, 0)


def check_image(hosts: Sequence[Host], image: str) -> None:
    """The image is on every host with one id (the same bits everywhere); never pulled. ImageMissing (exit 2)
    names each host without it and how to load it there."""
    ids = {h.name: h.engine.image_id(image) for h in hosts}
    missing = [name for name, found in ids.items() if found is None]
    if missing:
        how = "; ".join(f"{name}: {load_hint(name, image)}" for name in missing)
        build = " (or 'pp-launch images build' with DOCKER_HOST set to that engine)" if image == BUILTIN_IMAGE else ""
        raise errors.ImageMissing(
            f"image {image} is not present on host{'s' if len(missing) > 1 else ''} {', '.join(missing)}, and "
            f"pp-launch never pulls. Load it there: {how}{build}"
        )
    if len(set(ids.values())) > 1:
        listed = ", ".join(f"{name}: {str(found)[:19]}" for name, found in ids.items())
        raise errors.ConfigError(
            f"image {image} differs between hosts ({listed}): every stage must run the same image. Copy one "
            f"build to every host ({load_hint('HOST', image)})"
        )


def probe_requests(attach: str) -> tuple[list[Mapping[str, Any]], dict[str, str]]:
    """Every GPU of the host, attached the way the chain's stages will be (--gpu-attach)."""
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    if attach == "env":
        return [], env
    if attach == "cdi":
        cdi = {"Driver": "cdi", "Count": 0, "DeviceIDs": ["nvidia.com/gpu=all"], "Capabilities": [], "Options": {}}
        return [cdi], env
    request = gpu_request(count=-1)
    request["Capabilities"] = [["gpu", "utility"]]
    return [request], env


def probe_inventory(host: Host, image: str, attach: str, run_id: str, owner: str, attempt: int = 1) -> GpuInventory:
    """The host's GPUs as NVML shows them inside a container given all of them. A host without the NVIDIA
    toolkit, or without GPUs, gives an empty inventory with the reason in `note` (its stages run on CPU)."""
    requests, env = probe_requests(attach)
    probe_labels = {labels.RUN: run_id, labels.STAGE: "probe", labels.OWNER: owner, labels.GPUS: ""}
    probe_labels[labels.ATTEMPT] = str(attempt)
    try:
        code, out, err = host.engine.run_helper(
            image, ["python3", "-c", PROBE_BOOT], probe_files(), probe_labels, env, requests
        )
    except errors.EngineLost:
        raise
    except errors.EngineError as exc:
        return GpuInventory(note=f"host {host.name}: no GPU can be attached there ({exc})")
    last = out.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    try:
        doc = json.loads(last[0])
    except json.JSONDecodeError:
        doc = None
    if code != 0 or not isinstance(doc, dict):
        why = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit code {code}"]
        raise errors.ConfigError(
            f"host {host.name}: the GPU probe (python3 in image {image}) failed: {why[0]}. Give that host's "
            f"inventory instead: run 'pp-launch gpus --record FILE' there and pass --gpu-inventory {host.name}=FILE"
        )
    if "inventory" in doc:
        return GpuInventory.from_json(doc["inventory"], source=f"host {host.name}")
    return GpuInventory(note=f"host {host.name}: {doc.get('note', 'no GPU')}")


class HostGpuWatch:
    """A host's GPUs of a run watched for Xid errors while its stages run: a watcher container on that host's engine
    (the chain's image, every GPU attached as the probe attaches them, our NVML reader and GPU watch copied in),
    owned by the run's guard there (`own`), its stdin this process's lifeline. `on_xid(uuid, index, code, where)`
    for each Xid it prints, on a thread of its own; a watch that cannot run there is said once (`say`). Started in
    the background (`start`: a bring-up never waits for it); `stop` removes the watcher and joins its thread."""

    def __init__(
        self,
        host: Host,
        uuids: Sequence[str],
        run: tuple[str, str, int],  # run id, owner, attempt
        image: str,
        attach: str,
        own: Callable[[str], None],
        on_xid: Callable[[str, int, int, str], None],
        say: Callable[[str], None],
    ) -> None:
        self.host, self.uuids, self.run, self.image, self.attach = host, tuple(uuids), run, image, attach
        self.own, self.on_xid, self.say = own, on_xid, say
        self.ref = ""
        self.session: Session | None = None
        self.stopped = False
        self._lock = threading.Lock()
        self._threads = Nursery(f"the GPU watch on host {host.name}")

    def start(self) -> HostGpuWatch:
        self._threads.start(self._watch, name=f"gpu-watch-{self.host.name}")
        return self

    def _watch(self) -> None:
        where = f"host {self.host.name}"
        run_id, owner, attempt = self.run
        requests, env = probe_requests(self.attach)
        tags = {labels.RUN: run_id, labels.STAGE: labels.STAGE_WATCH, labels.OWNER: owner, labels.GPUS: ""}
        tags[labels.ATTEMPT] = str(attempt)
        argv = ["python3", "-u", "-c", WATCH_BOOT, *self.uuids]
        try:
            spec = Watcher(self.image, argv, tags, env, requests)
            ref, session = self.host.engine.watcher(spec, probe_files(WATCH_MODULES), self.own)
        except errors.PpLaunchError as exc:
            if not self.stopped:
                self.say(f"warning: the GPUs on {where} are not watched for Xid errors: {exc}")
            return
        with self._lock:
            self.ref, self.session, late = ref, session, self.stopped
        if late:  # the attempt ended while the watcher started: it goes at once
            self._end(ref, session)
            return
        while (line := session.line(None)) is not None:
            words = line.decode("ascii", "replace").split()
            if words[:1] == ["note"]:
                self.say(f"warning: on {where}, {' '.join(words[1:])}")
            elif len(words) == 4 and words[0] == "xid" and (code := labels.ascii_int(words[3])) is not None:
                index = labels.ascii_int(words[2])  # -1 (unknown) reads as None
                self.on_xid(words[1], -1 if index is None else index, code, where)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            ref, session = self.ref, self.session
        if session is not None:
            self._end(ref, session)
        self._threads.join(10.0)  # a watcher still starting is ended by its thread, which sees `stopped`

    def _end(self, ref: str, session: Session) -> None:
        with contextlib.suppress(errors.PpLaunchError):
            self.host.engine.remove(ref)
        session.close()


def engine_here(timeout: float | None = None) -> Engine:
    """DOCKER_HOST's engine (DOCKER_CONTEXT's, or the default), reached: EngineUnavailable when it does not answer
    within `timeout`. How the testing kit reaches an engine."""
    return connect(timeout=timeout)


def live_gpu_labels(engine: Engine | None = None, timeout: float = 5.0) -> list[Mapping[str, str]]:
    """Labels of every existing pp-launch container that holds GPUs (exited ones hold nothing); on DOCKER_HOST's
    engine when none is given (EngineUnavailable when it does not answer within `timeout`)."""
    if engine is None:
        here = connect(timeout=timeout)
        try:
            return live_gpu_labels(here)
        finally:
            here.close()
    return [
        c.labels
        for c in engine.containers([labels.GPUS])
        if c.state not in ("exited", "dead") and c.labels.get(labels.GPUS)
    ]


@dataclass(frozen=True)
class GpusSeen:
    """`pp-launch gpus`: the GPUs of this machine (NVML or an inventory file) or of a host's engine (a probe), and
    the labels of the containers that hold any there; `holders` None when the engine did not answer (`why_not`)."""

    inventory: GpuInventory
    holders: list[Mapping[str, str]] | None
    why_not: str = ""


def gpus_seen(
    host: str | None, inventory_path: str | None, image: str, attach: str, owner: str, run_id: str
) -> GpusSeen:
    """The `gpus` use case: with `host`, its engine is reached, `image` checked there and the GPUs read by a probe
    container given every GPU as `attach` gives them (unless `inventory_path` says them), the holders from that
    engine; without, this machine's GPUs and DOCKER_HOST's holders (an engine that does not answer: said, not
    fatal)."""
    if host is None:
        inventory = gpu_select.load_inventory(inventory_path)
        try:
            return GpusSeen(inventory, live_gpu_labels(timeout=5))
        except errors.EngineUnavailable as exc:
            return GpusSeen(inventory, None, str(exc))
    reached = connect_all([host])
    try:
        check_image(reached, image)
        if inventory_path:
            inventory = gpu_select.load_inventory(inventory_path)
        else:
            inventory = probe_inventory(reached[0], image, attach, run_id, owner)
        return GpusSeen(inventory, live_gpu_labels(reached[0].engine))
    finally:
        close_all(reached)


def host_gpus(
    h: Host, image: str, attach: str, run_id: str, owner: str, path: str | None, attempt: int = 1
) -> gpu_select.HostGpus:
    """A host's inventory (the file `path` where one is given, else its probe) and holdings."""
    inventory = inventory_file.load(path) if path else probe_inventory(h, image, attach, run_id, owner, attempt)
    engine = h.engine
    return gpu_select.HostGpus(h.name, inventory, lambda: live_gpu_labels(engine))
