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
    pinned = re.search(r'"docker>=([0-9.]+),<([0-9]+)"', (ROOT / "pyproject.toml").read_text())
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

    docker_engine.removal_wait(Recording(base_url="unix:///nonexistent/docker.sock", version="1.41"), "c1", 5.0)
    assert seen["url"].endswith("/v1.41/containers/c1/wait")
    assert seen["params"] == {"condition": "removed"} and seen["stream"] is True and seen["timeout"] is None


def test_the_unix_adapter_is_replaced_where_docker_py_keeps_it() -> None:
    """docker_client.api_client swaps APIClient._custom_adapter (a UnixHTTPAdapter with .socket_path, mounted on
    http+docker://) for its bounded one, and sets ._version (what version="auto" sets) once it asked the engine."""
    from docker.transport.unixconn import UnixHTTPAdapter

    client = api()
    assert isinstance(client._custom_adapter, UnixHTTPAdapter)
    assert client._custom_adapter.socket_path == "/nonexistent/docker.sock"
    assert client.get_adapter("http+docker://localhost/v1.41/info") is client._custom_adapter
    assert client._version == "1.41" and client.api_version == "1.41"
    connection = client._custom_adapter.get_connection("http+docker://localhost")._new_conn()
    assert connection.unix_socket == "/nonexistent/docker.sock" and hasattr(connection, "timeout")


def test_a_plain_install_leaves_paramiko_to_the_ssh_extra() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any("paramiko" in d or "[ssh]" in d for d in project["dependencies"]), project["dependencies"]
    assert any(d.startswith("paramiko") for d in project["optional-dependencies"]["ssh"])


def test_after_importing_every_module_find_spec_still_works() -> None:
    """No stand-in is left in sys.modules: a user's own session can still ask for any module's spec."""
    import importlib
    import importlib.util
    import pkgutil
    import subprocess
    import sys

    import pp_launch

    names = [m.name for m in pkgutil.walk_packages(pp_launch.__path__, "pp_launch.") if "__main__" not in m.name]
    code = (
        "import importlib, importlib.util, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "for name in ('requests', 'docker', 'docker.errors', 'urllib3', 'charset_normalizer', 'click', 'pynvml'):\n"
        "    assert importlib.util.find_spec(name) is not None, name\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert importlib.util.find_spec("requests") is not None
