"""The worker wire codec (contract §8): round trips, strict parsing, aliases."""

from __future__ import annotations

import json

import pytest

from pp_launch.worker import codec as w

H = w.DeviceHandle(worker_generation=2, id=7)
EXAMPLES: list[w.Message] = [
    w.InitializeWorker(worker_generation=1, arena_ceiling=1 << 20, required_ring_helper_abi=1, backend="cpu"),
    w.ConfigureRole(role_id="decoder", config={"layers": [0, 1], "dtype": "bf16"}),
    w.InstallRing(
        ring_id=3, edge_id="e0", port_id="in", direction="ingress", layout={"slots": 4}, object_spec={"extent": 4096}
    ),
    w.RingReadable(ring_id=3),
    w.ExecuteStep(
        role_id="decoder", step_id=9, inputs=[H], outputs=[4], runtime={"batch": 1}, release_inputs_after=True
    ),
    w.ReleaseDeviceObject(device_handle=H),
    w.UninstallRing(ring_id=3, reason="done"),
    w.ShutdownWorker(mode="AbortInFlight"),
    w.WorkerReady(pid=42, worker_generation=1, ring_helper_abi=1, backend="cpu"),
    w.RoleConfigured(role_id="decoder"),
    w.RoleFailed(role_id="decoder", reason="no such layer"),
    w.RingInstalled(ring_id=3, edge_id="e0", port_id="in"),
    w.ObjectLoaded(ring_id=3, edge_id="e0", port_id="in", object_id=1, sequence=0, extent=4096, device_handle=H),
    w.ObjectProduced(
        role_id="decoder",
        step_id=9,
        ring_id=4,
        edge_id="e1",
        port_id="out",
        object_id=2,
        sequence=0,
        extent=4096,
        device_handle=H,
    ),
    w.StepCompleted(role_id="decoder", step_id=9),
    w.StepFailed(role_id="decoder", step_id=9, reason="oom"),
    w.DeviceObjectReleased(device_handle=H),
    w.ReleaseFailed(device_handle=H, reason="unknown handle"),
    w.RingQuiesced(ring_id=3),
    w.WorkerStopped(reason="Graceful"),
    w.WorkerFatal(reason="InvalidJson"),
]


def test_examples_cover_every_message() -> None:
    assert {type(m).__name__ for m in EXAMPLES} == set(w.COMMANDS) | set(w.EVENTS)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_compact_type_first(message: w.Message) -> None:
    line = w.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b": " not in line and b", " not in line
    assert line.startswith(b'{"type":"' + type(message).__name__.encode() + b'"')
    kinds = w.COMMANDS if isinstance(message, w.Command) else w.EVENTS
    assert w.decode(line, kinds) == message


def test_aliases_generation_and_handle() -> None:
    line = b'{"type":"ReleaseDeviceObject","handle":{"generation":2,"id":7}}'
    assert w.decode(line, w.COMMANDS) == w.ReleaseDeviceObject(device_handle=H)
    line = b'{"type":"WorkerReady","pid":1,"generation":3,"ring_helper_abi":1,"backend":"cpu"}'
    assert w.decode(line, w.EVENTS).worker_generation == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{not json", "InvalidJson"),
        (b"[1, 2]", "InvalidJson: a message must be a JSON object"),
        (b"\xff\xfe", "InvalidJson"),
        (b'{"ring_id":1}', "UnknownCommand: unknown message type None"),
        (b'{"type":"LaunchMissiles"}', "UnknownCommand"),
        (b'{"type":"WorkerReady","pid":1,"worker_generation":1,"ring_helper_abi":1,"backend":"x"}', "UnknownCommand"),
        (b'{"type":"RingReadable","ring_id":1,"payload":"AAAA"}', "ForbiddenKey: payload"),
        (b'{"type":"RingReadable","ring_id":1,"bytes":[1]}', "ForbiddenKey: bytes"),
        (b'{"type":"RingReadable","ring_id":1,"data":{}}', "ForbiddenKey: data"),
        (b'{"type":"RingReadable"}', "InvalidField: RingReadable lacks ring_id"),
        (b'{"type":"RingReadable","ring_id":1,"extra":1}', "InvalidField: RingReadable has no field extra"),
        (b'{"type":"RingReadable","ring_id":"1"}', "ring_id must be an integer, not str"),
        (b'{"type":"RingReadable","ring_id":true}', "ring_id must be an integer, not bool"),
        (b'{"type":"RingReadable","ring_id":1.5}', "ring_id must be an integer, not float"),
        (b'{"type":"RingReadable","ring_id":-1}', "ring_id must not be negative"),
        (b'{"type":"ShutdownWorker","mode":"Now"}', "mode must be one of ['Graceful', 'AbortInFlight']"),
        (b'{"type":"ConfigureRole","role_id":"r","config":[]}', "config must be an object"),
        (b'{"type":"ReleaseDeviceObject","device_handle":{"id":1}}', "device_handle must have exactly"),
        (
            b'{"type":"ReleaseDeviceObject","device_handle":{"generation":1,"worker_generation":1,"id":1}}',
            "device_handle must have exactly",
        ),
        (b'{"type":"ReleaseDeviceObject","device_handle":7}', "device_handle must be an object"),
        (
            b'{"type":"ReleaseDeviceObject","device_handle":{"worker_generation":1,"id":1},'
            b'"handle":{"worker_generation":1,"id":1}}',
            "given twice",
        ),
        (
            b'{"type":"ExecuteStep","role_id":"r","step_id":1,"inputs":[1],"outputs":[],"runtime":{},'
            b'"release_inputs_after":false}',
            "inputs[0] must be an object",
        ),
        (
            b'{"type":"ExecuteStep","role_id":"r","step_id":1,"inputs":[],"outputs":["x"],"runtime":{},'
            b'"release_inputs_after":false}',
            "outputs[0] must be an integer",
        ),
    ],
)
def test_malformed_lines_are_protocol_faults_naming_the_line(line: bytes, reason: str) -> None:
    with pytest.raises(w.ProtocolFault) as exc:
        w.decode(line, w.COMMANDS, line_no=12)
    assert reason in str(exc.value)
    assert "line 12" in str(exc.value)


def test_line_decoder_needs_data_then_yields_and_faults_stick() -> None:
    d = w.LineDecoder(w.COMMANDS)
    assert d.next() is w.NEED_DATA
    d.feed(b'{"type":"RingReadable",')
    assert d.next() is w.NEED_DATA
    d.feed(b'"ring_id":1}\n\n{"type":"RingReadable","ring_id":2}\nnope\n')
    assert d.next() == w.RingReadable(ring_id=1)
    assert d.next() == w.RingReadable(ring_id=2)
    with pytest.raises(w.ProtocolFault, match="line 4") as first:
        d.next()
    with pytest.raises(w.ProtocolFault) as again:
        d.next()
    assert again.value is first.value


def test_construction_validates() -> None:
    with pytest.raises(TypeError, match="ring_id must be an integer"):
        w.RingReadable(ring_id="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        w.InstallRing(ring_id=1, edge_id="e", port_id="p", direction="sideways", layout={}, object_spec={})  # type: ignore[arg-type]


def test_encoded_json_is_plain_json() -> None:
    doc = json.loads(w.encode(EXAMPLES[4]))
    assert doc == {
        "type": "ExecuteStep",
        "role_id": "decoder",
        "step_id": 9,
        "inputs": [{"worker_generation": 2, "id": 7}],
        "outputs": [4],
        "runtime": {"batch": 1},
        "release_inputs_after": True,
    }
