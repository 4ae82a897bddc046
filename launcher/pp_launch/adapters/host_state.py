"""This user's own state: a private directory, never shared with other users.

Nothing that coordinates launches lives here any more: GPU exclusivity across users, launchers and machines is
kept on the engine (the GPU lock is a running container tied to its launcher, and the containers' labels say
which GPUs they hold), so no other user can forge, block or steal it. What is left is a convenience: the hosts
of each chain across hosts started here, so that `ps`, `down` and `gc --all-hosts` know where to look.

The directory is `PP_LAUNCH_STATE_DIR`, else `$XDG_STATE_HOME/pp-launch`, else `~/.local/state/pp-launch`,
created with mode 0700. It is used only when it is a real directory (not a symbolic link), owned by this user and
writable by no one else; otherwise every command that needs it stops with one line naming it and the fix. Files
in it are opened relative to the directory's descriptor, never following a symbolic link (O_NOFOLLOW), written
to a temporary name and renamed into place. A file that does not parse is moved aside (`<name>.corrupt`), said
once, and never blocks a launch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pp_launch.core import errors

STATE_ENV = "PP_LAUNCH_STATE_DIR"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def default_dir(environ: dict[str, str] | os._Environ[str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "pp-launch"
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".local" / "state" / "pp-launch"


def _fix(path: Path) -> str:
    return f"remove it, or set {STATE_ENV} to a directory of your own (mode 0700)"


def _fault(path: Path, exc: OSError, doing: str) -> errors.PpLaunchError:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return errors.StateUnsafe(f"cannot {doing} {path}: {exc.strerror}; {_fix(path)}")
    if exc.errno == errno.ENOSPC:
        return errors.StateFault(
            f"cannot {doing} {path}: no space left on its file system; free some, or set "
            f"{STATE_ENV} to a directory elsewhere"
        )
    return errors.StateFault(f"cannot {doing} {path}: {exc.strerror or exc}")


class StateDir:
    """The directory, held open: every file is reached through its descriptor, so a path swapped underneath
    (a symbolic link planted after the check) is never followed."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: Path | None = None) -> StateDir:
        path = path or default_dir()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise errors.StateUnsafe(
                    f"the state directory {path} is a symbolic link or not a directory: pp-launch does not follow "
                    f"it; {_fix(path)}"
                ) from None
            raise _fault(path, exc, "open the state directory") from None
        info = os.fstat(fd)
        why = ""
        if info.st_uid != os.geteuid():
            why = f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
        if why:
            os.close(fd)
            raise errors.StateUnsafe(f"the state directory {path} {why}: nothing in it is trusted; {_fix(path)}")
        return cls(path, fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sub(self, name: str) -> StateDir:
        """A subdirectory (made 0700 if missing), held open the same way."""
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=self.fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            raise _fault(self.path / name, exc, "open") from None
        return StateDir(self.path / name, fd)

    def names(self, suffix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.fd) if n.endswith(suffix))
        except OSError as exc:
            raise _fault(self.path, exc, "list") from None

    def mtime(self, name: str) -> float:
        """When the file was last written (a link's own time, never its target's); now when it is gone meanwhile."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return time.time()
        except OSError as exc:
            raise _fault(self.path / name, exc, "read") from None

    def read(self, name: str) -> bytes | None:
        """The file's bytes; None when it is not there. A symbolic link is never followed (it reads as absent)."""
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise _fault(self.path / name, exc, "read") from None
        with os.fdopen(fd, "rb") as f:
            return f.read(1 << 20)

    def write(self, name: str, data: bytes) -> None:
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=self.fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)
                raise
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            raise _fault(self.path / name, exc, "write") from None

    def append_fd(self, name: str) -> int:
        """A descriptor to append to `name` (made 0600, never through a link), for the caller to close."""
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | NOFOLLOW
            return os.open(name, flags, 0o600, dir_fd=self.fd)
        except OSError as exc:
            raise _fault(self.path / name, exc, "open") from None

    def remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _fault(self.path / name, exc, "remove") from None

    def set_aside(self, name: str) -> str:
        aside = f"{name}.corrupt"
        try:
            os.replace(name, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            raise _fault(self.path / name, exc, "move aside") from None
        return aside


@contextlib.contextmanager
def state(path: Path | None = None) -> Iterator[StateDir]:
    d = StateDir.open(path)
    try:
        yield d
    finally:
        d.close()


@contextlib.contextmanager
def _folder(base: Path | None, name: str) -> Iterator[StateDir]:
    """A folder of the state directory, held open for the block."""
    with state(base) as top:
        sub = top.sub(name)
        try:
            yield sub
        finally:
            sub.close()


RAY_LOG = "ray-driver.log"  # what Ray's own driver code writes to the launcher's stderr, kept aside (without -v)


def ray_log() -> tuple[int, Path]:
    """Where Ray's own lines go when they are not shown: (a descriptor to append to, its path)."""
    with state() as d:
        return d.append_fd(RAY_LOG), d.path / RAY_LOG


def _quiet(text: str) -> None:
    pass


class RunHosts:
    """The hosts of each chain across hosts started here (`hosts/<run>.json` in this user's state), so that `ps`,
    `down` and `gc` with --all-hosts know where to look. Written before anything starts; dropped once nothing of
    the run is left anywhere. A record that does not parse is moved aside and said once (`warn`)."""

    def __init__(self, directory: Path | None = None, warn: Callable[[str], None] = _quiet) -> None:
        self.base = directory
        self.warn = warn

    def _dir(self) -> contextlib.AbstractContextManager[StateDir]:
        return _folder(self.base, "hosts")

    def write(self, run_id: str, hosts: tuple[str, ...]) -> None:
        with self._dir() as d:
            d.write(f"{run_id}.json", json.dumps({"run": run_id, "hosts": list(hosts)}).encode())

    def _read(self, d: StateDir, name: str) -> tuple[str, ...]:
        data = d.read(name)
        if data is None:
            return ()
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list):
                raise ValueError("not an object with a list of hosts")
            if not all(isinstance(h, str) for h in doc["hosts"]):
                raise ValueError("a host that is not a string")
        except (ValueError, UnicodeDecodeError) as exc:
            aside = d.set_aside(name)
            self.warn(f"{d.path / name} is not a record pp-launch wrote ({exc}); moved aside as {aside}")
            return ()
        return tuple(doc["hosts"])

    def of(self, run_id: str) -> tuple[str, ...]:
        with self._dir() as d:
            return self._read(d, f"{run_id}.json")

    def every(self) -> tuple[str, ...]:
        """Every host any recorded run uses, in the order first seen."""
        seen: dict[str, None] = {}
        with self._dir() as d:
            for name in d.names(".json"):
                seen.update(dict.fromkeys(self._read(d, name)))
        return tuple(seen)

    def forget(self, run_id: str) -> None:
        with self._dir() as d:
            d.remove(f"{run_id}.json")

    def _matching(self, d: StateDir, prefix: str) -> list[str]:
        return [n for n in d.names(".json") if n.startswith(prefix)] if prefix else []

    def of_prefix(self, prefix: str) -> tuple[str, ...]:
        """The hosts of the recorded runs whose id starts with `prefix` (a run id, or a unique prefix of one)."""
        seen: dict[str, None] = {}
        with self._dir() as d:
            for name in self._matching(d, prefix):
                seen.update(dict.fromkeys(self._read(d, name)))
        return tuple(seen)

    def forget_prefix(self, prefix: str) -> None:
        with self._dir() as d:
            matching = self._matching(d, prefix)
            if len(matching) == 1:
                d.remove(matching[0])


class RunIds:
    """Every id the engine returned for a create of a run started here (`ids/<run>` in this user's private state),
    written the moment it is known, as the run's guard records it. The guard's record ends with the guard; this one
    stays, so that `down` and `gc` of the same user can still act, by id, on what an engine crash left (a Dead
    container whose guard died with the engine). Dropped once the run ended and nothing of it is left."""

    def __init__(self, directory: Path | None = None) -> None:
        self.base = directory

    def _dir(self) -> contextlib.AbstractContextManager[StateDir]:
        return _folder(self.base, "ids")

    def add(self, run_id: str, ref: str) -> None:
        """One line appended (O_APPEND: creates on several threads at once never lose one)."""
        with self._dir() as d:
            try:
                fd = os.open(run_id, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=d.fd)
                try:
                    os.write(fd, f"{ref}\n".encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _fault(d.path / run_id, exc, "write") from None

    def of(self, run_id: str) -> set[str]:
        with self._dir() as d:
            return self._read(d, run_id)

    @staticmethod
    def _read(d: StateDir, name: str) -> set[str]:
        text = (d.read(name) or b"").decode("ascii", "replace")
        return {w for w in text.split() if len(w) == 64 and all(ch in "0123456789abcdef" for ch in w)}

    def every(self) -> dict[str, set[str]]:
        """Each recorded run and its ids."""
        with self._dir() as d:
            return {name: self._read(d, name) for name in d.names("") if not name.startswith(".")}

    def forget(self, run_id: str) -> None:
        with self._dir() as d:
            d.remove(run_id)


RECORD_KEEP_ENV = "PP_LAUNCH_RECORD_KEEP"  # seconds an ended run's record is kept before it may be removed
RECORD_KEEP = 7 * 24 * 3600.0


RECORD_COUNT_ENV = "PP_LAUNCH_RECORD_COUNT"  # how many of this user's newest records are kept, whatever their age
RECORD_COUNT = 50  # as many as the run logs keep (adapters/run_logs.py)


def record_keep() -> float:
    return seconds_setting(RECORD_KEEP_ENV, RECORD_KEEP, "give seconds")


def record_count() -> int:
    """How many of this user's records a run's end and `gc` keep at most (the newest), besides the keep in time."""
    configured = os.environ.get(RECORD_COUNT_ENV, "").strip()
    if not configured:
        return RECORD_COUNT
    if not (configured.isascii() and configured.isdigit()):
        raise errors.ConfigError(f"{RECORD_COUNT_ENV}={configured!r}: give a count (0 or more)")
    return int(configured)


def seconds_setting(name: str, default: float, fix: str) -> float:
    """A setting in seconds from the environment (0 or more); its default when unset."""
    configured = os.environ.get(name, "").strip()
    if not configured:
        return default
    try:
        return max(0.0, float(configured))
    except ValueError:
        raise errors.ConfigError(f"{name}={configured!r}: {fix}") from None


class RunRecords:
    """The record volumes this user's runs made (`records/<volume>` in this user's private state, empty files): what
    `pp-launch gc` may remove once their runs are gone and the keep is over, and what this user made at all. Its
    `RAY` folder: the detached runs this user launched on Ray clusters (`ray-records/<run>`, holding the cluster's
    head address), whose records on the cluster a later run's end there releases likewise."""

    RAY = "ray-records"

    def __init__(self, directory: Path | None = None, folder: str = "records") -> None:
        self.base, self.folder = directory, folder

    def _dir(self) -> contextlib.AbstractContextManager[StateDir]:
        return _folder(self.base, self.folder)

    def listed(self) -> bool:
        """Whether this user's state has the list at all (asked without making the state directory)."""
        return ((self.base or default_dir()) / self.folder).is_dir()

    def add(self, name: str, note: str = "") -> None:
        with self._dir() as d:
            if note:
                d.write(name, note.encode())
                return
            try:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=d.fd))
            except OSError as exc:
                raise _fault(d.path / name, exc, "write") from None

    def every(self, older_than: float | None = None, note: str | None = None) -> list[str]:
        """Each name (older_than: only those recorded at least that many seconds ago; note: with that note)."""
        with self._dir() as d:
            names = sorted(name for name in d.names("") if not name.startswith("."))
            if older_than is not None:
                names = [n for n in names if time.time() - d.mtime(n) >= older_than]
            return names if note is None else [n for n in names if (d.read(n) or b"") == note.encode()]

    def past(self, keep: float, count: int) -> list[str]:
        """What is past keeping: recorded at least `keep` seconds ago, or older than the newest `count`."""
        with self._dir() as d:
            ages = {n: time.time() - d.mtime(n) for n in d.names("") if not n.startswith(".")}
        newest = sorted(ages, key=lambda n: ages[n])
        return sorted({n for n in newest if ages[n] >= keep} | set(newest[count:]))

    def forget(self, volume: str) -> None:
        with self._dir() as d:
            d.remove(volume)


def remove_all(dry_run: bool = False) -> tuple[str, str]:
    """This user's whole state directory, removed (`pp-launch uninstall`): its path, and "removed", "would remove"
    or "none there". A directory that is not private to this user is refused (StateUnsafe), never walked."""
    import shutil

    path = default_dir()
    if not path.is_dir():
        return str(path), "none there"
    StateDir.open(path).close()
    if dry_run:
        return str(path), "would remove"
    shutil.rmtree(path)
    return str(path), "removed"
