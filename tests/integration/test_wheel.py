"""pp-launch as a user installs it: a wheel built from this repository, installed in a fresh virtual environment
outside the checkout, against an engine that has none of pp-launch's stage or guard images. The wheel carries the
image sources, builds the images there, carries them to another engine (images save/load), and runs the demo with
its weights on a read-only mount to match=true."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..engines import SideEngine

pytestmark = [pytest.mark.docker, pytest.mark.full]
ROOT = Path(__file__).resolve().parents[2]
BASE = "pp-launch/base:bookworm"


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """The wheel, installed in a venv of its own in a folder that is not the checkout: its bin/ folder."""
    place = Path(tempfile.mkdtemp(prefix="pp-tests-wheel-"))
    try:
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(place / "dist"), str(ROOT)],
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stdout + built.stderr
        (wheel,) = (place / "dist").glob("pp_launch-*.whl")
        subprocess.run([sys.executable, "-m", "venv", str(place / "venv")], check=True)
        pip = [str(place / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
        yield place / "venv" / "bin"
    finally:
        subprocess.run(["rm", "-rf", str(place)], check=False)


@pytest.fixture
def bare_engine(engine) -> Iterator[SideEngine]:  # type: ignore[no-untyped-def]
    """A fresh engine with only the Debian base image: no stage image, no guard image."""
    side = SideEngine("wheel")
    try:
        side.start()
        side.load(BASE)
        yield side
    finally:
        side.close()


def run(bin_dir: Path, side: SideEngine, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(DOCKER_HOST=side.host, PATH=f"{bin_dir}:{env.get('PATH', '')}")
    return subprocess.run([str(bin_dir / "pp-launch"), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300, check=False)  # fmt: skip


def test_the_wheel_installs_pp_launch_alone_and_carries_the_old_entry_point(installed: Path, tmp_path: Path) -> None:
    """No top-level package but `pp_launch` (the checkout's launcher/scripts is not one); `docker-gpu-node.sh` is in
    the package, `pp-gpu-node --help` says where, and it runs the venv's pp-gpu-node with the venv not on PATH."""
    import zipfile

    (wheel,) = (installed.parents[1] / "dist").glob("pp_launch-*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"pp_launch"}, tops
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    said = subprocess.run([str(installed / "pp-gpu-node"), "--help"], capture_output=True, text=True, env=env,
                          check=False)  # fmt: skip
    assert said.returncode == 0, said.stderr
    wrapper = Path(said.stdout.rsplit("(it runs pp-gpu-node): ", 1)[1].strip())
    assert wrapper.name == "docker-gpu-node.sh" and installed.parent in wrapper.parents, said.stdout
    old = subprocess.run(["bash", str(wrapper), "--help"], capture_output=True, text=True, env=env, check=False)
    assert old.returncode == 0 and old.stdout.startswith("usage: pp-gpu-node"), old.stdout + old.stderr
    shown = subprocess.run([str(installed / "pp-launch"), "gpus", "--gpu-inventory", "example:nvlink-8gpu", "--topo"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=False)  # fmt: skip
    assert shown.returncode == 0 and "NV" in shown.stdout, shown.stdout + shown.stderr  # the docs' first commands


def test_a_wheel_builds_the_images_on_a_bare_engine_and_runs_the_demo_from_a_mount(
    installed: Path, bare_engine: SideEngine, tmp_path: Path
) -> None:
    version = run(installed, bare_engine, "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    where = subprocess.run([str(installed / "python"), "-c", "import pp_launch; print(pp_launch.__file__)"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert not where.startswith(str(ROOT)), where  # the installed package, not the checkout's
    built = run(installed, bare_engine, "images", "build", "--base", BASE, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines() == [
        "pp-launch/stub-worker:latest: built in " + built.stdout.split("built in ")[1].split("\n")[0],
        "pp-launch/guard:latest: built in " + built.stdout.split("built in ")[2].split("\n")[0],
    ]
    again = run(installed, bare_engine, "images", "build", "--base", BASE, cwd=tmp_path)
    assert again.stdout.splitlines() == [
        "pp-launch/stub-worker:latest: up to date",
        "pp-launch/guard:latest: up to date",
    ]
    weights = tmp_path / "weights"
    weights.mkdir()
    me = f"{os.getuid()}:{os.getgid()}"
    write = run(installed, bare_engine, "chain", "--stages", "1", "--gpus", "none", "--user", me, "-v",
                f"{weights}:/weights", "--env", "STUB_MODE=write-weights", "--env", "STUB_WEIGHTS=/weights/demo.npz",
                cwd=tmp_path)  # fmt: skip
    assert write.returncode == 0, write.stderr
    demo = run(installed, bare_engine, "chain", "--stages", "3", "--gpus", "none", "-v", f"{weights}:/weights:ro",
               "--env", "STUB_WEIGHTS=/weights/demo.npz", "--env", "MAX_TOKENS=6", cwd=tmp_path)  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    assert "match=true" in demo.stdout and demo.stdout.count("weights read from /weights/demo.npz") == 3
    assert bare_engine.docker("ps", "-aq").stdout.split() == []


def test_images_saved_from_one_engine_load_into_another_and_run_a_chain_there(
    installed: Path, bare_engine: SideEngine, tmp_path: Path, engine
) -> None:  # type: ignore[no-untyped-def]
    """What a cluster's nodes need (docs/ray.md, docs/hosts.md): the images of the suite's engine saved to a file,
    loaded into an engine that has none of them, a chain there."""
    archive = tmp_path / "images.tar"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    saved = subprocess.run([str(installed / "pp-launch"), "images", "save", "-o", str(archive)], capture_output=True,
                           text=True, env=env, check=False)  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(f"{archive}: pp-launch/stub-worker:latest, pp-launch/guard:latest (")
    loaded = run(installed, bare_engine, "images", "load", "-i", str(archive), cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    said = loaded.stdout.strip().rpartition(": loaded ")[2]  # in the order the engine read them from the file
    assert sorted(said.split(", ")) == ["pp-launch/guard:latest", "pp-launch/stub-worker:latest"], loaded.stdout
    chain = run(installed, bare_engine, "chain", "--stages", "2", "--gpus", "none", "--env", "MAX_TOKENS=4",
                cwd=tmp_path)  # fmt: skip
    assert chain.returncode == 0 and "match=true" in chain.stdout, chain.stderr
