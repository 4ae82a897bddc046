"""adapters/engine_api.SocketApi on the real engine: it answers as docker-py does, its attach loses no byte of a
stage's output, its removal wait gives the exit code; and a chain on a local engine never imports docker-py (the
~0.2 s that left every bring-up)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from typing import Any

import docker
import pytest

from pp_launch.adapters import docker_engine, engine_api

from ..helpers import run_containers, unique

pytestmark = pytest.mark.docker


def socket_api(engine: Any) -> engine_api.SocketApi:
    api = engine.api._api
    assert isinstance(api, engine_api.SocketApi), f"the local engine is not spoken to through SocketApi: {api!r}"
    return api


def test_a_chain_on_the_local_engine_never_imports_docker_py(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """Every call of a chain's life (the sweep, the name checks that find nothing: 404s, create, attach, start,
    the removal waits, teardown) goes through SocketApi; docker-py, requests and urllib3 are never imported."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pp_launch", "chain", "--stages", "3", "--gpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "match=true" in r.stdout + r.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "pp_launch.adapters.engine_api" in imported  # the log is the one we think it is
    heavy = sorted(m for m in imported if m.split(".")[0] in ("docker", "requests", "urllib3", "charset_normalizer"))
    assert heavy == [], heavy


def test_socket_api_answers_as_docker_py_does_on_the_same_engine(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    ours = socket_api(engine)
    theirs = docker.APIClient(base_url=docker_engine.engine_address(), timeout=30)
    try:
        assert ours.version()["ApiVersion"] == theirs.version()["ApiVersion"] == ours.api_version
        assert ours.ping() and theirs.ping()
        assert ours.inspect_image(stub_image)["Id"] == theirs.inspect_image(stub_image)["Id"]
        run = unique("api")
        label = f"pp-launch.run={run}"
        config = engine_api.container_config(
            image=stub_image,
            entrypoint=["true"],
            labels={"pp-launch.run": run},
            host_config=engine_api.host_config(network_mode="none"),
        )
        made = ours.create_container_from_config(config, f"pp-{run}")["Id"]
        try:
            assert [c["Id"] for c in ours.containers(all=True, filters={"label": [label]})] == [made]
            assert ours.containers(all=True, filters={"label": [label]}) == theirs.containers(
                all=True, filters={"label": [label]}
            )
            assert ours.inspect_container(made)["Config"] == theirs.inspect_container(made)["Config"]
            for call in (
                lambda api: api.create_container_from_config(config, f"pp-{run}"),  # the name is taken
                lambda api: api.inspect_container(f"pp-{run}-absent"),
                lambda api: api.inspect_image("pp-launch/absent:none"),
                lambda api: api.kill(made, signal=15),
            ):  # not running
                with pytest.raises(Exception) as mine:
                    call(ours)
                with pytest.raises(Exception) as docker_pys:
                    call(theirs)
                assert type(mine.value).__name__ == type(docker_pys.value).__name__
                assert mine.value.status_code == docker_pys.value.status_code  # type: ignore[attr-defined]
                assert mine.value.explanation == docker_pys.value.explanation  # type: ignore[attr-defined]
        finally:
            ours.remove_container(made, force=True)
        assert run_containers(engine, run) == []
    finally:
        theirs.close()


def test_attach_start_and_removal_wait_through_the_socket(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """The stage's first line comes right behind the attach answer: none of it may be taken with the headers."""
    api = socket_api(engine)
    run = unique("attach")
    script = "echo first; read x; echo got $x >&2; exit 3"
    config = engine_api.container_config(
        image=stub_image,
        entrypoint=["/bin/sh", "-c", script],
        labels={"pp-launch.run": run},
        stdin_open=True,
        host_config=engine_api.host_config(init=True, auto_remove=True, network_mode="none"),
    )
    ref = api.create_container_from_config(config, None)["Id"]
    try:
        sock = api.attach_socket(ref, {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        waiting = docker_engine.removal_wait(engine.api, ref)
        api.start(ref)
        sock.settimeout(30)
        frames = docker_engine._frames(sock)
        assert next(frames) == (1, b"first\n")
        sock.sendall(b"hello\n")
        assert next(frames) == (2, b"got hello\n")
        assert b'"StatusCode":3' in waiting.content.replace(b" ", b"")
        sock.close()
    finally:
        with contextlib.suppress(engine_api.NotFound, engine_api.APIError):
            api.remove_container(ref, force=True)
    deadline = time.monotonic() + 30
    while run_containers(engine, run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_containers(engine, run) == []  # auto-remove: the wait answered once it was gone
    with pytest.raises(engine_api.NotFound):
        api.attach_socket(ref, {"stdout": 1, "stream": 1})


def test_an_absent_socket_is_said_in_words(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/absent.sock"}
    code = "from pp_launch.adapters import docker_engine as d; d.connect(timeout=5)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert re.search(r"cannot reach the Docker engine at unix://.*absent\.sock: no engine socket there", r.stderr)


def test_docker_py_stays_a_way_out_for_a_local_engine(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """PP_LAUNCH_ENGINE_CLIENT=docker-py: the same chain through docker-py, as before engine_api."""
    env = {**os.environ, docker_engine.CLIENT_ENV: "docker-py"}
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pp_launch", "chain", "--stages", "2", "--gpus", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "match=true" in r.stdout + r.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert {"docker.api.client", "requests.exceptions"} <= imported
