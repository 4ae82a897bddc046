"""pp-gpu-node's configuration (docs/pp-gpu-node.md) and its supervisor, without Docker."""

from __future__ import annotations

import signal

import pytest

from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.app.node import NodeConfig, NodeSupervisor, parse_gpus
from pp_launch.core import errors
from pp_launch.core.chain.plan import Mount
from pp_launch.core.chain.ports import StopRequested

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
    assert spec.mounts == (Mount("/home/u/.cache/tinygrad/stage-3", "/root/.cache/tinygrad"),)
    assert spec.entrypoint is None and config.grace == 10.0
    assert spec.labels["pp-launch.stage"] == "3" and spec.labels["pp-launch.owner"] == OWNER
    assert spec.labels["pp-launch.gpus"] == ""


@pytest.mark.parametrize(
    ("env", "check"),
    [
        ({"PP_IMAGE": "img:1"}, lambda s: s.image == "img:1"),
        ({"PP_CONTAINER_PREFIX": "pfx"}, lambda s: s.name == "pfx-0"),
        ({"PP_DEV": "CUDA"}, lambda s: s.env["DEV"] == "CUDA"),
        ({"PP_CACHE_DIR": "/c"}, lambda s: s.mounts[0] == Mount("/c/stage-0", "/root/.cache/tinygrad")),
        ({"PP_STAGE_NETWORK": "container:abc"}, lambda s: s.network == "container:abc"),
        ({"PP_DIAG_NETWORK": "bridge"}, lambda s: s.network == "bridge"),
        ({"PP_DIAG_NETWORK": "bridge", "PP_STAGE_NETWORK": "host"}, lambda s: s.network == "host"),
        (
            {"PP_MODEL_CACHE_DIR": "/m"},
            lambda s: (
                s.mounts[1] == Mount("/m/stage-0", "/root/.cache/pp-pipeline")
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


def supervisor(scripts: dict[int, StageScript], grace: float = 10.0):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    inbox = FakeInbox(clock)
    backend = FakeBackend(scripts=scripts, inbox=inbox)
    out: list[tuple[str, bytes]] = []
    sup = NodeSupervisor(backend, inbox, lambda stream, data: out.append((stream, data)), grace, ThreadRuntime(clock))
    return sup, backend, inbox, clock, out


def _created(backend: FakeBackend) -> str:
    _, spec = spec_for({"STAGE": "0"})
    return backend.create(spec, spec.env)


def test_output_passes_through_and_the_exit_code_is_the_containers() -> None:
    sup, backend, _, _, out = supervisor({0: StageScript(exit_at=(1001.0, 3))})
    assert sup.run(_created(backend), 0) == 3
    assert out[0] == ("stdout", b"stage 0 booting")


def test_a_forwarded_signal_gives_128_plus_n_once_the_container_is_gone() -> None:
    sup, backend, inbox, _, _ = supervisor({0: StageScript()})
    inbox.at(1001.0, StopRequested(signal.SIGHUP))
    assert sup.run(_created(backend), 0) == 129
    assert ("signal", 0, signal.SIGHUP) in backend.calls and not [c for c in backend.calls if c[0] == "kill"]


def test_a_stage_ignoring_the_signal_is_killed_after_the_grace() -> None:
    sup, backend, inbox, clock, _ = supervisor({0: StageScript(ignore_sigterm=True)}, grace=2.0)
    inbox.at(1001.0, StopRequested(signal.SIGTERM))
    assert sup.run(_created(backend), 0) == 143
    assert ("kill", 0) in backend.calls
    assert 1003.0 <= clock.now < 1004.5


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_pp_gpu_node_help_without_stage_prints_its_usage(
    flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pp_launch.cli import node_cmd

    monkeypatch.delenv("STAGE", raising=False)
    assert node_cmd._run_node((flag,)) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pp-gpu-node") and "PP_STOP_GRACE" in out and "STAGE" in out


def test_with_stage_set_help_is_the_containers_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from pp_launch.app.node import NodeConfig

    monkeypatch.setenv("STAGE", "0")
    assert NodeConfig.from_env({"STAGE": "0"}, ("--help",)).command == ("--help",)


def test_a_stage_the_engine_never_confirms_gone_after_sigkill_ends_the_wait_bounded() -> None:
    """The old supervisor waited without end after its SIGKILL; the one teardown gives up after kill_wait and
    says what may be left."""
    from pp_launch.core.chain.teardown import TeardownFailed

    sup, backend, inbox, clock, _ = supervisor({0: StageScript(ignore_sigterm=True)}, grace=2.0)
    sup.kill_wait = 5.0
    backend.kill = lambda ref: backend.calls.append(("kill (no effect)", ref))  # type: ignore[method-assign]
    inbox.at(1001.0, StopRequested(signal.SIGTERM))
    ref = _created(backend)
    with pytest.raises(TeardownFailed, match=f"the stage container {ref[:12]} was not confirmed gone") as caught:
        sup.run(ref, 0)
    assert caught.value.left == (ref,)
    assert 1008.0 <= clock.now < 1010.0  # signal at 1001, grace 2, kill_wait 5: bounded
    assert ("close",) in backend.calls  # its threads are joined on every way out


def test_a_lost_engine_during_the_stop_is_a_typed_teardown_error_not_a_hang() -> None:
    sup, backend, inbox, _, _ = supervisor({0: StageScript()})
    inbox.at(1001.0, StopRequested(signal.SIGTERM))
    ref = _created(backend)
    original = backend.signal

    def lose(r: str, signum: int) -> None:
        backend.lost = True
        original(r, signum)

    backend.signal = lose  # type: ignore[method-assign]
    from pp_launch.core.chain.teardown import TeardownFailed

    with pytest.raises(TeardownFailed) as caught:
        sup.run(ref, 0)
    (failure,) = caught.value.failures
    assert isinstance(failure.error, errors.EngineLost) and failure.what.startswith("SIGTERM to the stage container")


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
