"""The CLI through CliRunner: help everywhere, flag errors, gpus and dry runs on inventory files.

No Docker needed: dry runs and `gpus` work without an engine (and say so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pp_launch.cli.main import COMMANDS, load_all, main

from ..helpers import NO_DRIVER

DATA = Path(__file__).parent.parent / "data"
load_all()  # the group imports each command when it runs; these tests walk them all
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "PP_LAUNCH_GPU_INVENTORY": ""}


def run(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), env={**NO_ENGINE, **(env or {})}, catch_exceptions=False)


def all_commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, cmd in group.commands.items():
        out += all_commands(cmd, (*path, name)) if isinstance(cmd, click.Group) else [(*path, name)]
    return out


@pytest.mark.parametrize("path", all_commands(main))
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = run(*path, "--help")
    assert result.exit_code == 0
    command = main
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    if not isinstance(command, click.Group) or command is main:
        assert "Example" in result.output
    assert len(result.output.splitlines()) > 3


def test_wait_help_and_the_docs_say_what_wait_does_as_docker_wait() -> None:
    """`wait` exits 0 once every stage's code is known, whatever the codes (as `docker wait`): its help and the
    command table say the same (tests/integration/test_record.py runs it on a stage that exited 3)."""
    text = " ".join(run("wait", "--help").output.split())
    assert "exits 0 once every code is known, whatever the codes are" in text, text
    assert "1 when a stage failed" not in text
    table = (Path(__file__).parents[2] / "docs" / "getting-started.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| <code>pp-launch wait RUN"))
    assert "exit 0 once every code is known" in row


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--stages", "0"), "Invalid value for '--stages'"),
        (("--grace", "-1"), "Invalid value for '--grace'"),
        (("--gpu-attach", "magic"), "Invalid value for '--gpu-attach'"),
        (("--env", "1BAD=x"), "'1BAD=x' is not NAME=VALUE"),
        (("--env", "STAGE=3"), "STAGE is set by pp-launch itself"),
        (("--stage-env", "5:A=b"), "stage 5 does not exist (--stages 2)"),
        (("--stage-env", "A=b"), "'A=b' is not K:NAME=VALUE"),
        (("--grace", "nan"), "'nan' is not a finite non-negative number"),
        (("--grace", "inf"), "'inf' is not a finite non-negative number"),
        (("--addr-timeout", "nan"), "'nan' is not a finite positive number"),
        (("--addr-timeout", "0"), "'0' is not a finite positive number"),
        (("--seed-addr", "ab" * 31), "SEED_ADDR " + "ab" * 31 + " is not the seed's node id (64 hex digits)"),
        (("--seed-direct", "127.0.0.1"), "SEED_DIRECT 127.0.0.1 is not host:port[,host:port...]"),
        (("--seed-relay", "ftp://relay"), "SEED_RELAY ftp://relay is not an http(s) URL"),
        (("--entrypoint", " "), "Invalid value for --entrypoint: must name a program"),
        (("--stages-per-host", "2"), "--stages-per-host needs --host"),
        (("--stages-per-host", "0", "--host", "a"), "Invalid value for '--stages-per-host'"),
        (("--placement", "random"), "Invalid value for '--placement'"),
        (("--host", "gpu1", "--gpu-node", __file__), "--host and --gpu-node do not go together"),
    ],
)
def test_bad_flags_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = run("chain", *args, "--dry-run")
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--image", "Bad Image!"), "--image 'Bad Image!' is not a valid image reference"),
        (("--image", ""), "--image '' is not a valid image reference"),
        (("--name", "-x"), "--name '-x' is not a valid container name prefix"),
        (("--gpus", "all"), f"--gpus all asks for GPUs, but {NO_DRIVER}"),
        (("--host", "gpu1,gpu1"), "--host gpu1 is named twice"),
        (("--host", "http://x"), "--host 'http://x' is neither a Docker context name nor an engine URL"),
    ],
)
def test_configuration_errors_are_exit_2_with_one_plain_message(args: tuple[str, ...], message: str) -> None:
    """One line; a usage error (a value no option takes) adds the hint line Click's own errors have."""
    result = run("chain", *args, "--dry-run")
    assert result.exit_code == 2
    assert result.output.startswith(f"pp-launch: error: {message}")
    hint = "pp-launch: hint: 'pp-launch chain --help' lists its options"
    assert result.output.strip().splitlines()[1:] in ([], [hint])


def test_dry_run_json_is_the_whole_plan_with_placeholders() -> None:
    result = run(
        "chain",
        "--stages",
        "3",
        "--dry-run",
        "--json",
        "--gpu-inventory",
        str(DATA / "pcie-2socket-4gpu.json"),
        "--env",
        "MAX_TOKENS=9",
        "--stage-env",
        "1:EXTRA=yes",
        env={"SWACTOR_DIAG_X": "1"},
    )
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert len(doc["run"]) == 12
    s0, s1, s2 = doc["stages"]
    assert s0["gpus"] == ["GPU-00000001-0000-4000-8000-00000002e668"]  # GPU 0 is busy
    assert s0["env"]["NVIDIA_VISIBLE_DEVICES"] == s0["gpus"][0]
    assert s0["device_requests"] == [
        {"Driver": "", "Count": 0, "DeviceIDs": s0["gpus"], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert s0["labels"] == {
        "pp-launch.run": doc["run"],
        "pp-launch.stage": "0",
        "pp-launch.owner": s0["labels"]["pp-launch.owner"],
        "pp-launch.gpus": s0["gpus"][0],
        "pp-launch.attempt": "1",
    }
    assert "PEER_DIRECT" not in s0["env"] and s0["env"]["SWACTOR_DIAG_X"] == "1" and s0["env"]["MAX_TOKENS"] == "9"
    assert s1["env"]["PEER_NODE_ID"] == "<from stage 0>" and s2["env"]["PEER_DIRECT"] == "<from stage 1>"
    assert s2["env"]["FIRST_PEER_DIRECT"] == "<from stage 0>"
    assert s1["env"]["EXTRA"] == "yes" and "EXTRA" not in s2["env"]
    assert [h["topology_level"] for h in doc["hops"]] == [
        50,
        10,
        50,
    ]  # 1 -> 2 -> 3 -> 1: socket 1's pair adjacent
    assert "warning" in doc  # no engine: running containers' GPUs were not checked


@pytest.mark.parametrize(
    ("attach", "requests"),
    [
        (
            "cdi",
            [
                {
                    "Driver": "cdi",
                    "Count": 0,
                    "DeviceIDs": ["nvidia.com/gpu=GPU-00000000-0000-4000-8000-000000001eef"],
                    "Capabilities": [],
                    "Options": {},
                }
            ],
        ),
        ("env", []),
    ],
)
def test_gpu_attach_modes(attach: str, requests: list[object]) -> None:
    result = run(
        "chain",
        "--stages",
        "1",
        "--dry-run",
        "--json",
        "--gpu-attach",
        attach,
        "--gpu-inventory",
        str(DATA / "plain-4gpu.json"),
    )
    stage = json.loads(result.output)["stages"][0]
    assert stage["device_requests"] == requests
    assert stage["env"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-00000000-0000-4000-8000-000000001eef"


def test_no_driver_means_cpu_stages_said_plainly() -> None:
    result = run("chain", "--dry-run", "--json")
    doc = json.loads(result.output)
    assert [s["env"]["NVIDIA_VISIBLE_DEVICES"] for s in doc["stages"]] == ["void", "void"]
    assert [s["labels"]["pp-launch.gpus"] for s in doc["stages"]] == ["", ""]
    assert doc["note"] == f"no GPU found ({NO_DRIVER}): stages run on CPU"


def test_not_enough_gpus_is_exit_2_naming_each_gpu() -> None:
    result = run("chain", "--stages", "4", "--dry-run", "--gpu-inventory", str(DATA / "pcie-2socket-4gpu.json"))
    assert result.exit_code == 2
    assert "not enough GPUs: 4 stages x 1 need 4, 3 free of 4" in result.output
    assert "busy: pid 4242 using 1024 MiB" in result.output


def test_gpus_without_a_driver_is_one_line_and_exit_0_and_says_what_it_could_not_check() -> None:
    result = run("gpus")
    assert result.exit_code == 0
    assert result.output.strip().splitlines() == [
        "pp-launch: warning: which run holds each GPU is not shown: cannot reach the Docker engine at "
        "unix:///nonexistent/docker.sock: no engine socket there (is the engine running?). Start it (or set "
        "DOCKER_HOST to the engine you mean) and check that 'docker info' works.",
        NO_DRIVER,
    ]


def test_gpus_record_without_nvml_records_nothing_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    result = run("gpus", "--record", str(out))
    assert result.exit_code == 2 and f"nothing recorded to {out}: {NO_DRIVER}" in result.output
    assert not out.exists()


def test_gpus_table_json_and_record(tmp_path: Path) -> None:
    inv = str(DATA / "pcie-2socket-4gpu.json")
    table = run("gpus", "--gpu-inventory", inv)
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["idx", "uuid", "name"]
    assert "4242(1024 MiB)" in lines[1] and "1536/46068" in lines[1]
    assert lines[-1] == "driver 580.159.03, CUDA 13.0"
    as_json = json.loads(run("gpus", "--json", "--gpu-inventory", inv).stdout)
    assert as_json.pop("held_by") is None  # no engine answered: not known (an engine's holders: integration)
    assert [g.pop("health") for g in as_json["gpus"]] == ["unknown"] * 4  # the file says nothing of their health
    assert as_json == json.loads(Path(inv).read_text())
    out = tmp_path / "rec.json"
    assert run("gpus", "--gpu-inventory", inv, "--record", str(out)).exit_code == 0
    assert json.loads(out.read_text()) == as_json


def test_seed_options_reach_every_stage_and_come_from_the_environment() -> None:
    seed = "AB" * 32
    env = {"SEED_ADDR": seed, "SEED_DIRECT": "10.0.0.1:4000", "SEED_RELAY": "https://relay.example:443/"}
    args = ("--dry-run", "--json", "--gpus", "none", "--stages", "3", "--entrypoint", "/usr/local/bin/pp-worker")
    result = run("chain", *args, env=env)
    assert result.exit_code == 0, result.output
    for stage in json.loads(result.output)["stages"]:
        assert stage["env"]["SEED_ADDR"] == seed.lower()
        assert stage["env"]["SEED_DIRECT"] == "10.0.0.1:4000"
        assert stage["env"]["SEED_RELAY"] == "https://relay.example:443/"
        assert stage["entrypoint"] == ["/usr/local/bin/pp-worker"]


def test_the_worker_check_image_name_is_checked_before_the_engine_is_asked() -> None:
    result = run("worker", "check", "")
    assert result.exit_code == 2
    assert result.output.startswith("pp-launch: error: IMAGE '' is not a valid image reference")


def _plan_gpus(*args: str) -> list[list[str]]:
    result = run("chain", "--dry-run", "--json", "--gpu-inventory", str(DATA / "plain-4gpu.json"), *args)
    assert result.exit_code == 0, result.output
    return [s["gpus"] for s in json.loads(result.output)["stages"]]


def test_gpus_n_is_a_count_per_stage_as_in_docker_run() -> None:
    uuids = [g["uuid"] for g in json.loads((DATA / "plain-4gpu.json").read_text())["gpus"]]
    plan = _plan_gpus("--stages", "2", "--gpus", "2")
    assert [len(g) for g in plan] == [2, 2] and len({u for g in plan for u in g}) == 4
    assert _plan_gpus("--stages", "1", "--gpus", "3,") == [[uuids[3]]]  # a list with a comma: indices
    assert _plan_gpus("--stages", "2", "--gpus", "device=0,2") == [[uuids[0]], [uuids[2]]]
    assert _plan_gpus("--stages", "1", "--gpus", uuids[1]) == [[uuids[1]]]  # a UUID needs no comma


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3", "pp-launch: error: not enough GPUs: 2 stages x 3 need 6, 4 free of 4"),
        ("0", "pp-launch: error: --gpus 0 asks for no GPU: use --gpus none"),
        ("three", "pp-launch: error: --gpus 'three' is not understood"),
    ],
)
def test_bad_gpu_counts_are_exit_2_with_the_reason(value: str, message: str) -> None:
    inventory = str(DATA / "plain-4gpu.json")
    result = run("chain", "--dry-run", "--stages", "2", "--gpu-inventory", inventory, "--gpus", value)
    assert result.exit_code == 2
    assert result.output.startswith(message), result.output


@pytest.mark.parametrize(
    "args", [("-q", "chain"), ("chain", "-q"), ("chain", "--verbose", "--verbose"), ("-v", "chain", "--verbose")]
)
def test_verbosity_flags_work_before_and_after_the_command(args: tuple[str, ...]) -> None:
    assert run(*args, "--dry-run", "--gpus", "none").exit_code == 0


def test_quiet_json_has_no_stage_lines_and_vv_shows_state_changes() -> None:
    import io

    from pp_launch.cli.report import JsonReporter, PlainReporter
    from pp_launch.core import events

    out, err = io.StringIO(), io.StringIO()
    quiet = JsonReporter("r", out=out, err=err, verbosity=-1)
    quiet.stage_line(0, "stdout", "hello")
    quiet.event(events.ChainStarting(stages=2, image="i"))
    assert err.getvalue() == "" and '"event":"chain_starting"' in out.getvalue()
    for verbosity, shown in ((1, False), (2, True)):
        err = io.StringIO()
        PlainReporter("r", verbosity, out=io.StringIO(), err=err).stage_state(1, events.StageState.STOPPING, "SIGKILL")
        assert ("stage 1: stopping (SIGKILL)" in err.getvalue()) is shown


@pytest.mark.parametrize(
    "args",
    [
        ("gpus", "--json", "--gpu-inventory", str(DATA / "nvlink-8gpu.json")),
        ("chain", "--dry-run", "--json", "--gpus", "none", "--stages", "3"),
    ],
)
def test_every_json_output_is_json_lines(args: tuple[str, ...]) -> None:
    """docs/formats.md: one JSON object per line on stdout, nothing else there."""
    result = CliRunner().invoke(main, list(args), env=NO_ENGINE, catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('{"gpus": [{"index": 0}]}', "gpus[0] lacks the field 'uuid' (docs/formats.md)"),
        ('{"gpus": [{"index": "x", "uuid": "GPU-1"}]}', "gpus[0] is not a GPU entry"),
        ("[1, 2]", "is not a GPU inventory: expected an object with a list 'gpus'"),
        ("{oops", "is not JSON"),
    ],
)
def test_a_bad_inventory_file_says_what_is_wrong(doc: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "inv.json"
    path.write_text(doc)
    result = run("gpus", "--gpu-inventory", str(path))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_the_packaged_example_inventories_are_named_example_name_and_an_unknown_one_lists_them() -> None:
    """What the docs' first commands read from a wheel too (no checkout's tests/data)."""
    result = run("chain", "--dry-run", "--gpus", "auto", "--stages", "2", "--gpu-inventory", "example:nvlink-8gpu")
    assert result.exit_code == 0 and "GPU-00000000-" in result.output, result.output
    result = run("gpus", "--gpu-inventory", "example:nvlink8")
    assert result.exit_code == 2 and "no example GPU inventory 'nvlink8'" in result.output
    assert "example:nvlink-8gpu" in result.output and "example:mig-2gpu" in result.output


def test_gpus_without_a_driver_suggests_cpu_stages() -> None:
    result = run("chain", "--dry-run", "--gpus", "2")
    assert result.exit_code == 2
    assert "use --gpus none for CPU stages" in result.output


def test_an_unreachable_engine_is_named_with_docker_host_and_no_requests_repr() -> None:
    result = run("ps")
    assert result.exit_code == 2
    assert result.output == (
        "pp-launch: error: cannot reach the Docker engine at unix:///nonexistent/docker.sock: no engine socket there "
        "(is the engine running?). Start it (or set DOCKER_HOST to the engine you mean) and check that 'docker info' "
        "works.\n"
    )


def test_gpus_shows_mig_slices_with_their_processes() -> None:
    out = run("gpus", "--gpu-inventory", str(DATA / "mig-2gpu.json")).output
    slice_1 = next(line for line in out.splitlines() if line.startswith("0/1 "))
    assert "MIG-aaaaaaaa-0000-4000-8000-000000000002" in slice_1 and "777(2000 MiB)" in slice_1


def test_gpus_topo_is_a_matrix_with_a_legend() -> None:
    out = run("gpus", "--topo", "--gpu-inventory", str(DATA / "pcie-2socket-4gpu.json")).output
    assert "GPU1  PIX   X     SYS   SYS" in out and "SYS  = across sockets" in out
    nvlink = run("gpus", "--topo", "--gpu-inventory", str(DATA / "nvlink-8gpu.json")).output
    assert "NV" in nvlink.split("GPU0", 2)[2].splitlines()[0]


def test_the_dry_run_names_gpus_by_index_and_uuid_and_hops_in_words() -> None:
    out = run("chain", "--dry-run", "--stages", "2", "--gpu-inventory", str(DATA / "nvlink-8gpu.json")).output
    assert "GPUs GPU 0 GPU-" in out and "GPUs GPU 1 GPU-" in out
    assert "hop 0 -> 1: NVLink, 2 links" in out and "level" not in out


# ---------------------------------------------------------------- chain file and PP_LAUNCH_* defaults
def test_a_chain_file_sets_defaults_and_flags_override_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "chain.toml"
    f.write_text('stages = 4\ngrace = 3\ngpus = "none"\n[env]\nA = "1"\n[stage_env.2]\nB = "2"\n')
    doc = json.loads(run("chain", "-f", str(f), "--stages", "3", "--dry-run", "--json").output)
    assert len(doc["stages"]) == 3 and doc["grace"] == 3.0
    envs = [s["env"] for s in doc["stages"]]
    assert envs[0]["A"] == "1" and envs[2]["B"] == "2" and "B" not in envs[1]


def test_the_example_chain_file_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "chain.toml"
    result = run("chain", "-f", str(example), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["stages"]) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stagez = 2\n", "line 1: stagez: unknown key"),
        ("stages = \n", "is not TOML"),
        ("env = 3\n", "env must be a table"),
    ],
)
def test_a_bad_chain_file_is_exit_2_naming_the_problem(tmp_path, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "chain.toml"
    f.write_text(text)
    result = run("chain", "-f", str(f), "--dry-run")
    assert result.exit_code == 2 and message in result.output


def test_pp_launch_environment_variables_set_option_defaults(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PP_LAUNCH_CHAIN_GRACE", "2")
    monkeypatch.setenv("PP_LAUNCH_CHAIN_STAGES", "3")
    doc = json.loads(run("chain", "--gpus", "none", "--dry-run", "--json").output)
    assert doc["grace"] == 2.0 and len(doc["stages"]) == 3


@pytest.mark.parametrize(
    ("values", "plain", "per_host"),
    [
        (("inv.json",), "inv.json", ()),
        (("gpu2=b.json", "a.json"), "a.json", (("gpu2", "b.json"),)),
        (("unix:///run/d.sock=/tmp/x.json",), None, (("unix:///run/d.sock", "/tmp/x.json"),)),
        (("ssh://root@h:22=x.json", "gpu3=y.json"), None, (("ssh://root@h:22", "x.json"), ("gpu3", "y.json"))),
        (("dir/with=sign.json",), "dir/with=sign.json", ()),
    ],
)
def test_gpu_inventory_takes_a_file_or_host_equals_file(
    values: tuple[str, ...], plain: str | None, per_host: tuple[tuple[str, str], ...]
) -> None:
    from pp_launch.cli.options import split_inventories

    assert split_inventories(values) == (plain, per_host)


@pytest.mark.parametrize(
    ("env", "announced"),
    [
        ({}, "127.0.0.1"),
        ({"STUB_BIND": "0.0.0.0"}, "127.0.0.1"),
        ({"STUB_BIND": "0.0.0.0", "STUB_ADVERTISE": "10.1.2.3"}, "10.1.2.3"),
        ({"STUB_BIND": "127.0.0.2"}, "127.0.0.2"),
    ],
)
def test_the_stub_announces_the_address_it_is_told_for_other_hosts(env: dict[str, str], announced: str) -> None:
    """Across hosts a stage binds beyond loopback and announces an address its peers reach."""
    import subprocess
    import sys

    stub = Path(__file__).resolve().parents[2] / "images" / "stub-worker"
    got = subprocess.run(
        [sys.executable, "-c", "import pp_stub; print(pp_stub.advertised())"],
        cwd=stub,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert got.stdout.strip() == announced


def test_the_command_list_is_the_same_before_and_after_the_commands_are_imported() -> None:
    """`pp-launch --help` lists the commands from main.COMMANDS without importing them (fast start);
    each line must be what the command's own docstring gives once it is imported."""
    cold = subprocess.run(
        [sys.executable, "-c", "from pp_launch.cli.main import main; main(['--help'], prog_name='pp-launch')"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "110"},
        check=False,
    )
    assert cold.returncode == 0, cold.stderr
    warm = CliRunner().invoke(main, ["--help"], prog_name="pp-launch", terminal_width=110)
    assert cold.stdout == warm.output
    assert set(main.list_commands(click.Context(main))) == set(main.commands)
    assert all(main.commands[name].short_help == line for name, (_, line) in COMMANDS.items())
    for name, (module, _) in COMMANDS.items():  # the module named is the one that defines it (else: no such command)
        assert main.commands[name].callback.__module__ == f"pp_launch.cli.{module}", name  # type: ignore[union-attr]


def test_version_and_help_import_neither_docker_nor_rich() -> None:
    code = (
        "import sys\nfrom pp_launch.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('docker', 'rich', 'pynvml', 'requests') if m in sys.modules)\n"
        "print('heavy:', *heavy, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Commands:" in done.stdout
    assert done.stderr.strip() == "heavy:", done.stderr


@pytest.mark.parametrize("path", [p for p in all_commands(main) if p and p[0] != "node"], ids=" ".join)
def test_every_usage_error_is_one_line_and_a_hint_exit_2(path: tuple[str, ...]) -> None:
    result = run(*path, "--no-such-flag")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("pp-launch: error: No such option") and "--no-such-flag" in lines[0], lines
    assert lines[1:] == [f"pp-launch: hint: 'pp-launch {' '.join(path)} --help' lists its options"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("chain", "--stages", "0"), "Invalid value for '--stages'"),
        (("chian",), "no command 'chian'; did you mean 'pp-launch chain'?"),
    ],
)
def test_click_and_our_own_errors_look_alike(args: tuple[str, ...], words: str) -> None:
    result = run(*args)
    assert result.exit_code == 2 and result.output.startswith(f"pp-launch: error: {words}")
    assert "Usage:" not in result.output


def test_a_bare_env_name_passes_the_callers_value_through_as_docker_does() -> None:
    result = run(
        "chain",
        "--stages",
        "1",
        "-e",
        "FOO",
        "-e",
        "UNSET_PP_X",
        "-e",
        "A=1",
        "--gpus",
        "none",
        "--dry-run",
        "--json",
        env={"FOO": "bar", "UNSET_PP_X": None},
    )  # type: ignore[dict-item]
    assert result.exit_code == 0, result.output
    env = json.loads(result.output)["stages"][0]["env"]
    assert env["FOO"] == "bar" and env["A"] == "1" and "UNSET_PP_X" not in env


def test_docker_context_is_honoured_as_the_docker_cli_does(tmp_path: Path) -> None:
    """DOCKER_CONTEXT names the engine when DOCKER_HOST is not set (it used to be ignored: the default engine
    was listed while docker itself failed)."""
    env = {"DOCKER_HOST": None, "DOCKER_CONTEXT": "bogus", "DOCKER_CONFIG": str(tmp_path)}
    result = run("ps", env=env)  # type: ignore[arg-type]
    assert result.exit_code == 2
    assert result.output.startswith("pp-launch: error: DOCKER_CONTEXT=bogus: no Docker context of that name")


def test_one_stage_with_a_list_of_two_gets_both_as_docker_gives_its_container(tmp_path: Path) -> None:
    inv = str(DATA / "nvlink-8gpu.json")
    result = run("chain", "--stages", "1", "--gpus", "device=0,2", "--dry-run", "--json", "--gpu-inventory", inv)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["stages"][0]["gpus"]) == 2


def test_a_list_that_does_not_fit_the_stages_says_how_to_fix_it() -> None:
    inv = str(DATA / "nvlink-8gpu.json")
    result = run("chain", "--stages", "2", "--gpus", "device=0,2,3", "--dry-run", "--gpu-inventory", inv)
    assert result.exit_code == 2
    assert "--gpus lists 3 GPUs but 2 stages x 1 need 2: list 2 (2 stages x 1 GPU each)" in result.output
    result = run(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "device=0,2,3,4",
        "--gpus-per-stage",
        "1",
        "--stages",
        "1",
        "--dry-run",
        "--gpu-inventory",
        inv,
    )
    assert result.exit_code == 0  # one stage takes all four


def test_chain_file_keys_are_the_flags_and_a_typo_gets_a_suggestion(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text('stages = 2\nnmae = "x"\n')
    result = run("chain", "-f", str(bad), "--dry-run")
    assert result.exit_code == 2
    assert "line 2: nmae: unknown key (did you mean 'name'?)" in result.output
    assert "name_prefix" not in result.output and "host_names" not in result.output and " host," in result.output
    good = tmp_path / "g.toml"
    good.write_text('stages = 3\nname = "mine"\ngpus = "none"\n[stage-env.1]\nA = "1"\n')
    result = run("chain", "-f", str(good), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["name"] for s in doc["stages"]] == ["mine-0", "mine-1", "mine-2"] and doc["stages"][1]["env"]["A"] == "1"


@pytest.mark.parametrize("command", ["ps", "logs", "wait", "down", "gc"])
def test_the_housekeeping_host_help_is_their_own_not_the_chains(command: str) -> None:
    text = " ".join(run(command, "--help").output.split())
    assert "Look at these Docker engines instead" in text and "ring order" not in text


def test_ps_help_suggests_nothing_that_stops_other_users_runs() -> None:
    assert "xargs" not in run("ps", "--help").output


def test_the_dry_run_draws_the_ring_over_the_topology() -> None:
    inv = str(DATA / "nvlink-8gpu.json")
    result = run("chain", "--stages", "3", "--dry-run", "--gpus-per-stage", "2", "--gpu-inventory", inv)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    top = next(line for line in lines if line.strip().startswith("┌>"))
    bottom = lines[lines.index(top) + 1]
    assert "[0: GPU 0,GPU 1]" in top and "[2: " in top and top.rstrip().endswith("┐")
    assert bottom.strip().startswith("└") and bottom.rstrip().endswith("┘") and len(bottom) == len(top)
    assert "══" in top  # NVLink between the stages of this machine


def test_gpus_watch_draws_bars_and_holders_frame_by_frame() -> None:
    inv = str(DATA / "pcie-2socket-4gpu.json")
    result = run("gpus", "--watch", "--frames", "2", "--interval", "0.1", "--gpu-inventory", inv)
    assert result.exit_code == 0, result.output
    assert "pp-launch gpus --watch" in result.stdout and "░" in result.stdout and "1536/46068" in result.stdout
    refused = run("gpus", "--watch", "--json")
    assert refused.exit_code == 2 and "--watch shows this machine's GPUs" in refused.output


@pytest.mark.parametrize(
    "args", [("chain", "--gpus", "foo", "--dry-run"), ("chain", "--handoff", "stdin", "--bring-up", "in-turn")]
)
def test_our_own_usage_errors_carry_the_same_hint_as_clicks(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("pp-launch: error: ") and lines[1:] == [
        "pp-launch: hint: 'pp-launch chain --help' lists its options"
    ]


def test_env_file_as_docker_reads_it_and_env_wins_over_it(tmp_path: Path) -> None:
    env_file = tmp_path / "stage.env"
    env_file.write_text('# the model\nMODEL=llama 3  \n\n  MAX_TOKENS=5\nQUOTED="kept as is"\nFROM_SHELL\nUNSET_HERE\n')
    result = run(
        "chain",
        "--stages",
        "2",
        "--gpus",
        "none",
        "--dry-run",
        "--json",
        "--env-file",
        str(env_file),
        "--env",
        "MAX_TOKENS=9",
        env={"FROM_SHELL": "shell value"},
    )
    assert result.exit_code == 0, result.output
    env = json.loads(result.output)["stages"][1]["env"]
    assert env["MODEL"] == "llama 3  " and env["QUOTED"] == '"kept as is"' and env["FROM_SHELL"] == "shell value"
    assert env["MAX_TOKENS"] == "9" and "UNSET_HERE" not in env


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"GOOD=1\nBAD NAME=2\n", "stage.env, line 2: 'BAD NAME=2' is not NAME=VALUE"),
        (b"A=1\n\xff\n", "stage.env, line 2: not UTF-8 text"),
        (b"NUM_STAGES=3\n", "stage.env, line 1: NUM_STAGES is set by pp-launch itself"),
        (b"X" * (1 << 20) + b"=1\n", "larger than 1 MiB: not an env file"),
    ],
)
def test_a_bad_env_file_is_a_usage_error_naming_file_and_line(tmp_path: Path, content: bytes, said: str) -> None:
    env_file = tmp_path / "stage.env"
    env_file.write_bytes(content)
    result = run("chain", "--stages", "2", "--gpus", "none", "--dry-run", "--env-file", str(env_file))
    assert result.exit_code == 2 and said in result.output, result.output
    missing = run("chain", "--dry-run", "--env-file", str(tmp_path / "absent.env"))
    assert missing.exit_code == 2 and "absent.env: No such file or directory" in missing.output


def test_pp_gpu_node_takes_leading_env_files_and_leaves_the_command_alone(tmp_path: Path) -> None:
    from pp_launch.cli.node_cmd import _env_files

    (tmp_path / "a.env").write_text("A=1\n")
    (tmp_path / "b.env").write_text("B=2\n")
    a, b = str(tmp_path / "a.env"), str(tmp_path / "b.env")
    assert _env_files(("--env-file", a, f"--env-file={b}", "python", "-m", "w")) == (
        (("A", "1"), ("B", "2")),
        ("python", "-m", "w"),
    )
    assert _env_files(("python", "--env-file", a)) == ((), ("python", "--env-file", a))  # the command's own
    assert _env_files(("--env-file", a, "--", "--env-file", b)) == ((("A", "1"),), ("--env-file", b))


def test_global_host_and_context_as_docker_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pp-launch -H URL CMD` and `--context NAME`: the engine every command of that call talks to; both at once
    is a usage error."""
    monkeypatch.setenv("DOCKER_CONTEXT", "")  # the flags set it in this process: recorded first, so that the
    monkeypatch.delenv("DOCKER_CONTEXT")  # undo puts back what was there (nothing), not what the flag set
    monkeypatch.setenv("DOCKER_HOST", os.environ.get("DOCKER_HOST", "unix:///nonexistent/docker.sock"))
    via_host = run("-H", "unix:///nonexistent/other.sock", "ps")
    assert via_host.exit_code == 2 and "/nonexistent/other.sock" in via_host.output, via_host.output
    via_context = run("--context", "no-such-context", "ps", env={"DOCKER_CONFIG": "/nonexistent"})
    assert via_context.exit_code == 2 and "no-such-context" in via_context.output, via_context.output
    both = run("-H", "unix:///x.sock", "--context", "c", "ps")
    assert both.exit_code == 2 and "do not go together" in both.output


def test_gpus_shows_temperature_power_and_who_runs_each_process(tmp_path: Path) -> None:
    doc = json.loads((DATA / "plain-4gpu.json").read_text())
    alice = {"pid": 77, "used_memory_mib": 300, "user": "alice", "command": "python serve.py"}
    doc["gpus"][0].update(temperature_c=41, power_w=123.4, power_limit_w=700, processes=[alice])
    doc["gpus"][1].pop("temperature_c", None)
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(doc))
    out = run("gpus", "--gpu-inventory", str(path)).output
    row0 = next(line for line in out.splitlines() if line.startswith("0 "))
    row1 = next(line for line in out.splitlines() if line.startswith("1 "))
    assert "temp power" in out and "41C 123/700W" in row0 and "77(300 MiB) alice:python serve.py" in row0
    assert "? ?W" in row1  # unknown, never 0
    again = json.loads(run("gpus", "--gpu-inventory", str(path), "--json").stdout)["gpus"][0]
    assert (again["temperature_c"], again["power_w"], again["processes"][0]["user"]) == (41, 123.4, "alice")


def test_a_chain_file_nested_thousands_deep_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("stages = " + "[" * 5000 + "2" + "]" * 5000 + "\n")
    result = run("chain", "-f", str(deep), "--dry-run")
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == (
        f"pp-launch: error: chain file {deep} nests its tables or arrays too deeply: not a chain file"
    )


def test_an_env_file_value_with_a_nul_byte_is_refused_by_the_dry_run_as_the_run_would_be(tmp_path: Path) -> None:
    env_file = tmp_path / "stage.env"
    env_file.write_bytes(b"GOOD=1\nBAD=x\0y\n")
    for args in (("--dry-run",), ("--dry-run", "--json")):
        result = run("chain", "--gpus", "none", "--env-file", str(env_file), *args)
        assert result.exit_code == 2
        assert "line 2: BAD's value holds a NUL byte, which no environment can carry" in result.output
    assert run("chain", "--gpus", "none", "-e", "BAD=x\0y", "--dry-run").exit_code == 2


@pytest.mark.parametrize(
    ("typed", "meant"), [("chian", "chain"), ("stop", "down"), ("rm", "down"), ("run", "chain"), ("ls", "ps")]
)
def test_an_unknown_command_says_which_was_meant(typed: str, meant: str) -> None:
    result = run(typed)
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == f"pp-launch: error: no command {typed!r}; did you mean 'pp-launch {meant}'?"


def test_compose_takes_no_verbosity_flags_and_chain_takes_verbose_but_v_is_volume() -> None:
    assert run("compose", "-q").exit_code == 2
    assert run("chain", "--verbose", "--dry-run", "--gpus", "none").exit_code == 0
    assert "Invalid value for '-v' / '--volume'" in run("chain", "-v", "--dry-run").output


def test_chain_vv_says_v_is_volume_here_and_how_to_say_more() -> None:
    """`-vv` says more on every other command; on chain, -v is docker run's --volume: the error says so and names
    the flags that say more, and --help does not offer -vv there."""
    said = " ".join(run("chain", "-vv", "--dry-run", "--gpus", "none").output.split())
    assert "-v after 'chain' is docker run's --volume (it took 'v' as its value): to say more, use --verbose" in said
    said = " ".join(run("chain", "-v", "--stages", "2", "--dry-run").output.split())  # -v took the next flag
    assert "-v after 'chain' is docker run's --volume (it took '--stages' as its value)" in said, said
    assert "docker run's --volume" not in run("chain", "-v", "x", "--dry-run").output  # a real mistake of a path
    assert "docker run's --volume" not in run("compose", "-vv").output  # compose says no more or less
    assert "-vv:" not in run("chain", "--help").output and "-vv:" in run("ps", "--help").output
    assert run("-vv", "chain", "--dry-run", "--gpus", "none").exit_code == 0
