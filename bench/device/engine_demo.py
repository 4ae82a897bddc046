"""The demo on a real GPU host that has NVML and CUDA but no Docker engine and no network (the device machine): a
Docker engine brought up from Debian's packages carried in the tree, pp-launch's images loaded from a carried
archive, a CDI spec for the host's GPUs written from NVML (device nodes and the driver's libraries, as `nvidia-ctk
cdi generate` writes one), and a chain run on them with `--gpus auto --gpu-attach cdi`: NVML picks the GPUs, the
engine attaches them by CDI name, and each stage reports the GPU its own NVML sees.

  prepare CARRY   here (network, an engine with pp-launch's images): Debian trixie's docker.io, containerd and
                  runc, and `pp-launch images save`, into CARRY (a folder .git/info/exclude ignores); says whether
                  CARRY fits the 64 MiB a device call carries.
  run CARRY [OUT] there, as root: the engine (its own socket, data root and exec root under /tmp, no bridge, no
                  iptables), the images, the CDI spec, `pp-launch chain`, everything taken down at the end; the
                  chain's output and a summary in OUT.
  run --dry-run CARRY
                  each step as it would run, every input checked, nothing started (the test suite runs this).

Run there as: PYTHONPATH=launcher python3 bench/device/engine_demo.py run .carry/engine "$OUT"
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = ("docker.io", "containerd", "runc")  # trixie's: Docker 26, with CDI
IMAGES = "pp-launch-images.tar"
CARRY_LIMIT = 64 << 20
LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1", "libnvidia-ptxjitcompiler.so.1")
NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def prepare(carry: Path) -> int:
    carry.mkdir(parents=True, exist_ok=True)
    lists = Path(tempfile.mkdtemp(prefix="pp-device-apt-"))
    try:
        (lists / "lists" / "partial").mkdir(parents=True)
        (lists / "cache" / "archives" / "partial").mkdir(parents=True)
        (lists / "sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
        o = [
            f"-oDir::Etc::SourceList={lists / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={lists / 'lists'}", f"-oDir::Cache={lists / 'cache'}", "-oAPT::Sandbox::User=root",
        ]  # fmt: skip
        subprocess.run(["apt-get", *o, "update", "-qq"], check=True)
        subprocess.run(["apt-get", *o, "download", "-qq", *PACKAGES], check=True, cwd=carry)
    finally:
        shutil.rmtree(lists, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pp_launch", "images", "save", "-o", str(carry / IMAGES)], check=True)
    subprocess.run(["xz", "-T0", "-f", "-6", str(carry / IMAGES)], check=True)
    size = sum(p.stat().st_size for p in carry.iterdir())
    fits = size <= CARRY_LIMIT
    verdict = "fits" if fits else "too large"
    print(f"{carry}: {size / (1 << 20):.1f} MiB; a device call carries 64 MiB with the tree: {verdict}")
    return 0 if fits else 1


class Steps:
    """Each step said; run unless this is a dry run."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry

    def say(self, text: str) -> None:
        print(f"engine-demo: {text}", flush=True)

    def run(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.say("$ " + " ".join(argv))
        if self.dry:
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.run(argv, text=True, capture_output=True, check=False, **kwargs)  # type: ignore[call-overload]


def cdi_spec(gpus: list[dict[str, object]], libraries: dict[str, str]) -> dict[str, object]:
    """`nvidia.com/gpu` devices by index and UUID: each its own device node; every one the control nodes and the
    driver's libraries (read-only binds), as nvidia-ctk generates them."""

    def node(path: str) -> dict[str, str]:
        return {"path": path}

    def mount(host: str) -> dict[str, object]:
        return {"hostPath": host, "containerPath": host, "options": ["ro", "nosuid", "nodev", "bind"]}

    devices = []
    for g in gpus:
        edits = {"deviceNodes": [node(f"/dev/nvidia{g['minor']}")]}
        devices += [
            {"name": str(g["index"]), "containerEdits": edits},
            {"name": str(g["uuid"]), "containerEdits": edits},
        ]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(f"/dev/nvidia{g['minor']}") for g in gpus]}})
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [node(p) for p in NODES if os.path.exists(p)],
            "mounts": [mount(path) for path in libraries.values()],
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        },
    }


def host_gpus(dry: bool) -> tuple[list[dict[str, object]], dict[str, str], str]:
    """The GPUs NVML lists (index, UUID, minor number) and where the driver's libraries are; why not, when not."""
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    libraries = {}
    for name in LIBRARIES:
        paths = [line.split("=>")[-1].strip() for line in found.splitlines() if line.strip().startswith(name)]
        if paths:
            libraries[name] = os.path.realpath(paths[0])
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver here
        return [], libraries, f"NVML: {exc}"
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        gpus.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                     "minor": pynvml.nvmlDeviceGetMinorNumber(h)})  # fmt: skip
    return gpus, libraries, ""


def run(carry: Path, out: Path, dry: bool) -> int:
    steps = Steps(dry)
    debs = {p: sorted(carry.glob(f"{p}_*.deb")) for p in PACKAGES}
    images = carry / f"{IMAGES}.xz"
    missing = [p for p, found in debs.items() if not found] + ([] if images.exists() else [images.name])
    if missing:
        steps.say(f"not in {carry}: {', '.join(missing)} (make them with: engine_demo.py prepare {carry})")
        if not dry:
            return 2
    gpus, libraries, why = host_gpus(dry)
    steps.say(f"GPUs NVML lists: {[g['uuid'] for g in gpus] or why}; driver libraries: {libraries or 'none found'}")
    if not gpus and not dry:
        return 2
    root = Path(tempfile.mkdtemp(prefix="pp-device-engine-"))
    sock, dockerd = root / "docker.sock", None
    env = {**os.environ, "PATH": f"{root}/fs/usr/bin:{root}/fs/usr/sbin:{os.environ.get('PATH', '')}"}
    try:
        for deb in (d for found in debs.values() for d in found):
            steps.run(["dpkg-deb", "-x", str(deb), str(root / "fs")])
        (root / "cdi").mkdir()
        spec = cdi_spec(gpus, libraries)
        (root / "cdi" / "nvidia.json").write_text(json.dumps(spec, indent=1))
        steps.say(f"CDI spec {root / 'cdi' / 'nvidia.json'}: {len(spec['devices'])} devices")  # type: ignore[arg-type]
        (root / "daemon.json").write_text(json.dumps({"features": {"cdi": True}, "cdi-spec-dirs": [str(root / "cdi")]}))
        argv = [
            "dockerd", "-H", f"unix://{sock}", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "dockerd.pid"), "--bridge", "none", "--iptables=false", "--ip-masq=false",
            "--config-file", str(root / "daemon.json"),
        ]  # fmt: skip
        steps.say("$ " + " ".join(argv))
        if not dry:
            log = open(root / "dockerd.log", "wb")  # noqa: SIM115  (the engine writes it while it runs)
            dockerd = subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True)
            deadline = time.monotonic() + 60
            while subprocess.run(
                ["docker", "-H", f"unix://{sock}", "version"], capture_output=True, env=env
            ).returncode:
                if dockerd.poll() is not None or time.monotonic() > deadline:
                    steps.say("the engine did not start: " + (root / "dockerd.log").read_text()[-2000:])
                    return 1
                time.sleep(0.2)
        steps.run(["sh", "-c", f"xz -dc {images} | docker -H unix://{sock} load"], env=env)
        chain = [sys.executable, "-m", "pp_launch", "chain", "--stages", str(max(2, len(gpus))), "--gpus", "auto",
                 "--gpu-attach", "cdi", "--env", "MAX_TOKENS=8"]  # fmt: skip
        done = steps.run(chain, env={**env, "DOCKER_HOST": f"unix://{sock}", "PP_LAUNCH_GPU_INVENTORY": ""})
        said = done.stdout + done.stderr
        out.mkdir(parents=True, exist_ok=True)
        (out / "chain.txt").write_text(said)
        seen = [line.split()[-1] for line in said.splitlines() if "PP_STAGE_GPUS" in line]
        ok = dry or (done.returncode == 0 and "match=true" in said and all(s.startswith("GPU-") for s in seen))
        summary = {"exit": done.returncode, "gpus_seen_in_stages": seen, "ok": ok, "dry_run": dry}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        steps.say(f"summary: {summary}")
        return 0 if ok else 1
    finally:
        if dockerd is not None and dockerd.poll() is None:
            host = f"unix://{sock}"
            clear = f'ids=$(docker -H {host} ps -aq); [ -z "$ids" ] || docker -H {host} rm -f $ids'
            subprocess.run(["sh", "-c", clear], capture_output=True, env=env)
            dockerd.send_signal(signal.SIGTERM)
            dockerd.wait(30)
        for mount in (line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()):
            if mount.startswith(str(root)):
                subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["prepare"] and len(argv) == 2:
        return prepare(Path(argv[1]))
    dry = "--dry-run" in argv
    rest = [a for a in argv if a != "--dry-run"]
    if rest[:1] == ["run"] and len(rest) in (2, 3):
        return run(Path(rest[1]), Path(rest[2]) if len(rest) == 3 else Path("."), dry)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
