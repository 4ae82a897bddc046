"""Images without a registry: a Debian root filesystem (debootstrap) imported as the base image, and the
stage image built on it from `images/`. Each image carries a content hash of its inputs in a label, so a
second build with unchanged inputs does nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pp_launch.adapters import host_state
from pp_launch.adapters.docker_engine import Engine
from pp_launch.core import errors
from pp_launch.core.chain.plan import BUILTIN_IMAGE, GUARD_IMAGE

HASH_LABEL = "pp-launch.content-hash"
BASE_IMAGE = "pp-launch/base:bookworm"
BASE_RECIPE_VERSION = "1"
BASE_PACKAGES = ("python3", "python3-numpy")
STUB_CONTEXT = "stub-worker"
GUARD_CONTEXT = "guard"

Progress = Callable[[str], None]


PACKAGED = "_images"  # where a wheel carries `images/` (setup.py copies it into the package at build time)


def images_dir() -> Path:
    """The image sources: PP_LAUNCH_IMAGES_DIR, else the package's own copy (an installed wheel), else `images/` of
    the source tree (an editable install)."""
    configured = os.environ.get("PP_LAUNCH_IMAGES_DIR")
    here = Path(__file__).resolve().parents[1]
    candidates = [Path(configured)] if configured else [here / PACKAGED, here.parents[1] / "images"]
    for path in candidates:
        if (path / STUB_CONTEXT / "Dockerfile").is_file():
            return path
    raise errors.ConfigError(
        f"cannot find pp-launch's image sources (looked in {', '.join(map(str, candidates))}): this install is "
        "incomplete; reinstall pp-launch (pip install --force-reinstall pp-launch) or set PP_LAUNCH_IMAGES_DIR"
    )


LOG_NAME = "images-build.log"
TAIL = 20


class BuildLog:
    """Every line the build's tools print (debootstrap, docker build), kept in a file of the user's state directory
    and the last ones in memory: shown as they come only with -v (`echo`), else only when a build fails."""

    def __init__(self, echo: Progress | None = None) -> None:
        from collections import deque


        self.echo = echo
        self.tail: deque[str] = deque(maxlen=TAIL)
        self.path: Path | None = None
        self._fd: int | None = None
        self.lines = 0
        try:
            with host_state.state() as d:
                with contextlib.suppress(errors.PpLaunchError):
                    d.remove(LOG_NAME)
                self._fd, self.path = d.append_fd(LOG_NAME), d.path / LOG_NAME
        except errors.PpLaunchError as exc:  # no state directory to keep it in: the tail alone
            self.tail.append(f"(no build log kept: {exc})")

    def __call__(self, line: str) -> None:
        self.lines += 1
        self.tail.append(line)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._fd, (line + "\n").encode("utf-8", "backslashreplace"))
        if self.echo is not None:
            self.echo(line)

    def failed(self, message: str) -> str:
        """A build's error with what its tools said last and where the rest is."""
        shown = "\n".join(f"    {line}" for line in self.tail)
        where = f"\n  the whole output: {self.path}" if self.path is not None else ""
        return f"{message}\n  its last lines:\n{shown}{where}" if shown else f"{message}{where}"

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class BaseRecipe:
    suite: str = os.environ.get("PP_DEBIAN_SUITE", "bookworm")
    mirror: str = os.environ.get("PP_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    packages: tuple[str, ...] = BASE_PACKAGES

    def content_hash(self) -> str:
        text = "\n".join([BASE_RECIPE_VERSION, self.suite, self.mirror, "minbase", *self.packages])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def context_hash(context: Path, extra: str) -> str:
    """Hash of every file a build context sends (those .dockerignore lets through) plus `extra`."""
    h = hashlib.sha256(extra.encode())
    for path in sorted(p for p in context.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class BuildResult:
    image: str
    built: bool  # False: up to date, nothing done


def build_base(
    engine: Engine, progress: Progress, recipe: BaseRecipe | None = None, log: Progress | None = None
) -> BuildResult:
    """progress: what it is doing, a line per step; log: every line debootstrap prints."""
    recipe = recipe or BaseRecipe()
    log = log or progress
    digest = recipe.content_hash()
    current = engine.image_labels(BASE_IMAGE)
    if current is not None and current.get(HASH_LABEL) == digest:
        return BuildResult(BASE_IMAGE, False)
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise errors.ConfigError(
            f"building {BASE_IMAGE} needs debootstrap run as root ('apt-get install debootstrap'), "
            "or name an "
            "existing image with python3 and numpy: pp-launch images build --base IMAGE"
        )
    workdir = Path(tempfile.mkdtemp(prefix="pp-launch-rootfs-"))
    try:
        root = workdir / "root"
        progress(f"debootstrap {recipe.suite} (minbase + {', '.join(recipe.packages)}) from {recipe.mirror}")
        _run_streaming(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(recipe.packages)}",
                recipe.suite,
                str(root),
                recipe.mirror,
            ],
            log,
        )
        for junk in (
            "var/cache/apt/archives",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
            "usr/share/info",
        ):
            shutil.rmtree(root / junk, ignore_errors=True)
        tar = workdir / "rootfs.tar"
        progress("packing the root filesystem")
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], check=True)
        progress(f"docker import -> {BASE_IMAGE}")
        repository, _, tag = BASE_IMAGE.partition(":")
        engine.import_rootfs(
            str(tar),
            repository,
            tag,
            changes=[
                f"LABEL {HASH_LABEL}={digest}",
                'CMD ["/bin/bash"]',
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8",
            ],
        )
    except subprocess.CalledProcessError as exc:
        raise errors.EngineError(f"{exc.cmd[0]} failed with exit code {exc.returncode}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return BuildResult(BASE_IMAGE, True)


def build_stub(engine: Engine, progress: Progress, base: str = BASE_IMAGE, log: Progress | None = None) -> BuildResult:
    return _build_on_base(engine, progress, base, STUB_CONTEXT, BUILTIN_IMAGE, log or progress)


def build_guard(engine: Engine, progress: Progress, base: str = BASE_IMAGE, log: Progress | None = None) -> BuildResult:
    """The guard of a run on its engine, and the body of the engine's GPU lock (python3 and cat only)."""
    return _build_on_base(engine, progress, base, GUARD_CONTEXT, GUARD_IMAGE, log or progress)


def _build_on_base(
    engine: Engine, progress: Progress, base: str, folder: str, image: str, log: Progress
) -> BuildResult:
    context = images_dir() / folder
    base_labels = engine.image_labels(base)
    if base_labels is None:
        raise errors.ImageMissing(f"base image {base} is not present; run 'pp-launch images build'")
    digest = context_hash(context, f"{base}={base_labels.get(HASH_LABEL, '')}")
    current = engine.image_labels(image)
    if current is not None and current.get(HASH_LABEL) == digest:
        return BuildResult(image, False)
    progress(f"docker build on {base}")
    old = engine.image_id(image)
    engine.build(str(context), image, {"BASE": base}, {HASH_LABEL: digest}, log)
    engine.drop_replaced_image(old, image)  # a rebuild leaves no untagged image behind (one in use stays)
    return BuildResult(image, True)


@dataclass(frozen=True)
class Step:
    """What a build says, one per image (`say`): it begins a step of `image` (`doing`), or the image is `done`
    (`built` or up to date, after `seconds`)."""

    image: str
    doing: str = ""
    done: bool = False
    built: bool = False
    seconds: float = 0.0

    def text(self) -> str:
        if not self.done:
            return f"{self.image}: {self.doing}"
        return f"{self.image}: built in {self.seconds:.0f} s" if self.built else f"{self.image}: up to date"


def build_all(
    engine: Engine, say: Callable[[Step], None] | Progress, base: str | None = None, log: BuildLog | None = None
) -> list[BuildResult]:
    """Every image the toolkit needs. With `base`, that image is used instead of the Debian import. `say` hears a
    Step per image step (a plain callable, their text); every line the tools print goes to `log` (default: a
    BuildLog, shown when a build fails)."""
    own = log is None
    log = log or BuildLog()
    try:
        steps: list[tuple[str, Callable[[Progress, Progress], BuildResult]]] = []
        if base is None:
            steps.append((BASE_IMAGE, lambda p, raw: build_base(engine, p, log=raw)))
            base = BASE_IMAGE
        elif engine.image_labels(base) is None:
            raise errors.ImageMissing(f"base image {base} is not present locally, and pp-launch never pulls")
        on = base
        steps.append((BUILTIN_IMAGE, lambda p, raw: build_stub(engine, p, on, raw)))
        steps.append((GUARD_IMAGE, lambda p, raw: build_guard(engine, p, on, raw)))
        return [_one(image, build, say, log) for image, build in steps]
    finally:
        if own:
            log.close()


def _one(
    image: str,
    build: Callable[[Progress, Progress], BuildResult],
    say: Callable[[Step], None] | Progress,
    log: BuildLog,
) -> BuildResult:
    def tell(step: Step) -> None:
        say(step) if _takes_steps(say) else say(step.text())  # type: ignore[arg-type]

    began = time.monotonic()
    try:
        result = build(lambda doing: tell(Step(image, doing)), log)
    except (errors.EngineError, errors.ConfigError) as exc:  # each of these takes its message alone
        said = str(exc) if str(exc).startswith(f"building {image}") else f"building {image} failed: {exc}"
        raise type(exc)(log.failed(said)) from None
    tell(Step(image, done=True, built=result.built, seconds=time.monotonic() - began))
    return result


def _takes_steps(say: object) -> bool:
    return bool(getattr(say, "takes_steps", False))


def _run_streaming(argv: list[str], progress: Progress) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                progress(line.rstrip())
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
