"""One launch: the request checks every rule between its options when it is made, and every way in
(the CLI, the testing kit, compose) goes through it and through `launch()` / `plan_launch()`.

No engine: the rules are checked before anything is reached, and `launch` is replaced at the CLI's boundary
only to see what the CLI asks of it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pp_launch.app import launch
from pp_launch.app.launch import GpuOptions, LaunchRequest
from pp_launch.cli.main import load_all, main
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainRequest

PKG = Path(__file__).resolve().parents[2] / "launcher" / "pp_launch"
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "PP_LAUNCH_GPU_INVENTORY": ""}

# Each rule broken alone, with the words its one message must carry.
BROKEN: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({"handoff": "stdin", "parallel": False}, {}, "--handoff stdin needs --bring-up parallel"),
    ({"handoff": "stdin"}, {"gpu_node": "/bin/true"}, "--handoff stdin and --gpu-node do not go together"),
    ({}, {"detach": True, "gpu_node": "/bin/true"}, "--detach and --gpu-node do not go together"),
    ({}, {"stages_per_host": 2}, "--stages-per-host needs --host"),
    ({}, {"hosts": ("ctx-a",), "gpu_node": "/bin/true"}, "--host and --gpu-node do not go together"),
    ({}, {"placement": "scatter"}, "--placement 'scatter'"),
    ({}, {"gpu": GpuOptions(attach="magic")}, "--gpu-attach 'magic'"),
    ({}, {"hosts": ("a", "b"), "gpu": GpuOptions(host_inventories=(("c", "f.json"),))}, "c is not one of the hosts"),
    ({}, {"gpu": GpuOptions(host_inventories=(("c", "f.json"),))}, "this chain has no --host"),
    ({}, {"gpu": GpuOptions(mode="foo")}, "--gpus 'foo' is not understood"),
    ({}, {"gpu": GpuOptions(mode="2", per_stage=3)}, "disagree"),
    ({}, {"hosts": ("a", "a")}, "named twice"),
    ({"image": "Not An Image"}, {}, "not a valid image reference"),
    ({"name_prefix": "-x"}, {}, "not a valid container name prefix"),
    ({}, {"ray": " "}, "--ray ADDRESS is empty"),
    ({}, {"ray": "auto", "hosts": ("a",)}, "--ray and --host do not go together"),
    ({}, {"ray": "auto", "gpu_node": "/bin/true"}, "--ray and --gpu-node do not go together"),
    ({}, {"ray": "auto", "gpu": GpuOptions(mode="device=0,1")}, "Ray grants the GPUs"),
    ({}, {"ray": "auto", "gpu": GpuOptions(mode="all")}, "Ray grants the GPUs"),
    ({}, {"ray": "auto", "gpu": GpuOptions(host_inventories=(("a", "f.json"),))}, "each node reads its own GPUs"),
    ({}, {"ray": "auto", "ray_timeout": 0}, "--ray-timeout must be positive"),
]


@pytest.mark.parametrize(("chain", "rest", "words"), BROKEN, ids=[w for _, _, w in BROKEN])
def test_each_rule_broken_alone_is_refused_when_the_request_is_made(chain: dict, rest: dict, words: str) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        LaunchRequest(ChainRequest(**chain), **rest)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)  # one message, one line
    assert caught.value.exit_code == errors.EXIT_USAGE


def test_a_ray_request_takes_a_count_none_and_stages_per_host() -> None:
    for gpu in (GpuOptions(mode="2"), GpuOptions(mode="none"), GpuOptions(per_stage=2)):
        assert LaunchRequest(ChainRequest(stages=4), gpu, ray="auto", stages_per_host=2).ray == "auto"


def test_a_request_that_keeps_every_rule_is_made_and_its_hosts_are_read_once() -> None:
    request = LaunchRequest(ChainRequest(stages=4, handoff="stdin"), hosts=("a,b",), stages_per_host=2)
    assert request.hosts == ("a", "b")


def test_the_testing_kit_keeps_the_same_rules_before_it_reaches_any_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """pp_launch.testing.Chain used to skip the CLI's rules; it builds the same request now."""
    from pp_launch.testing import kit

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with (
        pytest.raises(errors.UsageError, match="--handoff stdin needs --bring-up parallel"),
        kit.Chain(handoff="stdin", bring_up="in-turn"),
    ):
        pass


def test_the_cli_parses_calls_launch_once_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command body parses, calls, reports: the chain command hands launch() the request its flags make."""
    load_all()
    seen: list[LaunchRequest] = []

    def fake_launch(request: LaunchRequest, hooks: launch.Hooks | None = None, environ: Any = None) -> Any:
        seen.append(request)
        raise errors.NotEnoughGpus("stand-in: nothing was started")

    monkeypatch.setattr("pp_launch.app.launch.launch", fake_launch)  # what the chain command calls when it runs
    result = CliRunner().invoke(
        main, ["chain", "--stages", "3", "--handoff", "stdin", "--gpus", "none", "--no-sweep", "-d"], env=NO_ENGINE
    )
    assert result.exit_code == 2 and "stand-in" in result.output
    (request,) = seen
    assert request.chain.stages == 3 and request.chain.handoff == "stdin" and request.detach
    assert request.gpu.mode == "none"


def test_a_broken_rule_on_the_command_line_is_one_line_and_exit_2() -> None:
    load_all()
    result = CliRunner().invoke(main, ["chain", "--handoff", "stdin", "--bring-up", "in-turn"], env=NO_ENGINE)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "pp-launch: error: --handoff stdin needs --bring-up parallel: it starts every worker at once",
        "pp-launch: hint: 'pp-launch chain --help' lists its options",
    ]


def calls(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            found.add(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
    return found


@pytest.mark.parametrize("way_in", ["cli/chain_cmd.py", "cli/compose_cmd.py", "testing/kit.py"])
def test_every_way_in_builds_a_launch_request_and_none_plans_or_runs_by_itself(way_in: str) -> None:
    found = calls(PKG / way_in)
    assert "LaunchRequest" in found
    assert {"launch", "plan_launch"} & found
    forbidden = {"select", "ChainScope", "run_chain", "plan_chain", "build_plan"}
    if way_in == "testing/kit.py":
        forbidden.discard("build_plan")  # its StageContainer is one stage, not a chain: it builds that spec itself
    assert not forbidden & found
