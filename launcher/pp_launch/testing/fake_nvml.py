"""The fake NVML library: build it, and write the text it serves from an inventory (docs/formats.md).

`fake_nvml.c` (next to this file) is a `libnvidia-ml.so.1` with the NVML C ABI; `build()` compiles it with gcc.
A process uses it when the directory holding it is on its library path (`LD_LIBRARY_PATH`) and
`PP_FAKE_NVML_CONFIG` names the text `config_text()` wrote (a file, or a directory of files read in name order:
`system_text()` once, then one `gpu_text()` per GPU; that is how the fake toolkit hook and the CDI spec give a
container only its own GPUs). `PP_FAKE_NVML_FAIL` switches on failures (see the C file's header).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
CONFIG_ENV = "PP_FAKE_NVML_CONFIG"
FAIL_ENV = "PP_FAKE_NVML_FAIL"
EVENTS_ENV = "PP_FAKE_NVML_EVENTS"  # the Xid event file: `xid UUID CODE` lines reach nvmlEventSetWait
CONTAINER_CONFIG = "/etc/pp-fake-nvml"  # where the hook and the CDI spec put the text inside a container
CONTAINER_LIBRARY = "/usr/lib/libnvidia-ml.so.1"  # a default library directory: no ldconfig needed
NVLINKS = 18  # links each GPU reports when the inventory knows its NVLinks (NVML_NVLINK_MAX_LINKS)


class BuildError(RuntimeError):
    pass


def build(dest: str | Path) -> Path:
    """Compile the library into `dest` (a directory); reuses a build of the same source. Returns the file."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / LIBRARY
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    stamp = dest / (LIBRARY + ".sha256")
    if out.exists() and stamp.exists() and stamp.read_text() == digest:
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BuildError("building the fake NVML library needs gcc (apt-get install gcc)")
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        part = Path(tmp) / LIBRARY
        cmd = [
            gcc,
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            f"-Wl,-soname,{LIBRARY}",
            "-o",
            str(part),
            str(SOURCE),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"gcc failed on {SOURCE}:\n{done.stderr}")
        part.replace(out)
    stamp.write_text(digest)
    return out


def environ(
    library_dir: str | Path,
    config: str | Path,
    fail: str = "",
    base: Mapping[str, str] | None = None,
    events: str | Path | None = None,
) -> dict[str, str]:
    """An environment in which `CDLL("libnvidia-ml.so.1")` finds the fake, serving `config` (and the Xid events
    appended to `events`: `inject_xid`)."""
    env = dict(os.environ if base is None else base)
    path = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = f"{library_dir}:{path}" if path else str(library_dir)
    env[CONFIG_ENV] = str(config)
    if fail:
        env[FAIL_ENV] = fail
    else:
        env.pop(FAIL_ENV, None)
    if events is not None:
        env[EVENTS_ENV] = str(events)
    return env


def inject_xid(events: str | Path, uuid: str, xid: int) -> None:
    """An Xid on the GPU `uuid`, as the driver reports it: every event set registered for it sees it."""
    with open(events, "a") as f:
        f.write(f"xid {uuid} {xid}\n")


# ------------------------------------------------------------------------------------------- the text
def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def _mw(watts: float | None) -> str:
    return "-" if watts is None else str(round(watts * 1000))


def _procs(lines: list[str], procs: tuple[GpuProcess, ...] | None) -> None:
    if procs is None:
        return
    lines.append("procs")
    lines += [f"proc {p.pid} {_n(p.used_memory_mib)}" for p in procs]


def _cuda_number(version: str) -> int | None:
    """ "13.0" -> 13000, as nvmlSystemGetCudaDriverVersion_v2 gives it (major*1000 + minor*10)."""
    major, _, minor = version.partition(".")
    try:
        return int(major) * 1000 + int(minor or 0) * 10
    except ValueError:
        return None


def system_text(inv: GpuInventory, fail: Iterable[str] = ()) -> str:
    lines = ["# pp-fake-nvml 1: system"]
    if inv.driver_version is not None:
        lines.append(f"driver {inv.driver_version}")
    cuda = None if inv.cuda_version is None else _cuda_number(inv.cuda_version)
    if cuda is not None:
        lines.append(f"cuda {cuda}")
    lines += [f"fail {f}" for f in fail]
    return "\n".join(lines) + "\n"


def _facts(g: Gpu) -> list[str]:
    """What the GPU is and does now: name, bus, memory, use, temperature and power (those known)."""
    lines = [f"name {g.name}"] if g.name else []
    if g.pci_bus_id:
        lines.append(f"bus {g.pci_bus_id}")
    if g.memory_total_mib is not None and g.memory_used_mib is not None:
        lines.append(f"memory {g.memory_total_mib} {g.memory_used_mib}")
    if g.utilization_gpu_pct is not None:
        lines.append(f"util {g.utilization_gpu_pct}")
    if g.temperature_c is not None:
        lines.append(f"temp {g.temperature_c}")
    if g.power_w is not None or g.power_limit_w is not None:
        lines.append(f"power {_mw(g.power_w)} {_mw(g.power_limit_w)}")  # milliwatts, as NVML counts them
    return lines


def _health(g: Gpu) -> list[str]:
    """Its health (those known): uncorrected ECC errors, pages pending retirement, a failed row remap, MIG."""
    known = {
        "ecc": g.ecc_uncorrected,
        "retired_pending": g.retired_pages_pending,
        "remap_failure": g.row_remap_failure,
        "mig": g.mig_enabled,
    }
    return [f"{key} {int(value)}" for key, value in known.items() if value is not None]


def gpu_text(inv: GpuInventory, position: int) -> str:
    """One GPU, self-contained: its topology and NVLinks name their peers by UUID and bus id, so any subset of
    GPUs (what a container may see) is the concatenation of their texts."""
    g: Gpu = inv.gpus[position]
    lines = [f"gpu {g.uuid}", *_facts(g)]
    _procs(lines, g.processes)
    lines += _health(g)
    if inv.topology is not None:
        lines += [f"topo {peer.uuid} {inv.topology[position][j]}" for j, peer in enumerate(inv.gpus) if j != position]
    if inv.nvlink is not None:
        lines.append(f"nvlinks {NVLINKS}")
        lines += [
            f"link {peer.pci_bus_id} {inv.nvlink[position][j]}"
            for j, peer in enumerate(inv.gpus)
            if j != position and inv.nvlink[position][j]
        ]
    for m in g.mig_devices:
        lines.append(f"migdev {m.uuid}")
        if m.memory_total_mib is not None and m.memory_used_mib is not None:
            lines.append(f"memory {m.memory_total_mib} {m.memory_used_mib}")
        _procs(lines, m.processes)
    return "\n".join(lines) + "\n"


def config_text(inv: GpuInventory, visible: Iterable[int] | None = None, fail: Iterable[str] = ()) -> str:
    """The whole text for `inv`, or for the GPUs at the given positions only (in that order)."""
    positions = range(len(inv.gpus)) if visible is None else visible
    return system_text(inv, fail) + "".join(gpu_text(inv, i) for i in positions)


def write_config(inv: GpuInventory, path: str | Path, visible: Iterable[int] | None = None) -> Path:
    path = Path(path)
    path.write_text(config_text(inv, visible))
    return path


def write_config_dir(inv: GpuInventory, directory: str | Path) -> dict[int, Path]:
    """The per-file form: `00-system` and one `gpu-NNNN` per GPU (the CDI spec mounts a device's own file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "00-system").write_text(system_text(inv))
    out = {}
    for i in range(len(inv.gpus)):
        out[i] = directory / f"gpu-{i:04d}"
        out[i].write_text(gpu_text(inv, i))
    return out
