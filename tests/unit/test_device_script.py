"""bench/device/engine_demo.py, dry run: every step said, each missing input named with the command that makes it,
nothing started (no engine, no mount, no folder left), a summary written. On a GPU host it runs for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_demo_dry_runs_every_step_and_starts_nothing(tmp_path: Path) -> None:
    before = set(os.listdir("/tmp"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device" / "engine_demo.py"), "run", "--dry-run", str(tmp_path / "carry"),
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "launcher")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "not in " in said and "docker.io, containerd, runc, pp-launch-images.tar.xz" in said
    assert "engine_demo.py prepare" in said
    for step in ("$ dockerd -H unix://", "--bridge none --iptables=false", "docker -H unix://", " load",
                 "pp_launch chain --stages 2 --gpus auto --gpu-attach cdi"):  # fmt: skip
        assert step in said, step
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["dry_run"] is True
    assert {n for n in set(os.listdir("/tmp")) - before if n.startswith("pp-device-")} == set()
