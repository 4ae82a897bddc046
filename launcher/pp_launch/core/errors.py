"""One base error, a few typed subclasses, and the exit code each maps to (docs/getting-started.md).

The CLI maps these to exit codes and messages in one place; library code raises them with a message
a user can act on (which stage, which container, what to do).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def exit_code_for_signal(signum: int) -> int:
    """128+N: stopped by signal N after a clean teardown."""
    return 128 + signum


class PpLaunchError(Exception):
    """Base of every error pp-launch raises on purpose."""

    exit_code = EXIT_FAILURE


class ConfigError(PpLaunchError):
    """Bad flag, bad value, bad image name: found before any container starts."""

    exit_code = EXIT_USAGE


class UsageError(ConfigError):
    """Options that do not go together (a LaunchRequest checks its own rules when it is made)."""


class EngineUnavailable(ConfigError):
    """The Docker engine does not answer."""


class ImageMissing(ConfigError):
    """A user image is not present locally (pp-launch never pulls)."""


class NotEnoughGpus(ConfigError):
    """The machine cannot fit the requested GPUs; the message says why each GPU was passed over."""


class GpuAttachUnavailable(ConfigError):
    """The engine cannot attach GPUs (no NVIDIA container toolkit, or not configured): a host's set-up, exit 2."""


class NameInUse(ConfigError):
    """A container name is taken by a live owner: never killed, reported."""


class HostPathMissing(ConfigError):
    """A host path a stage mounts does not exist where its engine runs (never created empty and owned by root)."""


class EngineError(PpLaunchError):
    """The engine refused an operation we could not do without (create, start)."""


class EngineLost(EngineError):
    """The engine stopped answering mid-way (stopped, killed, frozen, restarted): a connection error or a
    timeout, never a refusal. What it held may still be there; the message says what to run when it is back."""


class HostLost(EngineError):
    """One host of a chain across hosts stopped answering. Not EngineLost: the chain's other hosts are still
    asked (and torn down); what that host held is reported as possibly left, with the command to run later."""


class StateUnsafe(ConfigError):
    """The state directory is not private to this user (another owner, writable by others, a symbolic link):
    nothing in it is trusted, nothing is written; the message names it and the fix."""


class StateFault(PpLaunchError):
    """A file of this user's state could not be written or read (no space, an I/O error): the message names it."""


class LockTimeout(ConfigError):
    """A GPU lock stayed held by another launch past PP_LOCK_TIMEOUT; nothing was started."""


class Interrupted(PpLaunchError):
    """A stop signal arrived while an attempt was placed (waiting for a lock, or planning), before any stage was
    created: exit 128+N; the message says what the attempt had started and was removed."""

    def __init__(self, signum: int, message: str = "", run_id: str = "", reason: str = "signal") -> None:
        super().__init__(message or f"stopped by signal {signum} while waiting; nothing was started")
        self.signum = signum
        self.run_id = run_id  # the run it stopped, once it has one (--json says it as a chain_stopped event)
        self.reason = reason  # chain_stopped's: "signal", or "down" (told to the run's guard)
        self.exit_code = exit_code_for_signal(signum)


class LockLost(PpLaunchError):
    """The engine's GPU lock this launch held is no longer running (removed by another client): another launch may
    be placing on the same GPUs, so this one stops before its stages start; nothing else is touched."""


class GuardLost(PpLaunchError):
    """A run's guard on an engine is gone (`pp-launch down`, or removed by another client): what the run creates
    there can no longer be recorded as its own, so the launch stops."""
