"""Images without a registry: a rebuild under the same tag leaves no untagged image behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import unique

pytestmark = pytest.mark.docker


def test_a_rebuild_removes_the_image_it_replaced(engine, stub_image, tmp_path: Path) -> None:
    tag = f"pp-launch-test/rebuild:{unique()}"
    (tmp_path / "Dockerfile").write_text("FROM pp-launch/base:bookworm\nCOPY a /a\n")
    ids = []
    try:
        for content in ("first", "second"):
            (tmp_path / "a").write_text(content)
            old = engine.image_id(tag)
            engine.build(str(tmp_path), tag, {}, {}, lambda text: None)
            engine.drop_replaced_image(old, tag)
            ids.append(engine.image_id(tag))
        assert ids[0] != ids[1]
        assert engine.image_id(ids[0]) is None  # the first build is gone, not left dangling
    finally:
        engine.remove_image(tag)
    assert engine.image_id(tag) is None
