"""The worker control wire (contract §8): typed messages and a strict JSON-lines codec. Pure.

Messages are frozen, keyword-only dataclasses that validate their fields on construction, so a message
that exists is a valid one. Decoding is strict: invalid JSON, an unknown type, a forbidden top-level key
(`payload`, `bytes`, `data`: bulk data travels in rings) or a field of the wrong type is a ProtocolFault
naming the line. Readers accept `generation` for `worker_generation` and `handle` for `device_handle`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

RING_HELPER_ABI = 1
FORBIDDEN_KEYS = frozenset({"payload", "bytes", "data"})
ALIASES = {"generation": "worker_generation", "handle": "device_handle"}
MAX_LINE = 1 << 20


class ProtocolFault(ValueError):
    """The peer broke the wire. `line` is the offending text (escaped, cut to 200 characters)."""

    def __init__(self, reason: str, line: bytes | str = b"", line_no: int | None = None) -> None:
        text = line if isinstance(line, str) else line.decode("utf-8", "backslashreplace")
        shown = text.encode("unicode_escape").decode("ascii")
        shown = shown if len(shown) <= 200 else shown[:200] + "…"
        where = f"line {line_no}" if line_no is not None else "line"
        super().__init__(f"{reason} ({where}: {shown!r})")
        self.reason = reason
        self.line_no = line_no


@dataclass(frozen=True, kw_only=True)
class DeviceHandle:
    worker_generation: int
    id: int

    def __post_init__(self) -> None:
        _check_fields(self)


class Message:
    """Base of every wire message; `type` is the class name."""

    sender: ClassVar[str]  # "controller" (a command) or "worker" (an event)

    def __post_init__(self) -> None:
        _check_fields(self)

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": type(self).__name__}
        doc.update(dataclasses.asdict(self))  # type: ignore[call-overload]
        return doc


def _check(value: Any, hint: Any, path: str) -> None:
    origin = typing.get_origin(hint)
    if hint is Any:
        return
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise TypeError(f"{path} must be one of {list(typing.get_args(hint))}, not {value!r}")
        return
    if origin in (types.UnionType, typing.Union):
        errors = []
        for arg in typing.get_args(hint):
            try:
                _check(value, arg, path)
                return
            except TypeError as exc:
                errors.append(str(exc))
        raise TypeError(errors[0])
    if hint is type(None):
        if value is not None:
            raise TypeError(f"{path} must be null")
        return
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"{path} must be a list, not {type(value).__name__}")
        (item,) = typing.get_args(hint) or (Any,)
        for i, v in enumerate(value):
            _check(v, item, f"{path}[{i}]")
        return
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{path} must be an object, not {type(value).__name__}")
        return
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{path} must be an integer, not {type(value).__name__}")
        return
    if hint is DeviceHandle:
        if not isinstance(value, DeviceHandle):
            raise TypeError(f"{path} must be a device handle")
        return
    if not isinstance(value, hint):
        raise TypeError(f"{path} must be {hint.__name__}, not {type(value).__name__}")


def _check_fields(obj: Any) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        _check(getattr(obj, f.name), hints[f.name], f.name)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0 and f.name != "count":
            raise TypeError(f"{f.name} must not be negative")


class Command(Message):
    sender = "controller"


class Event(Message):
    sender = "worker"


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True, kw_only=True)
class InitializeWorker(Command):
    worker_generation: int
    arena_ceiling: int
    required_ring_helper_abi: int
    backend: str


@dataclass(frozen=True, kw_only=True)
class ConfigureRole(Command):
    role_id: str
    config: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class InstallRing(Command):
    ring_id: int
    edge_id: str
    port_id: str
    direction: Literal["ingress", "egress"]
    layout: dict[str, Any]
    object_spec: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class RingReadable(Command):
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class ExecuteStep(Command):
    role_id: str
    step_id: int
    inputs: list[DeviceHandle]
    outputs: list[int]  # egress ring ids, one object produced on each
    runtime: dict[str, Any]
    release_inputs_after: bool


@dataclass(frozen=True, kw_only=True)
class ReleaseDeviceObject(Command):
    device_handle: DeviceHandle


@dataclass(frozen=True, kw_only=True)
class UninstallRing(Command):
    ring_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ShutdownWorker(Command):
    mode: Literal["Graceful", "AbortInFlight"]


# ------------------------------------------------------------------------------------------------ events
@dataclass(frozen=True, kw_only=True)
class WorkerReady(Event):
    pid: int
    worker_generation: int
    ring_helper_abi: int
    backend: str


@dataclass(frozen=True, kw_only=True)
class RoleConfigured(Event):
    role_id: str


@dataclass(frozen=True, kw_only=True)
class RoleFailed(Event):
    role_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class RingInstalled(Event):
    ring_id: int
    edge_id: str
    port_id: str


@dataclass(frozen=True, kw_only=True)
class ObjectLoaded(Event):
    ring_id: int
    edge_id: str
    port_id: str
    object_id: int
    sequence: int
    extent: int
    device_handle: DeviceHandle


@dataclass(frozen=True, kw_only=True)
class ObjectProduced(Event):
    role_id: str
    step_id: int
    ring_id: int
    edge_id: str
    port_id: str
    object_id: int
    sequence: int
    extent: int
    device_handle: DeviceHandle


@dataclass(frozen=True, kw_only=True)
class StepCompleted(Event):
    role_id: str
    step_id: int


@dataclass(frozen=True, kw_only=True)
class StepFailed(Event):
    role_id: str
    step_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class DeviceObjectReleased(Event):
    device_handle: DeviceHandle


@dataclass(frozen=True, kw_only=True)
class ReleaseFailed(Event):
    device_handle: DeviceHandle
    reason: str


@dataclass(frozen=True, kw_only=True)
class RingQuiesced(Event):
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class WorkerStopped(Event):
    reason: str


@dataclass(frozen=True, kw_only=True)
class WorkerFatal(Event):
    reason: str


COMMANDS: dict[str, type[Message]] = {
    c.__name__: c
    for c in (
        InitializeWorker,
        ConfigureRole,
        InstallRing,
        RingReadable,
        ExecuteStep,
        ReleaseDeviceObject,
        UninstallRing,
        ShutdownWorker,
    )
}
EVENTS: dict[str, type[Message]] = {
    c.__name__: c
    for c in (
        WorkerReady,
        RoleConfigured,
        RoleFailed,
        RingInstalled,
        ObjectLoaded,
        ObjectProduced,
        StepCompleted,
        StepFailed,
        DeviceObjectReleased,
        ReleaseFailed,
        RingQuiesced,
        WorkerStopped,
        WorkerFatal,
    )
}


def encode(message: Message) -> bytes:
    """Compact JSON, one line, `type` first."""
    return json.dumps(message.to_wire(), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _handle(value: Any, path: str) -> DeviceHandle:
    if not isinstance(value, dict):
        raise TypeError(f"{path} must be an object with worker_generation and id")
    doc = {ALIASES.get(k, k): v for k, v in value.items()}
    if set(doc) != {"worker_generation", "id"} or len(doc) != len(value):
        raise TypeError(f"{path} must have exactly worker_generation (or generation) and id")
    return DeviceHandle(worker_generation=doc["worker_generation"], id=doc["id"])


def decode(line: bytes | str, kinds: dict[str, type[Message]], line_no: int | None = None) -> Message:
    try:
        doc = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolFault(f"InvalidJson: {exc.msg if hasattr(exc, 'msg') else exc}", line, line_no) from None
    if not isinstance(doc, dict):
        raise ProtocolFault("InvalidJson: a message must be a JSON object", line, line_no)
    if forbidden := sorted(FORBIDDEN_KEYS & set(doc)):
        raise ProtocolFault(f"ForbiddenKey: {', '.join(forbidden)} (bulk data travels in rings)", line, line_no)
    kind = doc.pop("type", None)
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolFault(f"UnknownCommand: unknown message type {kind!r}", line, line_no)
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        name = ALIASES.get(str(key), str(key))
        if name in fields:
            raise ProtocolFault(f"InvalidField: {name} given twice (once as an alias)", line, line_no)
        fields[name] = value
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if missing := sorted(names - set(fields)):
        raise ProtocolFault(f"InvalidField: {kind} lacks {', '.join(missing)}", line, line_no)
    if extra := sorted(set(fields) - names):
        raise ProtocolFault(f"InvalidField: {kind} has no field {', '.join(extra)}", line, line_no)
    try:
        for name in ("device_handle",):
            if name in fields:
                fields[name] = _handle(fields[name], name)
        if "inputs" in fields and isinstance(fields["inputs"], list):
            fields["inputs"] = [_handle(v, f"inputs[{i}]") for i, v in enumerate(fields["inputs"])]
        return cls(**fields)
    except TypeError as exc:
        raise ProtocolFault(f"InvalidField: {exc}", line, line_no) from None


class NeedData:
    """Returned by LineDecoder.next() when no complete line is buffered yet."""


NEED_DATA = NeedData()


class LineDecoder:
    """Bytes in, messages out. "Not enough input yet" is a return value (NEED_DATA), not an exception.
    Faults are sticky: after one, every call raises it again."""

    def __init__(self, kinds: dict[str, type[Message]]) -> None:
        self.kinds = kinds
        self._buf = bytearray()
        self._line_no = 0
        self._fault: ProtocolFault | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Message | NeedData:
        if self._fault is not None:
            raise self._fault
        nl = self._buf.find(b"\n")
        if nl < 0:
            if len(self._buf) > MAX_LINE:
                self._fault = ProtocolFault(f"InvalidJson: line longer than {MAX_LINE} bytes", bytes(self._buf[:200]))
                raise self._fault
            return NEED_DATA
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]
        self._line_no += 1
        if not line.strip():
            return self.next()
        try:
            return decode(line, self.kinds, self._line_no)
        except ProtocolFault as exc:
            self._fault = exc
            raise
