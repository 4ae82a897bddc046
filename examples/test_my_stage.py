"""Testing your own stage image with pp-launch's pytest plugin: run with `pytest -p pp_launch examples/`.

IMAGE is the built-in stub here; put your own stage image's name (it must be on the engine: nothing is pulled).
"""

import re

from pp_launch.testing.kit import BUILTIN_IMAGE as IMAGE


def test_two_stage_chain_announces_and_leaves_nothing(pp_chain) -> None:
    chain = pp_chain(IMAGE, stages=2, env={"STUB_MODE": "hold"})
    assert [e.stage_index for e in chain.roster] == [0, 1]
    for a in chain.announcements:
        assert re.fullmatch(r"[0-9a-f]{64}", a.node_id_hex)


def test_one_stage_answers_on_the_address_it_announced(pp_stage) -> None:
    import socket

    stage = pp_stage(IMAGE, env={"STUB_MODE": "hold"})
    host, port = stage.wait_for_announcement(timeout=30).direct.split(",")[0].rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=5).close()
