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


def test_a_docker_site_plans_what_its_planner_says_and_a_given_stage_per_attempt() -> None:
    """One DockerSite class: what runs at each attempt is its planner's. `Given` plans the caller's stage for the
    attempt asked (a dry run included), touching no engine."""
    import dataclasses

    from pp_launch.app.docker_site import Allocated, DockerSite, EnginePlace, Given
    from pp_launch.app.request import GpuOptions, LaunchRequest
    from pp_launch.core.chain.plan import ChainRequest, build_plan

    chain = ChainRequest(stages=1, grace=3.0)
    specs = {k: build_plan(chain, {}, "me", [()], [()], f"run{k}").stages[0] for k in (1, 2)}
    asked: list[int] = []

    def describe(attempt: int):  # type: ignore[no-untyped-def]
        asked.append(attempt)
        return specs[attempt]

    site = DockerSite([EnginePlace("", None)], Given(describe))
    request = LaunchRequest(chain, GpuOptions(mode="none"), run_id="r1", owner="me")
    plan, note = site.plan(request, {}, None)
    assert (plan.stages, plan.run_id, plan.grace, note) == ((specs[1],), "r1", 3.0, "")
    second = dataclasses.replace(request, chain=dataclasses.replace(chain, attempt=2))
    assert site.dry_plan(second, {}, strict=True).plan.stages == (specs[2],)
    assert asked == [1, 2]
    assert isinstance(DockerSite([EnginePlace("", None)]).planner, Allocated)  # a chain's: the allocator
