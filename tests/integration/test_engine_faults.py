"""The engine goes away under a chain, on a second engine the test breaks, never the suite's
own: killed, frozen, stopped. The launcher ends with a plain message naming the engine and the run, exit 1, no
traceback; its watchdog keeps trying until the engine is back, and then nothing of the run is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pp_launch.core import labels

from ..helpers import Launcher, wait_until, watchdogs

pytestmark = [pytest.mark.docker, pytest.mark.full]  # engines killed, frozen, stopped: the full tier
HOLD = ["--json", "--gpus", "none", "--grace", "1", "--env", "STUB_MODE=hold"]


def on(engine_host: str) -> dict[str, str]:
    return {"DOCKER_HOST": engine_host, "PP_ENGINE_TIMEOUT": "5", "PP_WATCHDOG_PATIENCE": "120"}


def listed(side, run: str, *filters: str) -> list[str]:  # type: ignore[no-untyped-def]
    return side.docker("ps", "-aq", "--filter", f"label={labels.RUN}={run}", *filters).stdout.split()


def run_left(side, run: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The run's containers the engine still has, but for those the engine itself marked Dead after its crash
    (its own removal failed): those are checked by gone_or_removable()."""
    dead = listed(side, run, "--filter", "status=dead")
    return [i for i in listed(side, run) if i not in dead]


def gone_or_removable(side, run: str) -> None:  # type: ignore[no-untyped-def]
    """A container the crashed engine left Dead is ours to remove: `pp-launch down RUN` does, by id. One the engine
    lists but has not (a ghost of its listing after the crash: SideEngine.ghosts) is gone: `down` has nothing
    to remove, and the engine's next restart lists it no more."""
    said = ""
    if listed(side, run):
        down = Launcher("down", run, "--grace", "1", env=on(side.host))
        assert down.wait(60) == 0, down.stderr_text()
        said = "\n".join(down.stdout_lines + down.stderr_lines)
    left = listed(side, run)
    assert side.ghosts(left) == left, side.docker("ps", "-a").stdout  # nothing the engine still has
    for ghost in left:  # `down` said so, and counted it among no removal
        assert f"{ghost[:12]}: 'No such container'" in said, said
    if left:
        side.restart()
        assert listed(side, run) == [], side.docker("ps", "-a").stdout


def plain_failure(launcher: Launcher, side, run: str) -> None:  # type: ignore[no-untyped-def]
    text = launcher.stderr_text()
    assert "Traceback" not in text and "requests." not in text, text
    assert f"the Docker engine at {side.host} stopped" in text, text
    assert f"pp-launch down {run}" in text, text


def ours_said(launcher: Launcher) -> list[str]:
    """Every line the launcher said of its own (stage lines aside), in order: the whole story of the fault."""
    return [line for line in launcher.stderr_text().splitlines() if line.startswith("pp-launch: ")]


@pytest.mark.parametrize("knobs", [[], ["--env", "STUB_IGNORE_LIFELINE=1", "--env", "STUB_IGNORE_SIGTERM=1"]])
def test_engine_killed_under_a_chain(broken_engine, knobs: list[str]) -> None:
    side = broken_engine
    launcher = Launcher("chain", "--stages", "2", *HOLD, *knobs, env=on(side.host))
    run = launcher.wait_event("pp_stage_roster", timeout=60)["run"]
    before = ours_said(launcher)
    side.kill()  # kill -9 dockerd: the containers live on under their shims
    assert launcher.wait(60) == 1
    plain_failure(launcher, side, run)
    said = ours_said(launcher)[len(before) :]  # the one line, nothing false before it
    assert len(said) == 1 and said[0].startswith("pp-launch: error: "), said
    assert launcher.wait_event("chain_stopped")["reason"] == "place_lost"
    side.ensure_running()  # the engine comes back; the run's watchdog was waiting for it
    assert wait_until(lambda: run_left(side, run) == [], 60), side.docker("ps", "-a").stdout
    gone_or_removable(side, run)


def test_engine_frozen_under_a_chain_then_ctrl_c(broken_engine) -> None:
    side = broken_engine
    launcher = Launcher(
        "chain",
        "--stages",
        "2",
        *HOLD,
        "--env",
        "STUB_IGNORE_LIFELINE=1",
        "--env",
        "STUB_IGNORE_SIGTERM=1",
        env=on(side.host),
    )
    run = launcher.wait_event("pp_stage_roster", timeout=60)["run"]
    before = ours_said(launcher)
    side.freeze()  # SIGSTOP dockerd
    t0 = time.monotonic()
    launcher.signal(signal.SIGINT)
    assert launcher.wait(60) == 1
    assert time.monotonic() - t0 < 5 + 5  # one engine call's timeout, then it asks a lost engine nothing more
    plain_failure(launcher, side, run)
    said = ours_said(launcher)[len(before) :]  # the one line, nothing false before it
    assert len(said) == 1 and said[0].startswith("pp-launch: stopped by SIGINT; then the Docker engine at "), said
    # the watchdog must outlast tries that fail while the engine is frozen: thaw only once it has spent more
    # than one engine timeout (5 s) trying, and is still there
    watchdog = int(
        subprocess.run(
            ["pgrep", "-f", f"pp_launch.adapters.watchdog {run}"], capture_output=True, text=True
        ).stdout.split()[0]
    )
    assert wait_until(lambda: _age(watchdog) > 6, 20)
    side.thaw()
    assert wait_until(lambda: run_left(side, run) == [], 60), side.docker("ps", "-a").stdout
    gone_or_removable(side, run)


@pytest.mark.parametrize("how", ["stop", "restart"])
def test_engine_stopped_gracefully_or_restarted_under_a_chain(broken_engine, how: str) -> None:
    """`systemctl stop docker` (or `restart`): the engine stops the stages and the guard, then itself. The launcher
    says one thing, the documented line (exit 1, `place_lost`): no "completed", no guard said replaced (there was
    no engine to replace it on)."""
    side = broken_engine
    launcher = Launcher("chain", "--stages", "2", *HOLD, env=on(side.host))
    run = launcher.wait_event("pp_stage_roster", timeout=60)["run"]
    before = ours_said(launcher)
    getattr(side, how)()  # the engine stops its containers, then itself (and, restarted, comes back)
    assert launcher.wait(60) == 1
    said = ours_said(launcher)[len(before) :]
    assert len(said) == 1 and said[0].startswith("pp-launch: error: "), said
    assert f"the Docker engine at {side.host} stopped" in said[0] and f"pp-launch down {run}" in said[0], said
    assert "Traceback" not in launcher.stderr_text()
    stopped = launcher.wait_event("chain_stopped")
    assert (stopped["exit_code"], stopped["reason"]) == (1, "place_lost"), stopped
    side.ensure_running()
    assert wait_until(lambda: run_left(side, run) == [], 60)
    gone_or_removable(side, run)


def test_pp_gpu_node_says_why_when_its_engine_is_killed(broken_engine, stub_image) -> None:
    side = broken_engine
    node = Launcher(
        "node",
        env={**on(side.host), "STAGE": "0", "PP_IMAGE": stub_image, "STUB_MODE": "hold", "PP_FORWARD_ENV": "STUB_MODE"},
    )
    assert wait_until(lambda: any("PP_GPU_NODE_ADDR" in line for line in node.stdout_lines), 60)
    side.kill()
    assert node.wait(60) == 125  # as `docker run` whose engine goes away under it
    text = node.stderr_text()
    assert text.startswith("pp-gpu-node: error:") or "\npp-gpu-node: error:" in text, text
    assert "Traceback" not in text
    side.ensure_running()
    assert wait_until(lambda: side.ours_listed() == [], 60)  # a listing's ghost aside (SideEngine.ghosts)
    # its watchdog, which waited for the engine, finds nothing left and goes
    assert wait_until(lambda: watchdogs(**on(side.host)) == [], 60), watchdogs(**on(side.host))


def _age(pid: int) -> float:
    """Seconds since the process started (0 once it is gone)."""
    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return 0.0
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
