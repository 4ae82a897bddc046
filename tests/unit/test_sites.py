"""The registry of sites (app/sites.py): one line per kind, each opened the same two ways."""

from __future__ import annotations

import inspect

from pp_launch.app import sites
from pp_launch.app.site import Housekeeping, Launching


def test_the_flags_name_one_site_each() -> None:
    assert sites.named(None) == sites.SiteRef("docker")
    assert sites.named("127.0.0.1:6379") == sites.SiteRef("ray", "127.0.0.1:6379")


def test_every_kind_opens_for_a_launch_and_for_housekeeping_with_the_same_words() -> None:
    for kind in sites.KINDS:
        site, runs = sites._kind(sites.SiteRef(kind)), sites._kind(sites.SiteRef(kind), 1)
        assert list(inspect.signature(site.to_launch).parameters)[:3] == ["request", "dry_run", "strict"], kind
        assert list(inspect.signature(runs.for_runs).parameters) == ["where", "run", "voice"], kind
        for port, half in ((Launching, site), (Housekeeping, runs)):  # every step of both halves of the port
            missing = [name for name in vars(port) if not name.startswith("_") and not hasattr(half, name)]
            assert missing == [], (kind, port.__name__, missing)
