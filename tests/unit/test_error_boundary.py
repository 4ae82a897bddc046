"""One error boundary: every error the library raises is a PpLaunchError, and every one of them,
whatever command it comes out of, reaches the user as one plain line and its exit code, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pp_launch.adapters.nvml import NvmlUnavailable
from pp_launch.app import housekeeping
from pp_launch.app.worker_check import StepFailure
from pp_launch.cli import node_cmd
from pp_launch.cli.go_template import TemplateError
from pp_launch.cli.main import main
from pp_launch.core import errors, events
from pp_launch.core.announce import AnnouncementError
from pp_launch.core.chain.scope import DuplicateNodeId, RosterIncomplete
from pp_launch.core.chain.teardown import TeardownError, TeardownFailed
from pp_launch.core.worker import controller
from pp_launch.core.worker.codec import ProtocolFault
from pp_launch.core.worker.record import RecordError

EXAMPLES: dict[type[errors.PpLaunchError], errors.PpLaunchError] = {
    errors.PpLaunchError: errors.PpLaunchError("something went wrong"),
    errors.ConfigError: errors.ConfigError("--stages 0 is not a number of stages"),
    errors.UsageError: errors.UsageError("--detach and --gpu-node do not go together"),
    errors.EngineUnavailable: errors.EngineUnavailable("cannot reach the Docker engine at unix:///x.sock"),
    errors.ImageMissing: errors.ImageMissing("image x:1 is not present on this engine"),
    errors.NotEnoughGpus: errors.NotEnoughGpus("4 GPUs needed, 2 free"),
    errors.GpuAttachUnavailable: errors.GpuAttachUnavailable("could not select device driver: the engine cannot ..."),
    errors.NameInUse: errors.NameInUse("container name pp-0 is held by a container not made by pp-launch"),
    errors.EngineError: errors.EngineError("the engine refused to create pp-0"),
    errors.HostPathMissing: errors.HostPathMissing("--volume: /models/x does not exist on this host: create it first"),
    errors.EngineLost: errors.EngineLost("the Docker engine at unix:///x.sock stopped"),
    errors.StateUnsafe: errors.StateUnsafe("the state directory /tmp/x is owned by uid 0, not by you (uid 65534)"),
    errors.StateFault: errors.StateFault("cannot write /home/u/.local/state/pp-launch/hosts/r.json: no space left"),
    errors.LockTimeout: errors.LockTimeout("the GPU lock on unix:///x.sock is still held by run abc after 300 s"),
    errors.Interrupted: errors.Interrupted(2),
    errors.LockLost: errors.LockLost("the GPU lock on this engine (container 0123456789ab) was removed by another"),
    errors.GuardLost: errors.GuardLost("the run's guard on the engine at unix:///x.sock is gone"),
    errors.HostLost: errors.HostLost("host gpu2: the Docker engine at ssh://root@127.0.0.1:2222 stopped"),
    TemplateError: TemplateError("--format '{{.Nope}}': no field 'Nope' in a ps row"),
    AnnouncementError: AnnouncementError("malformed announcement 'PP_GPU_NODE_ADDR x'"),
    NvmlUnavailable: NvmlUnavailable("NVML not found: no NVIDIA driver on this host"),
    ProtocolFault: ProtocolFault("InvalidJson: oops", b"{", 3),
    controller.IllegalTransition: controller.IllegalTransition(controller.State.RUNNING, controller.StartWorker()),
    RosterIncomplete: RosterIncomplete([1, 3]),
    DuplicateNodeId: DuplicateNodeId(0, 2, "ab" * 32),
    RecordError: RecordError("InvalidObjectHeader", "no MO01 record at offset 128"),
    StepFailure: StepFailure("expected RoleConfigured"),
    events.IllegalStageTransition: events.IllegalStageTransition(events.StageState.GONE, events.StageInput.STOP),
    TeardownFailed: TeardownFailed(
        "stage 0 (pp-abc-0)", ["f" * 64], [TeardownError("SIGKILL to stage 0", errors.EngineError("refused"))]
    ),
}


def every_error_class(cls: type = errors.PpLaunchError) -> set[type]:
    out = {cls}
    for sub in cls.__subclasses__():
        out |= every_error_class(sub)
    return out


def test_every_error_class_of_the_library_has_an_example_here() -> None:
    """A new error type fails this test until it is driven through the boundary below."""
    assert every_error_class() == set(EXAMPLES)


@pytest.mark.parametrize("error", list(EXAMPLES.values()), ids=[c.__name__ for c in EXAMPLES])
def test_every_error_type_through_a_command_is_one_plain_line_and_its_exit_code(
    error: errors.PpLaunchError, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> None:
        raise error

    monkeypatch.setattr(housekeeping, "connect", boom)  # what `pp-launch ps` calls first (app/housekeeping.py)
    result = CliRunner().invoke(main, ["ps"], catch_exceptions=False)
    assert result.exit_code == error.exit_code
    hint = "pp-launch: hint: 'pp-launch ps --help' lists its options\n" if isinstance(error, errors.UsageError) else ""
    said = "" if isinstance(error, errors.Interrupted) else "error: "  # a stop the user asked for is no error
    assert result.output == f"pp-launch: {said}{error}\n{hint}"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EXAMPLES[errors.EngineLost], 125),  # the engine refused or went away: `docker run`'s 125
        (EXAMPLES[errors.ImageMissing], 125),
        (EXAMPLES[errors.NameInUse], 125),
        (EXAMPLES[errors.EngineUnavailable], 125),
        (EXAMPLES[errors.GpuAttachUnavailable], 125),
        (EXAMPLES[errors.HostPathMissing], 125),
        (EXAMPLES[errors.ConfigError], 2),  # pp-gpu-node's own configuration
        (EXAMPLES[errors.StateFault], 1),
    ],
)
def test_pp_gpu_node_has_the_same_boundary_with_its_own_name_and_docker_runs_codes(
    error: errors.PpLaunchError, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_args: object) -> int:
        raise error

    monkeypatch.setattr(node_cmd.node, "run_node", boom)
    with pytest.raises(SystemExit) as exit_:
        node_cmd._run_node(())
    assert exit_.value.code == code
    assert capsys.readouterr().err == f"pp-gpu-node: error: {error}\n"


def test_exit_codes_follow_the_contract() -> None:
    assert {c: e.exit_code for c, e in EXAMPLES.items() if e.exit_code == errors.EXIT_USAGE} == {
        c: 2 for c in EXAMPLES if issubclass(c, errors.ConfigError)
    }


def test_a_broken_pipe_from_inside_a_command_is_said_with_where_never_a_silent_exit_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Click ends a process whose command raised a broken pipe with exit 1 and not a word (it takes it for a
    closed stdout, which never raises here: cli/streams.py). One from inside is said, with its traceback."""

    def boom() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(housekeeping, "connect", boom)
    result = CliRunner().invoke(main, ["ps"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "in boom" in result.output  # the traceback: where it broke
    assert result.output.endswith(
        "pp-launch: error: a pipe broke inside pp-launch ([Errno 32] Broken pipe); the traceback above says where\n"
    )
