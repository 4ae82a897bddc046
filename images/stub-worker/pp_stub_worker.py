"""STUB_MODE=worker: the worker end of the worker-control wire (docs/worker-wire.md), standard library only.

Commands arrive as JSON lines on stdin; events leave as JSON lines on stdout; stderr is logs only. Ids are
integers and `backend` an object, as swactor's JSON workers speak them; unknown fields are ignored. The worker
behaves as swactor's node expects (docs/worker-wire.md): the node writes each ingress record (the 40-byte `MO01`
header, then i32 words) at the ingress ring's `data_offset` and sends `RingReadable`; the worker reads it and answers
`ObjectLoaded`. A step writes its output record at the egress ring's `data_offset` and reports the whole record
(header included) as `committed_bytes`. A handle of an older generation used as a step input is fatal. The arena
is the inherited memory file `SWACTOR_ARENA_FD` of `SWACTOR_ARENA_BYTES` bytes when given, else a file of its own
in /dev/shm. End of stdin means the controller is gone: exit 0.

STUB_WORKER_MISBEHAVE=<what> breaks one rule on purpose, for `pp-launch worker check` to catch:
  sequence        ObjectLoaded reports each sequence one higher than the record's
  release         ReleaseDeviceObject gets no answer
  stale           a device handle of an old generation is accepted as a step input
  stale-on-release-only
                  an old handle is refused on ReleaseDeviceObject only, not where it is used (ExecuteStep)
  own-input       RingReadable makes an input of its own instead of reading the node's record
  slots           records at data_offset + (sequence % slots) * stride instead of one at data_offset
  payload-bytes   committed_bytes counts the payload alone, not the whole record
  invalid_json    invalid JSON is ignored instead of fatal
  shutdown        exits 3 after WorkerStopped
  eof             keeps running after end of stdin
  string-ids      speaks the old wire: ids as strings and backend as "cpu" (swactor's workers refuse it)
  earlier-wire    an earlier swactor worker: needs `helper_abi_version` in InitializeWorker and dies without it
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO, TextIO

HEADER = struct.Struct("<4sHHQQQII")  # 40 bytes
MAGIC, VERSION = b"MO01", 1
RING_HELPER_ABI = 1
FORBIDDEN = {"payload", "bytes", "data"}
ALIASES = {"generation": "worker_generation", "handle": "device_handle"}


ERR: list[TextIO] = []  # where logs go: the serve() call's err, else stderr


def log(msg: str) -> None:
    print(f"stub-worker[{os.getpid()}] {msg}", file=ERR[-1] if ERR else sys.stderr, flush=True)


def emitter(out: TextIO) -> Callable[..., None]:
    def emit(kind: str, **fields: object) -> None:
        out.write(json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n")
        out.flush()

    return emit


class Fatal(Exception):
    def __init__(self, reason: str, **fields: object) -> None:
        super().__init__(reason)
        self.reason, self.fields = reason, fields


class Arena:
    def __init__(self, size: int, env: Mapping[str, str]) -> None:
        inherited = env.get("SWACTOR_ARENA_FD")
        if inherited:
            self.path = ""
            self.fd = int(inherited)
            available = int(env.get("SWACTOR_ARENA_BYTES", "0") or 0)
            if size > available:
                raise Fatal("ArenaTooSmall", arena_ceiling=size, arena_bytes=available)
            log(f"arena: inherited descriptor {self.fd}, {available} bytes")
        else:
            self.path = f"/dev/shm/pp-stub-arena-{os.getpid()}"
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(self.fd, max(size, HEADER.size))
        self.map = mmap.mmap(self.fd, max(size, HEADER.size))
        self.size = size

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
        if self.path:
            os.unlink(self.path)


class Ring:
    def __init__(self, cmd: dict, arena: Arena, misbehave: str = "") -> None:
        self.ring_id, self.edge_id, self.port_id = int(cmd["ring_id"]), int(cmd["edge_id"]), str(cmd["port_id"])
        self.direction = cmd["direction"]
        layout, spec = cmd["layout"], cmd["object_spec"]
        self.max_extent = int(spec["max_extent"])
        self.alignment = int(spec.get("alignment", 1)) or 1
        self.offset = int(layout["data_offset"])
        self.capacity = int(layout["data_capacity"])
        if self.max_extent < 1 or self.offset < 0 or self.offset + self.capacity > arena.size:
            raise Fatal("ObjectExtentInvalid", ring_id=self.ring_id)
        if self.capacity < HEADER.size + self.max_extent:
            raise Fatal("ObjectExtentInvalid", ring_id=self.ring_id, data_capacity=self.capacity)
        self.next_sequence = 0
        self.misbehave = misbehave

    def at(self, sequence: int) -> int:
        """Where this ring's record is: always its data_offset (one record per ring)."""
        if self.misbehave == "slots":
            return self.offset + (sequence % 4) * (HEADER.size + self.max_extent)
        return self.offset

    def read(self, arena: Arena) -> tuple[int, int, bytes, int]:
        """The node's record: (object id, sequence, payload, flags), checked as swactor's worker checks it."""
        base = self.at(self.next_sequence)
        if base + HEADER.size > arena.size:
            raise Fatal("InvalidObjectHeader", ring_id=self.ring_id)
        magic, version, hlen, object_id, sequence, extent, flags, _ = HEADER.unpack_from(arena.map, base)
        if (magic, version, hlen) != (MAGIC, VERSION, HEADER.size):
            raise Fatal("InvalidObjectHeader", ring_id=self.ring_id)
        if extent > self.max_extent or extent % self.alignment:
            raise Fatal("ObjectExtentInvalid", ring_id=self.ring_id, object_id=object_id, extent=extent)
        if sequence != self.next_sequence:
            raise Fatal("SequenceViolation", ring_id=self.ring_id, expected=self.next_sequence, actual=sequence)
        self.next_sequence += 1
        return object_id, sequence, bytes(arena.map[base + HEADER.size : base + HEADER.size + extent]), flags

    def write(self, arena: Arena, object_id: int, sequence: int, payload: bytes, flags: int) -> int:
        """Our output record at data_offset; returns the bytes committed (the whole record)."""
        if len(payload) > self.max_extent:
            raise Fatal("OutputExtentInvalid", ring_id=self.ring_id, extent=len(payload))
        if sequence != self.next_sequence:
            raise Fatal("SequenceViolation", ring_id=self.ring_id, expected=self.next_sequence, actual=sequence)
        base = self.at(sequence)
        record = HEADER.pack(MAGIC, VERSION, HEADER.size, object_id, sequence, len(payload), flags, 0) + payload
        arena.map[base : base + len(record)] = record
        self.next_sequence += 1
        return len(payload) if self.misbehave == "payload-bytes" else len(record)


def words(payload: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(payload) // 4}i", payload[: len(payload) // 4 * 4]))


class Worker:
    def __init__(self, emit: Callable[..., None], env: Mapping[str, str], misbehave: str = "") -> None:
        self.emit, self.env, self.misbehave = emit, env, misbehave
        self.generation: int | None = None
        self.backend: object = {"device": "CPU"}
        self.arena: Arena | None = None
        self.rings: dict[int, Ring] = {}
        self.roles: dict[int, dict] = {}
        self.objects: dict[int, tuple[int, int, bytes]] = {}  # handle id -> (object id, sequence, payload)
        self.next_handle = 1

    def _id(self, value: object) -> object:
        """An id as this worker sends it: an integer, or on the old wire (misbehave=string-ids) a string."""
        return str(value) if self.misbehave == "string-ids" else value

    def handle_of(self, value: object, used: bool) -> int:
        """A device handle's id; one of an older generation is fatal where it is used (a step input)."""
        if not isinstance(value, dict):
            raise Fatal("InvalidJson")
        doc = {ALIASES.get(k, k): v for k, v in value.items()}
        stale = doc.get("worker_generation") != self.generation
        refuse = (not used) if self.misbehave == "stale-on-release-only" else used and self.misbehave != "stale"
        if stale and refuse:
            raise Fatal("OldGenerationHandle", handle=value)
        return int(doc["id"])

    def ring_fields(self, ring: Ring) -> dict:
        return {"ring_id": self._id(ring.ring_id), "edge_id": self._id(ring.edge_id), "port_id": ring.port_id}

    def ring(self, ring_id: object, direction: str) -> Ring:
        ring = self.rings.get(int(ring_id))  # type: ignore[call-overload]
        if ring is None or ring.direction != direction:
            raise Fatal("WrongRingDirection" if ring else "UnknownRing", ring_id=ring_id)
        return ring

    def load(self, ring: Ring) -> dict:
        if self.misbehave == "own-input":  # the old habit: an input of the worker's own making
            object_id, sequence, payload = 1000 + self.next_handle, ring.next_sequence, struct.pack("<i", 7)
            ring.next_sequence += 1
        else:
            object_id, sequence, payload, _ = ring.read(self.arena)  # type: ignore[arg-type]
        handle = self.next_handle
        self.next_handle += 1
        self.objects[handle] = (object_id, sequence, payload)
        return {
            **self.ring_fields(ring),
            "object_id": self._id(object_id),
            "sequence": sequence + (1 if self.misbehave == "sequence" else 0),
            "extent": len(payload),
            "device_handle": {"worker_generation": self.generation, "id": handle},
        }

    def execute(self, cmd: dict) -> None:
        role_id, step_id = int(cmd["role_id"]), int(cmd["step_id"])
        handles = [self.handle_of(b.get("device_handle", b.get("handle")), used=True) for b in cmd["inputs"]]
        role = self.roles.get(role_id)
        if role is None:
            self.emit("StepFailed", role_id=self._id(role_id), step_id=step_id, reason="RoleUnavailable")
            return
        if any(h not in self.objects for h in handles):
            self.emit("StepFailed", role_id=self._id(role_id), step_id=step_id, reason="InvalidInputHandle")
            return
        total = sum(sum(words(self.objects[h][2])) for h in handles)
        value = (total + int(role.get("stage_index", 0)) + 1) & 0x7FFFFFFF  # a stand-in for the stage's layers
        for binding in cmd["outputs"]:
            ring = self.ring(binding["ring_id"], "egress")
            object_id, sequence = int(binding["object_id"]), int(binding["sequence"])
            committed = ring.write(
                self.arena,
                object_id,
                sequence,
                struct.pack("<i", value),  # type: ignore[arg-type]
                int(binding.get("flags", 0)),
            )
            self.emit(
                "ObjectProduced",
                **self.ring_fields(ring),
                object_id=self._id(object_id),
                sequence=sequence,
                committed_bytes=committed,
            )
        if cmd.get("release_inputs_after"):
            for h in handles:
                self.objects.pop(h, None)
        self.emit("StepCompleted", role_id=self._id(role_id), step_id=step_id)

    def initialize(self, cmd: dict) -> None:
        if self.misbehave == "earlier-wire" and "helper_abi_version" not in cmd:
            log("Traceback (most recent call last):\nKeyError: 'helper_abi_version'")
            raise SystemExit(1)
        if cmd.get("required_ring_helper_abi") != RING_HELPER_ABI:
            raise Fatal("UnsupportedHelperAbi", required_ring_helper_abi=cmd.get("required_ring_helper_abi"))
        self.generation = int(cmd.get("worker_generation", cmd.get("generation")))
        requested = cmd.get("backend") if isinstance(cmd.get("backend"), dict) else {}
        self.backend = {"device": self.env.get("DEV") or requested.get("device", "CPU")}  # a DEV given wins (§8a)
        if self.misbehave == "string-ids":
            self.backend = "cpu"
        self.arena = Arena(int(cmd["arena_ceiling"]), self.env)
        self.emit(
            "WorkerReady",
            pid=os.getpid(),
            worker_generation=self.generation,
            ring_helper_abi=RING_HELPER_ABI,
            backend=self.backend,
        )

    def dispatch(self, cmd: dict) -> bool:
        """Handle one command; False when the worker should exit (after a graceful shutdown)."""
        kind = cmd.get("type")
        if self.generation is None and kind != "InitializeWorker":
            raise Fatal("NotInitialized")
        if kind == "InitializeWorker":
            self.initialize(cmd)
        elif kind == "ConfigureRole":
            role_id, config = int(cmd["role_id"]), cmd["config"]
            if not isinstance(config, dict):
                self.emit("RoleFailed", role_id=self._id(role_id), reason="InvalidConfig")
            elif config.get("fail"):
                self.emit("RoleFailed", role_id=self._id(role_id), reason=str(config["fail"]))
            else:
                for name in ("run_id", "stage_index", "layer_start", "layer_end_exclusive"):
                    int(config.get(name, 0))  # integers, as swactor's worker reads them: "conformance" is a fault
                self.roles[role_id] = config
                self.emit("RoleConfigured", role_id=self._id(role_id))
        elif kind == "InstallRing":
            ring = Ring(cmd, self.arena, self.misbehave)  # type: ignore[arg-type]
            self.rings[ring.ring_id] = ring
            self.emit("RingInstalled", **self.ring_fields(ring))
        elif kind == "RingReadable":
            self.emit("ObjectLoaded", **self.load(self.ring(cmd["ring_id"], "ingress")))
        elif kind == "RingWritable":
            self.emit("RingWritable", ring_id=self._id(self.ring(cmd["ring_id"], "egress").ring_id))
        elif kind == "ExecuteStep":
            self.execute(cmd)
        elif kind == "ReleaseDeviceObject":
            raw = cmd.get("device_handle", cmd.get("handle"))
            handle_id = self.handle_of(raw, used=False)
            if self.misbehave == "release":
                return True
            if self.objects.pop(handle_id, None) is None:
                self.emit("ReleaseFailed", device_handle=raw, reason="UnknownHandle")
            else:
                self.emit("DeviceObjectReleased", device_handle=raw)
        elif kind == "UninstallRing":
            self.rings.pop(int(cmd["ring_id"]), None)
            self.emit("RingQuiesced", ring_id=self._id(cmd["ring_id"]))
        elif kind == "ShutdownWorker":
            self.emit("WorkerStopped", reason=str(cmd.get("mode", "Graceful")))
            return False
        else:
            raise Fatal("UnknownCommand", command=kind)
        return True


def serve(
    inp: BinaryIO | None = None,
    out: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    err: TextIO | None = None,
) -> int:
    """Commands from `inp` (stdin), events to `out` (stdout), logs to `err` (stderr); `env` is the container's."""
    if err is not None:
        ERR[:] = [err]
    inp = inp if inp is not None else sys.stdin.buffer
    env = env if env is not None else os.environ
    misbehave = env.get("STUB_WORKER_MISBEHAVE", "")
    emit = emitter(out if out is not None else sys.stdout)
    worker = Worker(emit, env, misbehave)
    log("speaking the worker-control wire on stdin/stdout")
    try:
        for raw in inp:
            if not raw.strip():
                continue
            try:
                cmd = json.loads(raw)
                if not isinstance(cmd, dict) or FORBIDDEN & set(cmd):
                    raise ValueError("not a command object")
            except ValueError:
                if misbehave == "invalid_json":
                    continue
                raise Fatal("InvalidJson") from None
            try:
                if not worker.dispatch(cmd):
                    return 3 if misbehave == "shutdown" else 0
            except (KeyError, TypeError, ValueError) as exc:
                raise Fatal("InvalidCommand", error=f"{type(exc).__name__}: {exc}") from None
        log("end of stdin: the controller is gone, exiting")
        if misbehave == "eof":
            while True:
                time.sleep(1)
        return 0
    except Fatal as exc:
        emit("WorkerFatal", reason=exc.reason, **exc.fields, worker_generation=worker.generation, pid=os.getpid())
        return 1
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        if worker.arena is not None:
            worker.arena.close()
