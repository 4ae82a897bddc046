"""Extra Docker engines for tests that break an engine (kill, freeze, stop, restart): never the suite's own.

Each is a second dockerd with its own socket, data root, exec root and pidfile, no bridge and no iptables, in a
folder of its own under /tmp, and in a network namespace of its own (loopback up): dockerd started with
`--bridge none` deletes the host's `docker0` (moby's configureNetworking calls removeDefaultBridgeInterface),
which would break the main engine's default network. Its stages' host network is that namespace, so stages of
one side engine reach each other on 127.0.0.1, as on the main engine. With `netns_of`, it joins another side
engine's namespace instead: two "hosts" whose stages reach each other on 127.0.0.1 (chains across
hosts). Images are copied in from the main engine
with `docker save | docker load`. `close()` leaves nothing: no dockerd, containerd or shim of it, no mount
under its folder, not the folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path


class SideEngine:
    def __init__(
        self,
        name: str = "side",
        dockerd: str = "dockerd",
        extra_args: tuple[str, ...] = (),
        path_prefix: str = "",
        netns_of: SideEngine | None = None,
    ) -> None:
        self.root = Path(f"/tmp/pp-engine-{name}-{uuid.uuid4().hex[:8]}")
        self.sock = self.root / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.dockerd = dockerd
        self.extra_args = extra_args
        self.path_prefix = path_prefix  # put first on dockerd's PATH (the fake toolkit's hook, another runc)
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self.netns_of = netns_of  # share that engine's network namespace (its stages reach ours on 127.0.0.1)

    # ------------------------------------------------------------------------------------------ life
    def start(self, timeout: float = 60.0) -> float:
        """Start (or restart on the same folders) and wait until it answers; returns the seconds it took."""
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115  (the engine writes it while it runs)
        if self.netns_of is not None:
            assert self.netns_of.proc is not None
            netns = ["nsenter", f"--net=/proc/{self.netns_of.proc.pid}/ns/net", "--"]
        else:
            netns = ["unshare", "--net", "--"]
        self.proc = subprocess.Popen(
            [
                *netns,
                "sh",
                "-c",
                'ip link set lo up && exec "$@"',
                "side-engine",
                self.dockerd,
                "-H",
                self.host,
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "dockerd.pid"),
                "--bridge",
                "none",
                "--iptables=false",
                "--ip-masq=false",
                *self.extra_args,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env(),
        )
        log.close()
        deadline = t0 + timeout
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the side engine did not start: {self.log_tail()}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.path_prefix:
            env["PATH"] = f"{self.path_prefix}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def answers(self) -> bool:
        try:
            argv = ["docker", "-H", self.host, "version", "--format", "{{.Server.Version}}"]
            return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def load(self, *images: str) -> None:
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, check=check)

    # ------------------------------------------------------------------------------------------ faults
    def kill(self) -> None:
        assert self.proc is not None
        self.thaw()
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """A graceful stop, as `systemctl stop docker` does: SIGTERM, the engine stops its containers."""
        assert self.proc is not None
        self.thaw()
        self.proc.terminate()
        self.proc.wait(timeout)

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.frozen:
            self.proc.send_signal(signal.SIGCONT)
            self.frozen = False

    def ensure_running(self) -> None:
        self.thaw()
        if self.proc is None or self.proc.poll() is not None:
            self._forget_dead_containerd()
            self.start()

    def _forget_dead_containerd(self) -> None:
        """dockerd kills its containerd when it dies; until that process is reaped, its pid file makes a new
        dockerd wait for it ("containerd is still running") and fail. Wait for it to go, or drop the file."""
        pidfile = self.root / "exec" / "containerd" / "containerd.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    return  # gone: the new dockerd starts a fresh one
                if state in ("Z", "X"):
                    break
                time.sleep(0.1)
            pidfile.unlink()

    def ghosts(self, ids: list[str]) -> list[str]:
        """Of `ids` that `docker ps -a` listed, those the engine has no container for (`docker inspect`: no such
        container). An engine that was killed lists, now and then, a container its restart removed as Dead,
        nameless, until its next restart (moby's in-memory view got the container back after its removal; the same
        as docker/for-linux#555). Nothing of it is left to remove: `docker rm` says there is no such container."""
        return [ref for ref in ids if self.docker("inspect", "--type", "container", ref, check=False).returncode]

    def restart(self) -> None:
        """A graceful stop, then a start: a listing's ghosts (ghosts()) go with it."""
        self.ensure_running()
        self.stop()
        self.ensure_running()

    def ours_listed(self) -> list[str]:
        """Every container with a run label the engine lists, after a restart that clears the ghosts of a listing,
        if there were any: what is left of pp-launch's there."""
        ids = self.docker("ps", "-aq", "--filter", "label=pp-launch.run", check=False).stdout.split()
        if ids and len(self.ghosts(ids)) == len(ids):
            self.restart()
            ids = self.docker("ps", "-aq", "--filter", "label=pp-launch.run", check=False).stdout.split()
        return ids

    # ------------------------------------------------------------------------------------------ the end
    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ensure_running()
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
            self.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._kill_strays()
        self._unmount()
        shutil.rmtree(self.root, ignore_errors=True)

    def _strays(self) -> list[int]:
        """Processes of this engine still running: whatever names its folder (containerd, shims)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                with contextlib.suppress(OSError):
                    if str(self.root).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                        found.append(int(entry))
        return found

    def _kill_strays(self) -> None:
        for pid in self._strays():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self._strays() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _unmount(self) -> None:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(str(self.root))), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def leftovers(self) -> list[str]:
        """What close() must have removed: processes and mounts of this engine, and its folder."""
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        left = [f"process {pid}" for pid in self._strays()]
        left += [f"mount {m}" for m in mounts if m.startswith(str(self.root))]
        return left + ([f"folder {self.root}"] if self.root.exists() else [])

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.root / "dockerd.log").read_text(errors="replace").splitlines()[-lines:])
        return ""
