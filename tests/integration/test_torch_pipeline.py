"""A real framework, unmodified (docs/torch-pipeline.md): examples/torch-pipeline's torch.distributed pipeline
(gloo, CPU; Debian's python3-torch, built by its one command) runs as a 4-stage chain under --rendezvous torch,
each stage's shard on a read-only mount, and stage 0's logits equal one process's exactly. A killed rank and a
paused rank (noticed by its health check) end the chain, leaving nothing."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import Launcher, docker, run_containers, wait_until

pytestmark = pytest.mark.full
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def torch_image(stub_image) -> str:  # type: ignore[no-untyped-def]
    """The example's image, built with its own command (reused while its inputs are unchanged)."""
    built = subprocess.run(["bash", str(ROOT / "examples" / "torch-pipeline" / "build.sh")], capture_output=True,
                           text=True, timeout=1500, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    return built.stdout.strip()


@pytest.fixture(scope="module")
def shards(torch_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The model's four shards, written by the example itself (a one-stage chain, as its docs say)."""
    folder = tmp_path_factory.mktemp("torch-weights")
    made = Launcher("chain", "--stages", "1", "--gpus", "none", "--image", torch_image, "--rendezvous", "torch",
                    "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{folder}:/w",
                    "--", "write-weights", "/w", "4")  # fmt: skip
    assert made.wait(300) == 0, made.stderr_text()
    yield folder


def chain(torch_image: str, shards: Path, *more: str) -> Launcher:
    return Launcher("chain", "--stages", "4", "--gpus", "none", "--grace", "1", "--json", "--image", torch_image,
                    "--rendezvous", "torch", "-v", f"{shards}/stage-{{stage}}:/weights:ro", *more)  # fmt: skip


def test_the_torch_pipeline_runs_as_a_chain_and_equals_one_process(engine, torch_image: str, shards: Path) -> None:  # type: ignore[no-untyped-def]
    run = chain(torch_image, shards)
    assert run.wait(300) == 0, run.stderr_text()
    said = run.stderr_text()
    assert "[stage 0] PP_TORCH_RESULT max_abs_diff=0.0 match=true" in said, said


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_a_killed_or_paused_rank_ends_the_chain_and_leaves_nothing(  # type: ignore[no-untyped-def]
    engine, torch_image: str, shards: Path, how: str
) -> None:
    run = chain(torch_image, shards, "--stage-env", "2:PIPELINE_HANG_RANK=2", "--health-cmd", "true",
                "--health-interval", "500ms", "--health-timeout", "1s", "--health-retries", "2")  # fmt: skip
    run_id = run.wait_event("pp_stage_roster", timeout=120)["run"]
    try:
        # the roster comes as the ranks start (no announcement): a cgroup freeze while the rank's processes are
        # still being spawned can fail ("unable to freeze"), as `docker pause` says; asked again until it holds
        assert wait_until(lambda: docker(how, f"pp-{run_id}-2").returncode == 0, 20), docker("ps", "-a").stdout
        assert run.wait(120) == 1, run.stderr_text()
    finally:
        if run.proc.poll() is None:
            run.signal(signal.SIGINT)
            run.wait(60)
    said = run.stderr_text()
    assert "stage 2 (" in said, said
    if how == "pause":  # docker runs no check in a paused container: paused as long as checks may fail is unhealthy
        assert "(unhealthy: paused for 2 s, its health check could not run)" in said, said
    assert wait_until(lambda: run_containers(engine, run_id) == [], 30)
