"""STUB_MODE=worker: the worker end of the worker-control wire (contract §8), standard library only.

Commands arrive as JSON lines on stdin; events leave as JSON lines on stdout; stderr is logs only. Ids are
integers and `backend` an object, as swactor's JSON workers speak them; unknown fields are ignored. Objects
live as ring records in the arena, each with the seed's 40-byte header: magic `MO01`, version 1, header
length 40, object id, sequence, extent, flags. The arena is the inherited memory file `SWACTOR_ARENA_FD`
of `SWACTOR_ARENA_BYTES` bytes when given (as pp-launch's worker driver gives it), else a file of its own in
/dev/shm. Sequences increase strictly from 0 per ring. End of stdin means the controller is gone: exit.

STUB_WORKER_MISBEHAVE=<what> breaks one rule on purpose, for `pp-launch worker check` to catch:
  sequence      ObjectLoaded sequences start at 1
  release       ReleaseDeviceObject gets no answer
  stale         a device handle of an old generation is accepted instead of fatal
  invalid_json  invalid JSON is ignored instead of fatal
  shutdown      exits 3 after WorkerStopped
  eof           keeps running after end of stdin
  string-ids    speaks the old wire: ids as strings and backend as "cpu" (swactor's workers refuse it)
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

HEADER = struct.Struct("<4sHHQQQI4x")  # 40 bytes
MAGIC, VERSION = b"MO01", 1
RING_HELPER_ABI = 1
FORBIDDEN = {"payload", "bytes", "data"}
ALIASES = {"generation": "worker_generation", "handle": "device_handle"}


def log(msg: str) -> None:
    print(f"stub-worker[{os.getpid()}] {msg}", file=sys.stderr, flush=True)


def emitter(out: TextIO) -> Callable[..., None]:
    def emit(kind: str, **fields: object) -> None:
        out.write(json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n")
        out.flush()

    return emit


class Fatal(Exception):
    pass


class Arena:
    def __init__(self, size: int, env: Mapping[str, str]) -> None:
        inherited = env.get("SWACTOR_ARENA_FD")
        if inherited:
            self.path = ""
            self.fd = int(inherited)
            available = int(env.get("SWACTOR_ARENA_BYTES", "0") or 0)
            if size > available:
                raise Fatal("ArenaTooSmall")
            log(f"arena: inherited descriptor {self.fd}, {available} bytes")
        else:
            self.path = f"/dev/shm/pp-stub-arena-{os.getpid()}"
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(self.fd, max(size, HEADER.size))
        self.map = mmap.mmap(self.fd, max(size, HEADER.size))
        self.size, self.used = size, 0

    def allocate(self, nbytes: int) -> int:
        if self.used + nbytes > self.size:
            raise Fatal("ArenaExhausted")
        offset, self.used = self.used, self.used + nbytes
        return offset

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
        if self.path:
            os.unlink(self.path)


class Ring:
    def __init__(self, cmd: dict, arena: Arena, misbehave: str = "") -> None:
        self.ring_id, self.edge_id, self.port_id = cmd["ring_id"], cmd["edge_id"], cmd["port_id"]
        self.direction = cmd["direction"]
        layout, spec = cmd["layout"], cmd["object_spec"]
        self.extent = int(spec.get("max_extent", spec.get("extent", 64)))
        if self.extent < 1:
            raise Fatal("ObjectExtentInvalid")
        self.stride = HEADER.size + self.extent
        if "data_capacity" in layout:  # the seed's layout: the ring's place in the arena
            self.slots = int(layout["data_capacity"]) // self.stride
            self.offset = int(layout.get("data_offset", 0))
            if self.slots < 1 or self.offset < 0 or self.offset + self.slots * self.stride > arena.size:
                raise Fatal("ObjectExtentInvalid")
        else:
            self.slots = int(layout.get("slots", 4))
            if self.slots < 1:
                raise Fatal("ObjectExtentInvalid")
            self.offset = arena.allocate(self.slots * self.stride)
        self.next_sequence = 1 if misbehave == "sequence" and self.direction == "ingress" else 0
        self.last_sequence = -1

    def write_record(self, arena: Arena, object_id: int, flags: int = 0) -> tuple[int, int]:
        """Write the next record; read it back and check it as a reader would. Returns (sequence, slot)."""
        sequence = self.next_sequence
        self.next_sequence += 1
        slot = self.offset + (sequence % self.slots) * self.stride
        arena.map[slot : slot + HEADER.size] = HEADER.pack(
            MAGIC, VERSION, HEADER.size, object_id, sequence, self.extent, flags
        )
        magic, version, hlen, oid, seq, extent, _ = HEADER.unpack_from(arena.map, slot)
        if (magic, version, hlen, oid) != (MAGIC, VERSION, HEADER.size, object_id):
            raise Fatal("ObjectExtentInvalid")
        if seq <= self.last_sequence:
            raise Fatal("SequenceViolation")
        if extent != self.extent:
            raise Fatal("ObjectExtentInvalid")
        self.last_sequence = seq
        return seq, slot


class Worker:
    def __init__(self, emit: Callable[..., None], env: Mapping[str, str], misbehave: str = "") -> None:
        self.emit, self.env, self.misbehave = emit, env, misbehave
        self.generation: int | None = None
        self.backend: object = {"device": "CPU"}
        self.arena: Arena | None = None
        self.rings: dict[int, Ring] = {}
        self.roles: dict[int, dict] = {}
        self.objects: dict[int, int] = {}  # device object id -> ring id
        self.next_object = 1

    def _id(self, value: object) -> object:
        """An id as this worker sends it: an integer, or on the old wire (misbehave=string-ids) a string."""
        return str(value) if self.misbehave == "string-ids" else value

    def handle_of(self, value: object) -> int:
        if not isinstance(value, dict):
            raise Fatal("InvalidJson")
        doc = {ALIASES.get(k, k): v for k, v in value.items()}
        if doc.get("worker_generation") != self.generation and self.misbehave != "stale":
            raise Fatal("OldGenerationHandle")
        return int(doc["id"])

    def ring_fields(self, ring: Ring) -> dict:
        return {"ring_id": self._id(ring.ring_id), "edge_id": self._id(ring.edge_id), "port_id": ring.port_id}

    def load(self, ring: Ring) -> dict:
        object_id = self.next_object
        self.next_object += 1
        sequence, _ = ring.write_record(self.arena, object_id)  # type: ignore[arg-type]
        self.objects[object_id] = ring.ring_id
        return {
            **self.ring_fields(ring),
            "object_id": self._id(object_id),
            "sequence": sequence,
            "extent": ring.extent,
            "device_handle": {"worker_generation": self.generation, "id": object_id},
        }

    def produce(self, ring: Ring, binding: dict) -> dict:
        object_id, flags = int(binding["object_id"]), int(binding.get("flags", 0))
        if int(binding["sequence"]) != ring.next_sequence:
            raise Fatal("SequenceViolation")
        sequence, _ = ring.write_record(self.arena, object_id, flags)  # type: ignore[arg-type]
        return {
            **self.ring_fields(ring),
            "object_id": self._id(object_id),
            "sequence": sequence,
            "committed_bytes": ring.extent,
        }

    def dispatch(self, cmd: dict) -> bool:
        """Handle one command; False when the worker should exit (after a graceful shutdown)."""
        kind = cmd.get("type")
        if self.generation is None and kind != "InitializeWorker":
            raise Fatal("NotInitialized")
        if kind == "InitializeWorker":
            if cmd.get("required_ring_helper_abi") != RING_HELPER_ABI:
                raise Fatal("UnsupportedHelperAbi")
            self.generation = cmd.get("worker_generation", cmd.get("generation"))
            self.backend = "cpu" if self.misbehave == "string-ids" else cmd.get("backend", self.backend)
            self.arena = Arena(int(cmd["arena_ceiling"]), self.env)
            self.emit(
                "WorkerReady",
                pid=os.getpid(),
                worker_generation=self.generation,
                ring_helper_abi=RING_HELPER_ABI,
                backend=self.backend,
            )
        elif kind == "ConfigureRole":
            role_id = cmd["role_id"]
            reason = cmd["config"].get("fail") if isinstance(cmd.get("config"), dict) else "config must be an object"
            if reason:
                self.emit("RoleFailed", role_id=self._id(role_id), reason=str(reason))
            else:
                self.roles[role_id] = cmd["config"]
                self.emit("RoleConfigured", role_id=self._id(role_id))
        elif kind == "InstallRing":
            ring = Ring(cmd, self.arena, self.misbehave)  # type: ignore[arg-type]
            self.rings[ring.ring_id] = ring
            self.emit("RingInstalled", **self.ring_fields(ring))
        elif kind == "RingReadable":
            ring = self.rings.get(cmd["ring_id"])
            if ring is None or ring.direction != "ingress":
                raise Fatal("UnknownRing")
            self.emit("ObjectLoaded", **self.load(ring))
        elif kind == "RingWritable":
            ring = self.rings.get(cmd["ring_id"])
            if ring is None or ring.direction != "egress":
                raise Fatal("UnknownRing")
            self.emit("RingWritable", ring_id=self._id(ring.ring_id))
        elif kind == "ExecuteStep":
            role_id, step_id = cmd["role_id"], cmd["step_id"]
            inputs = [self.handle_of(b.get("device_handle", b.get("handle"))) for b in cmd["inputs"]]
            if role_id not in self.roles:
                self.emit("StepFailed", role_id=self._id(role_id), step_id=step_id, reason="RoleUnavailable")
                return True
            if any(i not in self.objects for i in inputs):
                self.emit("StepFailed", role_id=self._id(role_id), step_id=step_id, reason="InvalidInputHandle")
                return True
            for binding in cmd["outputs"]:
                ring = self.rings.get(binding["ring_id"])
                if ring is None or ring.direction != "egress":
                    self.emit("StepFailed", role_id=self._id(role_id), step_id=step_id, reason="OutputValidationFailed")
                    return True
                self.emit("ObjectProduced", **self.produce(ring, binding))
            if cmd["release_inputs_after"]:
                for i in inputs:
                    self.objects.pop(i, None)
            self.emit("StepCompleted", role_id=self._id(role_id), step_id=step_id)
        elif kind == "ReleaseDeviceObject":
            object_id = self.handle_of(cmd.get("device_handle", cmd.get("handle")))
            handle = {"worker_generation": self.generation, "id": object_id}
            if self.misbehave == "release":
                return True
            if self.objects.pop(object_id, None) is None:
                self.emit("ReleaseFailed", device_handle=handle, reason="UnknownHandle")
            else:
                self.emit("DeviceObjectReleased", device_handle=handle)
        elif kind == "UninstallRing":
            self.rings.pop(cmd["ring_id"], None)
            self.emit("RingQuiesced", ring_id=self._id(cmd["ring_id"]))
        elif kind == "ShutdownWorker":
            self.emit("WorkerStopped", reason=str(cmd.get("mode", "Graceful")))
            return False
        else:
            raise Fatal("UnknownCommand")
        return True


def serve(
    inp: BinaryIO | None = None, out: TextIO | None = None, env: Mapping[str, str] | None = None
) -> int:
    """Commands from `inp` (stdin), events to `out` (stdout); `env` is the container's environment."""
    inp = inp if inp is not None else sys.stdin.buffer
    env = env if env is not None else os.environ
    misbehave = env.get("STUB_WORKER_MISBEHAVE", "")
    emit = emitter(out if out is not None else sys.stdout)
    worker = Worker(emit, env, misbehave)
    log("speaking the worker-control wire on stdin/stdout")
    code = 0
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
                    code = 3 if misbehave == "shutdown" else 0
                    return code
            except (KeyError, TypeError, ValueError) as exc:
                raise Fatal(f"InvalidJson: {exc}") from None
        log("end of stdin: the controller is gone, exiting")
        if misbehave == "eof":
            while True:
                time.sleep(1)
        return 0
    except Fatal as exc:
        emit("WorkerFatal", reason=str(exc), worker_generation=worker.generation, pid=os.getpid())
        return 1
    finally:
        if worker.arena is not None:
            worker.arena.close()
