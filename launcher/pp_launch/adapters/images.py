"""Images without a registry: a Debian root filesystem (debootstrap) imported as the base image, and the
stage image built on it from `images/`. Each image carries a content hash of its inputs in a label, so a
second build with unchanged inputs does nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def images_dir() -> Path:
    """`images/` of the source tree (the package is installed from it in editable mode)."""
    configured = os.environ.get("PP_LAUNCH_IMAGES_DIR")
    path = Path(configured) if configured else Path(__file__).resolve().parents[3] / "images"
    if not (path / STUB_CONTEXT / "Dockerfile").is_file():
        raise errors.ConfigError(
            f"cannot find the image sources at {path}; install pp-launch from its source tree "
            "(pip install -e .) or set PP_LAUNCH_IMAGES_DIR"
        )
    return path


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


def build_base(engine: Engine, progress: Progress, recipe: BaseRecipe | None = None) -> BuildResult:
    recipe = recipe or BaseRecipe()
    digest = recipe.content_hash()
    current = engine.image_labels(BASE_IMAGE)
    if current is not None and current.get(HASH_LABEL) == digest:
        progress(f"{BASE_IMAGE} is up to date ({digest})")
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
            progress,
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
        raise errors.EngineError(f"{exc.cmd[0]} failed with exit code {exc.returncode}; see the lines above") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return BuildResult(BASE_IMAGE, True)


def build_stub(engine: Engine, progress: Progress, base: str = BASE_IMAGE) -> BuildResult:
    return _build_on_base(engine, progress, base, STUB_CONTEXT, BUILTIN_IMAGE)


def build_guard(engine: Engine, progress: Progress, base: str = BASE_IMAGE) -> BuildResult:
    """The guard of a run on its engine, and the body of the engine's GPU lock (python3 and cat only)."""
    return _build_on_base(engine, progress, base, GUARD_CONTEXT, GUARD_IMAGE)


def _build_on_base(engine: Engine, progress: Progress, base: str, folder: str, image: str) -> BuildResult:
    context = images_dir() / folder
    base_labels = engine.image_labels(base)
    if base_labels is None:
        raise errors.ImageMissing(f"base image {base} is not present; run 'pp-launch images build'")
    digest = context_hash(context, f"{base}={base_labels.get(HASH_LABEL, '')}")
    current = engine.image_labels(image)
    if current is not None and current.get(HASH_LABEL) == digest:
        progress(f"{image} is up to date ({digest})")
        return BuildResult(image, False)
    progress(f"building {image} from {context} on {base}")
    old = engine.image_id(image)
    engine.build(str(context), image, {"BASE": base}, {HASH_LABEL: digest}, progress)
    engine.drop_replaced_image(old, image)  # a rebuild leaves no untagged image behind
    return BuildResult(image, True)


def build_all(engine: Engine, progress: Progress, base: str | None = None) -> list[BuildResult]:
    """Every image the toolkit needs. With `base`, that image is used instead of the Debian import."""
    results = []
    if base is None:
        results.append(build_base(engine, progress))
        base = BASE_IMAGE
    elif engine.image_labels(base) is None:
        raise errors.ImageMissing(f"base image {base} is not present locally, and pp-launch never pulls")
    results.append(build_stub(engine, progress, base))
    results.append(build_guard(engine, progress, base))
    return results


def _run_streaming(argv: list[str], progress: Progress) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                progress(line.rstrip())
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
