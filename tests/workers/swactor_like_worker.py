#!/usr/bin/env python3
"""A worker that behaves as swactor's own `tinygrad_cpu_worker.py` does (crates/mvp-system/tests/
local_e2e_cluster/), written here from docs/worker-wire.md and from reading that file; standard library only, so its
"device" is plain Python integers where swactor's has tinygrad tensors.

What it shares with swactor's worker, and what a check must not ask it to go beyond:
- it reads `SWACTOR_ARENA_FD` when initialized and maps `arena_ceiling` bytes of it; `DEV` it was given wins;
- `ConfigureRole`'s `run_id`, `stage_index`, `layer_start`, `layer_end_exclusive` are read with int();
- `RingReadable` reads the node's record at the ingress ring's `data_offset` (it never makes its own input), with
  the header, extent (at most `max_extent`, a multiple of `alignment`) and sequence (0, then +1) checked;
- `ExecuteStep` uses the first input and output; the input handle's generation is checked there (and only
  there); its output record goes to the egress ring's `data_offset`; `committed_bytes` is header + payload;
- handles start at 42; `ReleaseDeviceObject` echoes the handle it was given; `UninstallRing` answers
  `RingQuiesced`; a missing field or unknown handle is an uncaught error: a traceback and exit 1;
- `WorkerFatal` (exit 1) for invalid JSON, an unknown command and the checks above; end of stdin: exit 0.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import traceback
from collections.abc import Mapping
from typing import Any, BinaryIO, TextIO

RECORD = struct.Struct("<4sHHQQQII")


class Stop(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class SwactorLikeWorker:
    def __init__(self, out: TextIO, env: Mapping[str, str]) -> None:
        self.out, self.env = out, dict(env)
        self.generation = 0
        self.arena: mmap.mmap | None = None
        self.rings: dict[int, dict[str, Any]] = {}
        self.objects: dict[int, dict[str, Any]] = {}
        self.role: dict[str, int] = {}
        self.next_handle = 42

    def send(self, **event: Any) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
        self.out.flush()

    def fatal(self, reason: str, **fields: Any) -> None:
        self.send(type="WorkerFatal", reason=reason, **fields)
        raise Stop(1)

    def mapped(self) -> mmap.mmap:
        if self.arena is None:
            self.fatal("ArenaNotMapped")
        assert self.arena is not None
        return self.arena

    # ------------------------------------------------------------------------------------------ commands
    def InitializeWorker(self, cmd: dict[str, Any]) -> None:
        if int(cmd["required_ring_helper_abi"]) != 1:
            self.fatal("UnsupportedHelperAbi", required_ring_helper_abi=cmd["required_ring_helper_abi"])
        self.generation = int(cmd["worker_generation"])
        size = int(cmd.get("arena_ceiling", self.env["SWACTOR_ARENA_BYTES"]))
        self.arena = mmap.mmap(int(self.env["SWACTOR_ARENA_FD"]), size)
        self.env.setdefault("DEV", cmd.get("backend", {}).get("device", "CPU"))
        self.send(
            type="WorkerReady",
            pid=os.getpid(),
            worker_generation=self.generation,
            ring_helper_abi=1,
            backend={"device": self.env["DEV"]},
        )

    def InstallRing(self, cmd: dict[str, Any]) -> None:
        ring_id, layout, spec = int(cmd["ring_id"]), cmd["layout"], cmd["object_spec"]
        self.rings[ring_id] = {
            "ring_id": ring_id,
            "edge_id": int(cmd["edge_id"]),
            "port_id": cmd["port_id"],
            "direction": cmd["direction"],
            "data_offset": int(layout["data_offset"]),
            "max_extent": int(spec["max_extent"]),
            "alignment": int(spec["alignment"]),
            "next_sequence": 0,
        }
        self.send(type="RingInstalled", ring_id=ring_id, edge_id=int(cmd["edge_id"]), port_id=cmd["port_id"])

    def ConfigureRole(self, cmd: dict[str, Any]) -> None:
        config = cmd["config"]
        self.role = {"role_id": int(cmd["role_id"])}
        for name in ("run_id", "stage_index", "layer_start", "layer_end_exclusive"):
            self.role[name] = int(config[name])
        self.send(type="RoleConfigured", role_id=self.role["role_id"])

    def RingReadable(self, cmd: dict[str, Any]) -> None:
        ring = self.rings[int(cmd["ring_id"])]
        if ring["direction"] != "ingress":
            self.fatal("WrongRingDirection", ring_id=ring["ring_id"])
        view, base = self.mapped(), ring["data_offset"]
        magic, version, header_len, object_id, sequence, extent, _flags, _ = RECORD.unpack_from(view, base)
        if magic != b"MO01" or version != 1 or header_len != RECORD.size:
            self.fatal("InvalidObjectHeader", ring_id=ring["ring_id"])
        if extent > ring["max_extent"] or (ring["alignment"] and extent % ring["alignment"]):
            self.fatal("ObjectExtentInvalid", ring_id=ring["ring_id"], object_id=object_id, extent=extent)
        if sequence != ring["next_sequence"]:
            self.fatal("SequenceViolation", ring_id=ring["ring_id"], expected=ring["next_sequence"], actual=sequence)
        ring["next_sequence"] += 1
        payload = bytes(view[base + RECORD.size : base + RECORD.size + extent])
        handle, self.next_handle = self.next_handle, self.next_handle + 1
        self.objects[handle] = {
            "object_id": object_id,
            "sequence": sequence,
            "values": list(struct.unpack(f"<{extent // 4}i", payload)),
        }
        self.send(
            type="ObjectLoaded",
            ring_id=ring["ring_id"],
            edge_id=ring["edge_id"],
            port_id=ring["port_id"],
            object_id=object_id,
            sequence=sequence,
            extent=extent,
            device_handle={"worker_generation": self.generation, "id": handle},
        )

    def ExecuteStep(self, cmd: dict[str, Any]) -> None:
        if not self.role:
            self.fatal("RoleNotConfigured")
        role_id, step_id = int(cmd["role_id"]), int(cmd["step_id"])
        if role_id != self.role["role_id"]:
            self.fatal("RoleMismatch", expected=self.role["role_id"], actual=role_id)
        binding, output = cmd["inputs"][0], cmd["outputs"][0]
        if int(binding["device_handle"]["worker_generation"]) != self.generation:
            self.fatal("OldGenerationHandle", handle=binding["device_handle"])
        handle = int(binding["device_handle"]["id"])
        obj = self.objects[handle]
        if int(binding["object_id"]) != obj["object_id"] or int(binding["sequence"]) != obj["sequence"]:
            self.fatal("InputBindingMismatch", step_id=step_id)
        layers = self.role["layer_end_exclusive"] - self.role["layer_start"]
        value = sum(obj["values"]) * 3 + layers + self.role["stage_index"]
        words = [value % 2 + 1] if cmd.get("runtime", {}).get("final_stage") else [max(value, 1)]
        ring = self.rings[int(output["ring_id"])]
        if ring["direction"] != "egress":
            self.fatal("WrongRingDirection", ring_id=ring["ring_id"])
        payload = struct.pack(f"<{len(words)}i", *words)
        if len(payload) > ring["max_extent"]:
            self.fatal("OutputExtentInvalid", ring_id=ring["ring_id"], extent=len(payload))
        object_id, sequence = int(output["object_id"]), int(output["sequence"])
        head = RECORD.pack(b"MO01", 1, RECORD.size, object_id, sequence, len(payload), int(output.get("flags", 0)), 0)
        view, base = self.mapped(), ring["data_offset"]
        view[base : base + RECORD.size + len(payload)] = head + payload
        self.send(
            type="ObjectProduced",
            ring_id=ring["ring_id"],
            edge_id=ring["edge_id"],
            port_id=ring["port_id"],
            object_id=object_id,
            sequence=sequence,
            committed_bytes=RECORD.size + len(payload),
        )
        if cmd.get("release_inputs_after"):
            self.objects.pop(handle, None)
        self.send(type="StepCompleted", role_id=role_id, step_id=step_id)

    def ReleaseDeviceObject(self, cmd: dict[str, Any]) -> None:
        self.objects.pop(int(cmd["device_handle"]["id"]), None)
        self.send(type="DeviceObjectReleased", device_handle=cmd["device_handle"])

    def UninstallRing(self, cmd: dict[str, Any]) -> None:
        self.rings.pop(int(cmd["ring_id"]), None)
        self.send(type="RingQuiesced", ring_id=int(cmd["ring_id"]))

    def ShutdownWorker(self, _cmd: dict[str, Any]) -> None:
        self.send(type="WorkerStopped", reason="Graceful")
        raise Stop(0)

    COMMANDS = (
        "InitializeWorker",
        "InstallRing",
        "ConfigureRole",
        "RingReadable",
        "ExecuteStep",
        "ReleaseDeviceObject",
        "UninstallRing",
        "ShutdownWorker",
    )

    def handle(self, raw: bytes) -> None:
        try:
            command = json.loads(raw)
        except ValueError as exc:
            self.fatal("InvalidJson", error=str(exc))
        kind = command.get("type")
        if kind not in self.COMMANDS:
            self.fatal("UnknownCommand", command=kind)
        getattr(self, kind)(command)


def serve(inp: BinaryIO, out: TextIO, err: TextIO, env: Mapping[str, str]) -> int:
    """Commands from `inp`, events to `out`; the exit status. An uncaught error is a traceback and status 1."""
    worker = SwactorLikeWorker(out, env)
    try:
        for raw in inp:
            if raw.strip():
                worker.handle(raw)
        return 0
    except Stop as stop:
        return stop.code
    except Exception:
        traceback.print_exc(file=err)
        return 1


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout, sys.stderr, os.environ))
