"""STUB_MODE=worker: the worker end of the worker-control wire (contract §8), standard library only.

Commands arrive as JSON lines on stdin; events leave as JSON lines on stdout; stderr is logs only. Objects
live as ring records in a shared-memory arena (/dev/shm, `arena_ceiling` bytes), each with the seed's
40-byte header: magic `MO01`, version 1, header length 40, object id, sequence, extent, flags. Sequences
increase strictly from 0 per ring. End of stdin means the controller is gone: the worker exits.

STUB_WORKER_MISBEHAVE=<what> breaks one rule on purpose, for `pp-launch worker check` to catch:
  sequence      ObjectLoaded sequences start at 1
  release       ReleaseDeviceObject gets no answer
  stale         a device handle of an old generation is accepted instead of fatal
  invalid_json  invalid JSON is ignored instead of fatal
  shutdown      exits 3 after WorkerStopped
  eof           keeps running after end of stdin
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time

HEADER = struct.Struct("<4sHHQQQI4x")  # 40 bytes
MAGIC, VERSION = b"MO01", 1
RING_HELPER_ABI = 1
FORBIDDEN = {"payload", "bytes", "data"}
ALIASES = {"generation": "worker_generation", "handle": "device_handle"}
MISBEHAVE = os.environ.get("STUB_WORKER_MISBEHAVE", "")


def log(msg: str) -> None:
    print(f"stub-worker[{os.getpid()}] {msg}", file=sys.stderr, flush=True)


def emit(kind: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Fatal(Exception):
    pass


class Arena:
    def __init__(self, size: int) -> None:
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
        os.unlink(self.path)


class Ring:
    def __init__(self, cmd: dict, arena: Arena) -> None:
        self.ring_id, self.edge_id, self.port_id = cmd["ring_id"], cmd["edge_id"], cmd["port_id"]
        self.direction = cmd["direction"]
        self.slots = int(cmd["layout"].get("slots", 4))
        self.extent = int(cmd["object_spec"].get("extent", 64))
        if self.slots < 1 or self.extent < 1:
            raise Fatal("ObjectExtentInvalid")
        self.stride = HEADER.size + self.extent
        self.offset = arena.allocate(self.slots * self.stride)
        self.next_sequence = 1 if MISBEHAVE == "sequence" and self.direction == "ingress" else 0
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
    def __init__(self) -> None:
        self.generation: int | None = None
        self.backend = "cpu"
        self.arena: Arena | None = None
        self.rings: dict[int, Ring] = {}
        self.roles: dict[str, dict] = {}
        self.objects: dict[int, int] = {}  # device object id -> ring id
        self.next_object = 1

    def handle_of(self, value: object) -> int:
        if not isinstance(value, dict):
            raise Fatal("InvalidJson")
        doc = {ALIASES.get(k, k): v for k, v in value.items()}
        if doc.get("worker_generation") != self.generation and MISBEHAVE != "stale":
            raise Fatal("OldGenerationHandle")
        return int(doc["id"])

    def new_object(self, ring: Ring) -> dict:
        object_id = self.next_object
        self.next_object += 1
        sequence, _ = ring.write_record(self.arena, object_id)  # type: ignore[arg-type]
        self.objects[object_id] = ring.ring_id
        return {
            "ring_id": ring.ring_id,
            "edge_id": ring.edge_id,
            "port_id": ring.port_id,
            "object_id": object_id,
            "sequence": sequence,
            "extent": ring.extent,
            "device_handle": {"worker_generation": self.generation, "id": object_id},
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
            self.backend = str(cmd.get("backend", "cpu"))
            self.arena = Arena(int(cmd["arena_ceiling"]))
            emit(
                "WorkerReady",
                pid=os.getpid(),
                worker_generation=self.generation,
                ring_helper_abi=RING_HELPER_ABI,
                backend=self.backend,
            )
        elif kind == "ConfigureRole":
            reason = cmd["config"].get("fail") if isinstance(cmd.get("config"), dict) else "config must be an object"
            if reason:
                emit("RoleFailed", role_id=cmd["role_id"], reason=str(reason))
            else:
                self.roles[cmd["role_id"]] = cmd["config"]
                emit("RoleConfigured", role_id=cmd["role_id"])
        elif kind == "InstallRing":
            ring = Ring(cmd, self.arena)  # type: ignore[arg-type]
            self.rings[ring.ring_id] = ring
            emit("RingInstalled", ring_id=ring.ring_id, edge_id=ring.edge_id, port_id=ring.port_id)
        elif kind == "RingReadable":
            ring = self.rings.get(cmd["ring_id"])
            if ring is None or ring.direction != "ingress":
                raise Fatal("UnknownRing")
            emit("ObjectLoaded", **self.new_object(ring))
        elif kind == "ExecuteStep":
            role_id, step_id = cmd["role_id"], cmd["step_id"]
            inputs = [self.handle_of(h) for h in cmd["inputs"]]
            if role_id not in self.roles:
                emit("StepFailed", role_id=role_id, step_id=step_id, reason=f"role {role_id} is not configured")
                return True
            if any(i not in self.objects for i in inputs):
                emit("StepFailed", role_id=role_id, step_id=step_id, reason="an input object does not exist")
                return True
            for ring_id in cmd["outputs"]:
                ring = self.rings.get(ring_id)
                if ring is None or ring.direction != "egress":
                    emit("StepFailed", role_id=role_id, step_id=step_id, reason=f"ring {ring_id} is no egress ring")
                    return True
                emit("ObjectProduced", role_id=role_id, step_id=step_id, **self.new_object(ring))
            if cmd["release_inputs_after"]:
                for i in inputs:
                    self.objects.pop(i, None)
            emit("StepCompleted", role_id=role_id, step_id=step_id)
        elif kind == "ReleaseDeviceObject":
            object_id = self.handle_of(cmd.get("device_handle", cmd.get("handle")))
            handle = {"worker_generation": self.generation, "id": object_id}
            if MISBEHAVE == "release":
                return True
            if self.objects.pop(object_id, None) is None:
                emit("ReleaseFailed", device_handle=handle, reason=f"no device object {object_id}")
            else:
                emit("DeviceObjectReleased", device_handle=handle)
        elif kind == "UninstallRing":
            self.rings.pop(cmd["ring_id"], None)
            emit("RingQuiesced", ring_id=cmd["ring_id"])
        elif kind == "ShutdownWorker":
            emit("WorkerStopped", reason=str(cmd.get("mode", "Graceful")))
            return False
        else:
            raise Fatal("UnknownCommand")
        return True


def serve() -> int:
    worker = Worker()
    log("speaking the worker-control wire on stdin/stdout")
    code = 0
    try:
        for raw in sys.stdin.buffer:
            if not raw.strip():
                continue
            try:
                cmd = json.loads(raw)
                if not isinstance(cmd, dict) or FORBIDDEN & set(cmd):
                    raise ValueError("not a command object")
            except ValueError:
                if MISBEHAVE == "invalid_json":
                    continue
                raise Fatal("InvalidJson") from None
            try:
                if not worker.dispatch(cmd):
                    code = 3 if MISBEHAVE == "shutdown" else 0
                    return code
            except (KeyError, TypeError, ValueError) as exc:
                raise Fatal(f"InvalidJson: {exc}") from None
        log("end of stdin: the controller is gone, exiting")
        if MISBEHAVE == "eof":
            while True:
                time.sleep(1)
        return 0
    except Fatal as exc:
        emit("WorkerFatal", reason=str(exc))
        return 1
    finally:
        if worker.arena is not None:
            worker.arena.close()
