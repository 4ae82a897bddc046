"""adapters/engine_api: the JSON it sends and the errors it raises are docker-py's, for what pp-launch passes; the
attach answer is read to the end of its headers and not a byte further. No engine: docker-py's own builders and
error mapping are the reference, and a socket pair stands in for the engine's side of an attach."""

from __future__ import annotations

import json
import socket
from typing import Any

import docker
import docker.errors
import docker.utils
import pytest
import requests

from pp_launch.adapters import engine_api

HOST_CONFIGS: list[dict[str, Any]] = [
    {"init": True, "auto_remove": True, "network_mode": "host", "binds": None},
    {"init": True, "auto_remove": True, "network_mode": "bridge",
     "binds": {"/data": {"bind": "/mnt/data", "mode": "ro"}, "/w": {"bind": "/work", "mode": "rw"}}},
    {"network_mode": "none"},
    {"init": True, "auto_remove": True, "network_mode": "none"},
    {"auto_remove": True, "network_mode": "none"},
]  # fmt: skip
CONTAINER_CONFIGS: list[dict[str, Any]] = [
    {"image": "img", "command": ["a", "b"], "environment": {"A": "1", "PP_X": "y=z"}, "labels": {"l": "v"},
     "stdin_open": True, "entrypoint": ["/bin/sh", "-c", "x"]},
    {"image": "img", "command": None, "entrypoint": ["true"], "labels": {}},
    {"image": "img", "command": None, "entrypoint": ["cat"], "labels": {"a": "b"}, "stdin_open": True},
    {"image": "img", "command": None, "entrypoint": ["x"], "environment": {}, "labels": {"a": "b"}},
    {"image": "img", "command": ["c"], "entrypoint": None, "environment": {"A": ""}, "labels": {}},
]  # fmt: skip


def docker_api() -> docker.APIClient:
    return docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")  # connects to nothing


@pytest.mark.parametrize("kwargs", HOST_CONFIGS)
def test_host_config_is_docker_pys(kwargs: dict[str, Any]) -> None:
    assert engine_api.host_config(**kwargs) == docker_api().create_host_config(**kwargs)


@pytest.mark.parametrize("kwargs", CONTAINER_CONFIGS)
def test_container_config_is_docker_pys(kwargs: dict[str, Any]) -> None:
    host = engine_api.host_config(init=True, auto_remove=True, network_mode="host")
    ours = engine_api.container_config(**kwargs, host_config=host)
    theirs = docker_api().create_container_config(
        **kwargs, host_config=docker_api().create_host_config(init=True, auto_remove=True, network_mode="host")
    )
    assert ours == dict(theirs)


FILTERS = [
    {"label": ["pp-launch.run=abc", "pp-launch.stage"]},
    {"label": "x=y"},
    {"dangling": True, "label": ["a"]},
    {"status": ["running", "exited"]},
]


@pytest.mark.parametrize("filters", FILTERS)
def test_filters_are_encoded_as_docker_py_encodes_them(filters: dict[str, Any]) -> None:
    assert json.loads(engine_api._filters(filters)) == json.loads(docker.utils.convert_filters(filters))


REFUSALS = [
    (404, b'{"message":"No such container: pp-abc-0"}'),
    (404, b'{"message":"No such image: pp-launch/nope:latest"}'),
    (404, b'{"message":"pull access denied for x, repository does not exist or may require \'docker login\'"}'),
    (409, b'{"message":"Conflict. The container name \\"/pp-abc-0\\" is already in use"}'),
    (409, b'{"message":"container abc is not running"}'),
    (500, b'{"message":"could not select device driver \\"nvidia\\" with capabilities: [[gpu]]"}'),
    (400, b"not json at all\n"),
    (404, b""),
]


@pytest.mark.parametrize(("status", "body"), REFUSALS)
def test_a_refusal_is_the_error_docker_py_raises(status: int, body: bytes) -> None:
    response = requests.Response()
    response.status_code, response.reason, response._content = status, "Why", body
    response.url = "http+docker://localhost/v1.41/containers/create"
    with pytest.raises(docker.errors.APIError) as theirs:
        docker.errors.create_api_error_from_http_exception(requests.exceptions.HTTPError(response=response))
    ours = engine_api.refusal(status, "Why", "/v1.41/containers/create", body)
    assert type(ours).__name__ == type(theirs.value).__name__
    assert ours.status_code == theirs.value.status_code == status
    assert ours.explanation == theirs.value.explanation
    assert str(theirs.value).split(" for ")[0] == str(ours).split(" for ")[0]  # "404 Client Error"


def test_the_attach_answer_is_read_to_its_headers_and_not_a_byte_further() -> None:
    """What follows the engine's "101 UPGRADED" is the stage's first output: none of it may be swallowed."""
    ours, engine = socket.socketpair()
    with ours, engine:
        engine.sendall(
            b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n\x01\x00\x00\x00\x00\x00\x00\x05hello"
        )
        assert engine_api._head(ours) == (101, "UPGRADED", -1)
        assert ours.recv(100) == b"\x01\x00\x00\x00\x00\x00\x00\x05hello"


def test_a_refused_attach_reads_its_message_and_a_closed_one_is_a_transport_error() -> None:
    ours, engine = socket.socketpair()
    with ours, engine:
        body = b'{"message":"No such container: x"}'
        engine.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        status, reason, length = engine_api._head(ours)
        assert (status, reason, length) == (404, "Not Found", len(body))
        assert engine_api._body(ours, length) == body
    ours, engine = socket.socketpair()
    with ours:
        engine.sendall(b"HTTP/1.1 10")
        engine.close()
        with pytest.raises(ConnectionError):  # RemoteDisconnected: the engine went away mid-answer
            engine_api._head(ours)
    ours, engine = socket.socketpair()
    with ours, engine:
        engine.sendall(b"garbage\r\n\r\n")
        with pytest.raises(Exception, match="garbage"):
            engine_api._head(ours)
