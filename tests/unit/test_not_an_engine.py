"""A socket that is not a Docker engine, or an engine that answers odd shapes or trickles: one line and an exit code,
never a traceback; and every call bounded by PP_ENGINE_TIMEOUT as a whole. The other end is a small socket server
of this test's own (a thread it starts, stops and joins), speaking just enough HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
import requests

from pp_launch.adapters import docker_client, docker_engine
from pp_launch.core import errors

PP_LAUNCH = str(Path(sys.executable).with_name("pp-launch"))


def answer(body: bytes, content_type: str = "application/json") -> Callable[[socket.socket, threading.Event], None]:
    def reply(conn: socket.socket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)

    return reply


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """Headers at once, then a byte every 0.2 s: each read is quick, the whole answer never comes."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    while not stop.wait(0.2):
        conn.sendall(b" ")


@contextlib.contextmanager
def fake_socket(tmp_path: Path, reply: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    path = str(tmp_path / "not-docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    server.settimeout(0.1)
    stop = threading.Event()
    handlers: list[threading.Thread] = []

    def handle(conn: socket.socket) -> None:
        """Each request on the connection answered, as an engine keeps a connection open for the next call (its
        client pools it); until the client closes it or the test ends."""
        conn.settimeout(0.1)
        with conn, contextlib.suppress(OSError):
            while not stop.is_set():
                try:
                    if not conn.recv(65536):
                        return
                except TimeoutError:
                    continue
                reply(conn, stop)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=handle, args=(conn,), name="fake-engine-conn")
            handlers.append(t)
            t.start()

    thread = threading.Thread(target=serve, name="fake-engine")
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(5)
        for t in handlers:
            t.join(5)
        server.close()
        os.unlink(path)
        assert not thread.is_alive() and not any(t.is_alive() for t in handlers)


ODD = [
    ("html", answer(b"<html>hello</html>", "text/html"), "answered /version with something that is not JSON"),
    ("empty object", answer(b"{}"), "answered /version without an API version: not a Docker engine"),
    ("a list", answer(b"[1, 2]"), "answered /version with list where an object belongs"),
    ("a version that is no number", answer(b'{"ApiVersion": "x; rm"}'), "without an API version"),
]


@pytest.mark.parametrize(("what", "reply", "said"), ODD, ids=[o[0] for o in ODD])
def test_a_socket_that_is_not_docker_is_one_line_exit_2(tmp_path: Path, what: str, reply, said: str) -> None:  # type: ignore[no-untyped-def]
    with fake_socket(tmp_path, reply) as path:
        env = {**os.environ, "DOCKER_HOST": f"unix://{path}", "PP_ENGINE_TIMEOUT": "5"}
        for argv in (["ps"], ["chain", "--stages", "1", "--gpus", "none"]):
            done = subprocess.run([PP_LAUNCH, *argv], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 2, (argv, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
            assert said in lines[0] and f"unix://{path}" in lines[0]


def test_a_trickling_answer_is_bounded_as_a_whole_call(tmp_path: Path) -> None:
    with fake_socket(tmp_path, trickle) as path:
        began = time.monotonic()
        with pytest.raises((TimeoutError, requests.exceptions.ConnectionError), match="timed out"):
            docker_client.api_client(f"unix://{path}", timeout=1.0)
        assert time.monotonic() - began < 2.0  # 1 s for the whole call, not 1 s per byte
        env = {**os.environ, "DOCKER_HOST": f"unix://{path}", "PP_ENGINE_TIMEOUT": "1"}
        began = time.monotonic()
        done = subprocess.run([PP_LAUNCH, "ps"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "it did not answer in time" in done.stderr
        assert time.monotonic() - began < 10 and "Traceback" not in done.stderr


def test_a_call_after_the_first_is_bounded_too(tmp_path: Path) -> None:
    """The engine answered its version, then trickles: a later call ends at the timeout as EngineLost, in words."""
    answers = iter([b'{"ApiVersion": "1.41"}'])

    def first_then_trickle(conn: socket.socket, stop: threading.Event) -> None:
        body = next(answers, None)
        if body is None:
            trickle(conn, stop)
        else:
            answer(body)(conn, stop)

    with fake_socket(tmp_path, first_then_trickle) as path:
        engine = docker_engine.Engine(docker_client.api_client(f"unix://{path}", 1.0), lambda: None, 1.0)
        began = time.monotonic()
        with pytest.raises(errors.EngineLost, match=r"stopped answering \(no reply before the timeout"):
            engine.inspect("x")
        assert time.monotonic() - began < 2.0
        engine.api.close()


def engine_on(path: str) -> docker_engine.Engine:
    """An engine that said its version; what it answers next is the test's."""
    api = docker.APIClient(base_url=f"unix://{path}", version="1.41", timeout=5)
    return docker_engine.Engine(api, api.close, 5.0)


def test_odd_shapes_of_a_real_call_are_named_not_raised_as_key_errors(tmp_path: Path) -> None:
    with fake_socket(tmp_path, answer(b'"just a string"')) as path:
        engine = engine_on(path)
        with pytest.raises(errors.EngineLost, match="the container list with str where a list belongs"):
            engine.containers(["pp-launch.run"])
        with pytest.raises(errors.EngineLost, match="a container's inspect with str where an object belongs"):
            engine.inspect("x")
        engine.close()
    with fake_socket(tmp_path, answer(b'{"Warnings": []}')) as path:
        engine = engine_on(path)
        with pytest.raises(errors.EngineLost, match="no container id"):
            engine.api.create_container_from_config({"Image": "x"}, "y")
        engine.close()
    with fake_socket(tmp_path, answer(b"<html>hello</html>", "text/html")) as path:
        engine = engine_on(path)
        with pytest.raises(errors.EngineLost, match="answered /info with something that is not JSON"):
            engine.identity()
        engine.close()


def conflict(conn: socket.socket, stop: threading.Event) -> None:
    body = b'{"message": "can not get logs from container which is dead or marked for removal"}'
    head = f"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    conn.sendall(head.encode() + body)


def test_the_logs_of_a_container_being_removed_are_none_not_an_error(tmp_path: Path) -> None:
    """The engine's 409 for the logs of a container marked for removal (a run ending beside `gc` or `ps`, which read
    every guard's log): it is going, as good as gone; `gc` failed on it (exit 1) beside other runs' ends."""
    with fake_socket(tmp_path, conflict) as path:
        engine = engine_on(path)
        assert list(engine.log_lines("abc")) == []
        engine.close()


def test_an_engine_is_asked_what_it_is_once_per_connection(tmp_path: Path) -> None:
    """Each /info makes an engine run its runtimes to ask their versions: the identity (the spare guard's check, the
    guard's environment, a chain's GPU lock order) is asked once per connection, however often it is needed."""
    asked: list[str] = []
    body = b'{"ID": "e1", "Name": "box", "DockerRootDir": "/var/lib/docker", "ApiVersion": "1.41"}'

    def reply(conn: socket.socket, stop: threading.Event) -> None:
        asked.append("one")
        answer(body)(conn, stop)

    with fake_socket(tmp_path, reply) as path:
        engine = engine_on(path)
        assert engine.engine_id() == "e1|box|/var/lib/docker"
        assert engine.identity() == ("e1|box|/var/lib/docker", "1.41")
        assert engine.identity() == engine.identity() and engine.engine_id() == "e1|box|/var/lib/docker"
        engine.close()
    assert len(asked) == 2  # /info once, /version once
