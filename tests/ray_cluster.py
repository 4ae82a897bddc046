"""A real Ray cluster on this machine, for the `--ray` tests: a head and two worker nodes, each worker node with its
own Docker engine and fake GPUs.

- node `a`: the fake GPU host of tests/data/plain-4gpu.json, its GPU engine (the fake toolkit's hook);
- node `b`: the fake GPU host of tests/data/pcie-2socket-4gpu.json, its own GPU engine;
- the head: no CPU and no GPU for tasks (nothing of ours runs there), no dashboard, no usage stats.

Ray registers its nodes under the machine's address and listens on every interface, so the whole cluster, and
every launcher the tests run against it, lives in a network namespace of the tests' own with only loopback (the
engines' namespace: node b's engine joins node a's). `listeners()` reads what listens there (`ss`), so a test can
check that nothing listens or connects beyond 127.0.0.1. Each node is `ray start --block` in a process session of
its own; `close()` ends every process of those sessions and checks that none is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pp_launch.testing import fake_nvml

from .gpu_host import DATA, FakeGpuHost
from .helpers import drop_records, suite_engine

PORT = 6379  # the namespace is the tests' own: nothing else listens there
NODE_CPUS = 2  # each worker node's CPUs as Ray counts them: this machine's (8 made no difference to bring-up)
RAY = str(Path(sys.executable).with_name("ray"))
PP_LAUNCH = str(Path(sys.executable).with_name("pp-launch"))


class RayCluster:
    def __init__(self, images: tuple[str, ...]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ppr-", dir="/tmp"))  # short: Ray's socket paths must fit
        self.home_engine = suite_engine()  # the suite's engine, kept: its runs' records are removed there alone
        self.hosts: dict[str, FakeGpuHost] = {}
        self.head_up = False  # whether a head was started and not killed since (Ray can be asked)
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.state_dir = self.root / "state"
        self.state_dir.mkdir()
        self.token_path = self.root / "auth_token"  # token authentication on, as Ray's docs ask of every cluster
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        try:
            a = FakeGpuHost(DATA / "plain-4gpu.json")
            a.images = images
            self.hosts["a"] = a
            self.netns_pid = self._engine_pid(a)
            b = FakeGpuHost(DATA / "pcie-2socket-4gpu.json", netns_of=a.engine("request"))
            b.images = images
            self.hosts["b"] = b
            b.engine("request")
            self.address = f"127.0.0.1:{PORT}"
            self._start_all()
        except BaseException:
            self.close()
            raise

    def _start_all(self, head_cpus: int = 0) -> None:
        """The head, then nodes a and b. `head_cpus`: the head runs CPU stages too, on node a's engine."""
        head = [
            "--head",
            f"--port={PORT}",
            f"--num-cpus={head_cpus}",
            "--num-gpus=0",
            f"--temp-dir={self.root / 'r'}",
            "--include-dashboard=false",
            "--ray-client-server-port=10001",
        ]
        self._start("head", head, self.node_env("a") if head_cpus else self._base_env())
        self.head_up = True
        self.wait_nodes(1)
        for n, name in enumerate(("a", "b"), start=2):  # one at a time: raylets starting together collide
            self.start_node(name)
            self.wait_nodes(n)

    def kill_head(self) -> None:
        """The head lost: its GCS, raylet and everything else of it SIGKILLed at once (nothing of Ray answers
        until `restart`)."""
        self.head_up = False
        self.kill_node("head")

    def restart(self, head_cpus: int = 0) -> None:
        """A fresh cluster on the same engines (after the head was lost, the worker nodes cannot rejoin)."""
        for name in list(self.nodes):
            self.kill_node(name)
        self._start_all(head_cpus)

    # ------------------------------------------------------------------------------------------ nodes
    def _engine_pid(self, host: FakeGpuHost) -> int:
        side = host.engine("request")
        assert side.proc is not None
        return side.proc.pid

    def netns(self) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.netns_pid}/ns/net", "--"]

    def auth(self) -> dict[str, str]:
        """Ray's token authentication, as Ray's own tools find it: the mode and the token's file."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1", PYTHONUNBUFFERED="1")
        env.update(self.auth())
        for drop in ("RAY_ADDRESS", "DOCKER_HOST", "DOCKER_CONTEXT", "RAY_AUTH_TOKEN"):
            env.pop(drop, None)
        return env

    def node_env(self, name: str) -> dict[str, str]:
        """What a node's raylet, and so each actor on it, inherits: its engine and its GPUs (the fake NVML)."""
        host = self.hosts[name]
        env = self._base_env()
        env.update(host.env("request"))
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def start_node(self, name: str) -> None:
        gpus = len(self.hosts[name].inventory.gpus)
        args = [
            f"--address={self.address}",
            f"--num-cpus={NODE_CPUS}",
            f"--num-gpus={gpus}",
            "--labels",
            json.dumps({"pp-launch.node": name}),
        ]
        self._start(name, args, self.node_env(name))

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115  (the node writes it while it runs)
        argv = [
            *self.netns(),
            "sh",
            "-c",
            'ip link set lo up && exec "$@"',
            "ray-node",
            RAY,
            "start",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            "--block",
            *args,
        ]
        self.nodes[name] = subprocess.Popen(
            argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=self.root
        )
        log.close()

    def kill_node(self, name: str) -> None:
        """The node lost: every process of it SIGKILLed at once (raylet, workers, actors)."""
        proc = self.nodes.pop(name)
        _kill_session(proc.pid)
        proc.wait()

    def alive_nodes(self, at_least: int = 0, within: float = 0.0) -> int:
        """How many nodes are alive. With `at_least`: asked again by the same driver (every 0.2 s) until that many
        are, or `within` seconds pass; one driver's start (Ray imported, a connection made: about a second of CPU,
        with the cluster's share) for the whole wait, never one per look."""
        out = self.python(
            "import time, ray\n"
            f"until = time.monotonic() + {within}\n"
            "ray.init(address='auto', logging_level='ERROR')\n"
            f"while (alive := sum(1 for n in ray.nodes() if n['Alive'])) < {at_least} and time.monotonic() < until:\n"
            "    time.sleep(0.2)\n"
            "print(alive)\n",
            timeout=within + 60,
        )
        return int(out.stdout.strip() or 0)

    def wait_nodes(self, n: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:  # a node that exits is seen within 10 s
                if self.alive_nodes(n, within=min(10.0, max(0.0, deadline - time.monotonic()))) >= n:
                    return
            except (ValueError, subprocess.TimeoutExpired):
                pass
            for name, proc in self.nodes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray node {name} exited: {self.log_tail(name)}")
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes: {self.log_tail('head')}")

    def log_tail(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    # ------------------------------------------------------------------------------------------ the launcher's side
    def env(self, **extra: str) -> dict[str, str]:
        """A launcher's environment: the cluster's address, no engine and no GPU of its own, a private state."""
        env = fake_nvml.environ(self.hosts["a"].lib_dir, self.root / "no-gpu")
        for drop in ("DOCKER_HOST", "DOCKER_CONTEXT"):
            env.pop(drop, None)
        env.update(RAY_ADDRESS=self.address, RAY_USAGE_STATS_ENABLED="0", PP_LAUNCH_STATE_DIR=str(self.state_dir))
        env.pop("RAY_AUTH_TOKEN", None)
        env.update(self.auth())
        env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 240, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.netns(), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=kwargs.pop("env", None) or self.env(),
            **kwargs,
        )  # type: ignore[call-overload]

    def popen(self, *argv: str, **kwargs: object) -> subprocess.Popen[str]:
        env = kwargs.pop("env", None) or self.env()
        return subprocess.Popen([*self.netns(), *argv], text=True, env=env, **kwargs)  # type: ignore[call-overload]

    def python(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-c", code, timeout=timeout)

    def ours(self) -> dict[str, list[str]]:
        """Every container labelled pp-launch.run on each node's engine (running or not)."""
        out = {}
        for name, host in self.hosts.items():
            side = host.engines.get("request")
            if side is None:
                continue
            argv = ["docker", "-H", side.host, "ps", "-aq", "--no-trunc", "--filter", "label=pp-launch.run"]
            out[name] = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()
        return out

    def driver_log(self) -> int:
        """Where the launchers' shared Ray log ends now (its size): Ray's own lines (its driver's C++ log, its
        Python loggers) go there, never to a launcher's terminal without -v."""
        path = self.state_dir / "ray-driver.log"
        return path.stat().st_size if path.exists() else 0

    def post_mortem(self, since: float, log_from: int) -> str:
        """What the containers left on the nodes are, and Ray's own words from the launchers that ran since
        (the state folder's ray-driver.log from `log_from`, and their core drivers' error lines and last lines in the
        cluster's session logs): why a launcher ended where pp-launch said nothing."""
        lines: list[str] = []
        for name, host in self.hosts.items():
            side = host.engines.get("request")
            if side is None:
                continue
            fmt = '{{.ID}} {{.Names}} {{.State}} {{.Status}} run={{.Label "pp-launch.run"}}'
            argv = ["docker", "-H", side.host, "ps", "-a", "--filter", "label=pp-launch.run", "--format", fmt]
            out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()
            lines += [f"node {name}: {row}" for row in out]
        with contextlib.suppress(OSError), open(self.state_dir / "ray-driver.log", "rb") as log:
            log.seek(log_from)
            said = log.read().decode(errors="replace").splitlines()
            lines += [f"ray-driver.log: {x[:300]}" for x in said[-30:]]
        logs = self.root / "r" / "session_latest" / "logs"
        for path in sorted(logs.glob("python-core-driver-*.log")):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < since:
                    continue
                said = path.read_text(errors="replace").splitlines()
                bad = [x for x in said if re.match(r"\[[^]]* [EF] \d", x)]
                last = [x for x in said[-3:] if x not in bad[-8:]]  # how it ended, whatever the level
                lines += [f"driver {path.stem.rsplit('_', 1)[-1]}: {x[:300]}" for x in bad[-8:] + last]
        return "\n".join(lines) or "(no container left, and nothing in Ray's own logs)"

    def sweep(self) -> None:
        """Whatever a failed test left on the cluster is ended, so that it fails that test alone: each run left
        stopped with `down --ray`, any container still there removed by its id, every ended run's actors let go."""
        runs: set[str] = set()
        for name, ids in self.ours().items():
            side = self.hosts[name].engines["request"]
            for ref in ids:
                argv = ["docker", "-H", side.host, "inspect", "-f", '{{index .Config.Labels "pp-launch.run"}}', ref]
                runs.add(subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip())
        for run in sorted(runs - {""}) if self.head_up else ():
            self.run(PP_LAUNCH, "down", run, "--ray", "auto", "--grace", "1", timeout=120)
        for name, ids in self.ours().items():
            if ids:
                side = self.hosts[name].engines["request"]
                subprocess.run(["docker", "-H", side.host, "rm", "-f", *ids], capture_output=True, check=False)
        if self.head_up:
            self.run(PP_LAUNCH, "gc", "--ray", "auto", env=self.env(PP_LAUNCH_RECORD_KEEP="0"), timeout=120)

    def actors(self) -> list[str]:
        """Every live actor of the cluster's pp-launch namespace, and every live actor of any job (by class)."""
        code = (
            "import ray; from ray.util import state\n"
            "ray.init(address='auto', logging_level='ERROR')\n"
            "from ray._private.state import actors\n"
            "print('\\n'.join(f\"{a['ActorClassName'] if 'ActorClassName' in a else a.get('Name')}\" "
            "for a in actors().values() if a.get('State') == 'ALIVE'))\n"
        )
        out = self.python(code)
        return [line for line in out.stdout.splitlines() if line.strip()]

    def listeners(self) -> list[str]:
        """Local addresses of every listening socket in the cluster's namespace (ss -ltn)."""
        out = subprocess.run([*self.netns(), "ss", "-Htln"], capture_output=True, text=True, check=True).stdout
        return [line.split()[3] for line in out.splitlines() if line.split()]

    def connections(self) -> list[str]:
        """Peer addresses of every TCP connection in the namespace."""
        out = subprocess.run([*self.netns(), "ss", "-Htn"], capture_output=True, text=True, check=True).stdout
        return [line.split()[4] for line in out.splitlines() if len(line.split()) > 4]

    # ------------------------------------------------------------------------------------------ the end
    def close(self) -> list[str]:
        left: list[str] = []
        for name in list(self.nodes):
            proc = self.nodes.pop(name)
            _kill_session(proc.pid, gently=True)
            proc.wait()
            if _session(proc.pid):
                left.append(f"processes of ray node {name}: {_session(proc.pid)}")
        for host in self.hosts.values():
            left += host.close()
        if os.environ.get("PP_RAY_KEEP_LOGS"):  # a folder to keep the cluster's own logs in, for a post-mortem
            shutil.copytree(
                self.root / "r" / "session_latest" / "logs",
                os.environ["PP_RAY_KEEP_LOGS"],
                dirs_exist_ok=True,
                ignore_dangling_symlinks=True,
            )
        drop_records(self.home_engine, self.root)  # its runs' records on the suite's engine
        shutil.rmtree(self.root, ignore_errors=True)
        return left


def _session(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if os.getsid(int(entry)) == sid and int(entry) != sid and stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry))
            except (OSError, IndexError):
                pass
    return pids


def _kill_session(sid: int, gently: bool = False) -> None:
    """Every process of the session (the node's raylet, its workers, its GCS): SIGTERM first when `gently`."""
    if gently:
        for pid in [sid, *_session(sid)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _session(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    for _ in range(3):
        for pid in [sid, *_session(sid)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
