"""The worker controller state machine: one test per rule of the seed, the fixed gaps, and a property test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp_launch.worker import codec as w
from pp_launch.worker import controller as c


def running(generation: int = 1) -> c.WorkerController:
    ctl = c.WorkerController(arena_ceiling=1 << 20, init_timeout=5.0, shutdown_timeout=3.0)
    assert ctl.handle(c.StartRequested()) == [c.SpawnWorker(1)]
    out = ctl.handle(c.ProcessStarted(pid=100))
    assert out == [
        c.WriteCommands(
            (w.InitializeWorker(worker_generation=1, arena_ceiling=1 << 20, required_ring_helper_abi=1, backend="cpu"),)
        )
    ]
    assert ctl.handle(c.WorkerEventReceived(ready(1))) == [c.WorkerRunning(1, 100)]
    while ctl.generation < generation:
        ctl.handle(c.ProcessExited(137))
        ctl.handle(c.RestartRequested())
        ctl.handle(c.ProcessStarted(pid=100 + ctl.generation))
        ctl.handle(c.WorkerEventReceived(ready(ctl.generation)))
    assert ctl.state is c.State.RUNNING
    return ctl


def ready(gen: int, abi: int = 1) -> w.WorkerReady:
    return w.WorkerReady(pid=100, worker_generation=gen, ring_helper_abi=abi, backend="cpu")


def ring(ring_id: int, direction: str = "ingress") -> w.InstallRing:
    return w.InstallRing(
        ring_id=ring_id,
        edge_id=f"e{ring_id}",
        port_id="p",
        direction=direction,  # type: ignore[arg-type]
        layout={},
        object_spec={},
    )


def handle(gen: int, i: int = 1) -> w.DeviceHandle:
    return w.DeviceHandle(worker_generation=gen, id=i)


def test_generation_starts_at_1() -> None:
    assert c.WorkerController(arena_ceiling=1).generation == 1
    assert running().generation == 1


def test_a_command_when_not_running_is_rejected() -> None:
    ctl = c.WorkerController(arena_ceiling=1)
    cmd = w.RingReadable(ring_id=1)
    assert ctl.handle(c.ActorCommand(cmd, 1)) == [c.CommandRejected(cmd, "NotRunning")]
    ctl.handle(c.StartRequested())
    ctl.handle(c.ProcessStarted(pid=5))
    assert ctl.handle(c.ActorCommand(cmd, 1)) == [c.CommandRejected(cmd, "NotRunning")]  # initializing


def test_commands_and_handles_of_another_generation_are_rejected() -> None:
    ctl = running(generation=2)
    readable = w.RingReadable(ring_id=1)
    assert ctl.handle(c.ActorCommand(readable, 1)) == [c.CommandRejected(readable, "OldGeneration")]
    step = w.ExecuteStep(role_id="r", step_id=1, inputs=[handle(1)], outputs=[], runtime={}, release_inputs_after=False)
    assert ctl.handle(c.ActorCommand(step, 2)) == [c.CommandRejected(step, "OldGeneration")]
    release = w.ReleaseDeviceObject(device_handle=handle(1))
    assert ctl.handle(c.ActorCommand(release, 2)) == [c.CommandRejected(release, "OldGeneration")]
    ok = w.ReleaseDeviceObject(device_handle=handle(2))
    assert ctl.handle(c.ActorCommand(ok, 2)) == [c.WriteCommands((ok,))]


def test_a_crash_faults_every_installed_ring_in_ascending_order_then_fails_with_the_status() -> None:
    ctl = running()
    for r in (7, 2, 5):
        ctl.handle(c.ActorCommand(ring(r), 1))
    out = ctl.handle(c.ProcessExited(137))
    assert out == [
        c.RingFaulted(2, 1),
        c.StopRingPump(2),
        c.RingFaulted(5, 1),
        c.StopRingPump(5),
        c.RingFaulted(7, 1),
        c.StopRingPump(7),
        c.WorkerFailed(1, "worker exited unexpectedly with status 137", 137),
    ]
    assert ctl.state is c.State.FAILED and ctl.rings == {}


def test_a_clean_exit_while_shutting_down_quiesces_every_ring_then_stops() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(4), 1))
    ctl.handle(c.ActorCommand(ring(1, "egress"), 1))
    assert ctl.handle(c.ShutdownRequested()) == [c.WriteCommands((w.ShutdownWorker(mode="Graceful"),))]
    assert ctl.handle(c.WorkerEventReceived(w.WorkerStopped(reason="Graceful"))) == [c.WorkerStopped(1, "Graceful")]
    assert ctl.handle(c.ProcessExited(0)) == [
        c.RingQuiesced(1, 1),
        c.StopRingPump(1),
        c.RingQuiesced(4, 1),
        c.StopRingPump(4),
        c.TerminalStop(1),
    ]
    assert ctl.state is c.State.STOPPED


def test_restart_increments_the_generation_and_clears_the_rings() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(3), 1))
    ctl.handle(c.ProcessExited(1))
    assert ctl.handle(c.RestartRequested()) == [c.SpawnWorker(2)]
    assert ctl.generation == 2 and ctl.rings == {}
    ctl.handle(c.ProcessStarted(pid=200))
    assert ctl.handle(c.WorkerEventReceived(ready(2))) == [c.WorkerRunning(2, 200)]


def test_uninstall_then_quiesced_removes_the_ring() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(3), 1))
    ctl.handle(c.ActorCommand(w.UninstallRing(ring_id=3, reason="done"), 1))
    out = ctl.handle(c.WorkerEventReceived(w.RingQuiesced(ring_id=3)))
    assert out == [c.RingQuiesced(3, 1), c.Routed("edge_establisher", w.RingQuiesced(ring_id=3))]
    assert ctl.handle(c.ProcessExited(137))[-1] == c.WorkerFailed(1, "worker exited unexpectedly with status 137", 137)


# ---------------------------------------------------------------------------------------------- fixed gaps
def test_shutdown_overrunning_its_timeout_moves_to_killing_and_asks_for_a_kill() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(1), 1))
    ctl.handle(c.ShutdownRequested())
    assert ctl.handle(c.TimeAdvanced(2.9)) == []
    assert ctl.handle(c.TimeAdvanced(3.0)) == [c.KillProcess("shutdown did not finish within 3 s")]
    assert ctl.state is c.State.KILLING
    assert ctl.handle(c.ProcessExited(137)) == [
        c.RingFaulted(1, 1),
        c.StopRingPump(1),
        c.WorkerFailed(1, "shutdown timed out: killed", 137),
        c.TerminalStop(1),
    ]


def test_worker_fatal_fails_the_controller_with_the_exit_status() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(1), 1))
    assert ctl.handle(c.WorkerEventReceived(w.WorkerFatal(reason="SequenceViolation"))) == []  # it exits by itself
    assert ctl.handle(c.ActorCommand(w.RingReadable(ring_id=1), 1))[0].reason == "NotRunning"  # type: ignore[union-attr]
    assert ctl.handle(c.ProcessExited(1)) == [
        c.RingFaulted(1, 1),
        c.StopRingPump(1),
        c.WorkerFailed(1, "WorkerFatal: SequenceViolation", 1),
    ]


def test_a_worker_that_does_not_exit_after_fatal_is_killed() -> None:
    ctl = running()
    ctl.handle(c.WorkerEventReceived(w.WorkerFatal(reason="InvalidJson")))
    assert ctl.handle(c.TimeAdvanced(4.9)) == []
    assert ctl.handle(c.TimeAdvanced(5.0)) == [c.KillProcess("still running 5 s after failing")]
    assert ctl.handle(c.ProcessExited(137)) == [c.WorkerFailed(1, "WorkerFatal: InvalidJson", 137)]


def test_initialization_times_out() -> None:
    ctl = c.WorkerController(arena_ceiling=1, init_timeout=5.0)
    ctl.handle(c.StartRequested())
    ctl.handle(c.ProcessStarted(pid=1))
    assert ctl.handle(c.TimeAdvanced(5.0)) == [c.KillProcess("initialization timed out after 5 s")]
    assert ctl.handle(c.ProcessExited(137)) == [c.WorkerFailed(1, "initialization timed out after 5 s", 137)]


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (ready(1, abi=2), "UnsupportedHelperAbi"),
        (ready(3), "as generation 3"),
        (w.RoleConfigured(role_id="x"), "expected WorkerReady"),
    ],
)
def test_a_bad_handshake_fails(event: w.Message, reason: str) -> None:
    ctl = c.WorkerController(arena_ceiling=1)
    ctl.handle(c.StartRequested())
    ctl.handle(c.ProcessStarted(pid=1))
    out = ctl.handle(c.WorkerEventReceived(event))
    assert isinstance(out[0], c.KillProcess) and reason in out[0].reason


def test_a_protocol_fault_from_the_worker_fails_it() -> None:
    ctl = running()
    assert ctl.handle(c.ProtocolBroken("InvalidJson (line 3)")) == [
        c.KillProcess("protocol fault: InvalidJson (line 3)")
    ]


# ---------------------------------------------------------------------------------------------- routing
def test_routing_is_as_the_seed() -> None:
    ctl = running()
    ctl.handle(c.ActorCommand(ring(1, "ingress"), 1))
    ctl.handle(c.ActorCommand(ring(2, "egress"), 1))
    h = handle(1)
    loaded = {"edge_id": "e", "port_id": "p", "object_id": 1, "sequence": 0, "extent": 8, "device_handle": h}
    produced = {"role_id": "r", "step_id": 1, **loaded}
    cases = [
        (w.RingInstalled(ring_id=1, edge_id="e", port_id="p"), "edge_establisher"),
        (w.ObjectLoaded(ring_id=1, **loaded), "rx"),
        (w.ObjectLoaded(ring_id=9, **loaded), "role"),
        (w.ObjectProduced(ring_id=2, **produced), "tx"),
        (w.ObjectProduced(ring_id=1, **produced), "role"),
        (w.StepCompleted(role_id="r", step_id=1), "stage_controller"),
        (w.RoleFailed(role_id="r", reason="x"), "stage_controller"),
        (w.DeviceObjectReleased(device_handle=h), "worker_side"),
    ]
    for event, destination in cases:
        assert ctl.handle(c.WorkerEventReceived(event)) == [c.Routed(destination, event)]
    ctl.handle(c.ActorCommand(w.ReleaseDeviceObject(device_handle=h), 1))
    assert ctl.handle(c.WorkerEventReceived(w.ReleaseFailed(device_handle=h, reason="x")))[0].destination == "driver"  # type: ignore[union-attr]


def test_every_routed_event_type_has_a_route_and_the_table_is_walkable() -> None:
    assert set(c.ROUTES) == set(w.EVENTS.values()) - {w.WorkerReady, w.WorkerStopped, w.WorkerFatal}
    for (state, kind), fn in c.TRANSITIONS.items():
        assert isinstance(state, c.State) and callable(fn) and kind.__module__ == c.__name__
    with pytest.raises(c.IllegalTransition, match="RestartRequested is not allowed in state Running"):
        running().handle(c.RestartRequested())


# ---------------------------------------------------------------------------------------------- property
INPUTS = st.one_of(
    st.just(c.StartRequested()),
    st.builds(c.ProcessStarted, pid=st.integers(1, 1000)),
    st.builds(c.ProcessExited, status=st.sampled_from([0, 1, 137])),
    st.just(c.RestartRequested()),
    st.just(c.ShutdownRequested()),
    st.builds(c.TimeAdvanced, now=st.floats(0, 100)),
    st.builds(lambda g: c.WorkerEventReceived(ready(g)), st.integers(1, 4)),
    st.just(c.WorkerEventReceived(w.WorkerFatal(reason="x"))),
    st.just(c.WorkerEventReceived(w.WorkerStopped(reason="Graceful"))),
    st.builds(lambda r, q: c.WorkerEventReceived(w.RingQuiesced(ring_id=r)), st.integers(0, 4), st.none()),
    st.builds(lambda r, g: c.ActorCommand(ring(r), g), st.integers(0, 4), st.integers(1, 4)),
    st.builds(
        lambda r, g: c.ActorCommand(w.UninstallRing(ring_id=r, reason="x"), g), st.integers(0, 4), st.integers(1, 4)
    ),
    st.builds(
        lambda hg, g: c.ActorCommand(w.ReleaseDeviceObject(device_handle=handle(hg)), g),
        st.integers(1, 4),
        st.integers(1, 4),
    ),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(INPUTS, max_size=40))
def test_random_sequences_keep_the_invariants(inputs: list[c.Input]) -> None:
    """No command of an old generation is ever written; commands are accepted only while running; every ring
    installation ends in exactly one fault or quiesce, within its own generation."""
    ctl = c.WorkerController(arena_ceiling=1)
    open_rings: dict[int, set[int]] = {}  # generation -> rings installed and not yet ended
    now = 0.0
    for inp in inputs:
        if isinstance(inp, c.TimeAdvanced):
            now = max(now, inp.now)
            inp = c.TimeAdvanced(now)
        state_before, gen = ctl.state, ctl.generation
        try:
            out = ctl.handle(inp)
        except c.IllegalTransition:
            continue
        for o in out:
            if isinstance(o, c.WriteCommands):
                for cmd in o.commands:
                    if isinstance(inp, c.ActorCommand):
                        assert state_before is c.State.RUNNING
                    handles = list(getattr(cmd, "inputs", ()))
                    if isinstance(cmd, w.ReleaseDeviceObject):
                        handles.append(cmd.device_handle)
                    assert all(h.worker_generation == gen for h in handles)
                    if isinstance(cmd, w.InitializeWorker):
                        assert cmd.worker_generation == gen
                    if isinstance(cmd, w.InstallRing):
                        open_rings.setdefault(gen, set()).add(cmd.ring_id)
            if isinstance(o, (c.RingFaulted, c.RingQuiesced)):
                assert o.generation == gen
                assert o.ring_id in open_rings.get(gen, set()), f"ring {o.ring_id} ended twice or never installed"
                open_rings[gen].discard(o.ring_id)
        if ctl.generation != gen or ctl.state in (c.State.FAILED, c.State.STOPPED):
            assert not open_rings.get(gen), f"generation {gen} ended with rings still open: {open_rings[gen]}"
