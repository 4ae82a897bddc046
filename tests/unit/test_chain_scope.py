"""The chain core against a fake backend: swactor's spawn_chain / ChainGuard test table, ported."""

from __future__ import annotations

import signal

import pytest

from pp_launch.adapters.runtime import ThreadRuntime
from pp_launch.core import events
from pp_launch.core.announce import parse_line
from pp_launch.core.chain.plan import ChainRequest, build_plan
from pp_launch.core.chain.ports import PlaceLost, StageOutput, StopRequested
from pp_launch.core.chain.scope import ChainScope, DuplicateNodeId, Found, RosterIncomplete, resolve_roster

from .fakes import FakeBackend, FakeClock, FakeHandoffBackend, FakeInbox, RecordingReporter, StageScript, node_id


def make(n: int, scripts: dict[int, StageScript] | None = None, **req: object):
    plan = build_plan(
        ChainRequest(stages=n, addr_timeout=5.0, grace=2.0, **req),  # type: ignore[arg-type]
        environ={"MAX_TOKENS": "7", "UNRELATED": "x", "SWACTOR_DIAG_LEVEL": "3"},
        owner="host:1:2",
        stage_gpus=[()] * n,
        device_requests=[()] * n,
        run_id="abcdef012345",
    )
    clock = FakeClock()
    inbox = FakeInbox(clock)
    backend = FakeBackend(scripts=scripts or {}, inbox=inbox)
    reporter = RecordingReporter()
    scope = ChainScope(plan, backend, inbox, reporter, ThreadRuntime(clock))
    return scope, backend, reporter, clock


@pytest.mark.parametrize("n", range(2, 9))
def test_stages_start_in_order_and_get_their_peers(n: int) -> None:
    scope, backend, reporter, _ = make(n)
    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    outcome = scope.run()
    assert [c[1] for c in backend.calls if c[0] == "create"] == list(range(n))
    assert [c[1] for c in backend.calls if c[0] == "start"] == list(range(n))
    for k in range(n):
        env = backend.envs[k]
        assert env["STAGE"] == str(k) and env["NUM_STAGES"] == str(n)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert env["MAX_TOKENS"] == "7" and env["SWACTOR_DIAG_LEVEL"] == "3" and "UNRELATED" not in env
        if k == 0:
            assert not any(name.startswith(("PEER_", "FIRST_PEER_")) for name in env)
        else:
            assert env["PEER_NODE_ID"] == node_id(k - 1)
            assert env["PEER_DIRECT"] == f"127.0.0.1:{7000 + k - 1}"
            assert env["FIRST_PEER_NODE_ID"] == node_id(0)
            assert env["FIRST_PEER_DIRECT"] == "127.0.0.1:7000"
    roster = reporter.named("pp_stage_roster")
    assert len(roster) == 1
    assert [e["stage_index"] for e in roster[0]["stages"]] == list(range(n))
    assert [e["node_id_short"] for e in roster[0]["stages"]] == [node_id(k)[:8] for k in range(n)]
    assert outcome.exit_code == 128 + signal.SIGTERM and outcome.reason == "signal"
    assert backend.existing == {}


@pytest.mark.parametrize("k", [0, 1, 3])
def test_create_failure_at_stage_k_removes_every_started_stage(k: int) -> None:
    scope, backend, reporter, _ = make(5, {k: StageScript(fail_create=True)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == k
    assert f"stage {k} (pp-abcdef012345-{k}) could not start" in outcome.message
    assert [c[1] for c in backend.calls if c[0] == "create"] == list(range(k + 1))
    assert backend.existing == {}
    assert reporter.named("chain_stopped")[0]["orphans"] == []
    # the stage whose create failed made no container of ours: nothing of it is reported or removed
    assert reporter.named("chain_stopped")[0]["removed"] == [f"pp-abcdef012345-{i}" for i in range(k)]
    assert ("remove", f"pp-abcdef012345-{k}") not in backend.calls


@pytest.mark.parametrize("k", [0, 2])
def test_a_name_held_by_someone_else_is_never_touched(k: int) -> None:
    scope, backend, reporter, _ = make(3)
    backend.foreign.add(f"pp-abcdef012345-{k}")  # the fake asserts it is never removed
    outcome = scope.run()
    assert outcome.failed_stage == k and "already in use" in outcome.message
    assert outcome.exit_code == (2 if k == 0 else 1)  # exit 2 only while nothing of ours has started
    assert not [c for c in backend.calls if c[0] in ("signal", "kill") and c[1] == k]
    assert reporter.named("chain_stopped")[0]["removed"] == [f"pp-abcdef012345-{i}" for i in range(k)]


def test_start_failure_removes_the_never_started_container() -> None:
    scope, backend, _, _ = make(3, {1: StageScript(fail_start=True)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and "could not select device driver" in outcome.message
    assert ("remove", "pp-abcdef012345-1") in backend.calls
    assert backend.existing == {}


def test_address_timeout_removes_stages_and_names_the_missing_ones_ascending() -> None:
    scope, backend, _, clock = make(5, {2: StageScript(announce=False)})
    t0 = clock.now
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == 2
    assert "did not announce its address within 5 s" in outcome.message
    assert "stages not announced: 2, 3, 4" in outcome.message
    assert "[stage 2] stage 2 booting" in outcome.message  # the last lines come with the error
    assert clock.now - t0 >= 5.0
    assert [c[1] for c in backend.calls if c[0] == "create"] == [0, 1, 2]
    assert backend.existing == {}


def test_malformed_announcement_fails_the_stage_and_is_never_passed_on() -> None:
    bad = "PP_GPU_NODE_ADDR " + "a" * 64 + " 127.0.0.1:1;touch /tmp/x"
    scope, backend, _, _ = make(4, {1: StageScript(line=bad)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == 1
    assert "stage 1 (pp-abcdef012345-1): malformed announcement" in outcome.message
    assert "'PP_GPU_NODE_ADDR" in outcome.message  # shell-escaped
    assert 2 not in backend.envs
    assert all("touch" not in v for env in backend.envs.values() for v in env.values())


@pytest.mark.parametrize("pad", [" ", "\t"])
def test_an_announcement_longer_than_the_line_limit_is_rejected_never_cut_and_passed_on(pad: str) -> None:
    # valid in its first 64 KiB: the old code accepted that first piece and handed a cut address list on
    long = f"{pad}PP_GPU_NODE_ADDR {node_id(1)} " + ",".join(f"10.0.{i // 250}.{i % 250}:1" for i in range(7000))
    assert len(long) > 64 * 1024
    scope, backend, _, _ = make(3, {1: StageScript(line=long)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == 1
    assert "an announcement longer than the line limit was rejected" in outcome.message
    assert 2 not in backend.envs


def test_stage_exiting_nonzero_fails_the_chain_with_its_code() -> None:
    scope, backend, reporter, _ = make(3, {1: StageScript(exit_at=(1500.0, 3))})
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == 1
    assert "stage 1 (pp-abcdef012345-1) exited with code 3" in outcome.message
    assert {"stage": 1, "exit_code": 3, "reason": "failed"} in reporter.named("stage_exited")
    assert backend.existing == {}
    # every other stage got SIGTERM; the dead one was not asked about again
    assert sorted(c[1] for c in backend.calls if c[0] == "signal") == [0, 2]
    assert not [c for c in backend.calls if c[0] == "remove"]


def test_every_stage_exiting_zero_is_success() -> None:
    scope, _, reporter, _ = make(3, {k: StageScript(exit_code_on_start=0) for k in range(3)})
    outcome = scope.run()
    assert outcome.exit_code == 0 and outcome.reason == "completed"
    assert [f["reason"] for f in reporter.named("stage_exited")] == ["exited"] * 3


def test_exit_zero_before_announcing_is_an_early_death() -> None:
    scope, _, _, _ = make(3, {1: StageScript(announce=False, exit_code_on_start=0)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and "exited with code 0 before announcing" in outcome.message


def test_a_lost_place_ends_the_chain_exit_1_with_its_own_words_never_completed() -> None:
    """The run lost what it cannot go on without (its guard, and no new one): the one teardown, exit 1, place_lost,
    the message as said; chain_stopped carries the same code."""
    scope, backend, reporter, _ = make(3)
    scope.inbox.at(2000.0, PlaceLost("the run's guard ... was paused by another client, and no new guard could be"))
    outcome = scope.run()
    assert (outcome.exit_code, outcome.reason) == (1, "place_lost")
    assert outcome.message.startswith("the run's guard ... was paused by another client")
    (stopped,) = reporter.named("chain_stopped")
    assert stopped["reason"] == "place_lost" and stopped["exit_code"] == 1 and stopped["orphans"] == []
    assert backend.existing == {}


def test_a_place_found_lost_while_stopping_makes_a_failed_chain_place_lost_but_never_a_signal() -> None:
    """A stage failed (exit 3); while the chain stops, its backend finds the place gone (a Ray node left the cluster)
    and says so: chain_stopped is place_lost, exit 1. A stop the user asked for stays a stop (128+N)."""
    def losing(scope: ChainScope, backend: FakeBackend) -> None:
        asked = backend.leftovers

        def leftovers(run_id: str) -> list[str]:  # as the Ray backend finds a node gone when asked what is left
            scope.inbox.put(PlaceLost("Ray node b was lost (the node left the cluster)"))
            return asked(run_id)

        backend.leftovers = leftovers  # type: ignore[method-assign]

    scope, backend, reporter, _ = make(3, {1: StageScript(exit_at=(1500.0, 3))})
    losing(scope, backend)
    outcome = scope.run()
    assert (outcome.exit_code, outcome.reason) == (1, "place_lost"), outcome
    assert [e["reason"] for e in reporter.named("chain_stopped")] == ["place_lost"]
    stopped, backend2, reporter2, _ = make(3)
    losing(stopped, backend2)
    stopped.inbox.at(1100.0, StopRequested(signal.SIGTERM))
    assert (stopped.run().exit_code, reporter2.named("chain_stopped")[0]["reason"]) == (143, "signal")


def test_teardown_kills_sigterm_ignorers_after_one_shared_grace() -> None:
    scripts = {k: StageScript(ignore_sigterm=True) for k in range(6)}
    scope, backend, reporter, clock = make(6, scripts)
    scope.inbox.at(1100.0, StopRequested(signal.SIGTERM))
    outcome = scope.run()
    assert outcome.exit_code == 143
    assert sorted(c[1] for c in backend.calls if c[0] == "kill") == list(range(6))
    # one grace for all six stages, not six graces
    assert 1100.0 + 2.0 <= clock.now < 1100.0 + 2.0 + 1.0
    assert reporter.named("chain_stopped")[0]["orphans"] == []


def test_second_signal_during_teardown_escalates_to_kill_now() -> None:
    scope, backend, _, clock = make(2, {0: StageScript(ignore_sigterm=True), 1: StageScript(ignore_sigterm=True)})
    scope.inbox.at(1100.0, StopRequested(signal.SIGINT))
    scope.inbox.at(1100.5, StopRequested(signal.SIGINT))
    outcome = scope.run()
    assert outcome.exit_code == 130
    assert clock.now < 1101.0
    assert len([c for c in backend.calls if c[0] == "kill"]) == 2


def test_roster_lists_missing_stages_in_ascending_order() -> None:
    with pytest.raises(RosterIncomplete) as exc:
        resolve_roster({0: None, 3: None, 1: None}, 4)
    assert exc.value.missing == [0, 1, 2, 3]
    assert str(exc.value) == "stages not announced: 0, 1, 2, 3"


def test_a_roster_with_one_node_id_twice_names_both_stages() -> None:
    ann = {k: parse_line(f"PP_GPU_NODE_ADDR {node_id(k % 2)} 127.0.0.1:{9000 + k}") for k in range(4)}
    with pytest.raises(DuplicateNodeId) as exc:
        resolve_roster(ann, 4)
    assert exc.value.stages == (0, 2) and "stages 0 and 2 announced the same node id" in str(exc.value)


def test_a_chain_whose_stages_announce_one_node_id_fails_naming_both() -> None:
    same = f"PP_GPU_NODE_ADDR {node_id(7)} 127.0.0.1:9001"
    scope, _, reporter, _ = make(3, {1: StageScript(line=same), 2: StageScript(line=same)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and "stages 1 and 2 announced the same node id" in outcome.message
    assert reporter.named("pp_stage_roster") == []
    assert reporter.named("chain_stopped")[0]["reason"] == "stage_failed"


def test_events_carry_contract_fields() -> None:
    scope, _, reporter, _ = make(2, {k: StageScript(exit_code_on_start=0) for k in range(2)})
    scope.run()
    started = reporter.named("stage_started")
    assert started[0] == {
        "stage": 0,
        "container": "pp-abcdef012345-0",
        "image": "pp-launch/stub-worker:latest",
        "gpus": [],
    }
    announced = reporter.named("stage_announced")
    assert set(announced[1]) == {"stage", "node_id_hex", "direct", "elapsed_s"}
    stopped = reporter.named("chain_stopped")[0]
    assert stopped == {
        "reason": "completed",
        "exit_code": 0,
        "removed": ["pp-abcdef012345-0", "pp-abcdef012345-1"],
        "orphans": [],
    }


def test_teardown_goes_on_past_an_engine_error_and_gathers_it() -> None:
    scope, backend, _, _ = make(3)
    backend.refuse_signal.add(1)
    scope.inbox.at(100.0, StopRequested(signal.SIGTERM))  # once every stage is up
    outcome = scope.run()
    assert sorted(c[1] for c in backend.calls if c[0] == "signal") == [0, 1, 2]  # stage 2 after 1's failure
    assert ("kill", 1) in backend.calls  # its grace ran out: killed through the engine
    assert outcome.exit_code == 1 and "teardown errors: SIGTERM to stage 1: cannot signal container" in outcome.message
    assert backend.existing == {}


def test_an_engine_lost_under_the_chain_ends_it_with_a_plain_message_and_what_may_be_left() -> None:
    scope, backend, reporter, _ = make(3)
    scope.inbox.at(100.0, StopRequested(signal.SIGINT))
    original = backend.signal

    def signal_then_lose(ref: str, signum: int) -> None:
        backend.lost = True  # the engine goes away as the teardown begins
        original(ref, signum)

    backend.signal = signal_then_lose  # type: ignore[method-assign]
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.reason == "signal"
    assert "stopped by SIGINT; then the Docker engine at unix:///fake.sock stopped" in outcome.message
    assert "pp-launch down abcdef012345" in outcome.message
    assert [c for c in backend.calls if c[0] == "signal"] == [("signal", 0, signal.SIGTERM)]  # asked nothing more
    stopped = reporter.named("chain_stopped")[0]
    assert sorted(stopped["orphans"]) == [f"pp-abcdef012345-{k}" for k in range(3)]  # possibly left, said so
    assert stopped["removed"] == []


class ExplodingReporter(RecordingReporter):
    """A bug on our side in the middle of bring-up (here: in the reporter, when stage 1 announces)."""

    def event(self, event: events.Event) -> None:
        if isinstance(event, events.StageAnnounced) and event.stage == 1:
            raise RuntimeError("a bug")
        super().event(event)


def test_an_exception_inside_the_scope_tears_everything_down_then_propagates() -> None:
    scope, backend, _, _ = make(3)
    scope.reporter = ExplodingReporter()
    with pytest.raises(RuntimeError, match="a bug"):
        scope.run()
    assert backend.existing == {}
    assert scope.reporter.named("chain_stopped")[0]["reason"] == "error"


def test_a_stray_of_the_run_is_removed_by_id_and_one_that_stays_is_reported() -> None:
    scope, backend, reporter, _ = make(2)
    scope.inbox.at(100.0, StopRequested(signal.SIGTERM))
    backend.existing["stray-id"] = 9  # carries our run's label, was never tracked (a create whose reply we lost)
    backend.existing["stuck-id"] = 9
    backend.stuck.add("stuck-id")
    outcome = scope.run()
    assert ("remove", "stray-id") in backend.calls and "stray-id" not in backend.existing
    stopped = reporter.named("chain_stopped")[0]
    assert stopped["orphans"] == ["stuck-id"]
    assert outcome.exit_code == 1 and stopped["exit_code"] == 1  # never a clean 143 with something left


def adopted(lost: bool = False):  # type: ignore[no-untyped-def]
    """Three containers of run r1 found by label: two running (one deaf to SIGTERM), one never started."""
    clock = FakeClock()
    inbox = FakeInbox(clock)
    backend = FakeBackend(scripts={1: StageScript(ignore_sigterm=True)}, inbox=inbox)
    for ref, stage in (("id-a", 0), ("id-b", 1), ("id-c", 2)):
        backend.existing[ref] = stage
    found = [Found("id-a", "pp-r1-0", True), Found("id-b", "pp-r1-1", True), Found("id-c", "pp-r1-2", False)]
    reporter = RecordingReporter()
    scope = ChainScope.adopt("r1", found, backend, inbox, reporter, grace=2.0, runtime=ThreadRuntime(clock))
    backend.lost = lost
    return scope, backend, reporter, clock


def test_down_and_the_watchdog_use_the_chains_teardown_on_adopted_containers() -> None:
    scope, backend, _, clock = adopted()
    assert [c for c in backend.calls if c[0] == "watch"] == [("watch", 0), ("watch", 1)]  # the running ones
    outcome = scope.stop()
    assert sorted(c[1] for c in backend.calls if c[0] == "signal") == [0, 1]  # SIGTERM to both at once
    assert [c for c in backend.calls if c[0] == "kill"] == [("kill", 1)]  # the deaf one, after the grace
    assert ("remove", "id-c") in backend.calls  # never started: removed by id, not signalled
    assert backend.existing == {}
    assert outcome.exit_code == 0 and outcome.removed == ("pp-r1-0", "pp-r1-1", "pp-r1-2")
    assert 1002.0 <= clock.now < 1003.0  # one shared grace (the fake clock starts at 1000)


def test_an_adopted_teardown_on_a_lost_engine_gathers_the_error_and_says_what_may_be_left() -> None:
    scope, _, _, _ = adopted(lost=True)
    outcome = scope.stop()
    assert outcome.exit_code == 1 and "stopped (its socket refuses connections)" in outcome.message
    assert sorted(outcome.orphans) == ["id-a", "id-b", "id-c"]


# ---------------------------------------------------------------- parallel bring-up
def make_parallel(n: int, scripts: dict[int, StageScript] | None = None, **req: object):
    scope, _, reporter, clock = make(n, scripts, **req)
    backend = FakeHandoffBackend(scripts=scripts or {}, inbox=scope.inbox)  # type: ignore[arg-type]
    scope.backend = backend
    return scope, backend, reporter, clock


@pytest.mark.parametrize("n", [2, 3, 8])
def test_env_handoff_creates_and_starts_every_stage_before_any_handoff(n: int) -> None:
    scope, backend, reporter, _ = make_parallel(n)
    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    scope.run()
    kinds = [c[0] for c in backend.calls]
    first_deliver = kinds.index("deliver")
    assert kinds[:first_deliver].count("create_waiting") == n - 1 and kinds[:first_deliver].count("start") == n
    assert kinds[:first_deliver].count("create") == 1  # stage 0 has no peers: its own command, no hand-off entry
    assert [c[1] for c in backend.calls if c[0] == "deliver"] == list(range(1, n))  # each once its peer is known
    assert 0 not in backend.delivered
    for k in range(1, n):
        env = backend.envs[k]
        assert env["PEER_NODE_ID"] == node_id(k - 1) and env["FIRST_PEER_DIRECT"] == "127.0.0.1:7000"
    assert [e["stage_index"] for e in reporter.named("pp_stage_roster")[0]["stages"]] == list(range(n))
    assert backend.existing == {}


@pytest.mark.parametrize("handoff", ["env", "stdin"])
def test_a_rendezvous_run_starts_every_stage_with_its_own_command_and_hands_nothing_off(handoff: str) -> None:
    """--rendezvous torch: no stage waits under the hand-off entry (docker ps shows each stage's own command), none
    is sent peer lines on its stdin, and the roster is every running stage at the master's address."""
    scripts = {k: StageScript(announce=False) for k in range(3)}
    scope, backend, reporter, _ = make_parallel(3, scripts, rendezvous="torch", handoff=handoff)
    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    scope.run()
    assert [c[0] for c in backend.calls if c[0].startswith("create")] == ["create"] * 3
    assert "deliver" not in [c[0] for c in backend.calls] and backend.delivered == {}
    roster = reporter.named("pp_stage_roster")[0]["stages"]
    assert [e["stage_index"] for e in roster] == [0, 1, 2]
    assert backend.existing == {}


def test_stdin_handoff_starts_workers_at_once_and_sends_peer_lines() -> None:
    scope, backend, reporter, _ = make_parallel(3, handoff="stdin")
    scope.inbox.at(2000.0, StopRequested(signal.SIGTERM))
    scope.run()
    assert "create_waiting" not in [c[0] for c in backend.calls]
    assert all(backend.envs[k]["PP_HANDOFF"] == "stdin" and "PEER_DIRECT" not in backend.envs[k] for k in range(3))
    want = [f"PP_PEER {node_id(1)} 127.0.0.1:7001", f"PP_FIRST_PEER {node_id(0)} 127.0.0.1:7000"]
    assert backend.delivered[2] == want
    assert 0 not in backend.delivered
    assert len(reporter.named("pp_stage_roster")) == 1


@pytest.mark.parametrize("k", [0, 2])
def test_parallel_create_failure_removes_every_created_stage(k: int) -> None:
    scope, backend, reporter, _ = make_parallel(4, {k: StageScript(fail_create=True)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and outcome.failed_stage == k
    assert f"stage {k} (pp-abcdef012345-{k}) could not start" in outcome.message
    assert "start" not in [c[0] for c in backend.calls]  # nothing starts when any create failed
    assert backend.existing == {}
    assert reporter.named("chain_stopped")[0]["orphans"] == []


def test_a_waiting_stage_that_never_gets_its_handoff_is_stopped_with_the_rest() -> None:
    scope, backend, _, _ = make_parallel(3, {0: StageScript(announce=False)})
    outcome = scope.run()
    assert outcome.exit_code == 1 and "stage 0" in outcome.message and "did not announce" in outcome.message
    assert [c[1] for c in backend.calls if c[0] == "deliver"] == []  # stages 1 and 2 still waiting
    assert backend.existing == {}


def test_an_illegal_move_raises_and_leaves_the_stage_as_it_was() -> None:
    """The stage's state is computed from the table first and committed only when the table has the move."""
    scope, _backend, reporter, _clock = make(2)
    st = scope.stages[0]
    with pytest.raises(events.IllegalStageTransition):
        scope._move(st, events.StageInput.ANNOUNCE)  # planned -> announce: no such row
    assert st.state is None and not st.attempted and reporter.states == []
    scope._move(st, events.StageInput.CREATE)
    with pytest.raises(events.IllegalStageTransition):
        scope._move(st, events.StageInput.START)  # creating -> start: the engine has not made it yet
    assert st.state is events.StageState.CREATING and not st.started


def test_an_announcement_read_only_after_the_teardown_is_shown_never_taken() -> None:
    """A stop during bring-up (a terminal's hang-up): the stage's announcement was already on its way, and its
    reader hands it on only as the backend closes, after the teardown. It is a line like any other then: shown,
    never taken as an announcement of a stage that is gone (that was 'a stage cannot take announce in state
    gone', exit 1, where the stop's own 129 was due)."""

    class LateLines(FakeBackend):
        def close(self, timeout: float = 5.0) -> None:
            super().close(timeout)
            for k, sink in self.sinks.values():
                sink(StageOutput(k, "stdout", f"PP_GPU_NODE_ADDR {node_id(k)} 127.0.0.1:{7000 + k}".encode()))

    plan = build_plan(
        ChainRequest(stages=2, addr_timeout=5.0, grace=2.0),
        environ={},
        owner="host:1:2",
        stage_gpus=[()] * 2,
        device_requests=[()] * 2,
        run_id="abcdef012345",
    )
    clock = FakeClock()
    inbox = FakeInbox(clock)
    backend = LateLines(scripts={0: StageScript(announce=False)}, inbox=inbox)
    reporter = RecordingReporter()
    scope = ChainScope(plan, backend, inbox, reporter, ThreadRuntime(clock))
    inbox.at(1001.0, StopRequested(signal.SIGHUP))
    outcome = scope.run()
    assert outcome.exit_code == 129
    assert (0, "stdout", f"PP_GPU_NODE_ADDR {node_id(0)} 127.0.0.1:7000") in reporter.lines  # shown
    assert reporter.named("stage_announced") == []  # never taken
    assert reporter.named("chain_stopped")[0]["exit_code"] == 129
