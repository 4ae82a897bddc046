"""The fake NVIDIA host for tests: this machine with 8 fake GPUs (tests/data/nvlink-8gpu.json by default).

- the host's NVML: the fake libnvidia-ml.so.1 on the launcher's library path, serving the inventory;
- GPU engines (second dockerds, tests/engines.py), started on first use and closed at the end of the session:
  `request`: Docker 20.10 with the fake `nvidia-container-runtime-hook` on its PATH (its nvidia device driver
             registered: `--gpus` / DeviceRequests work, the hook gives each container its GPUs);
  `env`:     the same, with the fake `nvidia-container-runtime` as the default runtime (hosts where
             NVIDIA_VISIBLE_DEVICES alone gives a container its GPUs);
  `cdi`:     Docker 26 (Debian trixie's docker.io, unpacked privately) with CDI on and a spec generated from the
             inventory (`nvidia.com/gpu=<index>` and `=<uuid>`).
- `env(mode)`: the environment for a launcher on this host: DOCKER_HOST of that engine, the fake NVML, and a
  state directory (lock, reservations) of the session's own, never the host's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from pp_launch.adapters import inventory_file
from pp_launch.testing import fake_nvml, fake_toolkit

from .engines import SideEngine
from .helpers import drop_records, suite_engine

DATA = Path(__file__).resolve().parent / "data"
DOCKER26 = Path(os.environ.get("PP_DOCKER26_DIR", "/opt/pp-launch/docker26"))


class FakeGpuHost:
    def __init__(self, inventory: Path = DATA / "nvlink-8gpu.json", netns_of: SideEngine | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pp-gpu-host-"))
        self.home_engine = suite_engine()  # the suite's engine, kept: its runs' records are removed there alone
        self._starting = threading.Lock()
        self.inventory_path = self.root / "inventory.json"
        shutil.copyfile(inventory, self.inventory_path)
        self.inventory = inventory_file.load(self.inventory_path)
        self.lib_dir = fake_nvml.build(self.root / "lib").parent
        self.config = fake_nvml.write_config(self.inventory, self.root / "host-nvml.conf")
        self.events = self.root / "xid-events"  # the host's Xid events: fake_nvml.inject_xid(host.events, UUID, CODE)
        self.events.touch()
        self.state_dir = self.root / "state"
        self.state_dir.mkdir()
        self.bin = fake_toolkit.install(self.root / "bin", self.inventory_path, self.lib_dir / fake_nvml.LIBRARY)
        self.engines: dict[str, SideEngine] = {}
        self.start_seconds: dict[str, float] = {}
        self.images: tuple[str, ...] = ()
        self.netns_of = netns_of  # the request engine joins that engine's network namespace

    # ------------------------------------------------------------------------------------------ engines
    def engine(self, mode: str) -> SideEngine:
        """The GPU engine of `mode`, started on first use: one per mode, also when two threads ask at once (two
        chains started together on a fresh host: each got an engine of its own, both the same GPUs, and the one
        not kept was left running)."""
        with self._starting:
            if mode not in self.engines:
                self.engines[mode] = self._start(mode)
            return self.engines[mode]

    def _start(self, mode: str) -> SideEngine:
        runtime = str(self.bin / fake_toolkit.RUNTIME)
        if mode == "request":
            side = SideEngine("gpu-request", path_prefix=str(self.bin), netns_of=self.netns_of)
        elif mode == "env":
            args = ("--add-runtime", f"nvidia={runtime}", "--default-runtime", "nvidia")
            side = SideEngine("gpu-env", path_prefix=str(self.bin), extra_args=args)
        elif mode == "cdi":
            side = self._cdi_engine()
        else:
            raise ValueError(mode)
        self.start_seconds[mode] = side.start()
        if self.images:
            side.load(*self.images)
        return side

    def _cdi_engine(self) -> SideEngine:
        dockerd = DOCKER26 / "usr" / "sbin" / "dockerd"
        if not dockerd.exists():
            raise RuntimeError(f"Docker 26 is not unpacked at {DOCKER26}: run launcher/scripts/ensure-docker26.sh")
        spec_dir = self.root / "cdi"
        fake_toolkit.write_cdi_spec(spec_dir, self.inventory, self.lib_dir / fake_nvml.LIBRARY, self.root / "cdi-nvml")
        config = self.root / "daemon-cdi.json"
        config.write_text(f'{{"features": {{"cdi": true}}, "cdi-spec-dirs": ["{spec_dir}"]}}')
        # docker-init and docker-proxy of its own version first on its PATH; containerd and runc are the host's
        path = f"{DOCKER26 / 'usr' / 'bin'}:{DOCKER26 / 'usr' / 'sbin'}"
        return SideEngine("gpu-cdi", dockerd=str(dockerd), extra_args=("--config-file", str(config)), path_prefix=path)

    # ------------------------------------------------------------------------------------------ launchers
    def env(self, mode: str | None = None, **extra: str) -> dict[str, str]:
        env = fake_nvml.environ(self.lib_dir, self.config, events=self.events)
        env["PP_LAUNCH_STATE_DIR"] = str(self.state_dir)
        if mode is not None:
            env["DOCKER_HOST"] = self.engine(mode).host
        env.update(extra)
        return env

    def inject_xid(self, uuid: str, code: int) -> None:
        """An Xid on GPU `uuid`, as the driver reports it: to this host's NVML, and inside every running container
        of its engines the toolkit gave that GPU."""
        fake_nvml.inject_xid(self.events, uuid, code)
        line = f"xid {uuid} {code}"
        inside = f"{fake_nvml.CONTAINER_CONFIG}/{fake_toolkit.CONTAINER_EVENTS}"
        for ref in fake_toolkit.given(self.bin, uuid):
            for side in self.engines.values():
                side.docker("exec", ref, "sh", "-c", f"echo '{line}' >> {inside}", check=False)

    def hook_log(self) -> list[dict[str, object]]:
        return fake_toolkit.hook_log(self.bin)

    def close(self) -> list[str]:
        left = []
        for side in self.engines.values():
            side.close()
            left += side.leftovers()
        drop_records(self.home_engine, self.root)  # its runs' records on the suite's engine
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            left.append(f"folder {self.root}")
        return left


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def docker(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "-H", host, *args], capture_output=True, text=True, check=False)
