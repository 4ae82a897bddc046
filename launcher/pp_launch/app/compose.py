"""`pp-launch compose`: a chain as a Docker Compose project. Pure: a ChainPlan in, YAML text out.

Compose has no "start stage k once stage k-1 has printed its address". The hand-off is built from what it
has: every stage runs under `pp-stage-entry` (images/stage-entry, POSIX sh, delivered as a compose config
so any image with /bin/sh works), which writes the stage's validated announcement to a directory shared by
all stages; the stage is healthy once that file exists. Every service starts at once: stage k
waits for the files of stage k-1 and stage 0 (up to --addr-timeout) and exports PEER_* and FIRST_PEER_*
from them before it starts its worker, so container start and image boot overlap.

The shared directory is a host bind mount, not a volume, so `docker compose down` leaves no container,
network or volume of the project behind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pp_launch.adapters.images import images_dir
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.container import ContainerOptions, MountSpec

ENTRY_CONFIG = "pp-stage-entry"
ENTRY_PATH = "/pp-stage-entry"
ANNOUNCE_MOUNT = "/dev/shm/pp-announce"  # stage 0's /dev/shm, shared by every stage (ipc): nothing on the host
DEFAULT_WORKER_CMD = ("/usr/local/bin/pp-worker",)
HEALTH_INTERVAL_S = 1


def owner_for(project: str) -> str:
    return f"{labels.OWNER_COMPOSE_PREFIX}{project}"


def run_id_for(project: str) -> str:
    """Deterministic, so the same command writes the same file."""
    return hashlib.sha256(project.encode()).hexdigest()[:12]


def entry_script() -> str:
    return (images_dir() / "stage-entry" / "pp-stage-entry.sh").read_text()


def services(plan: ChainPlan, project: str, worker_cmd: tuple[str, ...], addr_timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    retries = max(1, int(addr_timeout // HEALTH_INTERVAL_S))
    for s in plan.stages:
        k = s.index
        env = dict(s.env)
        env["PP_ANNOUNCE_DIR"] = ANNOUNCE_MOUNT
        env["PP_ADDR_TIMEOUT"] = str(max(1, int(addr_timeout)))
        service: dict[str, Any] = {
            "image": s.image,
            "container_name": f"{project}-stage-{k}",
            "init": True,
            "network_mode": "host",
            "entrypoint": ["/bin/sh", ENTRY_PATH],
            "command": list(worker_cmd),
            "environment": dict(sorted(env.items())),
            "labels": dict(s.labels),
            "configs": [{"source": ENTRY_CONFIG, "target": ENTRY_PATH}],
            # the announcements are handed over in stage 0's /dev/shm, which every stage shares: it goes with
            # the containers at `docker compose down`, and nothing is left on the host
            "ipc": "shareable" if k == 0 else "service:stage-0",
            "healthcheck": {
                "test": ["CMD", "/bin/sh", "-c", f"test -s {ANNOUNCE_MOUNT}/stage-{k}.addr"],
                "interval": f"{HEALTH_INTERVAL_S}s",
                "timeout": "2s",
                "retries": retries,
            },
        }
        service.update(_docker_run(s.options, k))
        service["labels"] = {**dict(s.options.labels), **dict(s.labels)}
        # --gpu-attach request: an nvidia reservation; cdi: a cdi one with CDI names; env: NVIDIA_VISIBLE_DEVICES
        if s.device_requests:
            devices = [_reservation(r) for r in s.device_requests]
            service["deploy"] = {"resources": {"reservations": {"devices": devices}}}
        out[f"stage-{k}"] = service
    return out


def _docker_run(o: ContainerOptions, k: int) -> dict[str, Any]:
    """docker run's options of stage k (core/container.py) as Compose writes them. A host path is never created by
    Compose (create_host_path: false) unless pp-launch makes it (the caches); /dev/shm's size is stage 0's, whose
    IPC namespace every stage shares."""
    out: dict[str, Any] = {}
    if o.mounts:
        out["volumes"] = [_volume(m) for m in o.mounts]
    if o.shm_size is not None and k == 0:
        out["shm_size"] = o.shm_size
    for key, value in (
        ("ulimits", {u.name: {"soft": u.soft, "hard": u.hard} for u in o.ulimits}),
        ("devices", [d.text() for d in o.devices]),
        ("cap_add", list(o.cap_add)),
        ("user", o.user),
        ("working_dir", o.workdir),
    ):
        if value:
            out[key] = value
    return out


def _volume(m: MountSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": m.type}
    if m.source:
        out["source"] = m.source
    out["target"] = m.target
    if m.read_only:
        out["read_only"] = True
    if m.type == "bind":
        bind: dict[str, Any] = {"create_host_path": m.ensure}
        if m.propagation:
            bind["propagation"] = m.propagation
        if m.selinux:
            bind["selinux"] = m.selinux
        out["bind"] = bind
    elif m.type == "volume" and m.nocopy:
        out["volume"] = {"nocopy": True}
    elif m.type == "tmpfs" and (m.tmpfs_size is not None or m.tmpfs_mode is not None):
        out["tmpfs"] = {k: v for k, v in (("size", m.tmpfs_size), ("mode", m.tmpfs_mode)) if v is not None}
    return out


def named_volumes(plan: ChainPlan) -> dict[str, Any]:
    """The named volumes the stages mount, declared as Compose needs them, under their own names (docker run -v
    NAME creates NAME if it is missing; so does Compose with `name:`)."""
    names = sorted({m.source for s in plan.stages for m in s.options.mounts if m.type == "volume" and m.source})
    return {n: {"name": n} for n in names}


def check(plan: ChainPlan) -> None:
    """What Compose cannot do as `pp-launch chain` does: said before anything is written (exit 2)."""
    for s in plan.stages:
        if s.options.ipc is not None:
            raise errors.UsageError(
                "--ipc: a Compose chain hands each announcement over in stage 0's IPC namespace, which every stage "
                "shares; use --shm-size for a larger /dev/shm"
            )
        if any(m.type == "volume" and not m.source for m in s.options.mounts):
            raise errors.UsageError(
                "--volume DST alone (an anonymous volume) outlives 'docker compose down'; give it a name "
                "(-v NAME:DST) or use --mount type=tmpfs,target=DST"
            )


def _reservation(request: Mapping[str, Any]) -> dict[str, Any]:
    """An engine DeviceRequest as Compose writes it (driver nvidia for `request`, cdi with CDI names for `cdi`)."""
    out: dict[str, Any] = {"driver": request.get("Driver") or "nvidia"}
    if request.get("DeviceIDs"):
        out["device_ids"] = list(request["DeviceIDs"])
    elif request.get("Count"):
        out["count"] = "all" if request["Count"] == -1 else request["Count"]
    # Compose requires capabilities; the engine's CDI driver ignores them
    out["capabilities"] = [c for group in request.get("Capabilities") or [] for c in group] or ["gpu"]
    return out


def render(
    plan: ChainPlan,
    project: str,
    command_line: str,
    worker_cmd: tuple[str, ...] = DEFAULT_WORKER_CMD,
    addr_timeout: float = 60.0,
    script: str | None = None,
) -> str:
    check(plan)
    doc = {
        "name": project,
        "services": services(plan, project, worker_cmd, addr_timeout),
        "configs": {ENTRY_CONFIG: {"content": script if script is not None else entry_script()}},
    }
    if volumes := named_volumes(plan):
        doc["volumes"] = volumes
    header = (
        f"# A {len(plan.stages)}-stage pp-launch chain as a Compose project (run {plan.run_id}).\n"
        f"# Written by: {command_line}\n"
        "# Regenerate it with that command; edit the command, not this file.\n"
        f"# Up: docker compose -f FILE up -d    Down: docker compose -f FILE down (or pp-launch down {plan.run_id})\n"
    )
    return header + to_yaml(doc)


# ------------------------------------------------------------------------------------------ a small YAML writer
def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # JSON strings are YAML strings; Compose interpolates $, so a literal one is written $$.
    return json.dumps(str(value).replace("$", "$$"), ensure_ascii=False)


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists, strings, ints and bools; multi-line strings as literal blocks."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            lines.append(_entry(f"{pad}{_key(key)}:", item, indent))
    elif isinstance(value, list):
        for item in value:
            lines.append(_entry(f"{pad}-", item, indent, in_list=True))
    return "\n".join(lines) + ("\n" if indent == 0 else "")


def _key(key: Any) -> str:
    text = str(key)
    plain = text.replace("-", "").replace("_", "").replace(".", "").isalnum()
    return text if plain else json.dumps(text)


def _entry(prefix: str, item: Any, indent: int, in_list: bool = False) -> str:
    if isinstance(item, str) and "\n" in item:
        body = item.replace("$", "$$").rstrip("\n").split("\n")
        inner = "  " * (indent + 1)
        return prefix + " |\n" + "\n".join(f"{inner}{line}" if line else "" for line in body)
    if isinstance(item, (Mapping, list)) and item:
        if in_list and isinstance(item, Mapping):
            nested = to_yaml(item, indent + 1).split("\n")
            first = nested[0].lstrip()
            return f"{prefix} {first}" + ("\n" + "\n".join(nested[1:]) if len(nested) > 1 else "")
        return prefix + "\n" + to_yaml(item, indent + 1)
    if isinstance(item, Mapping):
        return prefix + " {}"
    if isinstance(item, list):
        return prefix + " []"
    return f"{prefix} {_scalar(item)}"
