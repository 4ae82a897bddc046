"""examples/torch-pipeline as a 4-stage chain (`--rendezvous torch`) against the same model in one process (a
`docker run --rm` of the same image with torch's variables for a world of one), interleaved, in one run: the whole
command's time (bring-up, torch's import in each stage, the step, the teardown) and the pipeline step's own time as
the program reports it. Needs the example's image (`bash examples/torch-pipeline/build.sh`). Only loopback traffic.

Usage: python bench/bench_torch_pipeline.py [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"PP_TORCH_RESULT max_abs_diff=(\S+) match=(\w+) step_s=([0-9.]+)")


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(the command's seconds, the step's seconds, match) of one run."""
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    took = time.monotonic() - start
    found = STEP.search(done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench_torch_pipeline: {argv[:4]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return took, float(found.group(3)), found.group(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/torch-pipeline.md")
    opts = ap.parse_args()
    image = subprocess.run(["bash", str(ROOT / "examples" / "torch-pipeline" / "build.sh")], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    pp = [sys.executable, "-m", "pp_launch"]
    with tempfile.TemporaryDirectory(prefix="pp-bench-torch-") as scratch:
        for world in (1, 4):
            Path(scratch, str(world)).mkdir()
            subprocess.run([*pp, "chain", "--stages", "1", "--gpus", "none", "-q", "--image", image, "--rendezvous",
                            "torch", "-v", f"{scratch}/{world}:/w", "--", "write-weights", "/w", str(world)],
                           check=True)  # fmt: skip
        one = ["docker", "run", "--rm", "--init", "--network", "host", "-e", "RANK=0", "-e", "WORLD_SIZE=1",
               "-e", "MASTER_ADDR=127.0.0.1", "-e", "MASTER_PORT=29511", "-v", f"{scratch}/1/stage-0:/weights:ro",
               image]  # fmt: skip
        chain = [*pp, "chain", "--stages", "4", "--gpus", "none", "--image", image, "--rendezvous", "torch",
                 "-v", f"{scratch}/4/stage-{{stage}}:/weights:ro"]  # fmt: skip
        ones, chains = [], []
        for _ in range(opts.repeats):
            ones.append(timed(one))
            chains.append(timed(chain))
    rows = ["| side | whole command s | pipeline step s | match |", "|---|---:|---:|---|"]
    for name, runs in (("one process (docker run)", ones), ("4-stage chain, --rendezvous torch", chains)):
        wall = statistics.median(r[0] for r in runs)
        step = statistics.median(r[1] for r in runs)
        rows.append(f"| {name} | {wall:.2f} | {step:.3f} | {'/'.join(sorted({r[2] for r in runs}))} |")
    how = f"Medians of {opts.repeats} interleaved runs; `python bench/bench_torch_pipeline.py`."
    text = "\n".join(rows) + f"\n\n{how}\n"
    Path(opts.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
