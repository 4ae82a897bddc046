"""docker run's options on the real engine (docs/chain.md, "Your own model"): what a stage sees of its mounts,
/dev/shm, IPC namespace, user and labels; the demo's weights read from a read-only mount; the caches pp-gpu-node
gives a stage; the engine's own refusal of a host path it lacks. Each looks inside the running container."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pp_launch.adapters.docker_engine import DockerStageBackend
from pp_launch.core import errors
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.container import ContainerOptions

from ..helpers import Launcher, docker, run_containers, unique, wait_until

pytestmark = pytest.mark.docker
HOLD = ("--env", "STUB_MODE=hold")


def up(*args: str, env: dict[str, str] | None = None) -> tuple[Launcher, str, list[str]]:
    """A held 2-stage chain with these options, every stage announced: the launcher, its run, its stages' names."""
    chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--json", "--grace", "1", *HOLD, *args, env=env)
    roster = chain.wait_event("pp_stage_roster", timeout=60)
    names = [e["container"] for e in sorted(chain.events_named("stage_started"), key=lambda e: e["stage"])]
    return chain, roster["run"], names


def down(chain: Launcher, engine, run: str) -> None:  # type: ignore[no-untyped-def]
    chain.signal()
    assert chain.wait(30) == 143, chain.stderr_text()
    assert run_containers(engine, run) == []


def inside(name: str, script: str) -> subprocess.CompletedProcess[str]:
    return docker("exec", name, "sh", "-c", script)


def test_each_stage_sees_its_own_folder_and_cannot_write_a_read_only_one(engine, stub_image, tmp_path: Path) -> None:
    for k in range(2):
        (tmp_path / f"stage-{k}").mkdir()
        (tmp_path / f"stage-{k}" / "shard").write_text(f"weights of stage {k}\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    chain, run, names = up(
        "-v", f"{tmp_path}/stage-{{stage}}:/weights:ro", "--mount", f"type=bind,src={scratch},dst=/out"
    )
    try:
        for k, name in enumerate(names):
            assert inside(name, "cat /weights/shard").stdout == f"weights of stage {k}\n"
            refused = inside(name, "echo x > /weights/new")
            assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
            assert inside(name, f"echo {k} > /out/from-{k}").returncode == 0  # a writable bind is writable
    finally:
        down(chain, engine, run)
    assert sorted(p.name for p in scratch.iterdir()) == ["from-0", "from-1"]
    assert not (tmp_path / "stage-0" / "new").exists()


def test_shm_size_ipc_ulimit_user_workdir_and_labels_reach_every_stage(engine, stub_image) -> None:
    host_ipc = os.readlink("/proc/self/ns/ipc")
    label = unique("team")
    chain, run, names = up(
        "--shm-size", "96m", "--ulimit", "nofile=1024:2048", "--cap-add", "SYS_PTRACE", "--workdir", "/tmp",
        "--label", f"pp-tests.team={label}",
    )  # fmt: skip
    try:
        for name in names:
            df = inside(name, "df -k /dev/shm | tail -1").stdout.split()
            assert df[1] == str(96 * 1024), df
            limits = inside(name, "grep 'open files' /proc/1/limits").stdout.split()
            assert limits[3:5] == ["1024", "2048"], limits
            assert inside(name, "pwd").stdout.strip() == "/tmp"
            assert inside(name, "readlink /proc/1/ns/ipc").stdout.strip() != host_ipc
            info = json.loads(docker("inspect", name).stdout)[0]
            assert info["HostConfig"]["CapAdd"] == ["SYS_PTRACE"]
            labels = info["Config"]["Labels"]
            assert labels["pp-tests.team"] == label and labels["pp-launch.run"] == run
    finally:
        down(chain, engine, run)
    chain, run, names = up("--ipc", "host", "--user", "65534:65534")
    try:
        for name in names:
            assert inside(name, "readlink /proc/1/ns/ipc").stdout.strip() == host_ipc
            assert inside(name, "id -u; id -g").stdout.split() == ["65534", "65534"]
    finally:
        down(chain, engine, run)


def test_named_volumes_persist_as_docker_keeps_them_and_anonymous_ones_go(engine, stub_image) -> None:
    volume = unique("pp-tests-vol-")
    chain, run, names = up("-v", f"{volume}:/cache", "-v", "/scratch")
    try:
        info = json.loads(docker("inspect", names[0]).stdout)[0]
        anonymous = [m["Name"] for m in info["Mounts"] if m["Destination"] == "/scratch"]
        assert len(anonymous) == 1
        assert inside(names[0], "echo kept > /cache/x").returncode == 0
    finally:
        down(chain, engine, run)
    try:
        assert wait_until(lambda: docker("volume", "inspect", anonymous[0]).returncode != 0, 10), (
            "anonymous volume left"
        )
        assert docker("volume", "inspect", volume).returncode == 0  # the user's own volume, as docker run leaves it
    finally:
        docker("volume", "rm", "-f", volume)


def test_the_demo_reads_its_weights_from_a_read_only_mount(engine, stub_image, tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    me = f"{os.getuid()}:{os.getgid()}"
    write = Launcher(
        "chain", "--stages", "1", "--gpus", "none", "--user", me, "-v", f"{weights}:/weights",
        "--env", "STUB_MODE=write-weights", "--env", "STUB_WEIGHTS=/weights/demo.npz",
    )  # fmt: skip
    assert write.wait(60) == 0, write.stderr_text()
    npz = weights / "demo.npz"
    assert npz.stat().st_uid == os.getuid() and npz.stat().st_size > 100_000
    demo = Launcher("chain", "--stages", "3", "--gpus", "none", "-v", f"{weights}:/weights:ro",
                    "--env", "STUB_WEIGHTS=/weights/demo.npz", "--env", "MAX_TOKENS=6")  # fmt: skip
    assert demo.wait(90) == 0, demo.stderr_text()
    said = demo.stdout_lines
    assert sum("weights read from /weights/demo.npz" in line for line in said) == 3
    assert any("PP_DEMO_RESULT" in line and "match=true" in line for line in said), said
    # weights that are not the model's: the ring's tokens differ from the seeded model's, and the check says so
    flip = "import numpy as np; f = dict(np.load('/w/demo.npz')); f['w3'] = -f['w3']; np.savez('/w/other.npz', **f)"
    me = f"{os.getuid()}:{os.getgid()}"
    made = docker("run", "--rm", "--network", "none", "--user", me, "-v", f"{weights}:/w", "--entrypoint", "python3",
                  stub_image, "-c", flip)  # fmt: skip
    assert made.returncode == 0, made.stderr
    wrong = Launcher("chain", "--stages", "2", "--gpus", "none", "-v", f"{weights}:/weights:ro",
                     "--env", "STUB_WEIGHTS=/weights/other.npz", "--env", "MAX_TOKENS=6")  # fmt: skip
    assert wrong.wait(90) == 1
    assert any("match=false" in line for line in wrong.stdout_lines), wrong.stdout_lines


def test_the_caches_are_made_per_stage_with_the_users_ownership_as_pp_gpu_node_makes_them(
    engine, stub_image, tmp_path: Path
) -> None:
    cache, models = tmp_path / "tinygrad", tmp_path / "models"
    env = {"PP_CACHE_DIR": str(cache), "PP_MODEL_CACHE_DIR": str(models)}
    chain, run, names = up(env=env)
    try:
        for k, name in enumerate(names):
            assert inside(name, "echo $PP_MODEL_CACHE_DIR").stdout.strip() == "/root/.cache/pp-pipeline"
            assert (
                inside(
                    name, f"echo {k} > /root/.cache/tinygrad/kernel && echo {k} > /root/.cache/pp-pipeline/m"
                ).returncode
                == 0
            )
    finally:
        down(chain, engine, run)
    for k in range(2):
        assert (cache / f"stage-{k}" / "kernel").read_text() == f"{k}\n"
        assert (models / f"stage-{k}" / "m").read_text() == f"{k}\n"
        assert (cache / f"stage-{k}").stat().st_uid == os.getuid()


def test_a_host_path_the_engine_lacks_is_its_refusal_named_never_a_folder_it_creates(engine, stub_image) -> None:
    """Where pp-launch cannot look first (an engine on another machine), the bind goes as --mount type=bind: the
    engine refuses it, and the error names the flag, the path and the mkdir; nothing is created or left."""
    missing = f"/tmp/{unique('pp-tests-absent-')}"
    options = ContainerOptions.parse(1, volumes=[f"{missing}:/w:ro"])
    spec = StageSpec(0, unique("pp-tests-refused-"), stub_image, {}, {"pp-tests": "refused"}, options=options)
    backend = DockerStageBackend(engine)
    try:
        with pytest.raises(errors.HostPathMissing) as caught:
            backend.create(spec, {})
    finally:
        backend.close()
    assert str(caught.value).startswith(f"--volume: {missing} does not exist on the engine's machine")
    assert f"(mkdir -p {missing})" in str(caught.value)
    assert not Path(missing).exists() and engine.inspect(spec.name) is None
