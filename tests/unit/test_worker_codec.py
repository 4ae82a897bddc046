"""The worker wire codec (docs/worker-wire.md): its golden lines, leniency where swactor's workers
need it (unknown fields, WorkerFatal details, aliases) and strictness where the wire is strict."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pp_launch.core.worker import codec as w

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "worker-wire.md"


def golden() -> dict[str, list[str]]:
    """The jsonl blocks of the wire document: the commands block, then the events block."""
    blocks = re.findall(r"```jsonl\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2, "docs/worker-wire.md must have a commands block and an events block"
    return {"commands": blocks[0].splitlines(), "events": blocks[1].splitlines()}


GOLDEN = golden()


def test_every_message_type_has_exactly_one_golden_line() -> None:
    for kinds, lines in ((w.COMMANDS, GOLDEN["commands"]), (w.EVENTS, GOLDEN["events"])):
        types = [json.loads(line)["type"] for line in lines]
        assert sorted(types) == sorted(kinds), "one golden line per message type, no more, no less"


@pytest.mark.parametrize(
    ("kinds", "line"),
    [(w.COMMANDS, line) for line in GOLDEN["commands"]] + [(w.EVENTS, line) for line in GOLDEN["events"]],
)
def test_a_golden_line_decodes_and_encodes_back_to_itself(kinds: dict[str, type[w.Message]], line: str) -> None:
    message = w.decode(line, kinds)
    assert w.encode(message) == line.encode() + b"\n"


def test_the_golden_lines_carry_the_seed_types() -> None:
    init = w.decode(GOLDEN["commands"][0], w.COMMANDS)
    assert isinstance(init, w.InitializeWorker) and init.backend == {"device": "CPU"}
    step = w.decode(GOLDEN["commands"][5], w.COMMANDS)
    assert isinstance(step, w.ExecuteStep)
    assert step.inputs == [
        w.InputBinding(
            device_handle=w.DeviceHandle(worker_generation=1, id=1), object_id=1, sequence=0, port_id="input"
        )
    ]
    assert step.outputs == [w.OutputBinding(ring_id=2, object_id=500, sequence=0, flags=0, port_id="output", extent=4)]
    produced = w.decode(GOLDEN["events"][5], w.EVENTS)
    assert isinstance(produced, w.ObjectProduced) and produced.committed_bytes == 44 and produced.edge_id == 102


def test_unsolicited_ring_events_decode_as_events_not_commands() -> None:
    readable = w.decode('{"type":"RingReadable","ring_id":4}', w.EVENTS)
    assert isinstance(readable, w.RingBecameReadable) and readable.ring_id == 4
    assert isinstance(w.decode('{"type":"RingReadable","ring_id":4}', w.COMMANDS), w.RingReadable)


def test_unknown_fields_are_ignored() -> None:
    line = (
        '{"type":"ObjectProduced","ring_id":2,"edge_id":1,"port_id":"o","object_id":5,"sequence":0,'
        '"committed_bytes":8,"extent":8,"role_id":7}'
    )
    ev = w.decode(line, w.EVENTS)
    assert ev == w.ObjectProduced(ring_id=2, edge_id=1, port_id="o", object_id=5, sequence=0, committed_bytes=8)


def test_worker_fatal_keeps_its_extra_fields_as_details() -> None:
    ev = w.decode('{"type":"WorkerFatal","reason":"InvalidJson","detail":"line 3","pid":9}', w.EVENTS)
    assert ev == w.WorkerFatal(reason="InvalidJson", details={"detail": "line 3", "pid": 9})
    assert json.loads(w.encode(ev)) == {"type": "WorkerFatal", "reason": "InvalidJson", "detail": "line 3", "pid": 9}


def test_aliases_are_accepted_at_every_level() -> None:
    ev = w.decode('{"type":"DeviceObjectReleased","handle":{"generation":3,"id":4}}', w.EVENTS)
    assert ev == w.DeviceObjectReleased(device_handle=w.DeviceHandle(worker_generation=3, id=4))
    init = w.decode(
        '{"type":"InitializeWorker","generation":2,"arena_ceiling":1,"required_ring_helper_abi":1,"backend":{}}',
        w.COMMANDS,
    )
    assert isinstance(init, w.InitializeWorker) and init.worker_generation == 2


def test_optional_fields_of_object_failed() -> None:
    ev = w.decode('{"type":"ObjectFailed","ring_id":1,"edge_id":2,"port_id":"p","reason":"RingFaulted"}', w.EVENTS)
    assert isinstance(ev, w.ObjectFailed) and ev.object_id is None and ev.sequence is None
    assert b"object_id" not in w.encode(ev)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"type":"RoleConfigured","role_id":"decoder"}', "role_id must be an integer"),  # the old string-id wire
        (
            '{"type":"WorkerReady","pid":1,"worker_generation":1,"ring_helper_abi":1,"backend":"cpu"}',
            "backend must be an object",
        ),
        ('{"type":"RoleConfigured","role_id":true}', "role_id must be an integer"),
        ('{"type":"RoleConfigured","role_id":-1}', "role_id must not be negative"),
        ('{"type":"RoleConfigured"}', "lacks role_id"),
        ('{"type":"DeviceObjectReleased","device_handle":{"id":1}}', "device_handle.lacks worker_generation"),
        (
            '{"type":"DeviceObjectReleased","handle":{"worker_generation":1,"id":1},"device_handle":{"worker_generation":1,"id":1}}',
            "given twice",
        ),
        ('{"type":"RingQuiesced","ring_id":1,"payload":"AAAA"}', "ForbiddenKey: payload"),
        ('{"type":"Nope"}', "UnknownCommand"),
        ('{"ring_id":1}', "UnknownCommand"),
        ("[1,2]", "InvalidJson"),
        ('{"type":', "InvalidJson"),
    ],
)
def test_faults_name_the_reason_and_the_line(line: str, reason: str) -> None:
    with pytest.raises(w.ProtocolFault) as exc:
        w.decode(line, w.EVENTS, line_no=4)
    assert reason in str(exc.value) and "line 4" in str(exc.value)


def test_a_message_cannot_be_built_invalid() -> None:
    with pytest.raises(TypeError, match="ring_id must be an integer"):
        w.RingReadable(ring_id="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="direction must be one of"):
        w.InstallRing(ring_id=1, edge_id=1, port_id="p", direction="sideways", layout={}, object_spec={})  # type: ignore[arg-type]


def test_the_line_decoder_needs_data_then_faults_stickily() -> None:
    d = w.LineDecoder(w.EVENTS)
    d.feed(b'{"type":"RingQuiesced",')
    assert d.next() is w.NEED_DATA
    d.feed(b'"ring_id":1}\n\n{"type":"RingQuiesced","ring_id":2}\n')
    assert d.next() == w.RingQuiesced(ring_id=1)
    assert d.next() == w.RingQuiesced(ring_id=2)
    assert d.next() is w.NEED_DATA
    d.feed(b"oops\n")
    with pytest.raises(w.ProtocolFault, match="line 4") as first:  # the blank line counts
        d.next()
    d.feed(b'{"type":"RingQuiesced","ring_id":3}\n')
    with pytest.raises(w.ProtocolFault) as again:
        d.next()
    assert again.value is first.value


def test_an_over_long_line_is_a_fault() -> None:
    d = w.LineDecoder(w.EVENTS)
    d.feed(b"x" * (w.MAX_LINE + 1))
    with pytest.raises(w.ProtocolFault, match="longer than"):
        d.next()


ids = st.integers(min_value=0, max_value=2**63)
handles = st.builds(w.DeviceHandle, worker_generation=ids, id=ids)


@given(
    st.one_of(
        st.builds(
            w.ObjectLoaded,
            ring_id=ids,
            edge_id=ids,
            port_id=st.text(),
            object_id=ids,
            sequence=ids,
            extent=ids,
            device_handle=handles,
        ),
        st.builds(
            w.ExecuteStep,
            role_id=ids,
            step_id=ids,
            inputs=st.lists(st.builds(w.InputBinding, device_handle=handles, object_id=ids, sequence=ids)),
            outputs=st.lists(
                st.builds(w.OutputBinding, ring_id=ids, object_id=ids, sequence=ids, flags=st.integers(0, 2**32 - 1))
            ),
            runtime=st.dictionaries(st.text(), st.integers()),
            release_inputs_after=st.booleans(),
        ),
        st.builds(
            w.ObjectFailed,
            ring_id=ids,
            edge_id=ids,
            port_id=st.text(),
            reason=st.text(),
            object_id=st.none() | ids,
            sequence=st.none() | ids,
        ),
        st.builds(
            w.WorkerFatal,
            reason=st.text(),
            details=st.dictionaries(
                st.text().filter(lambda k: k not in ("type", "reason", "payload", "bytes", "data")), st.integers()
            ),
        ),
    )
)
def test_every_message_round_trips(message: w.Message) -> None:
    kinds = w.COMMANDS if message.sender == "controller" else w.EVENTS
    assert w.decode(w.encode(message), kinds) == message
