"""Random GPU inventories shaped like real machines, for property tests and benchmarks.

Shapes: one or two CPU sockets (PCIe levels: same switch, host bridge, NUMA node, across sockets), optionally
NVLink pairs or an all-to-all NVLink mesh, busy GPUs (memory used, processes), MIG-enabled GPUs, and fields
NVML could not read (None). Every inventory survives the file format (docs/formats.md) and the fake NVML library.
"""

from __future__ import annotations

import random

from pp_launch.core.gpu.inventory import Gpu, GpuInventory, GpuProcess, MigDevice

NAMES = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA L40S")


def _uuid(rng: random.Random, prefix: str = "GPU") -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _procs(rng: random.Random, busy: bool) -> tuple[GpuProcess, ...] | None:
    if rng.random() < 0.1:
        return None  # NVML could not say
    if not busy:
        return ()
    return tuple(
        GpuProcess(rng.randrange(2, 4_000_000), rng.choice([None, rng.randrange(1, 60_000)]))
        for _ in range(rng.randrange(1, 4))
    )


def topology_levels(n: int, sockets: int, rng: random.Random) -> tuple[tuple[int, ...], ...]:
    """nvmlGpuTopologyLevel_t between GPUs: pairs behind one switch (10), a socket's GPUs under one host
    bridge (30) or NUMA node (40), across sockets (50)."""
    per = max(1, -(-n // sockets))
    inner = rng.choice([30, 40])
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append(0)
            elif i // per != j // per:
                row.append(50)
            elif i // 2 == j // 2:
                row.append(10)
            else:
                row.append(inner)
        rows.append(tuple(row))
    return tuple(rows)


def nvlink_counts(n: int, shape: str) -> tuple[tuple[int, ...], ...]:
    if shape == "pairs":
        return tuple(tuple(2 if i != j and i // 2 == j // 2 else 0 for j in range(n)) for i in range(n))
    if shape == "mesh":
        return tuple(tuple(0 if i == j else max(1, 12 // max(1, n - 1)) for j in range(n)) for i in range(n))
    return tuple(tuple(0 for _ in range(n)) for _ in range(n))


def random_inventory(
    rng: random.Random, n: int | None = None, *, unknowns: bool = True, mig: bool = True
) -> GpuInventory:
    """One random machine. `unknowns`: some fields NVML could not read; `mig`: some MIG-enabled GPUs."""
    n = rng.randrange(1, 13) if n is None else n
    sockets = rng.choice([1, 2]) if n > 1 else 1
    name = rng.choice(NAMES)
    total = rng.choice([32768, 81559, 143771])
    gpus = []
    for i in range(n):
        busy = rng.random() < 0.3
        known_mem = not (unknowns and rng.random() < 0.05)
        mig_on: bool | None = rng.random() < 0.15 if mig else False
        if unknowns and rng.random() < 0.05:
            mig_on = None
        migs: tuple[MigDevice, ...] = ()
        if mig_on:
            migs = tuple(
                MigDevice(_uuid(rng, "MIG"), total // 4, rng.choice([10, 2048]), _procs(rng, rng.random() < 0.3))
                for _ in range(rng.randrange(0, 5))
            )
        gpus.append(
            Gpu(
                index=i,
                uuid=_uuid(rng),
                name=name,
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                memory_total_mib=total if known_mem else None,
                memory_used_mib=(rng.randrange(1024, total) if busy else 512) if known_mem else None,
                utilization_gpu_pct=(rng.randrange(1, 100) if busy else 0)
                if not (unknowns and rng.random() < 0.05)
                else None,
                processes=_procs(rng, busy),
                mig_enabled=mig_on,
                mig_devices=migs,
            )
        )
    topology = topology_levels(n, sockets, rng) if not (unknowns and rng.random() < 0.1) else None
    shape = rng.choice(["none", "pairs", "mesh"])
    nvlink = None if shape == "none" and rng.random() < 0.5 else nvlink_counts(n, shape)
    return GpuInventory(
        gpus=tuple(gpus),
        driver_version=rng.choice(["535.183.01", "550.90.07", "580.159.03"]),
        cuda_version=f"{rng.choice([12, 13])}.{rng.randrange(0, 10)}",
        topology=topology,
        nvlink=nvlink,
    )
