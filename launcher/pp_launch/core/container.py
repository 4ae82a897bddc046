"""docker run's options for a stage's container, in docker's syntax (docs/chain.md, "Your own model"): what a real
model needs (its weights and caches mounted, a large /dev/shm or the host's IPC namespace, devices, capabilities,
limits, a user). Parsed and checked here, resolved per stage ({stage} in a host path), and said as the Engine API's
JSON, which every site sends as it is. Pure: whether a host path exists is asked where the engine is
(app/docker_site.py; the engine's own refusal elsewhere).

Every host path of a bind mount goes to the engine as `--mount type=bind` does, never as `-v` does: a missing host
folder is refused by the engine rather than created empty and owned by root."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

STAGE_FIELD = "{stage}"  # in a host path: the stage's index

MOUNT_TYPES = ("bind", "volume", "tmpfs")
PROPAGATIONS = ("rprivate", "private", "rshared", "shared", "rslave", "slave")
VOLUME_OPTIONS = ("ro", "rw", "z", "Z", "nocopy", *PROPAGATIONS)
IPC_MODES = ("none", "private", "shareable", "host")
ULIMITS = (
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
    "rttime", "sigpending", "stack",
)  # fmt: skip
VOLUME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")  # the engine's own rule for a volume's name
CAP = re.compile(r"(CAP_)?[A-Z][A-Z0-9_]*|ALL")
USER = re.compile(r"[a-zA-Z0-9_.][a-zA-Z0-9_.-]*(:[a-zA-Z0-9_.][a-zA-Z0-9_.-]*)?")
LABEL_KEY = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_./-]*")
OUR_LABELS = "pp-launch."
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?", re.IGNORECASE)
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

# What pp-launch itself sets on every stage, and what to use instead (docker run's flags a user may reach for).
OURS = {
    "--rm": "every stage is removed by the engine when it ends (daemon-side auto-remove); drop --rm",
    "--init": "every stage runs under tini as init already; drop --init",
    "--interactive": "a stage's stdin is pp-launch's lifeline to it; drop -i (its output is in 'pp-launch logs')",
    "--tty": "a stage's output is read line by line; drop -t",
    "--restart": "use --max-restarts N: the whole chain is brought up again, as one",
    "--detach": "use pp-launch chain --detach (-d): the run is brought up, then its guard owns it",
}


class OptionError(ValueError):
    """A value docker would refuse, or one pp-launch sets itself: the message says what to write instead."""


@dataclass(frozen=True)
class MountSpec:
    """One mount, as `--mount` describes it (a `-v` is read into one)."""

    type: str  # bind | volume | tmpfs
    target: str  # the path inside the container
    source: str = ""  # bind: a host path ({stage} allowed); volume: its name ("" anonymous); tmpfs: ""
    read_only: bool = False
    propagation: str = ""  # bind-propagation
    selinux: str = ""  # z or Z (a -v option)
    nocopy: bool = False  # volume-nocopy
    tmpfs_size: int | None = None
    tmpfs_mode: int | None = None
    stage: int | None = None  # None: every stage; K: stage K alone (--stage-volume)
    ensure: bool = False  # pp-launch creates the host folder first, with the user's ownership (the caches)
    flag: str = "--volume"  # what the user wrote it with, for messages

    def for_stage(self, k: int) -> MountSpec:
        return replace(self, source=self.source.replace(STAGE_FIELD, str(k)), stage=None)

    def engine_json(self) -> dict[str, Any]:
        """The Engine API's Mount object (HostConfig.Mounts)."""
        out: dict[str, Any] = {"Type": self.type, "Target": self.target, "ReadOnly": self.read_only}
        if self.source:
            out["Source"] = self.source
        if self.type == "bind":
            out["BindOptions"] = {"Propagation": self.propagation} if self.propagation else {}
        elif self.type == "volume" and self.nocopy:
            out["VolumeOptions"] = {"NoCopy": True}
        elif self.type == "tmpfs":
            tmpfs: dict[str, Any] = {}
            if self.tmpfs_size is not None:
                tmpfs["SizeBytes"] = self.tmpfs_size
            if self.tmpfs_mode is not None:
                tmpfs["Mode"] = self.tmpfs_mode
            out["TmpfsOptions"] = tmpfs
        return out

    def bind_text(self) -> str:
        """The same bind as a `-v` string (HostConfig.Binds): how the engine takes an SELinux relabel (z, Z)."""
        opts = ["ro" if self.read_only else "rw", *filter(None, (self.selinux, self.propagation))]
        return f"{self.source}:{self.target}:{','.join(opts)}"

    def to_json(self) -> dict[str, Any]:
        """What a dry run and --json show."""
        out: dict[str, Any] = {"type": self.type, "source": self.source, "target": self.target}
        out["read_only"] = self.read_only
        for key, value in (
            ("propagation", self.propagation),
            ("selinux", self.selinux),
            ("nocopy", self.nocopy),
            ("tmpfs_size", self.tmpfs_size),
            ("tmpfs_mode", None if self.tmpfs_mode is None else f"{self.tmpfs_mode:o}"),
            ("created_by_pp_launch", self.ensure),
        ):
            if value:
                out[key] = value
        return out

    def docker_flag(self) -> str:
        """The same mount as docker run's --mount flag."""
        parts = [f"type={self.type}"]
        if self.source:
            parts.append(f"source={self.source}")
        parts.append(f"target={self.target}")
        if self.read_only:
            parts.append("readonly")
        if self.propagation:
            parts.append(f"bind-propagation={self.propagation}")
        if self.nocopy:
            parts.append("volume-nocopy")
        if self.tmpfs_size is not None:
            parts.append(f"tmpfs-size={self.tmpfs_size}")
        if self.tmpfs_mode is not None:
            parts.append(f"tmpfs-mode={self.tmpfs_mode:o}")
        return ",".join(parts)


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int
    hard: int

    def engine_json(self) -> dict[str, Any]:
        return {"Name": self.name, "Soft": self.soft, "Hard": self.hard}

    def text(self) -> str:
        return f"{self.name}={self.soft}:{self.hard}"


@dataclass(frozen=True)
class Device:
    host: str
    container: str
    permissions: str = "rwm"

    def engine_json(self) -> dict[str, Any]:
        return {"PathOnHost": self.host, "PathInContainer": self.container, "CgroupPermissions": self.permissions}

    def text(self) -> str:
        return f"{self.host}:{self.container}:{self.permissions}"


@dataclass(frozen=True)
class Healthcheck:
    """docker run's --health-* (the Engine API's Healthcheck): `test` empty with `disabled` is --no-healthcheck;
    durations in seconds, 0 for the engine's default (30 s, 30 s, 3 retries, 0 s)."""

    test: tuple[str, ...] = ()  # ("CMD-SHELL", cmd) for --health-cmd; () keeps the image's test
    interval: float = 0.0
    timeout: float = 0.0
    retries: int = 0
    start_period: float = 0.0
    disabled: bool = False

    def engine_json(self) -> dict[str, Any]:
        if self.disabled:
            return {"Test": ["NONE"]}
        out: dict[str, Any] = {"Test": list(self.test)} if self.test else {}
        durations = (("Interval", self.interval), ("Timeout", self.timeout), ("StartPeriod", self.start_period))
        for key, seconds in durations:
            if seconds:
                out[key] = int(seconds * 1e9)
        if self.retries:
            out["Retries"] = self.retries
        return out


DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns))+")
UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str, flag: str) -> float:
    """A Go duration, as docker takes it (30s, 1m30s, 500ms): seconds."""
    text = text.strip()
    if not DURATION.fullmatch(text):
        raise OptionError(f"{flag} {text!r}: give a duration as docker does (30s, 1m30s, 500ms)")
    return sum(float(n) * UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)", text))


def parse_health(
    cmd: str | None,
    interval: str | None,
    timeout: str | None,
    retries: int | str | None,
    start_period: str | None,
    disabled: bool,
) -> Healthcheck | None:
    """docker run's --health-* and --no-healthcheck; None when none is given (the image's own check applies)."""
    given = [x for x in (cmd, interval, timeout, retries, start_period) if x is not None]
    if disabled:
        if given:
            raise OptionError("--no-healthcheck and --health-* do not go together: give one or the other")
        return Healthcheck(disabled=True)
    if not given:
        return None
    if cmd is not None and not cmd.strip():
        raise OptionError("--health-cmd '': give the command that checks a stage (exit 0: healthy)")
    count = str(retries).strip() if retries is not None else ""
    if count and not (count.isascii() and count.isdigit() and int(count) > 0):
        raise OptionError(f"--health-retries {retries!r}: give a count of 1 or more")
    def seconds(value: str | None, flag: str) -> float:
        return parse_duration(value, flag) if value is not None else 0.0

    return Healthcheck(
        test=("CMD-SHELL", cmd) if cmd is not None else (),
        interval=seconds(interval, "--health-interval"),
        timeout=seconds(timeout, "--health-timeout"),
        retries=int(count) if count else 0,
        start_period=seconds(start_period, "--health-start-period"),
    )


@dataclass(frozen=True)
class ContainerOptions:
    """docker run's options for every stage (a mount may be one stage's alone)."""

    mounts: tuple[MountSpec, ...] = ()
    shm_size: int | None = None
    ipc: str | None = None
    ulimits: tuple[Ulimit, ...] = ()
    devices: tuple[Device, ...] = ()
    cap_add: tuple[str, ...] = ()
    user: str | None = None
    workdir: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    healthcheck: Healthcheck | None = None  # docker run's --health-*; None: the image's own HEALTHCHECK, if any
    extra: Mapping[str, Any] = field(default_factory=dict)  # nothing yet: room for a site's own additions

    @classmethod
    def parse(
        cls,
        stages: int,
        *,
        volumes: Sequence[str] = (),
        stage_volumes: Sequence[str] = (),
        mounts: Sequence[str] = (),
        shm_size: str | None = None,
        ipc: str | None = None,
        ulimits: Sequence[str] = (),
        devices: Sequence[str] = (),
        cap_add: Sequence[str] = (),
        user: str | None = None,
        workdir: str | None = None,
        labels: Sequence[str] | Mapping[str, str] = (),
        health_cmd: str | None = None,
        health_interval: str | None = None,
        health_timeout: str | None = None,
        health_retries: int | str | None = None,
        health_start_period: str | None = None,
        no_healthcheck: bool = False,
    ) -> ContainerOptions:
        """docker run's options as docker run takes them (text, each checked; OptionError names the first wrong)."""
        every = [f"{k}={v}" for k, v in labels.items()] if isinstance(labels, Mapping) else list(labels)
        health = parse_health(
            health_cmd, health_interval, health_timeout, health_retries, health_start_period, no_healthcheck
        )
        return cls(
            mounts=(
                *(parse_volume(v) for v in volumes),
                *(parse_stage_volume(v, stages) for v in stage_volumes),
                *(parse_mount(v) for v in mounts),
            ),
            shm_size=parse_size(shm_size) if shm_size is not None else None,
            ipc=parse_ipc(ipc) if ipc is not None else None,
            ulimits=tuple(parse_ulimit(u) for u in ulimits),
            devices=tuple(parse_device(d) for d in devices),
            cap_add=tuple(parse_cap(c) for c in cap_add),
            user=parse_user(user) if user is not None else None,
            workdir=parse_workdir(workdir) if workdir is not None else None,
            labels=tuple(parse_label(x) for x in every),
            healthcheck=health,
        )

    @classmethod
    def from_keys(cls, stages: int, given: Mapping[str, Any]) -> ContainerOptions:
        """docker run's options under any name a user has for them: `parse`'s (volumes=[...]) or the flags' and a
        chain file's (volume, stage-volume, mount, ulimit, device, label, cap-add, shm-size), a single text where
        the flag repeats taken as one; an unknown name is an OptionError naming them all."""
        names = {**{k: k for k in PARSE_KEYS}, **FLAG_KEYS}
        out: dict[str, Any] = {}
        for key, value in given.items():
            name = names.get(key.replace("-", "_"))
            if name is None:
                raise OptionError(f"{key!r} is not one of docker run's options here: {', '.join(sorted(names))}")
            many = name in MANY_KEYS and (isinstance(value, str) or not isinstance(value, Sequence | Mapping))
            out[name] = (value,) if many else value
        return cls.parse(stages, **out)

    def for_stage(self, k: int) -> ContainerOptions:
        """Stage k's: its own mounts and every stage's, {stage} replaced by k."""
        return replace(self, mounts=tuple(m.for_stage(k) for m in self.mounts if m.stage in (None, k)))

    def with_mounts(self, *mounts: MountSpec) -> ContainerOptions:
        return replace(self, mounts=(*self.mounts, *mounts))

    def host_config(self) -> dict[str, Any]:
        """The HostConfig fields these options set, as the Engine API names them."""
        out: dict[str, Any] = {}
        if any(not m.selinux for m in self.mounts):
            out["Mounts"] = [m.engine_json() for m in self.mounts if not m.selinux]
        if any(m.selinux for m in self.mounts):  # relabelling exists only in a bind's -v string
            out["Binds"] = [m.bind_text() for m in self.mounts if m.selinux]
        if self.shm_size is not None:
            out["ShmSize"] = self.shm_size
        if self.ipc is not None:
            out["IpcMode"] = self.ipc
        if self.ulimits:
            out["Ulimits"] = [u.engine_json() for u in self.ulimits]
        if self.devices:
            out["Devices"] = [d.engine_json() for d in self.devices]
        if self.cap_add:
            out["CapAdd"] = list(self.cap_add)
        return out

    def config(self) -> dict[str, Any]:
        """The container Config fields these options set."""
        out: dict[str, Any] = {}
        if self.user is not None:
            out["User"] = self.user
        if self.workdir is not None:
            out["WorkingDir"] = self.workdir
        if self.healthcheck is not None:
            out["Healthcheck"] = self.healthcheck.engine_json()
        return out

    def to_json(self) -> dict[str, Any]:
        """A dry run's view: every option that is set, every mount."""
        out: dict[str, Any] = {"mounts": [m.to_json() for m in self.mounts]}
        for key, value in (
            ("shm_size", self.shm_size),
            ("ipc", self.ipc),
            ("ulimits", [u.text() for u in self.ulimits]),
            ("devices", [d.text() for d in self.devices]),
            ("cap_add", list(self.cap_add)),
            ("user", self.user),
            ("workdir", self.workdir),
            ("healthcheck", self.healthcheck.engine_json() if self.healthcheck is not None else None),
        ):
            if value:
                out[key] = value
        return out

    def host_paths(self) -> list[tuple[MountSpec, str]]:
        """Every bind mount's host path that must exist before a create (a stage's own, once resolved)."""
        return [(m, m.source) for m in self.mounts if m.type == "bind" and not m.ensure]


# ------------------------------------------------------------------------------------------------ parsing
PARSE_KEYS = (
    "volumes", "stage_volumes", "mounts", "shm_size", "ipc", "ulimits", "devices", "cap_add", "user", "workdir",
    "labels", "health_cmd", "health_interval", "health_timeout", "health_retries", "health_start_period",
    "no_healthcheck",
)  # fmt: skip
FLAG_KEYS = {"volume": "volumes", "stage_volume": "stage_volumes", "mount": "mounts", "ulimit": "ulimits",
             "device": "devices", "label": "labels"}  # fmt: skip
MANY_KEYS = frozenset({"volumes", "stage_volumes", "mounts", "ulimits", "devices", "cap_add", "labels"})


def parse_volume(text: str, stage: int | None = None, flag: str = "--volume") -> MountSpec:
    """docker run -v: SRC:DST[:OPTS] (SRC a host path or a volume's name) or DST alone (an anonymous volume).
    OPTS: ro or rw, z or Z, nocopy, a propagation, comma-separated."""
    if not text or "\0" in text:
        raise OptionError(f"{flag} {text!r}: give SRC:DST[:ro|rw] (a host path or a volume's name, then a path)")
    parts = text.split(":")
    if len(parts) > 3:
        raise OptionError(f"{flag} {text!r}: too many ':' (SRC:DST[:ro|rw]; a path with ':' needs --mount)")
    if len(parts) == 1:
        return MountSpec("volume", _target(parts[0], flag, text), stage=stage, flag=flag)
    source, target, opts = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
    if not source:
        raise OptionError(f"{flag} {text!r}: the source before ':' is empty (a host path or a volume's name)")
    mode = _volume_options(opts, flag, text)
    target = _target(target, flag, text)
    if source.startswith("/"):
        _known_fields(source, flag, text)
        return MountSpec("bind", target, posixpath.normpath(source), stage=stage, flag=flag, **mode)
    if source.startswith((".", "~")):
        raise OptionError(
            f"{flag} {text!r}: {source} is a relative host path; give it absolute ({flag} $PWD/{source.lstrip('./')}:"
            f"{target}): docker would take it as the name of a volume, or resolve it somewhere you did not mean"
        )
    if not VOLUME_NAME.fullmatch(source) or STAGE_FIELD in source:
        raise OptionError(
            f"{flag} {text!r}: {source!r} is neither an absolute host path nor a volume name "
            "([a-zA-Z0-9][a-zA-Z0-9_.-]*)"
        )
    if mode.get("propagation") or mode.get("selinux"):
        raise OptionError(f"{flag} {text!r}: {opts} applies to a host path, not to the volume {source}")
    return MountSpec("volume", target, source, stage=stage, flag=flag, **mode)


FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _known_fields(path: str, flag: str, text: str) -> None:
    """{stage} is the one field a host path takes: any other `{name}` is a typo (exit 2, with a did-you-mean),
    never a folder made under that literal name."""
    import difflib

    for name in FIELD.findall(path):
        if f"{{{name}}}" != STAGE_FIELD:
            near = difflib.get_close_matches(name.lower(), [STAGE_FIELD.strip("{}")], n=1, cutoff=0.5)
            hint = f"did you mean {STAGE_FIELD}? " if near else ""
            raise OptionError(
                f"{flag} {text!r}: {{{name}}} is not a field of a host path: {hint}{STAGE_FIELD} (the stage's "
                "index) is the only one"
            )


def _volume_options(opts: str, flag: str, text: str) -> dict[str, Any]:
    mode: dict[str, Any] = {}
    for opt in filter(None, opts.split(",")):
        if opt not in VOLUME_OPTIONS:
            raise OptionError(f"{flag} {text!r}: unknown option {opt!r} (use ro or rw; z, Z, nocopy, a propagation)")
        if opt in ("ro", "rw"):
            if "read_only" in mode:
                raise OptionError(f"{flag} {text!r}: give ro or rw once")
            mode["read_only"] = opt == "ro"
        elif opt in ("z", "Z"):
            mode["selinux"] = opt
        elif opt == "nocopy":
            mode["nocopy"] = True
        else:
            mode["propagation"] = opt
    return mode


def _target(path: str, flag: str, text: str) -> str:
    if not path.startswith("/"):
        raise OptionError(f"{flag} {text!r}: the path in the container ({path or 'empty'}) must be absolute")
    if STAGE_FIELD in path:
        raise OptionError(f"{flag} {text!r}: {STAGE_FIELD} goes in the host path, not in the container's")
    return posixpath.normpath(path)


MOUNT_KEYS = {
    "type": "type",
    "source": "source",
    "src": "source",
    "destination": "target",
    "dst": "target",
    "target": "target",
    "readonly": "readonly",
    "ro": "readonly",
    "bind-propagation": "propagation",
    "volume-nocopy": "nocopy",
    "tmpfs-size": "tmpfs_size",
    "tmpfs-mode": "tmpfs_mode",
}


def parse_mount(text: str, stage: int | None = None) -> MountSpec:
    """docker run --mount: comma-separated key=value (type, source/src, target/destination/dst, readonly/ro,
    bind-propagation, volume-nocopy, tmpfs-size, tmpfs-mode); type defaults to volume, as docker's."""
    flag = "--mount"
    if not text or "\0" in text:
        raise OptionError(f"{flag} {text!r}: give type=bind|volume|tmpfs,source=...,target=...")
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        name = MOUNT_KEYS.get(key.strip().lower())
        if name is None:
            raise OptionError(
                f"{flag} {text!r}: unknown key {key!r} (type, source, target, readonly, bind-propagation, "
                "volume-nocopy, tmpfs-size, tmpfs-mode)"
            )
        if name in fields:
            raise OptionError(f"{flag} {text!r}: {key} is given twice")
        fields[name] = value if sep else "true"
    kind = fields.pop("type", "volume")
    if kind not in MOUNT_TYPES:
        raise OptionError(f"{flag} {text!r}: type={kind}: use bind, volume or tmpfs")
    target = _target(fields.pop("target", ""), flag, text)
    source = fields.pop("source", "")
    read_only = _boolean(fields.pop("readonly", "false"), flag, text)
    spec = MountSpec(kind, target, source, read_only=read_only, stage=stage, flag=flag)
    return _typed_mount(spec, fields, text)


def _typed_mount(spec: MountSpec, fields: dict[str, str], text: str) -> MountSpec:
    flag, kind, source = spec.flag, spec.type, spec.source
    allowed = {"bind": {"propagation"}, "volume": {"nocopy"}, "tmpfs": {"tmpfs_size", "tmpfs_mode"}}[kind]
    stray = sorted(set(fields) - allowed)
    if stray:
        said = {"propagation": "bind-propagation", "nocopy": "volume-nocopy"}.get(stray[0], stray[0].replace("_", "-"))
        raise OptionError(f"{flag} {text!r}: {said} does not apply to type={kind}")
    if kind == "bind":
        if not source.startswith("/"):
            raise OptionError(f"{flag} {text!r}: a bind's source must be an absolute host path")
        _known_fields(source, flag, text)
        propagation = fields.get("propagation", "")
        if propagation and propagation not in PROPAGATIONS:
            raise OptionError(f"{flag} {text!r}: bind-propagation={propagation}: use one of {', '.join(PROPAGATIONS)}")
        return replace(spec, source=posixpath.normpath(source), propagation=propagation)
    if kind == "volume":
        if source and (not VOLUME_NAME.fullmatch(source) or STAGE_FIELD in source):
            raise OptionError(f"{flag} {text!r}: {source!r} is not a volume name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
        return replace(spec, nocopy=_boolean(fields.get("nocopy", "false"), flag, text))
    if source:
        raise OptionError(f"{flag} {text!r}: a tmpfs has no source")
    size = parse_size(fields["tmpfs_size"], "--mount tmpfs-size") if "tmpfs_size" in fields else None
    mode = fields.get("tmpfs_mode")
    if mode is not None and not re.fullmatch(r"[0-7]{1,4}", mode):
        raise OptionError(f"{flag} {text!r}: tmpfs-mode={mode}: give an octal mode (1777)")
    return replace(spec, tmpfs_size=size, tmpfs_mode=None if mode is None else int(mode, 8))


def _boolean(value: str, flag: str, text: str) -> bool:
    if value.lower() in ("true", "1", ""):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise OptionError(f"{flag} {text!r}: {value!r} is not true or false")


def parse_stage_volume(text: str, stages: int) -> MountSpec:
    """--stage-volume K:SRC:DST[:OPTS]: a volume for stage K alone."""
    k, sep, rest = text.partition(":")
    if not sep or not k.isascii() or not k.isdigit():
        raise OptionError(f"--stage-volume {text!r}: give K:SRC:DST[:ro] (K a stage's index)")
    if int(k) >= stages:
        raise OptionError(f"--stage-volume {text!r}: stage {k} does not exist (--stages {stages})")
    return parse_volume(rest, stage=int(k), flag="--stage-volume")


def parse_size(text: str, flag: str = "--shm-size") -> int:
    """docker's sizes: a number of bytes, or with b, k, m, g (and kb, mib, ...): 1g, 512m, 2GiB."""
    match = SIZE.fullmatch(text.strip())
    if match is None or not text.isascii():
        raise OptionError(f"{flag} {text!r}: give a size such as 64m, 1g or 2GiB (bytes without a unit)")
    number = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    if number < 1 or number > 1 << 62:
        raise OptionError(f"{flag} {text!r}: out of range (at least one byte)")
    return int(number)


def parse_ipc(text: str) -> str:
    if text in IPC_MODES or (text.startswith("container:") and len(text) > len("container:")):
        return text
    raise OptionError(f"--ipc {text!r}: use host, private, shareable, none or container:NAME")


def parse_ulimit(text: str) -> Ulimit:
    """NAME=SOFT[:HARD], as docker run --ulimit (-1 for unlimited)."""
    name, sep, values = text.partition("=")
    if not sep or name not in ULIMITS:
        known = ", ".join(ULIMITS)
        raise OptionError(f"--ulimit {text!r}: give NAME=SOFT[:HARD] with NAME one of {known}")
    soft_text, _, hard_text = values.partition(":")
    try:
        soft = int(soft_text)
        hard = int(hard_text) if hard_text else soft
    except ValueError:
        raise OptionError(f"--ulimit {text!r}: SOFT and HARD are whole numbers (-1: unlimited)") from None
    if min(soft, hard) < -1 or (hard != -1 and (soft == -1 or soft > hard)):
        raise OptionError(f"--ulimit {text!r}: the soft limit must not exceed the hard one")
    return Ulimit(name, soft, hard)


def parse_device(text: str) -> Device:
    """HOST[:CONTAINER[:PERMS]], as docker run --device (PERMS from r, w, m)."""
    parts = text.split(":")
    if not text or len(parts) > 3 or not parts[0].startswith("/"):
        raise OptionError(f"--device {text!r}: give HOST[:CONTAINER[:PERMS]] with HOST an absolute path (/dev/...)")
    host = parts[0]
    container, perms = host, "rwm"
    if len(parts) == 2 and parts[1] and set(parts[1]) <= set("rwm") and not parts[1].startswith("/"):
        perms = parts[1]
    elif len(parts) >= 2:
        container = parts[1] or host
        perms = parts[2] if len(parts) == 3 else perms
    if not container.startswith("/"):
        raise OptionError(f"--device {text!r}: the path in the container must be absolute")
    if not perms or not set(perms) <= set("rwm"):
        raise OptionError(f"--device {text!r}: permissions are letters of rwm")
    return Device(host, container, perms)


def parse_cap(text: str) -> str:
    cap = text.strip().upper()
    if not CAP.fullmatch(cap):
        raise OptionError(f"--cap-add {text!r}: give a capability such as SYS_PTRACE or IPC_LOCK")
    return cap.removeprefix("CAP_")


def parse_user(text: str) -> str:
    if not USER.fullmatch(text):
        raise OptionError(f"--user {text!r}: give UID[:GID] or NAME[:GROUP]")
    return text


def parse_workdir(text: str) -> str:
    if not text.startswith("/") or "\0" in text:
        raise OptionError(f"--workdir {text!r}: give an absolute path inside the container")
    return text


def parse_label(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    if not LABEL_KEY.fullmatch(key):
        raise OptionError(f"--label {text!r}: give KEY=VALUE (KEY of letters, digits and ._-/)")
    if key.startswith(OUR_LABELS):
        raise OptionError(f"--label {text!r}: labels under {OUR_LABELS} are pp-launch's own; choose another key")
    if "\0" in value:
        raise OptionError(f"--label {text!r}: a NUL byte in the value")
    return key, value


def ours(flag: str) -> str:
    """Why `flag`, a docker run flag, is not one of chain's: pp-launch sets it itself (OURS), or ''."""
    return OURS.get(flag, "")


# ------------------------------------------------------------------------------------------------ caches
CACHE_DIR_ENV = "PP_CACHE_DIR"
MODEL_CACHE_DIR_ENV = "PP_MODEL_CACHE_DIR"
CACHE_MOUNT = "/root/.cache/tinygrad"  # where swactor's worker keeps tinygrad's kernel cache
MODEL_CACHE_MOUNT = "/root/.cache/pp-pipeline"  # and its per-stage model cache (PP_MODEL_CACHE_DIR inside)


def cache_mounts(
    environ: Mapping[str, str], stage: int, home: str, cwd: str = "/", creatable: bool = True, default: bool = True
) -> tuple[tuple[MountSpec, ...], dict[str, str]]:
    """The caches docker-gpu-node.sh gives a stage, and the variables set inside (docs/pp-gpu-node.md): PP_CACHE_DIR
    (default HOME/.cache/tinygrad) at CACHE_MOUNT and, when set, PP_MODEL_CACHE_DIR at MODEL_CACHE_MOUNT, each in a
    `stage-K` folder of its own (stages of one host run at once and would share an sqlite lock); a relative path is
    taken from `cwd`. `creatable`: the engine is on the machine that creates the container, so pp-launch creates the
    folders first with the user's ownership. Where it is not (an engine reached over the network) only a cache the
    user named counts, and the engine creates its folders there, as `docker -H ENGINE run -v` would. `default`:
    PP_CACHE_DIR unset still mounts HOME/.cache/tinygrad (pp-gpu-node, drop-in; `chain --swactor-caches`)."""
    cache = posixpath.join(cwd, environ.get(CACHE_DIR_ENV) or "") if environ.get(CACHE_DIR_ENV) else ""
    if not cache and creatable and default:
        cache = posixpath.join(home, ".cache", "tinygrad")
    model = posixpath.join(cwd, environ.get(MODEL_CACHE_DIR_ENV) or "") if environ.get(MODEL_CACHE_DIR_ENV) else ""
    mounts, env = [], {}
    if cache:
        source = posixpath.join(cache, f"stage-{stage}")
        mounts.append(MountSpec("bind", CACHE_MOUNT, source, ensure=creatable, flag=CACHE_DIR_ENV))
    if model:
        source = posixpath.join(model, f"stage-{stage}")
        mounts.append(MountSpec("bind", MODEL_CACHE_MOUNT, source, ensure=creatable, flag=MODEL_CACHE_DIR_ENV))
        env[MODEL_CACHE_DIR_ENV] = MODEL_CACHE_MOUNT
    return tuple(mounts), env
