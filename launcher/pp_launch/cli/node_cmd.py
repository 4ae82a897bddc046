"""`pp-launch node` and the `pp-gpu-node` console script."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from pp_launch.app import node
from pp_launch.app.request import Hooks
from pp_launch.cli import signals
from pp_launch.cli.boundary import mapped_errors, message
from pp_launch.cli.main import main
from pp_launch.cli.options import read_env_file
from pp_launch.core import errors


@main.command("node", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def node_command(args: tuple[str, ...]) -> None:
    """Run one stage container in the foreground: the same as `pp-gpu-node`.

    A drop-in for docker-gpu-node.sh, configured by the environment: STAGE (required), PP_IMAGE,
    PP_CONTAINER_PREFIX, PP_DEV, PP_CACHE_DIR, PP_STAGE_NETWORK, PP_GPUS (all, N, device=0,2, device=GPU-...,
    auto), PP_MODEL_CACHE_DIR, PP_ENTRYPOINT, PP_FORWARD_ENV, PP_STOP_GRACE. Output passes through unchanged;
    the exit code is the container's (128+N after signal N). The container cannot outlive this process.
    ARGS, if any, are the container's command, as docker-gpu-node.sh passed "$@".

    \b
    Example:
      STAGE=0 NUM_STAGES=2 PP_IMAGE=pp-launch/stub-worker:latest pp-launch node
    """
    sys.exit(_run_node(args))


USAGE = """usage: pp-gpu-node [--env-file FILE]... [COMMAND...]        (also: pp-launch node ...)

One stage container in the foreground, a drop-in for docker-gpu-node.sh. COMMAND, if given, is the container's
command (`--` before it passes it as it is, `-- --help` included); leading `--env-file FILE` options (as docker
run's) set variables in the container first. Output passes
through unchanged; the exit code is the container's (128+N after signal N); the container cannot outlive this
process. Configured by the environment:

  STAGE                 required   stage index (exit 2 without it)
  PP_IMAGE              swactor-pp-gpu:latest   image (never pulled)
  PP_CONTAINER_PREFIX   pp-stage   container name <prefix>-<STAGE>
  PP_DEV                unset      passed in as DEV (unset: the image's own default)
  PP_CACHE_DIR          $HOME/.cache/tinygrad   <dir>/stage-<STAGE> at /root/.cache/tinygrad
  PP_STAGE_NETWORK      host       network mode (older name PP_DIAG_NETWORK); container:<id> allowed
  PP_GPUS               unset      all, N (a count), device=0,2, device=GPU-..., or auto (NVML picks)
  PP_MODEL_CACHE_DIR    unset      <dir>/stage-<STAGE> at /root/.cache/pp-pipeline
  PP_ENTRYPOINT         unset      entrypoint (unset: the image's own)
  PP_FORWARD_ENV        unset      further variable names to forward, comma-separated
  PP_STOP_GRACE         10         seconds between a forwarded stop signal and the kill

Forwarded when set: the stage environment of pp-launch chain (SEED_ADDR, SEED_DIRECT, SEED_RELAY, MAX_TOKENS,
MODEL, WORKER_CMD, WORKER_SCRIPT, PYTHON, CUDA, PP_STAGE_SECRET, PEER_*, FIRST_PEER_*, ...).

Example:
  STAGE=0 NUM_STAGES=2 SEED_ADDR=... PP_IMAGE=pp-launch/stub-worker:latest pp-gpu-node"""


def _env_files(args: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Leading `--env-file FILE` (or `--env-file=FILE`), as docker run takes them, and the command after them
    (`--` ends them too). Everything else is the container's command, as it always was."""
    assignments: list[tuple[str, str]] = []
    rest = list(args)
    while rest:
        if rest[0] == "--":
            rest.pop(0)
            break
        if rest[0] == "--env-file" and len(rest) > 1:
            path = rest[1]
            del rest[:2]
        elif rest[0].startswith("--env-file="):
            path = rest.pop(0).partition("=")[2]
        else:
            break
        assignments += read_env_file(path, "--env-file")
    return tuple(assignments), tuple(rest)


WRAPPER = "docker-gpu-node.sh"


def wrapper_path() -> Path | None:
    """The old entry point, `docker-gpu-node.sh`, as this install carries it: the wheel's copy (setup.py puts it in
    the package), else the source tree's `wrappers/` (an editable install)."""
    here = Path(__file__).resolve().parents[1]
    for path in (here / "_wrappers" / WRAPPER, here.parents[1] / "wrappers" / WRAPPER):
        if path.is_file():
            return path
    return None


def _run_node(args: tuple[str, ...]) -> int:
    if args in (("--help",), ("-h",)):  # help, STAGE set or not; `-- --help` gives the container that argument
        click.echo(USAGE)
        wrapper = wrapper_path()
        click.echo(f"\n{WRAPPER}, the old entry point (it runs pp-gpu-node): {wrapper or 'not in this install'}")
        return 0
    signals.install()  # idempotent; also covers `pp-launch node` and direct calls
    with mapped_errors("pp-gpu-node"), as_docker_run():
        try:
            extra, command = _env_files(args)
        except click.BadParameter as exc:
            raise errors.ConfigError(exc.format_message()) from None
        say = lambda text: click.echo(f"pp-gpu-node: {text}", err=True)  # noqa: E731
        hooks = Hooks(say, on_scope=lambda scope: signals.route_to(scope.request_stop), stop_pending=signals.pending)
        return node.run_node(os.environ, command, hooks, signals.deliver, extra)


DOCKER_RUN_REFUSED = 125  # `docker run`'s code when the engine refuses (126/127 come from the container's tini)


@contextlib.contextmanager
def as_docker_run() -> Iterator[None]:
    """The drop-in for `exec docker run` exits as `docker run` does when the engine refuses: 125 for a missing
    image, a name in use, an engine that does not answer or refuses, GPUs it cannot attach (too many, one this
    host does not have, none at all: any PP_GPUS form, as `docker run --gpus 99`). Configuration that pp-gpu-node
    itself cannot read (STAGE missing, PP_GPUS not understood...) stays exit 2."""
    refused = (
        errors.ImageMissing,
        errors.NameInUse,
        errors.EngineError,
        errors.EngineUnavailable,
        errors.GpuAttachUnavailable,
        errors.NotEnoughGpus,
        errors.HostPathMissing,
    )
    try:
        yield
    except refused as exc:
        click.echo(message(exc, "pp-gpu-node"), err=True)
        sys.exit(DOCKER_RUN_REFUSED)


def gpu_node_main() -> None:
    """The `pp-gpu-node` console script: environment as docs/pp-gpu-node.md, arguments as the container's command."""
    sys.exit(_run_node(tuple(sys.argv[1:])))
