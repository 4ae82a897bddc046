"""The steps of a launch that stand alone: the checks of a request, the image, the names.

The use case that puts them together is app/launch.py."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from pp_launch.adapters import identity, images
from pp_launch.adapters.docker_engine import Engine, connect
from pp_launch.core import errors, labels
from pp_launch.core.announce import escape
from pp_launch.core.chain.plan import BUILTIN_IMAGE, GUARD_IMAGE, ChainPlan, ChainRequest
from pp_launch.core.chain.ports import Runtime
from pp_launch.core.chain.scope import ChainOutcome

# docker's reference grammar, simplified: [host[:port]/]path[:tag][@sha256:digest], lowercase path
_IMAGE_REF = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


_NAME_PREFIX = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}")


def check_image_name(image: str, what: str = "--image") -> None:
    if not _IMAGE_REF.fullmatch(image):
        raise errors.ConfigError(f"{what} {image!r} is not a valid image reference (e.g. repo/name:tag)")


def check_name_prefix(prefix: str) -> None:
    if not _NAME_PREFIX.fullmatch(prefix):
        raise errors.ConfigError(f"--name {prefix!r} is not a valid container name prefix ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")


def check_request(request: ChainRequest) -> None:
    """What a plan checks of the request before anything else (exit 2)."""
    check_image_name(request.image)
    if request.name_prefix is not None:
        check_name_prefix(request.name_prefix)


def check_host_paths(request: ChainRequest, local: bool) -> None:
    """Every host path a stage mounts exists (each stage's, {stage} replaced), when the engine is on this machine:
    exit 2 before anything starts, naming the flag and the fix. Elsewhere the engine itself refuses a missing one
    at the create (adapters/docker_engine.py), for it is sent as `--mount type=bind`: never created as root."""
    if not local:
        return
    for mount, template in request.container.host_paths():
        for k in range(request.stages):
            if mount.stage not in (None, k):
                continue
            path = mount.for_stage(k).source
            if not os.path.exists(path):
                which = f" (stage {k}'s)" if template != path else ""
                raise errors.HostPathMissing(
                    f"{mount.flag}: {path}{which} does not exist on this host: create it first (mkdir -p {path}); "
                    "docker would create it empty and owned by root"
                )


def ensure_image(engine: Engine, image: str, say: Callable[[str], None]) -> None:
    """The built-in image is built on first use; a user image must be there already (nothing is pulled)."""
    if engine.image_labels(image) is not None and engine.image_labels(GUARD_IMAGE) is not None:
        return
    if image != BUILTIN_IMAGE and engine.image_labels(image) is None:
        raise errors.ImageMissing(
            f"image {image} is not present on this engine, and pp-launch never pulls. Build it or load it "
            "('docker load -i FILE') first."
        )
    say("pp-launch's images are missing: building them now (once; 'pp-launch images build' does the same)")
    images.build_all(engine, say)


def build_images(
    say: Callable[[images.Step], None] | Callable[[str], None],
    base: str | None = None,
    hosts: Sequence[str] = (),
    log: images.BuildLog | None = None,
) -> list[images.BuildResult]:
    """`pp-launch images build`: pp-launch's images on DOCKER_HOST's engine (or on each of `hosts`, in turn: Docker
    contexts or engine URLs), each rebuilt only when its inputs changed. The base image's root filesystem is made
    here (debootstrap) and imported into each engine; nothing is pulled."""
    results: list[images.BuildResult] = []
    for host in hosts or (None,):
        engine = connect(host=host)
        try:
            results += images.build_all(engine, say, base, log)
        finally:
            engine.close()
    return results


SHIPPED = (BUILTIN_IMAGE, GUARD_IMAGE)  # what every engine a run uses needs (the base only builds them)


def save_images(path: str) -> tuple[list[str], int]:
    """`pp-launch images save`: the stage and guard images of DOCKER_HOST's engine in one archive (docker save)."""
    engine = connect()
    try:
        missing = [name for name in SHIPPED if engine.image_labels(name) is None]
        if missing:
            raise errors.ImageMissing(
                f"{', '.join(missing)} not on the engine at {engine.address}: run 'pp-launch images build' first"
            )
        return list(SHIPPED), engine.save_images(SHIPPED, path)
    finally:
        engine.close()


def load_images(path: str, hosts: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """`pp-launch images load`: an archive of `images save` loaded into DOCKER_HOST's engine, or into each of
    `hosts`; (where, the images it loaded) for each."""
    out = []
    for host in hosts or (None,):
        engine = connect(host=host)
        try:
            out.append((host or engine.address, engine.load_images(path)))
        finally:
            engine.close()
    return out


def check_names_free(engine: Engine, plan: ChainPlan, host: str | None, runtime: Runtime) -> None:
    """A stage's name held by any container, ours or not, is exit 2 before anything starts. The holder is named
    and never touched: a container is ours only by the id the engine gave us for our own create. `host`: only
    the stages of that host (a chain across hosts), on its engine. `runtime`: every name asked at once."""
    specs = [spec for spec in plan.stages if host is None or spec.host == host]
    asks: list[Callable[[], Any]] = [functools.partial(engine.inspect, spec.name) for spec in specs]
    answers = runtime.run_all(asks)
    for spec, info in zip(specs, answers, strict=True):
        if isinstance(info, BaseException):
            raise info
        if info is None or str(info.get("Name", "")).lstrip("/") != spec.name:
            continue
        raise errors.NameInUse(_held(spec.name, info, host))


def _held(name: str, info: dict[str, Any], host: str | None) -> str:
    held = dict((info.get("Config") or {}).get("Labels") or {})
    run = held.get(labels.RUN)
    if run is None:
        holder, fix = "a container not made by pp-launch", ""
    else:
        holder = (
            f"stage {escape(held.get(labels.STAGE, '?'))} of pp-launch run {escape(run)} "
            f"(owner {escape(held.get(labels.OWNER, '?'))})"
        )
        fix = f", or end that run first ('pp-launch down {escape(run)}')"
    on = f" on host {host}" if host is not None else ""
    return (
        f"container name {name}{on} is held by {holder}, id {str(info.get('Id', ''))[:12]}; it was left "
        f"untouched. Choose another --name{fix}"
    )


BuildLog = images.BuildLog  # every line a build's tools print, shown when it fails (the CLI's `images build`)


def new_run_id() -> str:
    """A new run's id (the testing kit names its runs as a launch does)."""
    return identity.new_run_id()


def this_host() -> str:
    """This machine's name as a run's owner label carries it."""
    return identity.here().host


def owner_label(detach: bool) -> str:
    """Whose the run's containers are: this launcher's user and process, or no process's once it is detached."""
    return labels.OWNER_DETACHED if detach else identity.current_owner().label()


def launcher_label(owner: str) -> str:
    """A detached run's launcher, as its containers name it (`ps` says whose it was); "" for any other run."""
    return identity.current_owner().label() if owner == labels.OWNER_DETACHED else ""


def say_plan(plan: ChainPlan, note: str, say: Callable[[str], None]) -> None:
    """What the plan is, in words, before anything starts: its note, and which stages run on which host."""
    if note:
        say(note)
    if plan.hosts:
        where = "; ".join(
            f"{h}: stages {', '.join(str(s.index) for s in plan.stages if s.host == h)}" for h in plan.hosts
        )
        say(f"run {plan.run_id} across {len(plan.hosts)} hosts: {where}")


def with_places_lost(outcome: ChainOutcome, said: Sequence[str]) -> ChainOutcome:
    """A chain that lost a place on the way (a host's engine, a Ray node) failed whatever its stages did: exit 1,
    each place said first (what may be left there, what to run when it is back), then how the chain ended."""
    if not said:
        return outcome
    message = "; ".join([*said, outcome.message] if outcome.message else said)  # what was lost first: the cause
    return dataclasses.replace(outcome, exit_code=errors.EXIT_FAILURE, message=message)
