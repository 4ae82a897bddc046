"""Three Docker engines of this machine as three hosts, for chains across hosts.

- `local`: the suite's main engine (DOCKER_HOST of the session; no NVIDIA toolkit, so no GPU there);
- `gpu-a`: a GPU engine (Docker 20.10 with the fake NVIDIA toolkit, tests/gpu_host.py) with the 4 fake GPUs of
  tests/data/pcie-2socket-4gpu.json, in a network namespace of its own, named by a Docker context (`pp-gpu-a`
  in the testbed's own DOCKER_CONFIG), as users name their hosts;
- `gpu-b`: a second GPU engine with the 8 fake GPUs of tests/data/nvlink-8gpu.json, in gpu-a's network namespace
  (so stages on a and b reach each other on 127.0.0.1, as stages on two real hosts reach each other over the
  network), reached the way remote hosts are: over `ssh://root@127.0.0.1:PORT` to an sshd the testbed starts
  (key auth; its keys and known_hosts in the testbed's HOME; `SetEnv DOCKER_HOST` points the session's
  `docker system dial-stdio` at gpu-b's socket).

`env()` is a launcher's environment: HOME (ssh keys), DOCKER_CONFIG (the context), a state directory of its own,
and the fake NVML of a GPU-less launcher machine. `close()` leaves nothing: engines, sshd, folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pp_launch.testing import fake_nvml

from . import helpers
from .gpu_host import DATA, FakeGpuHost

CONTEXT_A = "pp-gpu-a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sshd:
    """Debian's sshd on 127.0.0.1:PORT, key auth only, root allowed, every session's DOCKER_HOST set."""

    def __init__(self, root: Path, home: Path, docker_host: str) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"ssh://root@127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        remote_home = root / "home"  # the sessions' HOME: this machine's root shell setup is not the remote host's
        remote_home.mkdir(exist_ok=True)
        # each channel's `docker system dial-stdio` passes through a shim that counts it (channels())
        shim = root / "bin"
        shim.mkdir(exist_ok=True)
        self.dials = root / "dials.log"
        real = shutil.which("docker") or "/usr/bin/docker"
        (shim / "docker").write_text(f'#!/bin/sh\necho "$*" >> {self.dials}\nexec {real} "$@"\n')
        (shim / "docker").chmod(0o755)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run([*keygen, "-f", str(root / "host_key")], check=True)
        subprocess.run([*keygen, "-f", str(ssh_dir / "id_ed25519")], check=True)
        (root / "authorized_keys").write_text((ssh_dir / "id_ed25519.pub").read_text())
        host_pub = (root / "host_key.pub").read_text().split()
        (ssh_dir / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        (root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nMaxSessions 100\nMaxStartups 100\n"
            f"SetEnv DOCKER_HOST={docker_host} HOME={remote_home} PATH={shim}:/usr/local/bin:/usr/bin:/bin\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        log = open(root / "sshd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(root / "sshd_config")],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 20
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def channels(self) -> int:
        """How many SSH channels ran `docker system dial-stdio` (each a connection to the engine) so far."""
        return self.dials.read_text().count("dial-stdio") if self.dials.exists() else 0

    def _listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return False

    def sessions(self) -> list[int]:
        """The per-connection sshd processes (children of the listener): one per client connection."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[1]) == self.proc.pid:
                        out.append(int(entry))
        return out

    def cut(self) -> list[int]:
        """Drop every SSH connection now, as a network that fails would: the sessions are killed."""
        cut = self.sessions()
        for pid in cut:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return cut

    def close(self) -> None:
        self.cut()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ThreeHosts:
    def __init__(self, images: tuple[str, ...]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pp-hosts-"))
        self.home_engine = helpers.suite_engine()  # the suite's engine, kept: its runs' records are removed there alone
        self.home = self.root / "home"
        self.docker_config = self.root / "docker-config"
        self.state_dir = self.root / "state"
        self.state_dir.mkdir()
        self.no_gpu = self.root / "no-gpu"
        self.gpu_a = FakeGpuHost(DATA / "pcie-2socket-4gpu.json")
        self.gpu_a.images = images
        self.gpu_b: FakeGpuHost | None = None
        self.sshd: Sshd | None = None
        try:
            side_a = self.gpu_a.engine("request")
            self.gpu_b = FakeGpuHost(DATA / "nvlink-8gpu.json", netns_of=side_a)
            self.gpu_b.images = images
            side_b = self.gpu_b.engine("request")
            self.sshd = Sshd(self.root / "sshd", self.home, side_b.host)
            self.docker_config.mkdir()
            subprocess.run(
                [
                    "docker",
                    "--config",
                    str(self.docker_config),
                    "context",
                    "create",
                    CONTEXT_A,
                    "--docker",
                    f"host={side_a.host}",
                ],
                check=True,
                capture_output=True,
            )
        except BaseException:
            self.close()
            raise
        self.local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        self.a = CONTEXT_A
        self.b = self.sshd.url
        self.a_host = side_a.host  # its socket, for the test's own docker calls
        self.b_host = side_b.host

    def env(self, **extra: str) -> dict[str, str]:
        env = fake_nvml.environ(self.gpu_a.lib_dir, self.no_gpu)  # the launcher's machine has no GPU
        env.update(HOME=str(self.home), DOCKER_CONFIG=str(self.docker_config), PP_LAUNCH_STATE_DIR=str(self.state_dir))
        # gpu-b is reached over ssh: its guard needs that engine's socket on its machine (docs/chain.md, the guard)
        env.update(PP_LAUNCH_GUARD_SOCKET=self.b_host.removeprefix("unix://"))
        env.update(extra)
        return env

    def engines(self) -> dict[str, str]:
        """Each host's engine socket, for checks the test makes on its own (never through the launcher)."""
        return {"local": self.local, "a": self.a_host, "b": self.b_host}

    def ours(self, label: str = "pp-launch.run") -> dict[str, list[str]]:
        """Every container with that label on each engine (running or not); on the suite's own engine, only those
        this session made (real runs of other owners may live there beside the suite)."""
        found = {}
        for name, host in self.engines().items():
            argv = ["docker", "-H", host, "ps", "-aq", "--no-trunc", "--filter", f"label={label}"]
            ids = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()
            if name == "local" and ids:
                fmt = ["docker", "-H", host, "inspect", "-f", "{{json .Config.Labels}}", *ids]
                rows = subprocess.run(fmt, capture_output=True, text=True, check=False).stdout.splitlines()
                ids = [cid for cid, row in zip(ids, rows, strict=False) if row and helpers.ours(json.loads(row) or {})]
            found[name] = ids
        return found

    def close(self) -> list[str]:
        left: list[str] = []
        if self.sshd is not None:
            self.sshd.close()
        for gpu in (self.gpu_b, self.gpu_a):  # b lives in a's network namespace: it goes first
            if gpu is not None:
                left += gpu.close()
        helpers.drop_records(self.home_engine, self.root)  # its runs' records on the suite's engine
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            left.append(f"folder {self.root}")
        return left
