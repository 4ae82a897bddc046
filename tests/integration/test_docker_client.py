"""adapters/docker_client on the real engine: docker-py is the one client, its attach loses no byte of a stage's
output, its removal wait gives the exit code; and a chain on a local engine runs without paramiko (a plain install
leaves it out: only `pp-launch[ssh]` brings it)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker.errors
import pytest

from pp_launch.adapters import docker_client, docker_engine

from ..helpers import Relay, run_containers, unique

pytestmark = pytest.mark.docker


def test_a_local_chain_runs_through_docker_py_without_paramiko(engine, stub_image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every call of a chain's life goes through docker-py's APIClient; paramiko is barred from the launcher (as a
    plain install has none) and the chain runs the same."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['paramiko'] = None  # as if not installed\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pp_launch", "chain", "--stages", "3", "--gpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "match=true" in r.stdout + r.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert {"docker.api.client", "pp_launch.adapters.docker_client"} <= imported
    assert not any(m.startswith("paramiko.") for m in imported)  # ("paramiko" alone: the barred name, asked for)


def test_paramiko_installed_is_not_imported_for_a_local_engine(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """paramiko is installed here (the ssh extra); a chain on a local engine never imports it, nor docker-py's ssh
    transport (0.1 s of every launcher's start); find_spec still finds it, and an ssh:// client still gets it."""
    import importlib.util

    assert importlib.util.find_spec("paramiko") is not None
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pp_launch", "chain", "--stages", "2", "--gpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    loaded = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "docker.api.client" in loaded and not any(m.split(".")[0] == "paramiko" for m in loaded)
    probe = (
        "import importlib.util, sys; from pp_launch.adapters import docker_client as d; import docker.api.client as c; "
        "assert 'paramiko' not in sys.modules and importlib.util.find_spec('paramiko'); d.ssh_transport(); "
        "print(c.SSHHTTPAdapter.__module__, 'paramiko' in sys.modules)"
    )
    ssh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert ssh.stdout.split() == ["docker.transport.sshconn", "True"]


def test_the_local_engine_is_spoken_to_through_the_bounded_adapter(engine) -> None:  # type: ignore[no-untyped-def]
    api = engine.api._api
    assert isinstance(api, docker.APIClient)
    assert isinstance(api.get_adapter("http+docker://localhost/v1.41/info"), docker_client._UnixAdapter)
    assert api.api_version == engine.api.version()["ApiVersion"]  # asked, as version="auto" does


def test_calls_on_many_paths_share_one_pooled_connection(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """docker-py pools an engine's connections per URL (docker/docker-py#2970), so each new path (a container's id, a
    query) made a connection of its own: over ssh:// a channel, a shell and a `docker system dial-stdio` on the host.
    Through pp-launch's client, calls one after another on ten paths share one connection."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "relay.sock"))
    server.listen(16)
    relay = Relay(server, engine.url.removeprefix("unix://"))
    api = docker_client.api_client(f"unix://{tmp_path / 'relay.sock'}", 10)
    try:
        api.info()
        api.containers(all=True, filters={"label": f"pp-launch.run={unique('none')}"})
        for _ in range(4):
            with pytest.raises(docker.errors.NotFound):
                api.inspect_container(unique("absent"))
        api.images(name="pp-launch/*")
        api.volumes(filters={"label": f"pp-launch.run={unique('none')}"})
        connections = len(relay.conns) // 2  # each: the client's end and the engine's
    finally:
        api.close()
        relay.close()
    assert connections == 1  # the version asked when the client was made, and the ten calls


def test_attach_start_and_removal_wait_through_docker_py(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """The stage's first line comes right behind the attach answer: none of it may be taken with the headers."""
    api = engine.api
    run = unique("attach")
    script = "echo first; read x; echo got $x >&2; exit 3"
    config = api.create_container_config(
        image=stub_image,
        command=None,
        entrypoint=["/bin/sh", "-c", script],
        labels={"pp-launch.run": run},
        stdin_open=True,
        host_config=api.create_host_config(init=True, auto_remove=True, network_mode="none"),
    )
    ref = api.create_container_from_config(config, None)["Id"]
    try:
        sock = docker_engine.raw_socket(api.attach_socket(ref, {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}))
        waiting = docker_engine.removal_wait(engine.api, ref, 30)
        api.start(ref)
        sock.settimeout(30)
        frames = docker_engine._frames(sock)
        assert next(frames) == (1, b"first\n")
        sock.sendall(b"hello\n")
        assert next(frames) == (2, b"got hello\n")
        assert b'"StatusCode":3' in waiting.content.replace(b" ", b"")
        sock.close()
    finally:
        with contextlib.suppress(docker.errors.APIError):
            api.remove_container(ref, force=True)
    deadline = time.monotonic() + 30
    while run_containers(engine, run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_containers(engine, run) == []  # auto-remove: the wait answered once it was gone
    with pytest.raises(docker.errors.NotFound):
        api.attach_socket(ref, {"stdout": 1, "stream": 1})


def test_an_absent_socket_is_said_in_words(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/absent.sock"}
    code = "from pp_launch.adapters import docker_engine as d; d.connect(timeout=5)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert re.search(r"cannot reach the Docker engine at unix://.*absent\.sock: no engine socket there", r.stderr)


class Joining(Relay):
    """A relay to the engine that holds each answer a moment and passes it on in one piece, as a busy client or a
    network joins packets: an upgraded stream's first frames arrive with its headers."""

    def _pipe(self, src: socket.socket, dst: socket.socket, muted: threading.Event, asking: bool) -> None:
        if asking:
            return super()._pipe(src, dst, muted, asking)
        try:
            while data := src.recv(65536):
                src.settimeout(0.5)  # what else comes within the moment goes with it
                with contextlib.suppress(TimeoutError):
                    while more := src.recv(65536):
                        data += more
                src.settimeout(None)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def test_an_exec_session_loses_nothing_its_process_wrote_before_its_answer_was_read(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """A guard's session says `ready` at once: that line may come in the same read as the exec's upgrade headers
    (docker-py reads them through a buffer, then hands on the socket under it). Through a relay that joins them,
    the session still reads its first line."""
    local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    server = socket.create_server(("127.0.0.1", 0))
    relay = Joining(server, local)
    name = f"pp-test-exec-{unique()}"
    subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", "--name", name, "--entrypoint", "sleep",
                    stub_image, "120"], check=True, capture_output=True)  # fmt: skip
    far = docker_engine.connect(timeout=30, host=f"tcp://127.0.0.1:{server.getsockname()[1]}")
    try:
        session = far.session(name, ["sh", "-c", "echo ready; echo second; cat"])
        assert session.line(10) == b"ready"
        assert session.line(10) == b"second"
        session.write(b"echoed\n")
        assert session.line(10) == b"echoed"
        session.close()
    finally:
        far.close()
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        relay.close()
