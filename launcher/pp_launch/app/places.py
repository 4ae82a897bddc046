"""The engines a chain runs on, as places (docs/architecture.md, "Sites"): a launch's engines are a list of them,
DOCKER_HOST's a list of one. What differs between one engine and another is the place's alone: how the stage image
gets there, how its GPUs are read and watched, whether it can be lost alone. `reach` makes the list a request names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pp_launch.adapters.docker_engine import Engine, connect
from pp_launch.adapters.gpu_watch import GpuWatch
from pp_launch.adapters.guard import image_check as guard_image_check
from pp_launch.app import chain as steps
from pp_launch.app import gpus as gpu_select
from pp_launch.app import hosts as across
from pp_launch.app.gpu_faults import GpuFaults
from pp_launch.app.request import LaunchRequest
from pp_launch.core import errors
from pp_launch.core.chain.plan import BUILTIN_IMAGE, ChainRequest

if TYPE_CHECKING:
    from pp_launch.adapters.guard import RunGuard


@dataclass(frozen=True)
class EnginePlace:
    """An engine a chain runs on; a launch's engines are a list of these, DOCKER_HOST's a list of one. This one is
    DOCKER_HOST's (`name` "", `engine` None only in a dry run that found none): the stage image built on it on first
    use, its GPUs read by this machine's NVML (or the inventory file) and watched the same way. A `--host` engine
    is a `HostPlace`."""

    name: str
    engine: Engine | None
    lock_name: str = ""
    engine_id: str = ""

    def prepare(self, chain: ChainRequest, say: Callable[[str], None]) -> None:
        """Before the run's guard: the chain's host paths exist here, its image on the engine (built if it is
        pp-launch's own, never pulled)."""
        steps.check_host_paths(chain, is_local(self))
        steps.ensure_image(engine_of(self), chain.image, say)

    def check(self, chain: ChainRequest, strict: bool) -> None:
        """A dry run's look (strict: fail where a launch would): the host paths, the image present."""
        if not strict:
            return
        steps.check_host_paths(chain, self.engine is None or is_local(self))
        if self.engine is not None and chain.image != BUILTIN_IMAGE and self.engine.image_labels(chain.image) is None:
            raise errors.ImageMissing(
                f"image {chain.image} is not present on the engine at {self.engine.address}, and pp-launch never "
                "pulls: a launch would stop here. Build it or load it ('docker load -i FILE') first."
            )

    def gpus(self, request: LaunchRequest, environ: Mapping[str, str]) -> gpu_select.HostGpus:
        """Its GPUs (this machine's NVML, or the inventory file) and what running containers hold of them."""
        engine = self.engine
        held = (lambda: across.live_gpu_labels(engine)) if engine is not None else list
        path = request.gpu.inventory_path or environ.get(gpu_select.INVENTORY_ENV) or None
        return gpu_select.HostGpus(self.name, gpu_select.load_inventory(path), held)

    def watch(
        self,
        uuids: Sequence[str],
        request: LaunchRequest,
        g: RunGuard | None,
        faults: GpuFaults,
        say: Callable[[str], None],
    ) -> Watch | None:
        """The stages' GPUs here watched for Xid errors: this machine's NVML."""
        return GpuWatch(uuids, faults.on_xid).start()


@dataclass(frozen=True, kw_only=True)
class HostPlace(EnginePlace):
    """A `--host` engine, reached and checked: the image must be there already (the same on every host), its GPUs
    probed by a short-lived container on it (or its inventory file) and watched by a watcher container its guard
    owns. It can be lost alone: the other hosts are torn down as usual and it is named (adapters/multi_host.py)."""

    host: across.Host

    @classmethod
    def of(cls, h: across.Host) -> HostPlace:
        return cls(h.name, h.engine, h.name, h.engine_id, host=h)

    def prepare(self, chain: ChainRequest, say: Callable[[str], None]) -> None:
        guard_image_check(engine_of(self), f"host {self.name}")

    def check(self, chain: ChainRequest, strict: bool) -> None:
        pass  # the image, on every host at once: DockerSite

    def gpus(self, request: LaunchRequest, environ: Mapping[str, str]) -> gpu_select.HostGpus:
        gpu, chain = request.gpu, request.chain
        path = dict(gpu.host_inventories).get(self.name) or gpu.inventory_path or environ.get(gpu_select.INVENTORY_ENV)
        run_id, owner = request.run_id or "", request.owner or ""
        return across.host_gpus(self.host, chain.image, gpu.attach, run_id, owner, path or None, chain.attempt)

    def watch(
        self,
        uuids: Sequence[str],
        request: LaunchRequest,
        g: RunGuard | None,
        faults: GpuFaults,
        say: Callable[[str], None],
    ) -> Watch | None:
        if g is None:
            return None
        run = (request.run_id or "", request.owner or "", request.chain.attempt)
        image, attach = request.chain.image, request.gpu.attach
        return across.HostGpuWatch(self.host, uuids, run, image, attach, g.own, faults.on_xid, say).start()


class Watch(Protocol):
    """What watches a place's GPUs while its stages run."""

    def stop(self) -> None: ...


def reach(request: LaunchRequest, dry_run: bool, strict: bool = False) -> list[EnginePlace]:
    """The engines: every --host reached and checked at once (exit 2 naming each that does not answer), or
    DOCKER_HOST's (a dry run tolerates none: a plan needs no engine; strict: but one that runs and refuses this
    user is the error a launch would meet)."""
    if request.hosts:
        return [HostPlace.of(h) for h in across.connect_all(request.hosts)]
    if dry_run:
        try:
            return [EnginePlace("", connect(timeout=5))]
        except errors.EngineUnavailable as exc:
            if strict and "permission denied" in str(exc):
                raise
            return [EnginePlace("", None)]
    engine = connect()
    return [EnginePlace("", engine, engine.address)]  # one engine: no lock order to keep, no identity to ask


def hosts_of(sites: Sequence[EnginePlace]) -> list[across.Host]:
    """The --host engines among them (none: DOCKER_HOST's alone)."""
    return [s.host for s in sites if isinstance(s, HostPlace)]


def is_local(site: EnginePlace) -> bool:
    """The engine runs on this machine (its unix socket): a host path of a stage is a path here."""
    return site.engine is not None and site.engine.url.startswith("unix://")


def engine_of(site: EnginePlace) -> Engine:
    assert site.engine is not None  # only a dry run goes without one
    return site.engine
