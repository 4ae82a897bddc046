"""pp-gpu-node on the real engine: its environment (docs/pp-gpu-node.md) as the engine sees it, exit codes,
byte-for-byte output, the old wrapper's teardown loop, SIGKILL at any moment, the stale-name rule, and
chain --gpu-node."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pp_launch.adapters import identity
from pp_launch.adapters.docker_engine import DockerStageBackend
from pp_launch.app.node import NodeConfig
from pp_launch.core import labels

from ..helpers import Launcher, Relay, spawn, unique, wait_until, watchdogs

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
SHIM = str(ROOT / "wrappers" / "docker-gpu-node.sh")
BASE = "pp-launch/base:bookworm"
HOLD = {"STUB_MODE": "hold", "PP_FORWARD_ENV": "STUB_MODE,STUB_IGNORE_SIGTERM,STUB_ANNOUNCE_DELAY"}


def node_env(prefix: str, image: str, **extra: str) -> dict[str, str]:
    # The real console scripts first on PATH (the shim execs pp-gpu-node; a pyenv shim would fork instead).
    path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    return {"STAGE": "0", "PP_IMAGE": image, "PP_CONTAINER_PREFIX": prefix, "PATH": path, **extra}


def containers_named(engine, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.name for c in engine.containers([labels.RUN]) if c.name == name]


def wait_running(engine, name: str, timeout: float = 30) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert wait_until(lambda: (i := engine.inspect(name)) is not None and i["State"]["Running"], timeout), name
    return engine.inspect(name)  # type: ignore[no-any-return]


def test_environment_rows_as_the_engine_sees_them(engine, stub_image, tmp_path: Path) -> None:
    prefix = unique("row")
    env = node_env(
        prefix,
        stub_image,
        **HOLD,
        PP_DEV="CUDA",
        PP_CACHE_DIR=str(tmp_path / "cache"),
        PP_MODEL_CACHE_DIR=str(tmp_path / "models"),
        PP_ENTRYPOINT="/usr/local/bin/pp-worker",
        MAX_TOKENS="7",
        SWACTOR_DIAG_LEVEL="2",
        UNRELATED="no",
        STAGE="2",
        NUM_STAGES="3",
    )
    node = Launcher("node", env=env)
    info = wait_running(engine, f"{prefix}-2")
    cfg, host = info["Config"], info["HostConfig"]
    envs = dict(e.split("=", 1) for e in cfg["Env"])
    assert envs["DEV"] == "CUDA" and envs["STAGE"] == "2" and envs["NUM_STAGES"] == "3"
    assert envs["MAX_TOKENS"] == "7" and envs["SWACTOR_DIAG_LEVEL"] == "2" and "UNRELATED" not in envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "void" and envs["PP_MODEL_CACHE_DIR"] == "/root/.cache/pp-pipeline"
    assert cfg["Entrypoint"] == ["/usr/local/bin/pp-worker"]
    assert host["NetworkMode"] == "host" and host["Init"] is True and host["AutoRemove"] is True
    # on an engine of this machine the folders are made here, as the user, and bound as --mount type=bind binds
    # (and the run's record, read-only: docs/chain.md, "The record")
    run = cfg["Labels"][labels.RUN]
    mounts = sorted((m["Type"], m["Source"], m["Target"], m.get("ReadOnly", False)) for m in host["Mounts"])
    assert mounts[:2] == [
        ("bind", f"{tmp_path}/cache/stage-2", "/root/.cache/tinygrad", False),
        ("bind", f"{tmp_path}/models/stage-2", "/root/.cache/pp-pipeline", False),
    ]
    assert [m[0] for m in mounts[2:]] == ["volume"] and mounts[2][1].startswith(f"pp-launch-record-{run}-")
    assert mounts[2][2:] == ("/run/pp-launch-record", True)
    assert (tmp_path / "cache" / "stage-2").is_dir()
    assert cfg["Labels"][labels.STAGE] == "2" and cfg["Labels"][labels.GPUS] == ""
    assert cfg["Labels"][labels.OWNER].split(":")[1] == str(node.proc.pid)
    node.signal(signal.SIGTERM)
    assert node.wait(30) == 143
    assert containers_named(engine, f"{prefix}-2") == []


def test_default_image_name_and_a_missing_image(engine, stub_image) -> None:
    missing = Launcher("node", env=node_env(unique("m"), "pp-launch/absent:latest"))
    assert missing.wait(30) == 125  # as `docker run` when the engine refuses
    assert "image pp-launch/absent:latest (PP_IMAGE) is not present" in missing.stderr_text()
    env = node_env(unique("d"), "")
    del env["PP_IMAGE"]
    engine.api.tag(stub_image, "swactor-pp-gpu", "latest")  # the old default name, for this test only
    try:
        node = Launcher("node", env={**env, "NUM_STAGES": "1"})
        assert node.wait(60) == 0
        assert any("match=true" in line for line in node.stdout_lines)
    finally:
        engine.remove_image("swactor-pp-gpu:latest")


@pytest.mark.parametrize("value", ["all", "2", "device=0,2", "device=GPU-aaaaaaaa-0000-4000-8000-000000000001"])
def test_gpu_requests_through_the_engine(engine, stub_image, value: str) -> None:
    """Created (not started: this host has no GPU) and inspected: the engine holds the docker CLI's request."""
    env = {"STAGE": "0", "PP_GPUS": value, "PP_CONTAINER_PREFIX": unique("gpu")}
    config = NodeConfig.from_env(env)
    spec = config.spec(env, identity.current_owner().label(), config.gpus)
    spec = spec.__class__(**{**spec.__dict__, "image": stub_image})
    ref = DockerStageBackend(engine).create(spec, spec.env)
    try:
        cli = subprocess.run(
            ["docker", "create", "--gpus", value if "," not in value else f'"{value}"', stub_image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            ours = engine.inspect(ref)["HostConfig"]["DeviceRequests"]
            assert ours == engine.inspect(cli)["HostConfig"]["DeviceRequests"]
        finally:
            engine.remove(cli)
    finally:
        engine.remove(ref)


def test_pp_gpus_on_an_engine_without_the_toolkit_is_exit_125_with_pp_gpu_nodes_own_fix(engine, stub_image) -> None:
    """This engine has no NVIDIA device driver: PP_GPUS cannot be attached. The message suggests what pp-gpu-node
    takes (not chain's --gpu-attach), and the exit is 125, as `docker run --gpus` there; nothing is left."""
    prefix = unique("tk")
    gpu_host = str(Path(__file__).resolve().parents[1] / "data" / "plain-4gpu.json")  # NVML sees 4 GPUs here
    node = Launcher("node", env=node_env(prefix, stub_image, PP_GPUS="all", PP_LAUNCH_GPU_INVENTORY=gpu_host))
    assert node.wait(60) == 125
    err = node.stderr_text()
    assert "the engine cannot attach GPUs" in err and "leave PP_GPUS unset" in err and "--gpu-attach" not in err
    assert containers_named(engine, f"{prefix}-0") == []
    # a host without any GPU (no NVML): the reason is that, not the toolkit
    bare = Launcher("node", env=node_env(prefix, stub_image, PP_GPUS="99", PP_LAUNCH_GPU_INVENTORY=""))
    assert bare.wait(60) == 125
    err = bare.stderr_text()
    assert "PP_GPUS=99 asks for GPUs, and this host has none that NVML can see" in err, err
    assert "toolkit" not in err and "leave PP_GPUS unset" in err
    assert containers_named(engine, f"{prefix}-0") == []


@pytest.mark.parametrize("code", [0, 3, 137])
def test_exit_codes_propagate(engine, stub_image, code: int) -> None:
    script = "kill -9 $$" if code == 137 else f"exit {code}"
    node = Launcher("node", "-c", script, env=node_env(unique("x"), BASE, PP_ENTRYPOINT="/bin/sh"))
    assert node.wait(30) == code


def test_stdout_passes_through_byte_for_byte(engine, stub_image) -> None:
    program = (
        "import sys; o = sys.stdout.buffer; o.write(b'PP_GPU_NODE_ADDR ' + b'a' * 64 + b' 127.0.0.1:1\\n'); "
        "o.write(b'x' * 100000 + b'\\n'); o.write(bytes(range(256))); "
        "o.write(b'\\r\\nno newline at the end'); o.flush(); "
        "sys.stderr.write('to stderr\\n')"
    )
    expected = (
        b"PP_GPU_NODE_ADDR "
        + b"a" * 64
        + b" 127.0.0.1:1\n"
        + b"x" * 100000
        + b"\n"
        + bytes(range(256))
        + b"\r\nno newline at the end"
    )
    env = {**os.environ, **node_env(unique("b"), BASE, PP_ENTRYPOINT="python3")}
    proc = subprocess.run(
        [sys.executable, "-m", "pp_launch", "node", "-c", program], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected
    assert proc.stderr == b"to stderr\n"


def _seed_teardown(children: list[subprocess.Popen[bytes]], grace: float = 2.0) -> None:
    """Swactor's orchestrator's loop: SIGTERM every child, wait up to the grace for each, SIGKILL each."""
    for child in children:
        child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@pytest.mark.parametrize("entry", ["pp-gpu-node", "shim"])
def test_seed_teardown_loop_leaves_nothing_with_sigterm_ignoring_stages(engine, stub_image, entry: str) -> None:
    prefix = unique("seed")
    children = []
    for k in range(3):
        env = {**os.environ, **node_env(prefix, stub_image, **HOLD, STUB_IGNORE_SIGTERM="1", STAGE=str(k))}
        argv = [SHIM] if entry == "shim" else [sys.executable, "-m", "pp_launch", "node"]
        children.append(spawn(argv, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for k in range(3):
        info = wait_running(engine, f"{prefix}-{k}")
        if entry == "shim":
            assert info["Config"]["Entrypoint"] == ["/usr/local/bin/pp-worker"]
    _seed_teardown(children)
    assert wait_until(lambda: not any(c.name.startswith(prefix) for c in engine.containers([labels.RUN])), 10)


@pytest.mark.full  # 6 cases; the quick tier kills launchers in test_chaos
@pytest.mark.parametrize("moment", ["before_announcement", "after_announcement", "while_forwarding_sigterm"])
@pytest.mark.parametrize("image", ["stub", "any"])
def test_sigkill_of_pp_gpu_node_leaves_nothing_within_10s(engine, stub_image, moment: str, image: str) -> None:
    """`stub` honours the stdin lifeline; `any` is a shell that ignores SIGTERM and never reads stdin, so only
    the watchdog can remove it."""
    prefix = unique("k9")
    delay = "3" if moment == "before_announcement" else "0"
    if image == "stub":
        node = Launcher(
            "node", env=node_env(prefix, stub_image, **HOLD, STUB_IGNORE_SIGTERM="1", STUB_ANNOUNCE_DELAY=delay)
        )
    else:
        script = f'trap "" TERM; sleep {delay}; echo PP_GPU_NODE_ADDR {"b" * 64} 127.0.0.1:9; exec sleep 1000'
        node = Launcher("node", "-c", script, env=node_env(prefix, BASE, PP_ENTRYPOINT="/bin/sh"))
    wait_running(engine, f"{prefix}-0")
    if moment != "before_announcement":
        assert wait_until(lambda: any("PP_GPU_NODE_ADDR" in line for line in node.stdout_lines), 20)
    if moment == "while_forwarding_sigterm":
        since = int(time.time()) - 1
        node.signal(signal.SIGTERM)
        assert wait_until(lambda: _got_sigterm(engine, f"{prefix}-0", since), 20)  # forwarded through the engine
        assert node.proc.poll() is None  # still inside its 10 s grace
    node.signal(signal.SIGKILL)
    node.wait(10)
    assert wait_until(lambda: containers_named(engine, f"{prefix}-0") == [], 10)


def _got_sigterm(engine, name: str, since: int) -> bool:  # type: ignore[no-untyped-def]
    """The engine's own record that the container was sent SIGTERM (its `kill` event, signal 15)."""
    events = engine.api.events(
        since=since, until=int(time.time()) + 1, decode=True, filters={"container": name, "event": "kill"}
    )
    return any((e.get("Actor") or {}).get("Attributes", {}).get("signal") == "15" for e in events)


def test_stale_name_of_a_dead_owner_is_replaced(engine, stub_image) -> None:
    prefix = unique("stale")
    dead = f"{socket.gethostname()}:{2**22 + 12345}:1"  # above pid_max on this host's default: never alive
    engine.api.create_container(stub_image, name=f"{prefix}-0", labels={labels.RUN: "deadrun00001", labels.OWNER: dead})
    node = Launcher("node", env=node_env(prefix, stub_image, NUM_STAGES="1"))
    assert node.wait(60) == 0
    assert "removed" in node.stderr_text() and dead in node.stderr_text()


def test_stale_name_of_a_live_owner_is_an_error_and_untouched(engine, stub_image) -> None:
    prefix = unique("live")
    owner = identity.current_owner().label()  # pytest itself: alive
    ref = engine.api.create_container(
        stub_image, name=f"{prefix}-0", labels={labels.RUN: "liverun00001", labels.OWNER: owner}
    )["Id"]
    try:
        node = Launcher("node", env=node_env(prefix, stub_image))
        assert node.wait(30) == 125  # as `docker run --name` of a name in use
        assert f"container {prefix}-0 is in use by a live owner ({owner})" in node.stderr_text()
        assert engine.inspect(ref) is not None
    finally:
        engine.remove(ref)


def test_chain_through_the_old_shim_runs_the_demo(engine, stub_image) -> None:
    chain = Launcher(
        "chain", "--stages", "4", "--json", "--gpus", "none", "--gpu-node", SHIM, env=node_env("unused", stub_image)
    )
    assert chain.wait(120) == 0, chain.stderr_text()
    assert any("PP_DEMO_RESULT" in line and "match=true" in line for line in chain.stderr_lines)
    stopped = chain.wait_event("chain_stopped")
    assert stopped["orphans"] == []
    assert engine.containers([f"{labels.RUN}={chain.run_id}"]) == []


@pytest.mark.parametrize(("entry", "code"), [("no-such-command", 127), ("/etc/passwd", 126)])
def test_a_command_that_cannot_run_exits_126_or_127_as_docker_run(engine, stub_image, entry: str, code: int) -> None:
    """The drop-in's exit codes are `docker run --init`'s: 127 for a command not found, 126 for one that cannot
    be invoked (tini in the container says which), 125 for an engine that refuses (tests above)."""
    prefix = unique("cmd")
    node = Launcher("node", env=node_env(prefix, stub_image, PP_ENTRYPOINT=entry))
    assert node.wait(60) == code, node.stderr_text()
    assert wait_until(lambda: containers_named(engine, f"{prefix}-0") == [], 10)


def muted_creates(engine_socket: str, path: Path, name: str) -> Relay:
    """The suite's engine through a relay that passes everything on, except that the answer to the create of
    container `name` never comes back: the create happens on the engine, and its client waits."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(64)
    wanted = f"/containers/create?name={name}".encode()
    return Relay(server, engine_socket, lambda data: data.startswith(b"POST ") and wanted in data.split(b"\r\n")[0])


def test_pp_gpu_node_killed_before_its_create_was_answered_leaves_nothing(engine, stub_image, tmp_path: Path) -> None:
    """The engine made the stage container, pp-gpu-node never read the answer (so never learnt its id) and was
    killed: the watchdog was told the name before the create, and removes that container (this run's label, never
    started) as it would a chain's."""
    prefix = unique("unanswered")
    name = f"{prefix}-0"
    relay = muted_creates(engine.url.removeprefix("unix://"), tmp_path / "engine.sock", name)
    try:
        node = Launcher("node", env=node_env(prefix, stub_image, **HOLD, DOCKER_HOST=f"unix://{tmp_path}/engine.sock"))
        assert wait_until(lambda: engine.inspect(name) is not None, 60), node.stderr_text()
        made = engine.inspect(name)
        assert made["State"]["Status"] == "created"  # made, never started: nothing would ever end it
        run = made["Config"]["Labels"][labels.RUN]
        node.signal(signal.SIGKILL)
        node.wait(10)
        assert wait_until(lambda: engine.inspect(name) is None, 30), engine.inspect(name)
        assert wait_until(lambda: engine.containers([f"{labels.RUN}={run}"]) == [], 30)  # its guard too
        # and its watchdog, which speaks to the engine through the relay: it finds nothing left and goes (closing
        # the relay first would leave it retrying an engine that is no longer there)
        assert wait_until(lambda: watchdogs(PP_CONTAINER_PREFIX=prefix) == [], 30), watchdogs(
            PP_CONTAINER_PREFIX=prefix
        )
    finally:
        relay.close()
        with contextlib.suppress(Exception):
            engine.remove(name)
