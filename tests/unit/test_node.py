"""pp-gpu-node's configuration (docs/pp-gpu-node.md) and its stage in the foreground under the chain's scope, without
Docker."""

from __future__ import annotations

import signal

import pytest

from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.app import node
from pp_launch.app.node import NodeConfig, parse_gpus
from pp_launch.core import errors
from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.chain.ports import StageOutput, StopRequested
from pp_launch.core.chain.scope import ChainScope, QuietReporter
from pp_launch.core.container import MountSpec

from .fakes import FakeBackend, FakeClock, FakeInbox, StageScript

OWNER = "host:1:2"
GPU_CAP = [["gpu"]]

# What `docker create --gpus X` sends, read back from the engine (HostConfig.DeviceRequests) on this host.
DOCKER_CLI = {
    "all": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": GPU_CAP, "Options": {}}],
    "2": [{"Driver": "", "Count": 2, "DeviceIDs": None, "Capabilities": GPU_CAP, "Options": {}}],
    # the CLI needs '"device=0,2"' quoted; unquoted it sends Count 2 + DeviceIDs ["0"], which the engine refuses
    "device=0,2": [{"Driver": "", "Count": 0, "DeviceIDs": ["0", "2"], "Capabilities": GPU_CAP, "Options": {}}],
    "device=GPU-abc": [{"Driver": "", "Count": 0, "DeviceIDs": ["GPU-abc"], "Capabilities": GPU_CAP, "Options": {}}],
}


def spec_for(env: dict[str, str]):  # type: ignore[no-untyped-def]
    config = NodeConfig.from_env(env)
    return config, config.spec(env, OWNER, config.gpus)


def test_missing_stage_is_a_usage_error() -> None:
    with pytest.raises(errors.ConfigError) as exc:
        NodeConfig.from_env({})
    assert exc.value.exit_code == 2
    assert str(exc.value) == "STAGE is not set: set it to this stage's index (0, 1, ...)"


def test_defaults() -> None:
    config, spec = spec_for({"STAGE": "3", "HOME": "/home/u"})
    assert spec.name == "pp-stage-3" and spec.image == "swactor-pp-gpu:latest" and spec.network == "host"
    assert "DEV" not in spec.env  # PP_DEV unset: the image's own default (the old script forced CPU)
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "void" and spec.device_requests == ()
    assert spec.options.mounts == (
        MountSpec("bind", "/root/.cache/tinygrad", "/home/u/.cache/tinygrad/stage-3", ensure=True),
    )
    assert spec.entrypoint is None and config.grace == 10.0
    assert spec.labels["pp-launch.stage"] == "3" and spec.labels["pp-launch.owner"] == OWNER
    assert spec.labels["pp-launch.gpus"] == ""


@pytest.mark.parametrize(
    ("env", "check"),
    [
        ({"PP_IMAGE": "img:1"}, lambda s: s.image == "img:1"),
        ({"PP_CONTAINER_PREFIX": "pfx"}, lambda s: s.name == "pfx-0"),
        ({"PP_DEV": "CUDA"}, lambda s: s.env["DEV"] == "CUDA"),
        (
            {"PP_CACHE_DIR": "/c"},
            lambda s: s.options.mounts[0] == MountSpec("bind", "/root/.cache/tinygrad", "/c/stage-0", ensure=True),
        ),
        ({"PP_STAGE_NETWORK": "container:abc"}, lambda s: s.network == "container:abc"),
        ({"PP_DIAG_NETWORK": "bridge"}, lambda s: s.network == "bridge"),
        ({"PP_DIAG_NETWORK": "bridge", "PP_STAGE_NETWORK": "host"}, lambda s: s.network == "host"),
        (
            {"PP_MODEL_CACHE_DIR": "/m"},
            lambda s: (
                s.options.mounts[1] == MountSpec("bind", "/root/.cache/pp-pipeline", "/m/stage-0", ensure=True)
                and s.env["PP_MODEL_CACHE_DIR"] == "/root/.cache/pp-pipeline"
            ),
        ),
        ({"PP_ENTRYPOINT": "/usr/local/bin/pp-worker"}, lambda s: s.entrypoint == ("/usr/local/bin/pp-worker",)),
        ({"PP_FORWARD_ENV": "A,B", "A": "1", "C": "3"}, lambda s: s.env["A"] == "1" and "B" not in s.env),
        (
            {"MAX_TOKENS": "5", "SWACTOR_DIAG_Q": "q", "WORKER_SCRIPT": "w.py"},
            lambda s: (s.env["MAX_TOKENS"], s.env["SWACTOR_DIAG_Q"], s.env["WORKER_SCRIPT"]) == ("5", "q", "w.py"),
        ),
        (
            {"NUM_STAGES": "4", "PEER_DIRECT": "127.0.0.1:5", "FIRST_PEER_NODE_ID": "f" * 64},
            lambda s: (
                (s.env["NUM_STAGES"], s.env["PEER_DIRECT"]) == ("4", "127.0.0.1:5") and "FIRST_PEER_NODE_ID" in s.env
            ),
        ),
        ({"UNRELATED": "x"}, lambda s: "UNRELATED" not in s.env),
        (
            {"PP_GPUS": "device=GPU-a,GPU-b"},
            lambda s: s.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and s.labels["pp-launch.gpus"] == "GPU-a,GPU-b",
        ),
        ({"PP_GPUS": "2"}, lambda s: "NVIDIA_VISIBLE_DEVICES" not in s.env),  # the engine's GPU driver sets it
        ({"PP_GPUS": "all"}, lambda s: s.env["NVIDIA_VISIBLE_DEVICES"] == "all"),
    ],
)
def test_each_variable(env: dict[str, str], check) -> None:  # type: ignore[no-untyped-def]
    _, spec = spec_for({"STAGE": "0", "HOME": "/h", **env})
    assert check(spec)


@pytest.mark.parametrize("value", sorted(DOCKER_CLI))
def test_pp_gpus_maps_as_the_docker_cli_does(value: str) -> None:
    assert [dict(r) for r in parse_gpus(value).device_requests] == DOCKER_CLI[value]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STAGE": "x"}, "STAGE='x' is not a stage index"),
        ({"STAGE": "0", "PP_STOP_GRACE": "soon"}, "PP_STOP_GRACE='soon' is not a number of seconds"),
        ({"STAGE": "0", "PP_GPUS": "some"}, "PP_GPUS='some' is not understood"),
    ],
)
def test_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(errors.ConfigError, match=message.replace("(", r"\(")):
        NodeConfig.from_env(env)


class Foreground:
    """One stage on a fake backend, run in the foreground of the chain's scope (as pp-gpu-node's run is) on a fake
    clock; what it wrote kept."""

    def __init__(
        self, scripts: dict[int, StageScript], grace: float = 10.0, kill_wait: float = 15.0, stage: int = 0
    ) -> None:
        self.clock = FakeClock()
        self.inbox = FakeInbox(self.clock)
        self.backend = FakeBackend(scripts=scripts, inbox=self.inbox)
        self.out: list[tuple[str, bytes]] = []
        _, spec = spec_for({"STAGE": str(stage)})
        self.plan = ChainPlan(run_id="r1", stages=(spec,), grace=grace)
        self.ref = spec.name  # the fake engine's id for it
        self.kill_wait = kill_wait

    def run(self):  # type: ignore[no-untyped-def]
        write = lambda stream, data: self.out.append((stream, data))  # noqa: E731
        runtime = ThreadRuntime(self.clock)
        scope = ChainScope(
            self.plan, self.backend, self.inbox, QuietReporter(), runtime, kill_wait=self.kill_wait, passthrough=write
        )
        return scope.run()


def test_output_passes_through_and_the_exit_code_is_the_containers() -> None:
    fg = Foreground({0: StageScript(exit_at=(1001.0, 3))})
    outcome = fg.run()
    assert outcome.exit_code == 3 and outcome.orphans == ()
    assert fg.out[0] == ("stdout", b"stage 0 booting")


def test_a_stage_of_any_index_is_supervised_by_its_index() -> None:
    """pp-gpu-node runs stage STAGE alone: its events name that index, not a position in a chain."""
    fg = Foreground({2: StageScript(exit_at=(1001.0, 5))}, stage=2)
    assert fg.run().exit_code == 5 and fg.out[0] == ("stdout", b"stage 2 booting")


def test_output_is_passed_through_as_it_comes_and_never_read_as_an_announcement() -> None:
    """A malformed announcement line ends a chain; in the foreground it is only bytes to pass on."""
    fg = Foreground({0: StageScript(exit_at=(1002.0, 0))})
    fg.inbox.at(1001.0, StageOutput(0, "stdout", b"PP_GPU_NODE_ADDR not-a-node-id \x01"))
    outcome = fg.run()
    assert outcome.exit_code == 0 and ("stdout", b"PP_GPU_NODE_ADDR not-a-node-id \x01") in fg.out


def test_a_forwarded_signal_gives_128_plus_n_once_the_container_is_gone() -> None:
    fg = Foreground({0: StageScript()})
    fg.inbox.at(1001.0, StopRequested(signal.SIGHUP))
    assert fg.run().exit_code == 129
    assert ("signal", 0, signal.SIGHUP) in fg.backend.calls and not [c for c in fg.backend.calls if c[0] == "kill"]


def test_a_second_signal_is_passed_on_too_and_the_grace_still_runs() -> None:
    """As `docker run` does: every signal reaches the stage; the first one's grace is not cut short."""
    fg = Foreground({0: StageScript(ignore_sigterm=True)}, grace=4.0)
    fg.inbox.at(1001.0, StopRequested(signal.SIGTERM))
    fg.inbox.at(1002.0, StopRequested(signal.SIGINT))
    assert fg.run().exit_code == 143  # the first stop's
    sent = [c for c in fg.backend.calls if c[0] in ("signal", "kill")]
    assert sent == [("signal", 0, signal.SIGTERM), ("signal", 0, signal.SIGINT), ("kill", 0)]
    assert 1005.0 <= fg.clock.now < 1006.5  # killed after the whole grace, not at the second signal


@pytest.mark.parametrize("refuses", ["create", "start"])
def test_an_engine_that_refuses_the_stage_is_the_runs_error_and_nothing_is_left(refuses: str) -> None:
    """As `docker run` reports the engine's refusal (pp-gpu-node exits 125 for it): the error is raised, once a
    stage created but not started is removed by its id."""
    fg = Foreground({0: StageScript(fail_create=refuses == "create", fail_start=refuses == "start")})
    with pytest.raises(
        errors.PpLaunchError, match="create refused" if refuses == "create" else "could not select device driver"
    ):
        fg.run()
    created = ("create", 0) in fg.backend.calls and refuses == "start"
    assert fg.backend.existing == {} and (("remove", fg.ref) in fg.backend.calls) == created, fg.backend.calls


def test_a_stage_ignoring_the_signal_is_killed_after_the_grace() -> None:
    fg = Foreground({0: StageScript(ignore_sigterm=True)}, grace=2.0)
    fg.inbox.at(1001.0, StopRequested(signal.SIGTERM))
    assert fg.run().exit_code == 143
    assert ("kill", 0) in fg.backend.calls
    assert 1003.0 <= fg.clock.now < 1004.5


@pytest.mark.parametrize("stage", [None, "0"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_pp_gpu_node_help_prints_its_usage_and_starts_nothing_stage_set_or_not(
    flag: str, stage: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pp-gpu-node --help` with STAGE set ran a container with `--help` as its command; now it is help either way
    (DOCKER_HOST names no engine here: a run would fail, help never asks it)."""
    from pp_launch.cli import node_cmd

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    if stage is None:
        monkeypatch.delenv("STAGE", raising=False)
    else:
        monkeypatch.setenv("STAGE", stage)
    assert node_cmd._run_node((flag,)) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pp-gpu-node") and "PP_STOP_GRACE" in out and "-- --help" in out


def test_after_a_double_dash_help_is_the_containers_command() -> None:
    from pp_launch.app.node import NodeConfig
    from pp_launch.cli import node_cmd

    assert node_cmd._env_files(("--", "--help")) == ((), ("--help",))
    assert NodeConfig.from_env({"STAGE": "0"}, ("--help",)).command == ("--help",)


@pytest.mark.parametrize(
    ("value", "names"), [("FOO,BAR", ("FOO", "BAR")), ("FOO BAR", ("FOO", "BAR")), (" FOO, BAR ,", ("FOO", "BAR"))]
)
def test_pp_forward_env_takes_commas_or_spaces(value: str, names: tuple[str, ...]) -> None:
    from pp_launch.app.node import NodeConfig

    assert NodeConfig.from_env({"STAGE": "0", "PP_FORWARD_ENV": value}).forward_extra == names


def test_pp_forward_env_with_something_not_a_name_is_exit_2() -> None:
    from pp_launch.app.node import NodeConfig

    with pytest.raises(errors.ConfigError, match="PP_FORWARD_ENV: 'A=1' is not a variable name"):
        NodeConfig.from_env({"STAGE": "0", "PP_FORWARD_ENV": "OK,A=1"})


def test_a_stage_the_engine_never_confirms_gone_after_sigkill_is_removed_by_force() -> None:
    """The old supervisor waited without end after its SIGKILL; the one teardown gives up after kill_wait and
    removes the container by its id."""
    fg = Foreground({0: StageScript(ignore_sigterm=True)}, grace=2.0, kill_wait=5.0)
    fg.backend.kill = lambda ref: fg.backend.calls.append(("kill (no effect)", ref))  # type: ignore[method-assign]
    fg.inbox.at(1001.0, StopRequested(signal.SIGTERM))
    outcome = fg.run()
    assert outcome.exit_code == 143 and outcome.orphans == () and ("remove", fg.ref) in fg.backend.calls
    assert 1008.0 <= fg.clock.now < 1010.0  # signal at 1001, grace 2, kill_wait 5: bounded
    assert ("close",) in fg.backend.calls  # its threads are joined on every way out


def test_a_stage_the_engine_can_neither_stop_nor_remove_is_exit_1_naming_it() -> None:
    fg = Foreground({0: StageScript(ignore_sigterm=True)}, grace=2.0, kill_wait=5.0)
    fg.backend.kill = lambda ref: fg.backend.calls.append(("kill (no effect)", ref))  # type: ignore[method-assign]
    fg.backend.stuck.add(fg.ref)
    fg.inbox.at(1001.0, StopRequested(signal.SIGTERM))
    outcome = fg.run()
    assert outcome.exit_code == errors.EXIT_FAILURE and outcome.orphans == (fg.ref,), outcome
    assert 1008.0 <= fg.clock.now < 1010.0  # signal at 1001, grace 2, kill_wait 5: bounded
    assert ("close",) in fg.backend.calls  # its threads are joined on every way out


def test_a_lost_engine_during_the_stop_is_exit_1_saying_so_not_a_hang() -> None:
    fg = Foreground({0: StageScript()})
    fg.inbox.at(1001.0, StopRequested(signal.SIGTERM))
    original = fg.backend.signal

    def lose(r: str, signum: int) -> None:
        fg.backend.lost = True
        original(r, signum)

    fg.backend.signal = lose  # type: ignore[method-assign]
    outcome = fg.run()
    assert outcome.exit_code == errors.EXIT_FAILURE and "may still be there" in outcome.message, outcome.message


def test_what_went_wrong_besides_the_stages_own_exit_is_said() -> None:
    said: list[str] = []
    from pp_launch.core.chain.scope import ChainOutcome

    assert node._exit_code(ChainOutcome(3, "completed"), said.append) == 3
    assert node._exit_code(ChainOutcome(143, "signal", "stopped by SIGTERM"), said.append) == 143
    assert said == []
    assert node._exit_code(ChainOutcome(1, "signal", "stopped by SIGTERM; teardown errors: x"), said.append) == 1
    assert said == ["error: stopped by SIGTERM; teardown errors: x"]
    with pytest.raises(errors.EngineLost, match="lost track"):  # exit 125, as docker run whose engine went away
        node._exit_code(ChainOutcome(1, "stage_failed", "lost track"), said.append)


@pytest.mark.parametrize("value", ["auto", "all", "2", "device=0,2", "device=GPU-abc", "0,3", "none", "x"])
def test_pp_gpus_and_chain_gpus_are_read_by_one_reader(value: str) -> None:
    """One reader (core.gpu.requests.read_gpus) for both: a count means N GPUs for one container in each; only
    what each does with it differs (the engine picks for PP_GPUS, as docker run does; our allocator for chain)."""
    from pp_launch.app.gpus import parse_gpus_flag
    from pp_launch.core.gpu.requests import read_gpus

    node_reads = read_gpus(value, bare_lists=False)
    if node_reads is None or node_reads.kind == "none":
        with pytest.raises(errors.ConfigError, match="PP_GPUS"):
            parse_gpus(value)
    else:
        request = parse_gpus(value)
        if node_reads.kind == "count":
            assert request.device_requests[0]["Count"] == node_reads.count
            assert parse_gpus_flag(value, 1) == ("auto", node_reads.count)  # the same count, per container
    chain_reads = read_gpus(value)
    if chain_reads is None:
        with pytest.raises(errors.ConfigError, match="--gpus"):
            parse_gpus_flag(value, 1)


def test_a_pp_image_that_is_no_image_reference_is_exit_2_before_the_engine_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pp_launch.app.request import Hooks

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # asked, it would say it is not there
    with pytest.raises(errors.ConfigError, match="PP_IMAGE 'Bad Image' is not a valid image reference") as exc:
        node.run_node({"STAGE": "0", "PP_IMAGE": "Bad Image"}, (), Hooks(), lambda signum: None)
    assert exc.value.exit_code == 2


def test_pp_gpus_asking_for_more_than_the_host_has_is_said_as_a_chain_says_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """PP_GPUS=99 on a 4-GPU host was the runtime's raw error; now "not enough GPUs", before the engine (the error's
    own code is a configuration's; pp-gpu-node exits 125 with it, as docker run)."""
    from pathlib import Path

    from pp_launch.app.node import _check_count

    monkeypatch.setenv("PP_LAUNCH_GPU_INVENTORY", str(Path(__file__).parents[1] / "data" / "plain-4gpu.json"))
    with pytest.raises(errors.NotEnoughGpus, match=r"PP_GPUS=99 asks for 99, and this host has 4") as caught:
        _check_count("99")
    assert caught.value.exit_code == 2
    _check_count("4")  # as many as there are: the engine's to attach
    _check_count("all")
    _check_count("device=0,2")
    with pytest.raises(errors.NotEnoughGpus, match=r"PP_GPUS=device=2,9 names 9, which this host does not have"):
        _check_count("device=2,9")


@pytest.mark.parametrize("asked", ["99", "device=9", "device=GPU-nope"])
def test_pp_gpu_node_says_gpus_it_cannot_attach_in_one_line_and_exits_125_as_docker_run(asked: str) -> None:
    """`docker run --gpus 99` exits 125: so does its drop-in, for every PP_GPUS form, before the engine is asked."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    inventory = str(Path(__file__).parents[1] / "data" / "plain-4gpu.json")
    env = {**os.environ, "STAGE": "0", "PP_GPUS": asked, "PP_LAUNCH_GPU_INVENTORY": inventory,
           "DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pp_launch", "node"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 125, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pp-gpu-node: error: ") and f"PP_GPUS={asked}" in lines[0], lines
