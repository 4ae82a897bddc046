"""Ring object records and ring layouts as swactor's node lays them out (docs/worker-wire.md). Pure: bytes in and out.

A record is the 40-byte little-endian `MO01` header (magic, u16 version 1, u16 header length 40, u64 object id,
u64 sequence, u64 extent, u32 flags, u32 reserved) followed by `extent` payload bytes. A ring holds one record,
always at its `data_offset`: the next record overwrites it. An arena holds rings one after another, each a
128-byte ring header then its data, aligned. The node writes ingress records and reads egress records back;
the worker does the opposite. Users' tests use these to write an ingress record the way swactor's node does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pp_launch.core.errors import PpLaunchError

MAGIC = b"MO01"
VERSION = 1
HEADER = struct.Struct("<4sHHQQQII")
HEADER_LEN = HEADER.size  # 40
EARLIER_HEADER_LEN = 48  # an earlier swactor wire: u8 version, u8 header length, max extent and alignment in it
RING_HEADER_BYTES = 128
RING_DATA_BYTES = 4096
RING_ALIGNMENT = 64
ARENA_BYTES = 16384  # swactor's tests
OBJECT_MAX_EXTENT = 16
OBJECT_ALIGNMENT = 4
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1


class RecordError(PpLaunchError):
    """A record that breaks the MO01 layout (the writer's fault); `reason` is a WorkerFatal-style name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class ObjectRecord:
    object_id: int
    sequence: int
    payload: bytes
    flags: int = 0

    def __post_init__(self) -> None:
        for name, value, top in (
            ("object_id", self.object_id, U64),
            ("sequence", self.sequence, U64),
            ("flags", self.flags, U32),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise RecordError("InvalidObjectHeader", f"{name} must be an integer from 0 to {top}, not {value!r}")

    @property
    def extent(self) -> int:
        return len(self.payload)

    @property
    def size(self) -> int:
        """The whole record, header included: what `ObjectProduced.committed_bytes` reports."""
        return HEADER_LEN + self.extent

    def encode(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, HEADER_LEN, self.object_id, self.sequence, self.extent, self.flags, 0) + (
            self.payload
        )

    @classmethod
    def of_words(cls, object_id: int, sequence: int, words: Iterable[int], flags: int = 0) -> ObjectRecord:
        """A record whose payload is little-endian i32 words (swactor's `token_or_activation` objects)."""
        values = list(words)
        return cls(
            object_id=object_id, sequence=sequence, payload=struct.pack(f"<{len(values)}i", *values), flags=flags
        )

    def words(self) -> list[int]:
        return list(struct.unpack(f"<{self.extent // 4}i", self.payload[: self.extent // 4 * 4]))


def decode_record(buf: bytes | bytearray | memoryview, offset: int = 0, limit: int | None = None) -> ObjectRecord:
    """The record at `offset` of `buf`; `limit` bounds the extent (a ring's data capacity less the header)."""
    view = memoryview(buf)
    if offset < 0 or offset + HEADER_LEN > len(view):
        raise RecordError("InvalidObjectHeader", f"no room for a {HEADER_LEN}-byte header at offset {offset}")
    magic, version, header_len, object_id, sequence, extent, flags, _ = HEADER.unpack_from(view, offset)
    if magic != MAGIC:
        raise RecordError("InvalidObjectHeader", f"no MO01 record at offset {offset} (found {bytes(magic)!r})")
    if view[offset + 4] == VERSION and view[offset + 5] == EARLIER_HEADER_LEN:
        raise RecordError(
            "InvalidObjectHeader",
            f"the record at offset {offset} has a {EARLIER_HEADER_LEN}-byte header (an earlier swactor wire); "
            f"this wire's header is {HEADER_LEN} bytes",
        )
    if version != VERSION or header_len != HEADER_LEN:
        raise RecordError(
            "InvalidObjectHeader",
            f"the record at offset {offset} has version {version} and header length {header_len}, "
            f"not {VERSION} and {HEADER_LEN}",
        )
    room = len(view) - offset - HEADER_LEN if limit is None else min(limit, len(view) - offset - HEADER_LEN)
    if extent > room:
        raise RecordError("ObjectExtentInvalid", f"the record at offset {offset} claims {extent} bytes, {room} fit")
    start = offset + HEADER_LEN
    return ObjectRecord(
        object_id=object_id, sequence=sequence, payload=bytes(view[start : start + extent]), flags=flags
    )


@dataclass(frozen=True, kw_only=True)
class RingLayout:
    """One ring's place in the arena, as `InstallRing.layout` carries it."""

    ring_id: int
    arena_offset: int
    header_offset: int
    data_offset: int
    data_capacity: int
    alignment: int = RING_ALIGNMENT

    def to_wire(self) -> dict[str, Any]:
        return {
            "ring_id": self.ring_id,
            "arena_offset": self.arena_offset,
            "header_offset": self.header_offset,
            "data_offset": self.data_offset,
            "data_capacity": self.data_capacity,
            "alignment": self.alignment,
        }

    @property
    def end(self) -> int:
        return self.data_offset + self.data_capacity


def ring_layouts(
    ring_ids: Iterable[int],
    data_bytes: int = RING_DATA_BYTES,
    ring_header: int = RING_HEADER_BYTES,
    alignment: int = RING_ALIGNMENT,
    base: int = 0,
) -> list[RingLayout]:
    """Rings one after another from `base`: each a ring header then its data, each start aligned."""
    if alignment < 1 or data_bytes < HEADER_LEN or ring_header < 0:
        raise ValueError("a ring needs alignment >= 1, a header size >= 0 and room for one record header")
    layouts, at = [], base
    for ring_id in ring_ids:
        at = -(-at // alignment) * alignment
        layouts.append(
            RingLayout(
                ring_id=ring_id,
                arena_offset=at,
                header_offset=at,
                data_offset=at + ring_header,
                data_capacity=data_bytes,
                alignment=alignment,
            )
        )
        at += ring_header + data_bytes
    return layouts


def object_spec(max_extent: int = OBJECT_MAX_EXTENT, alignment: int = OBJECT_ALIGNMENT) -> dict[str, Any]:
    """`InstallRing.object_spec` as swactor's node sends it for token or activation objects of i32 words."""
    return {
        "kind": "token_or_activation",
        "max_extent": max_extent,
        "dtype_family": "i32",
        "dtype_width_bytes": 4,
        "layout": "linear",
        "alignment": alignment,
        "sequence_policy": "strict_increasing",
    }
