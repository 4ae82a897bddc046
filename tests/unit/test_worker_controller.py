"""The worker controller against swactor's `GpuWorkerCtl` (its `crates/mvp-system/src/gpu_worker_ctl.rs`),
transition by transition, in swactor's order: each `seed:` test names the swactor code it checks. Then the deviations
(D1-D9 of the controller's docstring and the README's table), the table walk, and a property test."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp_launch.core.worker import codec as w
from pp_launch.core.worker import controller as c

S = c.State
CEILING = 1 << 20


def ctl() -> c.WorkerController:
    return c.WorkerController(arena_ceiling=CEILING, init_timeout=5.0, shutdown_timeout=3.0, fatal_exit_timeout=2.0)


def init(gen: int) -> w.InitializeWorker:
    return w.InitializeWorker(
        worker_generation=gen, arena_ceiling=CEILING, required_ring_helper_abi=1, backend={"device": "CPU"}
    )


def running(generation: int = 1, pid: int = 100) -> c.WorkerController:
    x = ctl()
    while x.generation < generation:
        x.handle(c.RestartRequested())
    x.handle(c.StartWorker())
    x.handle(c.ProcessStarted(pid=pid))
    assert x.handle(c.WorkerReady(generation, pid)) == [c.WorkerRunning(generation, pid)]
    return x


def in_state(state: c.State) -> c.WorkerController:
    """A controller brought to `state` through the table alone."""
    x = ctl()
    if state is S.IDLE:
        return x
    if state is S.STARTING:
        x.handle(c.StartWorker())
        x.handle(c.ProcessStarted(pid=100))
        return x
    x = running()
    if state is S.SHUTTING_DOWN:
        x.handle(c.ShutdownRequested())
    elif state is S.KILLING:
        x.handle(c.ShutdownRequested())
        x.handle(c.TimeAdvanced(10.0))
    elif state is S.FAILING:
        x.handle(c.ProtocolBroken("garbage"))
    elif state is S.CRASHED:
        x.handle(c.ProcessExited(137))
    elif state is S.STOPPED:
        x.handle(c.ShutdownRequested())
        x.handle(c.ProcessExited(0))
    assert x.state is state
    return x


def install(ring_id: int, direction: str = "ingress") -> w.InstallRing:
    return w.InstallRing(
        ring_id=ring_id,
        edge_id=100 + ring_id,
        port_id="p",
        direction=direction,
        layout={},
        object_spec={},  # type: ignore[arg-type]
    )


def handle(gen: int, i: int = 1) -> w.DeviceHandle:
    return w.DeviceHandle(worker_generation=gen, id=i)


def step(*gens: int) -> w.ExecuteStep:
    return w.ExecuteStep(
        role_id=1,
        step_id=1,
        inputs=[w.InputBinding(device_handle=handle(g, i), object_id=i, sequence=0) for i, g in enumerate(gens)],
        outputs=[w.OutputBinding(ring_id=2, object_id=9, sequence=0)],
        runtime={},
        release_inputs_after=False,
    )


# ---------- seed: new()
def test_seed_new_starts_idle_at_generation_1() -> None:
    x = ctl()
    assert (x.state, x.generation, x.rings) == (S.IDLE, 1, set())


# ---------- seed: observe(StartWorker) -> start()
@pytest.mark.parametrize("state", [S.IDLE, S.CRASHED, S.STOPPED])
def test_seed_start_worker_moves_to_starting_and_spawns(state: c.State) -> None:
    x = in_state(state)
    assert x.handle(c.StartWorker()) == [c.SpawnWorker(x.generation)]
    assert x.state is S.STARTING


# ---------- seed: ProcessStarted
def test_seed_process_started_moves_to_starting_and_queues_initialize_worker() -> None:
    x = ctl()
    x.handle(c.StartWorker())
    assert x.handle(c.ProcessStarted(pid=7)) == [c.WriteCommands((init(1),))]
    assert (x.state, x.pid) == (S.STARTING, 7)


# ---------- seed: WorkerReady
def test_seed_worker_ready_moves_to_running_and_reports_worker_running() -> None:
    x = in_state(S.STARTING)
    assert x.handle(c.WorkerReady(1, 100)) == [c.WorkerRunning(1, 100)]
    assert x.state is S.RUNNING


# ---------- seed: actor_command
@pytest.mark.parametrize("state", [s for s in S if s is not S.RUNNING])
def test_seed_actor_command_when_not_running_is_rejected_not_running(state: c.State) -> None:
    x = in_state(state)
    cmd = w.RingReadable(ring_id=1)
    assert x.handle(c.ActorCommand(cmd, x.generation)) == [c.CommandRejected(cmd, "NotRunning")]
    assert x.state is state


def test_seed_actor_command_of_another_generation_is_rejected_old_generation_handle() -> None:
    x = running(2)
    cmd = w.ConfigureRole(role_id=1, config={})
    assert x.handle(c.ActorCommand(cmd, 1)) == [c.CommandRejected(cmd, "OldGenerationHandle")]


@pytest.mark.parametrize(
    "cmd",
    [
        w.ConfigureRole(role_id=1, config={"stage_index": 0}),
        w.RingReadable(ring_id=1),
        w.RingWritable(ring_id=1),
        w.ReleaseDeviceObject(device_handle=handle(1)),
        step(1, 1),
    ],
)
def test_seed_actor_command_of_this_generation_is_serialized(cmd: w.Command) -> None:
    x = running()
    assert x.handle(c.ActorCommand(cmd, 1)) == [c.WriteCommands((cmd,))]
    assert x.state is S.RUNNING


def test_seed_install_ring_adds_the_ring_and_is_serialized() -> None:
    x = running()
    assert x.handle(c.ActorCommand(install(3), 1)) == [c.WriteCommands((install(3),))]
    assert x.rings == {3}


def test_seed_uninstall_ring_removes_the_ring_when_sent() -> None:
    x = running()
    x.handle(c.ActorCommand(install(3), 1))
    cmd = w.UninstallRing(ring_id=3, reason="Reconfigure")
    assert x.handle(c.ActorCommand(cmd, 1)) == [c.WriteCommands((cmd,))]
    assert x.rings == set()  # not when RingQuiesced arrives: swactor's controller drops it on send


def test_seed_execute_step_spec_with_any_stale_input_is_rejected() -> None:
    x = running(2)
    cmd = step(2, 1)
    assert x.handle(c.ActorCommand(cmd, 2)) == [c.CommandRejected(cmd, "OldGenerationHandle")]


def test_seed_release_of_a_stale_handle_is_rejected() -> None:
    x = running(2)
    cmd = w.ReleaseDeviceObject(device_handle=handle(1))
    assert x.handle(c.ActorCommand(cmd, 2)) == [c.CommandRejected(cmd, "OldGenerationHandle")]


@pytest.mark.parametrize("mode", ["Graceful", "AbortInFlight"])
def test_seed_shutdown_worker_command_is_serialized_and_moves_to_shutting_down(mode: str) -> None:
    x = running()
    cmd = w.ShutdownWorker(mode=mode)  # type: ignore[arg-type]
    assert x.handle(c.ActorCommand(cmd, 1)) == [c.WriteCommands((cmd,))]
    assert x.state is S.SHUTTING_DOWN
    # ...so its clean exit is a stop, not a failure (the port's old bug reported WorkerFailed here)
    assert x.handle(c.ProcessExited(0)) == [c.TerminalStopped(1)]
    assert x.state is S.STOPPED


# ---------- seed: route()
@pytest.mark.parametrize(
    ("event", "route"),
    [
        (w.RingInstalled(ring_id=1, edge_id=1, port_id="p"), c.Route.EDGE_ESTABLISHER),
        (w.RingFault(ring_id=1, edge_id=1, port_id="p", reason="HelperFailed"), c.Route.EDGE_ESTABLISHER),
        (w.RingQuiesced(ring_id=1), c.Route.EDGE_ESTABLISHER),
        (
            w.ObjectLoaded(
                ring_id=1, edge_id=1, port_id="p", object_id=1, sequence=0, extent=1, device_handle=handle(1)
            ),
            c.Route.RX_OR_ROLE,
        ),
        (w.ObjectFailed(ring_id=1, edge_id=1, port_id="p", reason="InvalidRecord"), c.Route.RX_OR_ROLE),
        (
            w.ObjectProduced(ring_id=2, edge_id=2, port_id="p", object_id=1, sequence=0, committed_bytes=1),
            c.Route.TX_OR_ROLE,
        ),
        (w.StepCompleted(role_id=1, step_id=1), c.Route.STAGE_CONTROLLER),
        (w.StepFailed(role_id=1, step_id=1, reason="RuntimeFailed"), c.Route.STAGE_CONTROLLER),
        (w.RoleConfigured(role_id=1), c.Route.STAGE_CONTROLLER),
        (w.RoleFailed(role_id=1, reason="InvalidConfig"), c.Route.STAGE_CONTROLLER),
        (w.RingBecameReadable(ring_id=1), c.Route.DRIVER_OR_WORKER_SIDE),
        (w.RingBecameWritable(ring_id=1), c.Route.DRIVER_OR_WORKER_SIDE),
        (w.DeviceObjectReleased(device_handle=handle(1)), c.Route.DRIVER_OR_WORKER_SIDE),
        (w.ReleaseFailed(device_handle=handle(1), reason="UnknownHandle"), c.Route.DRIVER_OR_WORKER_SIDE),
        (w.WorkerReady(pid=1, worker_generation=1, ring_helper_abi=1, backend={}), c.Route.DRIVER_OR_WORKER_SIDE),
        (w.WorkerStopped(reason="Graceful"), c.Route.DRIVER_OR_WORKER_SIDE),
    ],
)
def test_seed_route_sends_each_event_to_its_destination(event: w.Message, route: c.Route) -> None:
    x = running()
    assert x.handle(c.StdoutEvent(event)) == [c.Routed(route, event)]
    assert x.state is S.RUNNING


def test_seed_route_covers_every_event_type() -> None:
    assert set(c.ROUTES) == set(w.EVENTS.values())


# ---------- seed: process_exited()
def test_seed_clean_exit_while_shutting_down_quiesces_every_ring_ascending_then_terminal_stop() -> None:
    x = running()
    for r in (5, 2, 9):
        x.handle(c.ActorCommand(install(r), 1))
    x.handle(c.ShutdownRequested())
    assert x.handle(c.ProcessExited(0)) == [
        c.RingQuiesced(2, 1),
        c.RingQuiesced(5, 1),
        c.RingQuiesced(9, 1),
        c.TerminalStopped(1),
    ]
    assert x.state is S.STOPPED


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (S.RUNNING, 137),
        (S.RUNNING, 0),
        (S.STARTING, 1),
        (S.SHUTTING_DOWN, 3),
        (S.IDLE, 0),
        (S.STOPPED, 1),
        (S.CRASHED, 9),
    ],
)
def test_seed_any_other_exit_faults_every_ring_ascending_then_fails_and_crashes(state: c.State, status: int) -> None:
    x = in_state(state)
    if state in (S.RUNNING, S.SHUTTING_DOWN):
        x.rings.update({4, 1})
    out = x.handle(c.ProcessExited(status))
    rings = [o for o in out if not isinstance(o, c.WorkerFailed)]
    expected = (
        [c.RingFaulted(1, 1), c.StopRingPump(1), c.RingFaulted(4, 1), c.StopRingPump(4)]
        if x.generation == 1 and state in (S.RUNNING, S.SHUTTING_DOWN)
        else []
    )
    assert rings == expected
    assert out[-1] == c.WorkerFailed(
        x.generation, c.Failure.PROCESS_EXITED, status, f"worker exited with status {status}"
    )
    assert x.state is S.CRASHED  # a non-zero exit while shutting down is restartable, as in the seed


# ---------- seed: restart()
@pytest.mark.parametrize("state", [S.IDLE, S.CRASHED, S.STOPPED])
def test_seed_restart_increments_the_generation_and_moves_to_starting_without_a_spawn(state: c.State) -> None:
    x = in_state(state)
    assert x.handle(c.RestartRequested()) == []
    assert (x.state, x.generation) == (S.STARTING, 2)
    assert x.handle(c.StartWorker()) == [c.SpawnWorker(2)]  # swactor's caller starts the new process


# ---------- seed: shutdown()
def test_seed_shutdown_requested_in_running_sends_graceful_shutdown() -> None:
    x = running()
    assert x.handle(c.ShutdownRequested()) == [c.WriteCommands((w.ShutdownWorker(mode="Graceful"),))]
    assert x.state is S.SHUTTING_DOWN


@pytest.mark.parametrize("state", [s for s in S if s is not S.RUNNING])
def test_seed_shutdown_requested_outside_running_does_nothing(state: c.State) -> None:
    x = in_state(state)
    assert x.handle(c.ShutdownRequested()) == []
    assert x.state is state


# ---------- seed: WorkerStopped
@pytest.mark.parametrize("state", list(S))
def test_seed_worker_stopped_is_echoed(state: c.State) -> None:
    x = in_state(state)
    assert x.handle(c.WorkerStopped(x.generation, "Graceful")) == [c.WorkerStoppedNotice(x.generation, "Graceful")]
    assert x.state is state


# ---------- swactor-behaviour.md: init timeout
def test_seed_initialization_timeout_fails_with_initialization_timeout_and_crashes() -> None:
    x = in_state(S.STARTING)
    assert x.handle(c.TimeAdvanced(4.9)) == []
    assert x.handle(c.TimeAdvanced(5.0)) == [c.KillProcess("initialization timed out after 5 s")]  # D8
    out = x.handle(c.ProcessExited(137))
    assert out == [c.WorkerFailed(1, c.Failure.INITIALIZATION_TIMEOUT, 137, "initialization timed out after 5 s")]
    assert x.state is S.CRASHED


# ---------- deviations
def test_d1_start_while_a_process_of_this_generation_is_live_is_refused() -> None:
    with pytest.raises(c.IllegalTransition, match="a process of this generation is live"):
        running().handle(c.StartWorker())


@pytest.mark.parametrize(
    ("ready", "detail"),
    [
        (c.WorkerReady(2, 100), "worker answered as generation 2, not 1"),
        (c.WorkerReady(1, 100, 2), "UnsupportedHelperAbi"),
    ],
)
def test_d2_a_ready_of_another_generation_or_abi_fails_instead_of_being_adopted(
    ready: c.WorkerReady, detail: str
) -> None:
    x = in_state(S.STARTING)
    out = x.handle(ready)
    assert out == [c.KillProcess(out[0].reason)] and detail in out[0].reason  # type: ignore[union-attr]
    assert x.state is S.FAILING
    failed = x.handle(c.ProcessExited(137))[-1]
    assert isinstance(failed, c.WorkerFailed) and failed.reason is c.Failure.PROTOCOL_FAULT and detail in failed.detail


@pytest.mark.parametrize("state", [s for s in S if s is not S.STARTING])
def test_d2_worker_ready_outside_starting_changes_nothing(state: c.State) -> None:
    x = in_state(state)
    assert x.handle(c.WorkerReady(x.generation, 1)) == []
    assert x.state is state


def test_d3_a_shutdown_that_overruns_is_killed_and_reported() -> None:
    x = running()
    x.handle(c.ActorCommand(install(1), 1))
    x.handle(c.ShutdownRequested())
    assert x.handle(c.TimeAdvanced(2.9)) == []
    assert x.handle(c.TimeAdvanced(3.0)) == [c.KillProcess("shutdown did not finish within 3 s")]
    assert x.state is S.KILLING
    out = x.handle(c.ProcessExited(137))
    assert out == [
        c.RingFaulted(1, 1),
        c.StopRingPump(1),
        c.WorkerFailed(1, c.Failure.SHUTDOWN_TIMEOUT, 137, "shutdown did not finish within 3 s"),
    ]
    assert x.state is S.CRASHED


def test_d4_worker_fatal_fails_the_controller_with_the_exit_status() -> None:
    x = running()
    fatal = w.WorkerFatal(reason="SequenceViolation", details={"ring_id": 1})
    assert x.handle(c.StdoutEvent(fatal)) == [c.Routed(c.Route.DRIVER_OR_WORKER_SIDE, fatal)]
    assert x.state is S.FAILING
    assert x.handle(c.ProcessExited(1)) == [
        c.WorkerFailed(1, c.Failure.WORKER_FATAL, 1, "WorkerFatal: SequenceViolation")
    ]


def test_d4_a_worker_that_does_not_exit_after_fatal_is_killed() -> None:
    x = running()
    x.handle(c.StdoutEvent(w.WorkerFatal(reason="InvalidJson")))
    assert x.handle(c.TimeAdvanced(2.0)) == [c.KillProcess("still running 2 s after failing")]


def test_d5_the_exit_of_an_earlier_generation_is_not_this_ones_crash() -> None:
    x = running()
    assert x.handle(c.RestartRequested()) == [c.KillProcess("restart as generation 2")]  # D7
    assert x.handle(c.ProcessExited(137, generation=1)) == []
    assert (x.state, x.generation) == (S.STARTING, 2)


def test_d6_rings_are_cleared_on_crash_so_a_restart_faults_nothing_twice() -> None:
    x = running()
    x.handle(c.ActorCommand(install(1), 1))
    x.handle(c.ProcessExited(137))
    assert x.rings == set()
    x.handle(c.RestartRequested())
    x.handle(c.StartWorker())
    x.handle(c.ProcessStarted(pid=5))
    x.handle(c.WorkerReady(2, 5))
    assert x.handle(c.ProcessExited(137)) == [
        c.WorkerFailed(2, c.Failure.PROCESS_EXITED, 137, "worker exited with status 137")
    ]


def test_d9_a_protocol_fault_kills_and_fails_the_worker() -> None:
    x = running()
    assert x.handle(c.ProtocolBroken("InvalidJson: x")) == [c.KillProcess("protocol fault: InvalidJson: x")]
    out = x.handle(c.ProcessExited(137))
    assert out == [c.WorkerFailed(1, c.Failure.PROTOCOL_FAULT, 137, "protocol fault: InvalidJson: x")]


# ---------- the table
def test_the_table_has_a_row_for_every_state_and_input() -> None:
    assert {(s, i) for s in S for i in c.INPUTS} == set(c.TRANSITIONS)


def test_an_illegal_transition_names_the_state_and_the_input() -> None:
    with pytest.raises(c.IllegalTransition, match="StartWorker is not allowed in state Running"):
        running().handle(c.StartWorker())


commands = st.sampled_from(
    [
        w.RingReadable(ring_id=1),
        install(1),
        install(2, "egress"),
        w.UninstallRing(ring_id=1, reason="x"),
        w.ShutdownWorker(mode="Graceful"),
    ]
)
inputs = st.one_of(
    st.just(c.StartWorker()),
    st.builds(c.ProcessStarted, pid=st.integers(1, 99)),
    st.builds(c.WorkerReady, generation=st.integers(1, 4), pid=st.integers(1, 9)),
    st.builds(c.ActorCommand, command=commands, generation=st.integers(1, 4)),
    st.builds(
        c.StdoutEvent,
        event=st.sampled_from(
            [w.RingQuiesced(ring_id=1), w.WorkerFatal(reason="x"), w.StepCompleted(role_id=1, step_id=1)]
        ),
    ),
    st.builds(c.ProcessExited, status=st.sampled_from([0, 1, 137]), generation=st.none() | st.integers(1, 4)),
    st.just(c.RestartRequested()),
    st.just(c.ShutdownRequested()),
    st.builds(c.TimeAdvanced, now=st.floats(0, 100)),
    st.builds(c.ProtocolBroken, reason=st.just("bad")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(inputs, max_size=40))
def test_random_sequences_keep_the_invariants(seq: list[c.Input]) -> None:
    x = ctl()
    now = 0.0
    for inp in seq:
        if isinstance(inp, c.TimeAdvanced):
            now = max(now, inp.now)
            inp = c.TimeAdvanced(now)
        generation = x.generation
        try:
            out = x.handle(inp)
        except c.IllegalTransition:
            assert isinstance(inp, c.StartWorker) and x.pid is not None
            continue
        assert x.generation >= generation
        if x.state is not S.RUNNING:
            assert not any(
                isinstance(o, c.WriteCommands) and not isinstance(o.commands[0], (w.InitializeWorker, w.ShutdownWorker))
                for o in out
            )
        if x.state in (S.CRASHED, S.STOPPED):
            assert x.rings == set() and x.pid is None
        faulted = [o.ring_id for o in out if isinstance(o, c.RingFaulted)]
        assert faulted == sorted(faulted)


# ---------- the table decides: compute on a copy, commit only when legal
SAMPLE_INPUTS: dict[type, c.Input] = {
    c.StartWorker: c.StartWorker(),
    c.ProcessStarted: c.ProcessStarted(pid=200),
    c.WorkerReady: c.WorkerReady(1, 200),
    c.ActorCommand: c.ActorCommand(install(1), 1),
    c.StdoutEvent: c.StdoutEvent(w.WorkerFatal(reason="x")),
    c.ProcessExited: c.ProcessExited(0),
    c.RestartRequested: c.RestartRequested(),
    c.ShutdownRequested: c.ShutdownRequested(),
    c.WorkerStopped: c.WorkerStopped(1, "done"),
    c.TimeAdvanced: c.TimeAdvanced(1000.0),
    c.ProtocolBroken: c.ProtocolBroken("bad"),
}


@pytest.mark.parametrize(
    ("state", "kind"),
    sorted(c.TRANSITIONS, key=lambda k: (k[0].value, k[1].__name__)),
    ids=lambda v: getattr(v, "value", getattr(v, "__name__", str(v))),
)
def test_every_row_moves_only_where_the_table_says_or_leaves_the_state_as_it_was(state: c.State, kind: type) -> None:
    x = in_state(state)
    before = dataclasses.replace(x, rings=set(x.rings))
    try:
        x.handle(SAMPLE_INPUTS[kind])
    except c.IllegalTransition:
        assert x == before  # refused: nothing changed
        return
    assert x.state in c.TRANSITIONS[(state, kind)].targets


def test_a_refused_input_leaves_the_controller_exactly_as_it_was() -> None:
    x = running()
    before = dataclasses.replace(x, rings=set(x.rings))
    with pytest.raises(c.IllegalTransition, match="a process of this generation is live"):
        x.handle(c.StartWorker())  # D1
    assert x == before


def test_a_handler_that_strays_from_its_row_is_refused_and_nothing_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    x = running()
    before = dataclasses.replace(x, rings=set(x.rings))
    row = c.TRANSITIONS[(S.RUNNING, c.ShutdownRequested)]

    def strays(ctl_: c.WorkerController, inp: object) -> list[c.Output]:
        ctl_.state, ctl_.pid = S.STOPPED, None  # a bug: ShutdownRequested may only lead to SHUTTING_DOWN
        ctl_.rings.add(9)
        return []

    monkeypatch.setitem(c.TRANSITIONS, (S.RUNNING, c.ShutdownRequested), dataclasses.replace(row, handler=strays))
    with pytest.raises(c.IllegalTransition, match="would move to Stopped, which the table lacks"):
        x.handle(c.ShutdownRequested())
    assert x == before and x.rings == before.rings
