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

    from pp_launch.app.docker_site import DockerSite
    from pp_launch.app.places import EnginePlace
    from pp_launch.app.planning import Allocated, Given
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
    plan, note = site.planner.plan(request, site.places(), {}, None)
    assert (plan.stages, plan.run_id, plan.grace, note) == ((specs[1],), "r1", 3.0, "")
    second = dataclasses.replace(request, chain=dataclasses.replace(chain, attempt=2))
    assert site.planner.dry_plan(second, site.places(), {}, strict=True).plan.stages == (specs[2],)
    assert asked == [1, 2]
    assert isinstance(DockerSite([EnginePlace("", None)]).planner, Allocated)  # a chain's: the allocator


def test_one_engine_is_a_list_of_one_place_planned_as_many_are(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """DOCKER_HOST's engine and `--host` engines go through one planning path: what differs is each place's (how
    its GPUs are read). One place named "": a plan with no hosts, GPUs from this machine's inventory; two --host
    places: each stage on a host, each host's GPUs from its own inventory file."""
    from typing import cast

    from pp_launch.adapters import inventory_file
    from pp_launch.adapters.docker_engine import Engine
    from pp_launch.app import hosts as across
    from pp_launch.app.docker_site import DockerSite
    from pp_launch.app.places import EnginePlace, HostPlace
    from pp_launch.app.request import GpuOptions, LaunchRequest
    from pp_launch.core.chain.plan import ChainRequest
    from pp_launch.core.gpu.inventory import Gpu, GpuInventory

    def inventory(name: str, n: int) -> str:
        gpus = tuple(Gpu(index=k, uuid=f"GPU-{name}{k}", memory_total_mib=81559, memory_used_mib=0) for k in range(n))
        path = tmp_path / f"{name}.json"
        inventory_file.save(GpuInventory(gpus=gpus), path)
        return str(path)

    here = inventory("here", 2)
    one = LaunchRequest(ChainRequest(stages=2), GpuOptions(inventory_path=here), run_id="r1", owner="me")
    site = DockerSite([EnginePlace("", None)])
    plan, _ = site.planner.plan(one, site.places(), {}, None)
    assert plan.hosts == () and [s.host for s in plan.stages] == ["", ""]
    assert sorted(g for s in plan.stages for g in s.gpus) == ["GPU-here0", "GPU-here1"]

    class Quiet:  # an engine elsewhere that holds no GPU (the I/O boundary: what planning asks of it)
        url = "tcp://127.0.0.1:2375"

        def containers(self, selector: list[str]) -> list[object]:
            return []

    quiet = cast(Engine, Quiet())
    places = [HostPlace.of(across.Host(name, quiet, f"id-{name}", "1.41")) for name in ("a", "b")]
    files = (("a", inventory("a", 1)), ("b", inventory("b", 1)))
    many = LaunchRequest(
        ChainRequest(stages=2), GpuOptions(host_inventories=files), hosts=("a", "b"), run_id="r1", owner="me",
        placement="spread",
    )  # fmt: skip
    site = DockerSite(places)
    plan, _ = site.planner.plan(many, site.places(), {}, None)
    assert plan.hosts == ("a", "b")
    assert [(s.host, s.gpus) for s in plan.stages] == [("a", ("GPU-a0",)), ("b", ("GPU-b0",))]
