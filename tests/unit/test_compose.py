"""`pp-launch compose` without an engine: the checked-in file, the YAML writer, and the entry's grammar."""

from __future__ import annotations

import random
import shlex
import string
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pp_launch.app import compose
from pp_launch.cli.main import main
from pp_launch.core import stage_env
from pp_launch.core.announce import PREFIX, AnnouncementError, parse_line

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "compose" / "pp-chain-4.yaml"
ENTRY = ROOT / "images" / "stage-entry" / "pp-stage-entry.sh"
DATA = ROOT / "tests" / "data"
# Nothing of the test runner's own environment may leak into a rendered file.
CLEAN_ENV: dict[str, str | None] = {name: None for name in stage_env.FORWARDED} | {
    "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    "PP_LAUNCH_GPU_INVENTORY": None,
    "CUDA_VISIBLE_DEVICES": None,
}


def render(*args: str) -> str:
    result = CliRunner().invoke(main, ["compose", *args], env=CLEAN_ENV, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_checked_in_file_is_what_its_command_writes() -> None:
    text = REFERENCE.read_text()
    command = text.splitlines()[1].removeprefix("# Written by: ")
    words = shlex.split(command)
    assert words[:2] == ["pp-launch", "compose"]
    assert render(*words[2:]) == text, f"compose/pp-chain-4.yaml is stale: regenerate it with `{command}`"


def test_the_file_parses_as_yaml_into_the_services_we_meant() -> None:
    doc = yaml.safe_load(render("--stages", "3", "--gpus", "none", "--project", "p1", "--env", "GREETING=$HOME"))
    assert doc["name"] == "p1" and list(doc["services"]) == ["stage-0", "stage-1", "stage-2"]
    s0, s1, s2 = (doc["services"][f"stage-{k}"] for k in range(3))
    assert all("depends_on" not in s for s in (s0, s1, s2))  # all start at once; the entry waits for the files
    assert s1["init"] is True and s1["network_mode"] == "host"
    assert s1["environment"]["STAGE"] == "1" and s1["environment"]["NUM_STAGES"] == "3"
    assert s1["environment"]["GREETING"] == "$$HOME"  # a literal $, not interpolated by compose
    assert "PEER_DIRECT" not in s1["environment"]  # comes from stage 0's file at run time
    assert s2["labels"]["pp-launch.owner"] == "compose:p1"
    assert s2["labels"]["pp-launch.run"] == compose.run_id_for("p1") and s2["labels"]["pp-launch.stage"] == "2"
    assert s2["healthcheck"]["test"] == ["CMD", "/bin/sh", "-c", "test -s /dev/shm/pp-announce/stage-2.addr"]
    assert s0["ipc"] == "shareable" and s1["ipc"] == s2["ipc"] == "service:stage-0"  # stage 0's /dev/shm
    assert all("volumes" not in s for s in (s0, s1, s2))  # nothing on the host to leave behind
    assert "deploy" not in s2 and s2["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    script = doc["configs"]["pp-stage-entry"]["content"]
    assert script.replace("$$", "$") == ENTRY.read_text()


def test_gpus_are_pinned_by_uuid() -> None:
    doc = yaml.safe_load(
        render("--stages", "2", "--gpus", "auto", "--gpu-inventory", str(DATA / "pcie-2socket-4gpu.json"))
    )
    for k, uuid in enumerate(["GPU-00000002-0000-4000-8000-000000125de8", "GPU-00000003-0000-4000-8000-000000127cd7"]):
        s = doc["services"][f"stage-{k}"]
        assert s["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "device_ids": [uuid], "capabilities": ["gpu"]}
        ]
        assert s["environment"]["NVIDIA_VISIBLE_DEVICES"] == uuid and s["labels"]["pp-launch.gpus"] == uuid


def test_a_bad_project_name_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["compose", "--project", "Bad Name"], env=CLEAN_ENV)
    assert result.exit_code == 2 and "--project" in result.output


# ------------------------------------------------------------------------ the entry's grammar == ours
def _shell_verdicts(lines: list[str]) -> list[str]:
    text = ENTRY.read_text()
    grammar = text[text.index("# --- grammar begin") : text.index("# --- grammar end")]
    harness = (
        "cr=$(printf '\\r')\n" + grammar + 'while IFS= read -r line; do parse_announcement "$line"; '
        'case $? in 0) echo "ok $id $direct" ;; 1) echo bad ;; *) echo none ;; esac; done\n'
    )
    data = "".join(line + "\n" for line in lines).encode()
    out = subprocess.run(["sh", "-c", harness], input=data, capture_output=True, check=True).stdout
    return out.decode().splitlines()


def _python_verdict(line: str) -> str:
    try:
        a = parse_line(line)
    except AnnouncementError:
        return "bad"
    return "none" if a is None else f"ok {a.node_id_hex} {a.direct}"


NODE = "0123456789abcdef" * 4
PIECES = [
    "127.0.0.1",
    "10.0.0.255",
    "256.1.1.1",
    "[::1]",
    "[fe80::1]",
    "[::1",
    "::1",
    "host",
    "a-b.c",
    "-bad",
    "bad-",
    "a..b",
    ".a",
    "h_x",
    "",
    "1.2.3",
    ":",
    "[]",
    "$(id)",
    "a;b",
    "x y",
    "\t",
    "é",
    "[1:2:3:4:5:6:7:8]",
    "[1:2:3:4:5:6:7:8:9]",
    "[::ffff:1.2.3.4]",
    "[1::2::3]",
    "[:1]",
    "[1:]",
    "[12345::]",
    "[::]",
    "[1:2:3:4:5:6:7::]",
    "[::2:3:4:5:6:7:8]",
    "[1.2.3.4]",
    "[::1.2.3]",
    "[1:2:3:4:5:6:1.2.3.4]",
    "[1:2:3:4:5:6:7:1.2.3.4]",
    "[fe80::1%eth0]",
    "[::g]",
    "01.2.3.4",
    "1.2.3.4.",
    "0.0.0.0",
    "a.",
    "a..",
    "a.-b",
    "a-.b",
    "x" * 63 + ".io",
    "x" * 64 + ".io",
    "[[::1]]",
    "1.2.3.04",
]


def _random_line(rng: random.Random) -> str:
    items = []
    for _ in range(rng.randint(1, 3)):
        port = rng.choice(["1", "80", "65535", "65536", "0", "", "08", "99999", "x", "-1"])
        items.append(f"{rng.choice(PIECES)}:{port}" if rng.random() < 0.9 else rng.choice(PIECES))
    node = rng.choice([NODE, NODE.upper(), NODE[:-1], NODE + "0", NODE[:-1] + "g", "x"])
    sep = rng.choice([" ", " ", " ", "  ", "\t"])
    lead = rng.choice(["", " ", "\t", "  "])
    tail = rng.choice(["", " ", "\r", "\t "])
    prefix = rng.choice([PREFIX, PREFIX, PREFIX, PREFIX + "X", "pp_gpu_node_addr", "# " + PREFIX])
    return f"{lead}{prefix}{sep}{node}{sep}{','.join(items)}{tail}"


def test_the_shell_entry_and_the_launcher_agree_on_every_line() -> None:
    rng = random.Random(20261202)
    lines = [_random_line(rng) for _ in range(4000)]
    lines += [f"{PREFIX} {NODE} 127.0.0.1:1", f"{PREFIX} {NODE} [::1]:443,node-3.cluster.local:5000", "hello"]
    for line, shell, python in zip(lines, _shell_verdicts(lines), map(_python_verdict, lines), strict=True):
        assert shell == python, f"sh says {shell!r}, Python says {python!r} for {line!r}"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet=string.printable.replace("\n", "").replace("\x0b", "").replace("\x0c", ""), max_size=60).map(
            lambda s: f"{PREFIX} {NODE} {s}"
        ),
        min_size=1,
        max_size=30,
    )
)
def test_agreement_on_arbitrary_direct_values(lines: list[str]) -> None:
    for line, shell in zip(lines, _shell_verdicts(lines), strict=True):
        assert shell == _python_verdict(line), line


@pytest.mark.parametrize("name", ["pp-demo", "p1"])
def test_run_ids_are_deterministic(name: str) -> None:
    assert compose.run_id_for(name) == compose.run_id_for(name) and len(compose.run_id_for(name)) == 12
