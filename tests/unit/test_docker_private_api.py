"""docker-py's private parts pp-launch relies on, held to what docker_engine.py expects.

pyproject pins docker to a range (>=7.1,<8); these fail the day a release inside it changes one of them."""

from __future__ import annotations

import importlib.metadata
import re
import socket
from pathlib import Path

import docker
import docker.errors
import pytest
import requests

from pp_launch.adapters import docker_engine

ROOT = Path(__file__).resolve().parents[2]


def api() -> docker.APIClient:
    return docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.41")  # connects to nothing


def test_the_installed_docker_is_inside_the_pinned_range() -> None:
    pinned = re.search(r'"docker\[ssh\]>=([0-9.]+),<([0-9]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned is not None, "pyproject.toml must pin docker to a range"
    low, high = tuple(int(p) for p in pinned.group(1).split(".")), int(pinned.group(2))
    installed = tuple(int(p) for p in importlib.metadata.version("docker").split(".")[:2])
    assert low <= installed and installed[0] < high


def test_url_builds_a_versioned_path_with_the_id_quoted() -> None:
    url = api()._url("/containers/{0}/wait", "abc def")
    assert url == "http+docker://localhost/v1.41/containers/abc%20def/wait"


def test_raise_for_status_maps_404_to_not_found_and_5xx_to_api_error() -> None:
    for status, kind in ((404, docker.errors.NotFound), (500, docker.errors.APIError)):
        response = requests.Response()
        response.status_code = status
        response.url = "http+docker://localhost/v1.41/containers/x/wait"
        response._content = b'{"message": "no such container"}'
        with pytest.raises(kind):
            api()._raise_for_status(response)
    ok = requests.Response()
    ok.status_code = 200
    api()._raise_for_status(ok)  # no exception


def test_attach_socket_answers_a_socketio_whose_sock_is_the_raw_socket() -> None:
    """What raw_socket() unwraps (the engine's own answer is checked in tests/integration/test_images_docker.py)."""
    a, b = socket.socketpair()
    try:
        wrapped = socket.SocketIO(a, "rwb")
        assert docker_engine.raw_socket(wrapped) is a
        assert docker_engine.raw_socket(a) is a
    finally:
        a.close()
        b.close()


def test_removal_wait_posts_to_the_wait_endpoint_with_condition_removed() -> None:
    seen = {}

    class Recording(docker.APIClient):  # type: ignore[misc]
        def post(self, url: str, **kwargs: object) -> requests.Response:
            seen.update(url=url, **kwargs)
            response = requests.Response()
            response.status_code = 200
            return response

    Recording(base_url="unix:///nonexistent/docker.sock", version="1.41")
    docker_engine.removal_wait(Recording(base_url="unix:///nonexistent/docker.sock", version="1.41"), "c1")
    assert seen["url"].endswith("/v1.41/containers/c1/wait")
    assert seen["params"] == {"condition": "removed"} and seen["stream"] is True and seen["timeout"] is None
