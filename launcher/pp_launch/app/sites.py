"""Every kind of site, by name (docs/architecture.md, "Sites"): how a command's `Where` or a launch's request names
one (`SiteRef`: the flags as users type them, `--host` and `--ray`, read in one place), and how it is opened, for a
launch or for housekeeping. A new kind of site is one module, one adapter and one line in `KINDS`. A site's module
is imported only when a command opens it (Ray's only for `--ray`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pp_launch.app.request import LaunchRequest
    from pp_launch.app.site import AnySite, Housekeeping, Voice, Where

KINDS = {  # each kind: what opens it for a launch (`to_launch`), and for housekeeping (`for_runs`)
    "docker": ("pp_launch.app.docker_site:DockerSite", "pp_launch.app.docker_runs:DockerRuns"),  # DOCKER_HOST's, --host
    "ray": ("pp_launch.app.on_ray:RaySite", "pp_launch.app.on_ray:RaySite"),  # a Ray cluster (--ray ADDRESS)
}


@dataclass(frozen=True)
class SiteRef:
    """A site as a command names it: its kind (a key of KINDS) and, where the kind has one, its address."""

    kind: str
    address: str | None = None


def named(ray: str | None) -> SiteRef:
    """The site the flags name: `--ray ADDRESS`, else Docker engines (DOCKER_HOST's, or the `--host` list)."""
    return SiteRef("ray", ray) if ray is not None else SiteRef("docker")


def _kind(ref: SiteRef, half: int = 0) -> Any:
    module, _, name = KINDS[ref.kind][half].partition(":")
    return getattr(importlib.import_module(module), name)


def for_launch(request: LaunchRequest, dry_run: bool, strict: bool = False) -> AnySite:
    """The site the request names, reached for a launch."""
    site: AnySite = _kind(named(request.ray)).to_launch(request, dry_run, strict)
    return site


def for_housekeeping(where: Where, run: str | None, voice: Voice) -> Housekeeping:
    """The place `where` names, opened for `ps`, `down`, `gc`, `logs` or `wait` (for --all-hosts, the hosts recorded
    for `run` too)."""
    site: Housekeeping = _kind(named(where.ray), 1).for_runs(where, run, voice)
    return site
