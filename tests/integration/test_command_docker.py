"""docker run's command (docs/chain.md, "A command, as docker run's"): `pp-launch chain -- COMMAND ARG...` runs it in
every stage, with {stage}, {stages} and {first_peer} filled in the arguments and --env values, whichever the
bring-up (the hand-off entry fills {first_peer} with --handoff env; the launcher at create, in turn); `docker
inspect` shows the model's command."""

from __future__ import annotations

import re
import signal

import pytest

from ..helpers import Launcher, docker, wait_until

pytestmark = pytest.mark.docker
STUB = "exec python3 -u /usr/local/lib/pp-stub/pp_stub.py"


@pytest.mark.parametrize("bring_up", ["parallel", "in-turn"])
def test_a_command_runs_in_every_stage_with_its_fields_filled(engine, stub_image, bring_up: str) -> None:  # type: ignore[no-untyped-def]
    script = 'echo "args {stage}/{stages} peer={first_peer} env=$WHO"; ' + STUB
    chain = Launcher("chain", "--stages", "3", "--gpus", "none", "--grace", "1", "--json", "--bring-up", bring_up,
                     "--env", "STUB_MODE=hold", "--env", "WHO=s{stage}-{first_peer}", "--entrypoint", "sh",
                     "--", "-c", script)  # fmt: skip
    try:
        roster = chain.wait_event("pp_stage_roster", timeout=60)
        first = chain.wait_event("stage_announced", stage=0)["direct"].split(",")[0]

        def said() -> dict[int, str]:
            lines = chain.stderr_text().splitlines()
            return {k: line.split("] ", 1)[1] for k in range(3) for line in lines
                    if line.startswith(f"[stage {k}] args ")}  # fmt: skip

        assert wait_until(lambda: len(said()) == 3, 20), chain.stderr_text()
        got = said()
        assert got[0] == "args 0/3 peer= env=s0-", got
        assert got[1] == f"args 1/3 peer={first} env=s1-{first}", got
        assert got[2] == f"args 2/3 peer={first} env=s2-{first}", got
        run = roster["run"]
        shown = docker("inspect", "-f", "{{json .Config.Cmd}}", f"pp-{run}-1").stdout
        assert "args {stage}" not in shown and re.search(r"args 1/3", shown), shown  # the model's command, filled
        # docker ps's COMMAND: stage 0 (no peers to wait for) runs the model's command itself, whichever the bring-up
        listed = docker("ps", "--no-trunc", "--format", "{{.Command}}", "--filter", f"name=^pp-{run}-0$").stdout
        assert listed.strip().startswith('"sh -c'), listed
    finally:
        chain.signal(signal.SIGINT)
        assert chain.wait(60) == 130, chain.stderr_text()


def test_an_image_without_a_shell_is_refused_in_one_line_before_any_stage_starts(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--handoff env runs /bin/sh before the stage's command: an image without it is named, with what to use
    instead, before anything starts; nothing is left. In turn (no hand-off entry) it is created as it is."""
    import subprocess
    import tarfile

    from ..helpers import unique

    (tmp_path / "hello").write_text("no shell here\n")
    with tarfile.open(tmp_path / "rootfs.tar", "w") as tar:
        tar.add(tmp_path / "hello", arcname="hello")
    image = f"pp-launch-test/no-shell:{unique()}"
    imported = subprocess.run(["docker", "import", str(tmp_path / "rootfs.tar"), image], capture_output=True,
                              text=True, check=False)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    try:
        chain = Launcher("chain", "--stages", "2", "--gpus", "none", "--grace", "1", "--image", image,
                         "--entrypoint", "/hello")  # fmt: skip
        code = chain.wait(60)
        said = chain.stderr_text()
        assert code != 0 and f"image {image} has no /bin/sh" in said and "--bring-up in-turn" in said, said
        assert not any(f"stage {k} started" in said for k in (0, 1)), said  # no stage was started
        left = docker("ps", "-aq", "--filter", f"ancestor={image}").stdout.split()
        assert left == [], left
    finally:
        docker("rmi", "-f", image)
