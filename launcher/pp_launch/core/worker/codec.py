"""The worker control wire (docs/worker-wire.md): typed messages and a JSON-lines codec. Pure.

The JSON form of swactor's `WorkerCommand`/`WorkerEvent` as swactor's own JSON workers speak it: integer
ids, an object `backend`, binding objects in `ExecuteStep`, the ring fields (and `committed_bytes`) on
`ObjectProduced`, and the unsolicited `RingFault`/`ObjectFailed`/`RingReadable`/`RingWritable` events.

Messages are frozen, keyword-only dataclasses that validate their fields on construction, so a message
that exists is a valid one. Decoding is strict where the wire is (invalid JSON, an unknown `type`, a
forbidden top-level key, a missing field or a field of the wrong type is a ProtocolFault naming the line)
and lenient where swactor's workers are: unknown fields are ignored, except on `WorkerFatal`, which keeps
them as `details` so the fatal path carries what the worker said. Readers accept `generation` for
`worker_generation` and `handle` for `device_handle`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pp_launch.core.errors import PpLaunchError

RING_HELPER_ABI = 1
FORBIDDEN_KEYS = frozenset({"payload", "bytes", "data"})
ALIASES = {"generation": "worker_generation", "handle": "device_handle"}
MAX_LINE = 1 << 20
CPU_BACKEND: dict[str, Any] = {"device": "CPU"}


class ProtocolFault(PpLaunchError):
    """The peer broke the wire (the peer's fault). `line` is the offending text, escaped, cut to 200 characters."""

    def __init__(self, reason: str, line: bytes | str = b"", line_no: int | None = None) -> None:
        text = line if isinstance(line, str) else line.decode("utf-8", "backslashreplace")
        shown = text.encode("unicode_escape").decode("ascii")
        shown = shown if len(shown) <= 200 else shown[:200] + "…"
        where = f"line {line_no}" if line_no is not None else "line"
        super().__init__(f"{reason} ({where}: {shown!r})")
        self.reason = reason
        self.line_no = line_no


class _Checked:
    """A frozen dataclass whose fields are checked against their type hints on construction."""

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True)
class DeviceHandle(_Checked):
    worker_generation: int
    id: int


@dataclass(frozen=True, kw_only=True)
class InputBinding(_Checked):
    """An `ExecuteStep` input: a device object the worker holds."""

    device_handle: DeviceHandle
    object_id: int
    sequence: int
    port_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class OutputBinding(_Checked):
    """An `ExecuteStep` output: the object the step must write to an egress ring (`extent`: its payload bytes)."""

    ring_id: int
    object_id: int
    sequence: int
    flags: int = 0
    port_id: str | None = None
    extent: int | None = None


NESTED: tuple[type, ...] = (DeviceHandle, InputBinding, OutputBinding)


class Message(_Checked):
    """Base of every wire message. `TYPE` is the wire's `type` (the class name unless a class says otherwise)."""

    TYPE: ClassVar[str]
    sender: ClassVar[str]  # "controller" (a command) or "worker" (an event)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE" not in cls.__dict__:
            cls.TYPE = cls.__name__

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": self.TYPE}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "details":
                doc.update({k: v for k, v in value.items() if k not in doc})
            elif value is not None:
                doc[f.name] = _plain(value)
        return doc


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {name: _plain(v) for name, v in fields if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _check(value: Any, hint: Any, path: str) -> None:
    """TypeError, naming `path`, when `value` (decoded JSON) is not of the field's type `hint`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise TypeError(f"{path} must be one of {list(typing.get_args(hint))}, not {value!r}")
    elif origin in (types.UnionType, typing.Union):
        _check_union(value, hint, path)
    elif hint is type(None):
        if value is not None:
            raise TypeError(f"{path} must be null")
    elif origin is list:
        _check_list(value, hint, path)
    elif origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{path} must be an object, not {type(value).__name__}")
    elif hint is int:
        _check_count(value, path)
    elif not isinstance(value, hint):
        raise TypeError(f"{path} must be {hint.__name__}, not {type(value).__name__}")


def _check_union(value: Any, hint: Any, path: str) -> None:
    """One of the union's types; else the first one's complaint."""
    errors = []
    for arg in typing.get_args(hint):
        try:
            _check(value, arg, path)
            return
        except TypeError as exc:
            errors.append(str(exc))
    raise TypeError(errors[0])


def _check_list(value: Any, hint: Any, path: str) -> None:
    if not isinstance(value, list):
        raise TypeError(f"{path} must be a list, not {type(value).__name__}")
    (item,) = typing.get_args(hint) or (Any,)
    for i, v in enumerate(value):
        _check(v, item, f"{path}[{i}]")


def _check_count(value: Any, path: str) -> None:
    """An int field: a JSON integer (not a boolean), never negative."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{path} must be an integer, not {type(value).__name__}")
    if value < 0:
        raise TypeError(f"{path} must not be negative")


def _check_fields(obj: Any) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        _check(getattr(obj, f.name), hints[f.name], f.name)


class Command(Message):
    sender = "controller"


class Event(Message):
    sender = "worker"


Direction = Literal["ingress", "egress"]
ShutdownMode = Literal["Graceful", "AbortInFlight"]


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True, kw_only=True)
class InitializeWorker(Command):
    worker_generation: int
    arena_ceiling: int
    required_ring_helper_abi: int
    backend: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ConfigureRole(Command):
    role_id: int
    config: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class InstallRing(Command):
    """Swactor's `InstallRingSpec`, `"InstallRing"` on the wire."""

    ring_id: int
    edge_id: int
    port_id: str
    direction: Direction
    layout: dict[str, Any]
    object_spec: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class RingReadable(Command):
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class RingWritable(Command):
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class ExecuteStep(Command):
    """Swactor's `ExecuteStepSpec`, `"ExecuteStep"` on the wire."""

    role_id: int
    step_id: int
    inputs: list[InputBinding]
    outputs: list[OutputBinding]
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
    mode: ShutdownMode


# ------------------------------------------------------------------------------------------------ events
@dataclass(frozen=True, kw_only=True)
class WorkerReady(Event):
    pid: int
    worker_generation: int
    ring_helper_abi: int
    backend: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class RoleConfigured(Event):
    role_id: int


@dataclass(frozen=True, kw_only=True)
class RoleFailed(Event):
    role_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RingInstalled(Event):
    """Swactor's `RingInstalledForEdge`, `"RingInstalled"` on the wire."""

    ring_id: int
    edge_id: int
    port_id: str


@dataclass(frozen=True, kw_only=True)
class ObjectLoaded(Event):
    """Swactor's `ObjectLoadedFromRing`, `"ObjectLoaded"` on the wire."""

    ring_id: int
    edge_id: int
    port_id: str
    object_id: int
    sequence: int
    extent: int
    device_handle: DeviceHandle


@dataclass(frozen=True, kw_only=True)
class ObjectProduced(Event):
    """Swactor's `ObjectProducedToRing`, `"ObjectProduced"` on the wire: what a step committed to a ring."""

    ring_id: int
    edge_id: int
    port_id: str
    object_id: int
    sequence: int
    committed_bytes: int


@dataclass(frozen=True, kw_only=True)
class StepCompleted(Event):
    """Swactor's `StepCompletedForRole`, `"StepCompleted"` on the wire."""

    role_id: int
    step_id: int


@dataclass(frozen=True, kw_only=True)
class StepFailed(Event):
    role_id: int
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
class RingFault(Event):
    ring_id: int
    edge_id: int
    port_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ObjectFailed(Event):
    ring_id: int
    edge_id: int
    port_id: str
    reason: str
    object_id: int | None = None
    sequence: int | None = None


@dataclass(frozen=True, kw_only=True)
class RingBecameReadable(Event):
    """Swactor's `WorkerEvent::RingReadable` (unsolicited)."""

    TYPE = "RingReadable"
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class RingBecameWritable(Event):
    """Swactor's `WorkerEvent::RingWritable` (unsolicited)."""

    TYPE = "RingWritable"
    ring_id: int


@dataclass(frozen=True, kw_only=True)
class WorkerStopped(Event):
    reason: str


@dataclass(frozen=True, kw_only=True)
class WorkerFatal(Event):
    """Always the fatal path; `details` keeps every other field the worker sent."""

    reason: str
    details: dict[str, Any] = field(default_factory=dict)


def _registry(*classes: type[Message]) -> dict[str, type[Message]]:
    return {c.TYPE: c for c in classes}


COMMANDS = _registry(
    InitializeWorker,
    ConfigureRole,
    InstallRing,
    RingReadable,
    RingWritable,
    ExecuteStep,
    ReleaseDeviceObject,
    UninstallRing,
    ShutdownWorker,
)
EVENTS = _registry(
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
    RingFault,
    ObjectFailed,
    RingBecameReadable,
    RingBecameWritable,
    WorkerStopped,
    WorkerFatal,
)


def encode(message: Message) -> bytes:
    """Compact JSON, one line, `type` first."""
    return json.dumps(message.to_wire(), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _build(cls: type, value: Any, path: str, keep_extra: bool = False) -> Any:
    """An object of the wire (a dict) as `cls`: aliases resolved, required fields present, unknown fields ignored
    (kept in `details` where `keep_extra`), nested objects built the same way."""
    if not isinstance(value, dict):
        raise TypeError(f"{path} must be an object, not {type(value).__name__}")
    fields_: dict[str, Any] = {}
    for key, item in value.items():
        name = ALIASES.get(str(key), str(key))
        if name in fields_:
            raise TypeError(f"{path}{name} given twice (once as an alias)")
        fields_[name] = item
    known = {f.name: f for f in dataclasses.fields(cls)}
    required = {
        n for n, f in known.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    if missing := sorted(required - set(fields_)):
        raise TypeError(f"{path or cls.__name__ + ' '}lacks {', '.join(missing)}".replace("  ", " "))
    hints = typing.get_type_hints(cls)
    args: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, item in fields_.items():
        if name not in known or name == "details":
            extra[name] = item
            continue
        hint = hints[name]
        if hint in NESTED:
            item = _build(hint, item, f"{path}{name}.")
        elif typing.get_origin(hint) is list and typing.get_args(hint)[0] in NESTED:
            if not isinstance(item, list):
                raise TypeError(f"{path}{name} must be a list, not {type(item).__name__}")
            item = [_build(typing.get_args(hint)[0], v, f"{path}{name}[{i}].") for i, v in enumerate(item)]
        args[name] = item
    if keep_extra:
        args["details"] = extra
    return cls(**args)


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
    try:
        message: Message = _build(cls, doc, "", keep_extra=cls is WorkerFatal)
    except TypeError as exc:
        raise ProtocolFault(f"InvalidField: {kind}: {exc}", line, line_no) from None
    return message


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
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_LINE:
                    self._fault = ProtocolFault(
                        f"InvalidJson: line longer than {MAX_LINE} bytes", bytes(self._buf[:200])
                    )
                    raise self._fault
                return NEED_DATA
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            self._line_no += 1
            if line.strip():
                break
        try:
            return decode(line, self.kinds, self._line_no)
        except ProtocolFault as exc:
            self._fault = exc
            raise
