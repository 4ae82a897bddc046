"""MO01 records and ring layouts (docs/worker-wire.md): what the node writes and reads back, byte for byte."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pp_launch.core.worker import codec as w
from pp_launch.core.worker import record


def test_a_record_is_a_40_byte_header_then_the_payload() -> None:
    rec = record.ObjectRecord.of_words(object_id=10, sequence=3, words=[1, -2], flags=1)
    data = rec.encode()
    assert len(data) == rec.size == 48 and rec.extent == 8
    assert data[:4] == b"MO01" and struct.unpack_from("<HHQQQII", data, 4) == (1, 40, 10, 3, 8, 1, 0)
    assert struct.unpack_from("<2i", data, 40) == (1, -2)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_records_round_trip(object_id: int, sequence: int, payload: bytes, flags: int) -> None:
    rec = record.ObjectRecord(object_id=object_id, sequence=sequence, payload=payload, flags=flags)
    buf = bytearray(200) + rec.encode()
    assert record.decode_record(buf, 200) == rec


def test_the_header_length_is_read_as_the_u16_it_is() -> None:
    """296 is 0x0128: its low byte is 40. A reader of one byte would take it for a valid header."""
    data = bytearray(record.ObjectRecord.of_words(1, 0, [5]).encode())
    struct.pack_into("<H", data, 6, 296)
    with pytest.raises(record.RecordError, match="header length 296"):
        record.decode_record(data)


def test_an_earlier_wire_48_byte_header_is_named_as_such() -> None:
    data = bytearray(64)
    data[0:4], data[4], data[5] = b"MO01", 1, 48  # the earlier wire: u8 version, u8 header length
    with pytest.raises(record.RecordError, match=r"48-byte header \(an earlier swactor wire\)"):
        record.decode_record(data)


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda d: d.__setitem__(slice(0, 4), b"XXXX"), "InvalidObjectHeader"),
        (lambda d: struct.pack_into("<Q", d, 24, 10_000), "ObjectExtentInvalid"),
    ],
)
def test_a_broken_record_is_refused_with_a_reason(mangle, reason: str) -> None:  # type: ignore[no-untyped-def]
    data = bytearray(record.ObjectRecord.of_words(1, 0, [5]).encode())
    mangle(data)
    with pytest.raises(record.RecordError) as exc:
        record.decode_record(data)
    assert exc.value.reason == reason


def test_rings_are_a_128_byte_header_then_4096_bytes_aligned_as_swactor_lays_them_out() -> None:
    ingress, egress = record.ring_layouts([1, 2])
    assert ingress.to_wire() == {
        "ring_id": 1,
        "arena_offset": 0,
        "header_offset": 0,
        "data_offset": 128,
        "data_capacity": 4096,
        "alignment": 64,
    }
    assert (egress.arena_offset, egress.data_offset) == (4224, 4352) and egress.end <= record.ARENA_BYTES
    odd = record.ring_layouts([5, 6], data_bytes=100, base=3)
    assert [r.arena_offset for r in odd] == [64, 320] and all(r.arena_offset % 64 == 0 for r in odd)


def test_execute_step_bindings_keep_port_id_and_extent_on_the_wire() -> None:
    line = (
        b'{"type":"ExecuteStep","role_id":1,"step_id":1,"inputs":[{"port_id":"input","object_id":10,"sequence":0,'
        b'"device_handle":{"worker_generation":1,"id":42}}],"outputs":[{"port_id":"output","ring_id":2,'
        b'"object_id":500,"sequence":0,"extent":4,"flags":1}],"runtime":{"final_stage":true},'
        b'"release_inputs_after":false}'
    )
    step = w.decode(line, w.COMMANDS)
    assert isinstance(step, w.ExecuteStep)
    assert step.inputs[0].port_id == "input" and (step.outputs[0].port_id, step.outputs[0].extent) == ("output", 4)
    again = w.decode(w.encode(step), w.COMMANDS)
    assert again == step
    bare = w.OutputBinding(ring_id=2, object_id=1, sequence=0)
    assert w._plain(bare) == {"ring_id": 2, "object_id": 1, "sequence": 0, "flags": 0}  # no nulls on the wire
