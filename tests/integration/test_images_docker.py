"""Images without a registry: a rebuild under the same tag leaves no untagged image behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import docker, unique

pytestmark = pytest.mark.docker


def test_a_rebuild_removes_the_image_it_replaced(engine, stub_image, tmp_path: Path) -> None:
    tag = f"pp-launch-test/rebuild:{unique()}"
    (tmp_path / "Dockerfile").write_text("FROM pp-launch/base:bookworm\nCOPY a /a\n")
    ids = []
    try:
        for content in ("first", "second"):
            (tmp_path / "a").write_text(f"{content} {tag}")  # the test's own: an identical build is the cache's image
            old = engine.image_id(tag)
            engine.build(str(tmp_path), tag, {}, {}, lambda text: None)
            engine.drop_replaced_image(old, tag)
            ids.append(engine.image_id(tag))
        assert ids[0] != ids[1]
        assert engine.image_id(ids[0]) is None  # the first build is gone, not left dangling
    finally:
        engine.remove_image(tag)
    assert engine.image_id(tag) is None


def test_attach_socket_on_a_real_engine_unwraps_to_a_plain_socket(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    """docker-py's private `_sock` under attach_socket: raw_socket() must reach a socket.socket
    that shuts down and takes timeouts, or the stdin lifeline cannot be held. docker-py's own client: a local
    engine is spoken to through docker-py too (adapters/docker_client.py)."""
    import socket

    import docker

    from pp_launch.adapters.docker_engine import engine_address, raw_socket, removal_wait
    from pp_launch.core import labels

    api = docker.APIClient(base_url=engine_address(), timeout=30)
    ref = api.create_container(
        stub_image,
        ["cat"],
        stdin_open=True,
        labels={labels.RUN: "privateapi0001"},
        host_config=api.create_host_config(auto_remove=True, init=True),
    )["Id"]
    try:
        attached = api.attach_socket(ref, params={"stdin": 1, "stream": 1})
        raw = raw_socket(attached)
        assert isinstance(raw, socket.socket)
        gone = removal_wait(api, ref, 30)  # answers once the container is removed
        api.start(ref)
        raw.settimeout(None)
        raw.shutdown(socket.SHUT_WR)  # cat sees the end of stdin and exits; auto-remove takes it
        assert gone.json()["StatusCode"] == 0
    finally:
        engine.remove(ref)
        api.close()


def test_a_rebuild_removes_the_image_it_replaced_unless_in_use_or_tagged_again(
    engine, stub_image, tmp_path: Path
) -> None:
    """A rebuild removes the image it replaced by its id; one a container still uses (a detached run's guard of the
    old image) stays, and so does one someone tagged again (theirs now). Nothing is kept in the user's state."""
    tag, other = f"pp-launch-test/replaced:{unique()}", f"pp-launch-test/theirs:{unique()}"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM pp-launch/base:bookworm\nCOPY a /a\n")
    built: list[str] = []

    def build(content: str) -> None:
        (tmp_path / "ctx" / "a").write_text(f"{content} {tag}")  # another test's identical build shares its id
        old = engine.image_id(tag)
        engine.build(str(tmp_path / "ctx"), tag, {}, {}, lambda text: None)
        engine.drop_replaced_image(old, tag)
        built.append(str(engine.image_id(tag)))

    user = ""
    try:
        build("first")
        user = docker("run", "-d", "--rm", "--network", "none", built[0], "sleep", "120").stdout.strip()
        build("second")
        assert engine.image_id(built[0]) is not None  # in use: kept
        docker("rm", "-f", user)
        user = ""
        build("third")
        assert engine.image_id(built[1]) is None  # nothing used it: removed by its id
        docker("tag", built[2], other)  # someone tagged the image about to be replaced: theirs
        build("fourth")
        assert engine.image_id(other) == built[2]
    finally:
        if user:
            docker("rm", "-f", user)
        for name in (tag, other):
            engine.remove_image(name)
        for image_id in built:
            engine.drop_untagged_image(image_id)
    assert all(engine.image_id(i) is None for i in built)
