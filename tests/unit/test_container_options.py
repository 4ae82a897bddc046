"""docker run's options for a stage (core/container.py): docker's syntax read as docker reads it, what is refused
and why, the Engine API's JSON, {stage} per stage, the caches; and the same through `pp-launch chain` and
`pp-launch compose` (exit 2 in one line naming the flag, a dry run that shows every mount). No Docker needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pp_launch.cli.main import load_all, main
from pp_launch.core import container as c
from pp_launch.core.chain.plan import ChainRequest, build_plan

load_all()
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "PP_LAUNCH_GPU_INVENTORY": ""}


def run(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), env={**NO_ENGINE, **(env or {})}, catch_exceptions=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/models/x:/weights:ro", c.MountSpec("bind", "/weights", "/models/x", read_only=True)),
        ("/models/x/:/weights/", c.MountSpec("bind", "/weights", "/models/x")),
        ("/m/stage-{stage}:/w:rw", c.MountSpec("bind", "/w", "/m/stage-{stage}")),
        ("/m:/w:ro,rslave", c.MountSpec("bind", "/w", "/m", read_only=True, propagation="rslave")),
        ("/m:/w:Z", c.MountSpec("bind", "/w", "/m", selinux="Z")),
        ("hf-cache:/root/.cache/huggingface", c.MountSpec("volume", "/root/.cache/huggingface", "hf-cache")),
        ("hf-cache:/c:ro,nocopy", c.MountSpec("volume", "/c", "hf-cache", read_only=True, nocopy=True)),
        ("/scratch", c.MountSpec("volume", "/scratch")),
    ],
)
def test_a_volume_is_read_as_docker_run_v_reads_it(text: str, expected: c.MountSpec) -> None:
    assert c.parse_volume(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("models:weights", "must be absolute"),
        ("./models:/w", "is a relative host path; give it absolute"),
        ("~/models:/w", "is a relative host path"),
        ("/m:/w:rx", "unknown option 'rx'"),
        ("/m:/w:ro,rw", "give ro or rw once"),
        ("/a:/b:ro:x", "too many ':'"),
        (":/w", "the source before ':' is empty"),
        ("bad name!:/w", "neither an absolute host path nor a volume name"),
        ("vol:/w:rslave", "applies to a host path, not to the volume vol"),
        ("/m:/w-{stage}", "{stage} goes in the host path"),
        ("", "give SRC:DST"),
        ("/m\0:/w", "give SRC:DST"),
    ],
)
def test_a_volume_docker_would_refuse_is_refused_saying_what_to_write(text: str, why: str) -> None:
    with pytest.raises(c.OptionError, match="--volume") as caught:
        c.parse_volume(text)
    assert why in str(caught.value)


def test_mounts_are_read_as_docker_run_mount_reads_them() -> None:
    bind = c.parse_mount("type=bind,source=/m/{stage},target=/w,readonly,bind-propagation=rshared")
    assert bind == c.MountSpec("bind", "/w", "/m/{stage}", read_only=True, propagation="rshared", flag="--mount")
    assert c.parse_mount("src=hf,dst=/c,volume-nocopy=true").engine_json() == {
        "Type": "volume",
        "Target": "/c",
        "ReadOnly": False,
        "Source": "hf",
        "VolumeOptions": {"NoCopy": True},
    }
    tmpfs = c.parse_mount("type=tmpfs,destination=/scratch,tmpfs-size=64m,tmpfs-mode=1770")
    assert tmpfs.engine_json()["TmpfsOptions"] == {"SizeBytes": 64 << 20, "Mode": 0o1770}
    for text, why in (
        ("type=nfs,dst=/x", "use bind, volume or tmpfs"),
        ("type=bind,src=rel,dst=/x", "absolute host path"),
        ("type=tmpfs,src=/a,dst=/x", "a tmpfs has no source"),
        ("type=volume,dst=/x,bind-propagation=shared", "bind-propagation does not apply to type=volume"),
        ("type=bind,src=/a,dst=/x,colour=red", "unknown key 'colour'"),
        ("type=bind,src=/a,dst=/x,readonly=maybe", "'maybe' is not true or false"),
        ("type=bind,src=/a,src=/b,dst=/x", "src is given twice"),
        ("type=tmpfs,dst=/x,tmpfs-mode=999", "give an octal mode"),
    ):
        with pytest.raises(c.OptionError, match="--mount") as caught:
            c.parse_mount(text)
        assert why in str(caught.value), text


@pytest.mark.parametrize(
    ("text", "size"),
    [("64m", 64 << 20), ("1g", 1 << 30), ("2GiB", 2 << 30), ("512", 512), ("1.5g", 3 << 29), ("16GB", 16 << 30)],
)
def test_sizes_are_docker_sizes(text: str, size: int) -> None:
    assert c.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "big", "-1g", "1x", "0", "1٣g"])
def test_a_size_docker_would_refuse_is_refused(text: str) -> None:
    with pytest.raises(c.OptionError, match="--shm-size"):
        c.parse_size(text)


def test_the_other_options_are_read_as_docker_reads_them() -> None:
    assert c.parse_ulimit("memlock=-1") == c.Ulimit("memlock", -1, -1)
    assert c.parse_ulimit("nofile=1024:65536") == c.Ulimit("nofile", 1024, 65536)
    assert c.parse_device("/dev/infiniband/uverbs0") == c.Device("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0")
    assert c.parse_device("/dev/null:r") == c.Device("/dev/null", "/dev/null", "r")
    assert c.parse_device("/dev/null:/dev/x:rw") == c.Device("/dev/null", "/dev/x", "rw")
    assert c.parse_cap("cap_ipc_lock") == "IPC_LOCK" and c.parse_cap("ALL") == "ALL"
    assert c.parse_ipc("host") == "host" and c.parse_ipc("container:abc") == "container:abc"
    assert c.parse_user("1000:1000") == "1000:1000" and c.parse_workdir("/work") == "/work"
    for parse, text, why in (
        (c.parse_ulimit, "nofile=9:1", "must not exceed the hard one"),
        (c.parse_ulimit, "coffee=1", "NAME one of"),
        (c.parse_ulimit, "nofile=a", "whole numbers"),
        (c.parse_device, "dev/null", "absolute path"),
        (c.parse_device, "/dev/null:/x:rwx", "letters of rwm"),
        (c.parse_cap, "ipc lock", "a capability"),
        (c.parse_ipc, "public", "use host, private"),
        (c.parse_user, "a b", "UID[:GID]"),
        (c.parse_workdir, "work", "absolute path"),
        (c.parse_label, "pp-launch.run=abc", "pp-launch's own"),
        (c.parse_label, "=x", "KEY=VALUE"),
    ):
        with pytest.raises(c.OptionError) as caught:
            parse(text)
        assert why in str(caught.value), (text, str(caught.value))


def test_each_stage_gets_its_own_paths_and_its_own_volumes() -> None:
    options = c.ContainerOptions.parse(
        3, volumes=["/models/m/stage-{stage}:/w:ro"], stage_volumes=["2:/extra:/extra"], shm_size="2g"
    )
    for k in range(3):
        mine = options.for_stage(k)
        assert mine.mounts[0].source == f"/models/m/stage-{k}" and mine.shm_size == 2 << 30
        assert [m.source for m in mine.mounts[1:]] == (["/extra"] if k == 2 else [])
    with pytest.raises(c.OptionError, match="stage 3 does not exist"):
        c.ContainerOptions.parse(3, stage_volumes=["3:/a:/b"])


def test_the_engine_gets_docker_runs_own_json_and_a_bind_never_as_a_v_string() -> None:
    options = c.ContainerOptions.parse(
        1,
        volumes=["/m:/w:ro", "/z:/zz:z"],
        shm_size="1g",
        ipc="host",
        ulimits=["memlock=-1"],
        devices=["/dev/null:/dev/x:r"],
        cap_add=["IPC_LOCK"],
        user="1000",
        workdir="/w",
        labels={"team": "llm"},
    )
    host = options.host_config()
    assert host["Mounts"] == [{"Type": "bind", "Target": "/w", "ReadOnly": True, "Source": "/m", "BindOptions": {}}]
    assert host["Binds"] == ["/z:/zz:rw,z"]  # an SELinux relabel exists only in a -v string
    assert host["ShmSize"] == 1 << 30 and host["IpcMode"] == "host" and host["CapAdd"] == ["IPC_LOCK"]
    assert host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert host["Devices"] == [{"PathOnHost": "/dev/null", "PathInContainer": "/dev/x", "CgroupPermissions": "r"}]
    assert options.config() == {"User": "1000", "WorkingDir": "/w"}
    assert options.labels == (("team", "llm"),)


def test_the_caches_are_pp_gpu_nodes_own_per_stage_and_only_named_ones_on_a_remote_engine() -> None:
    mounts, env = c.cache_mounts({}, 3, "/home/u")
    assert mounts == (c.MountSpec("bind", c.CACHE_MOUNT, "/home/u/.cache/tinygrad/stage-3", ensure=True,
                                  flag="PP_CACHE_DIR"),)  # fmt: skip
    assert env == {}
    named = {"PP_CACHE_DIR": "/c", "PP_MODEL_CACHE_DIR": "/m"}
    mounts, env = c.cache_mounts(named, 0, "/home/u")
    assert [(m.source, m.target) for m in mounts] == [
        ("/c/stage-0", c.CACHE_MOUNT),
        ("/m/stage-0", c.MODEL_CACHE_MOUNT),
    ]
    assert env == {"PP_MODEL_CACHE_DIR": c.MODEL_CACHE_MOUNT}
    assert c.cache_mounts({}, 0, "/home/u", creatable=False) == ((), {})
    remote, _ = c.cache_mounts(named, 1, "/home/u", creatable=False)
    assert [m.source for m in remote] == ["/c/stage-1", "/m/stage-1"] and not any(m.ensure for m in remote)


def test_a_plan_gives_every_stage_its_options_and_the_caches() -> None:
    request = ChainRequest(stages=2, container=c.ContainerOptions.parse(2, volumes=["/m/{stage}:/w:ro"]))
    plan = build_plan(request, {"HOME": "/home/u"}, "me", [(), ()], [(), ()], "r" * 12)
    assert [[m.source for m in s.options.mounts] for s in plan.stages] == [
        ["/m/0", "/home/u/.cache/tinygrad/stage-0"],
        ["/m/1", "/home/u/.cache/tinygrad/stage-1"],
    ]
    doc = plan.to_json()["stages"][1]
    assert doc["mounts"][0] == {"type": "bind", "source": "/m/1", "target": "/w", "read_only": True}
    remote = build_plan(request, {"HOME": "/home/u"}, "me", [(), ()], [(), ()], "r" * 12, remote_hosts=frozenset({""}))
    assert [len(s.options.mounts) for s in remote.stages] == [1, 1]  # no default cache on an engine over the network


def test_a_chain_mounts_only_the_caches_its_user_asked_for() -> None:
    """A chain's default ("asked"): no cache unless the environment names one; one named is made first, as you."""
    request = ChainRequest(stages=2, caches="asked")
    plan = build_plan(request, {"HOME": "/home/u"}, "me", [(), ()], [(), ()], "r" * 12)
    assert [s.options.mounts for s in plan.stages] == [(), ()] and "PP_MODEL_CACHE_DIR" not in plan.stages[0].env
    named = build_plan(request, {"HOME": "/home/u", "PP_CACHE_DIR": "/c"}, "me", [(), ()], [(), ()], "r" * 12)
    assert [[(m.source, m.ensure) for m in s.options.mounts] for s in named.stages] == [
        [("/c/stage-0", True)],
        [("/c/stage-1", True)],
    ]


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("-v", "models:w"), "pp-launch: error: Invalid value for '-v' / '--volume': --volume 'models:w'"),
        (("--shm-size", "lots"), "--shm-size 'lots': give a size such as 64m"),
        (
            ("--rm",),
            "pp-launch: error: --rm: every stage is removed by the engine when it ends (daemon-side auto-remove)",
        ),
        (("--init",), "--init: every stage runs under tini as init already"),
        (("-it",), "a stage's stdin is pp-launch's lifeline"),
        (("--label", "pp-launch.owner=me"), "labels under pp-launch. are pp-launch's own"),
        (("--stage-volume", "7:/a:/b"), "--stage-volume '7:/a:/b': stage 7 does not exist (--stages 2)"),
        (("--ipc", "public"), "--ipc 'public': use host"),
    ],
)
def test_chain_refuses_what_docker_would_in_one_line_naming_the_flag(args: tuple[str, ...], line: str) -> None:
    result = run("chain", "--dry-run", "--gpus", "none", *args)
    assert result.exit_code == 2, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("pp-launch: error:") and line in first, result.output


def test_a_missing_host_path_is_exit_2_before_anything_with_the_mkdir_to_run(tmp_path: Path) -> None:
    there = tmp_path / "stage-0"
    there.mkdir()
    result = run("chain", "--dry-run", "--gpus", "none", "-v", f"{tmp_path}/stage-{{stage}}:/w:ro")
    assert result.exit_code == 2
    missing = tmp_path / "stage-1"
    assert result.output.splitlines()[0] == (
        f"pp-launch: error: --volume: {missing} (stage 1's) does not exist on this host: create it first "
        f"(mkdir -p {missing}); docker would create it empty and owned by root"
    )
    assert not missing.exists()


def test_a_dry_run_shows_every_mount_and_option(tmp_path: Path) -> None:
    args = ["chain", "--dry-run", "--gpus", "none", "-v", f"{tmp_path}:/w:ro", "--shm-size", "2g", "--ipc", "host"]
    text = run(*args, "--user", "1000", env={"HOME": "/home/u"}).output
    assert f"--mount type=bind,source={tmp_path},target=/w,readonly" in text
    assert "--shm-size 2147483648" in text and "--ipc host" in text and "--user 1000" in text
    assert "tinygrad" not in text and "pp-pipeline" not in text  # nothing mounted that was not asked for
    text = run(*args, "--swactor-caches", env={"HOME": "/home/u"}).output
    assert "--mount type=bind,source=/home/u/.cache/tinygrad/stage-1,target=/root/.cache/tinygrad" in text
    named = run(*args, env={"HOME": "/home/u", "PP_MODEL_CACHE_DIR": str(tmp_path / "models")}).output
    assert f"source={tmp_path}/models/stage-1,target=/root/.cache/pp-pipeline" in named and "tinygrad" not in named
    doc = json.loads(run(*args, "--swactor-caches", "--json", env={"HOME": "/home/u"}).output)
    stage = doc["stages"][1]
    assert stage["mounts"][0] == {"type": "bind", "source": str(tmp_path), "target": "/w", "read_only": True}
    assert stage["mounts"][1]["created_by_pp_launch"] is True
    assert stage["shm_size"] == 2 << 30 and stage["ipc"] == "host"


def test_a_chain_file_takes_the_options_by_their_long_flags(tmp_path: Path) -> None:
    chain_file = tmp_path / "chain.toml"
    chain_file.write_text(f'volume = ["{tmp_path}:/w:ro"]\nshm-size = "1g"\nulimit = ["memlock=-1"]\n')
    doc = json.loads(run("chain", "-f", str(chain_file), "--dry-run", "--json", "--gpus", "none").output)
    assert doc["stages"][0]["mounts"][0]["target"] == "/w" and doc["stages"][0]["shm_size"] == 1 << 30
    chain_file.write_text('shm-size = "lots"\n')
    bad = run("chain", "-f", str(chain_file), "--dry-run", "--gpus", "none")
    assert bad.exit_code == 2 and f"chain file {chain_file}, line 1: shm-size" in bad.output


def test_gpu_node_chains_take_no_docker_run_options() -> None:
    result = run("chain", "--dry-run", "--gpus", "none", "--gpu-node", __file__, "--shm-size", "1g")
    assert result.exit_code == 2 and "--gpu-node do not go together" in result.output


def test_compose_writes_the_options_and_refuses_what_compose_cannot_do(tmp_path: Path) -> None:
    out = run("compose", "--gpus", "none", "-v", f"{tmp_path}:/w:ro", "-v", "hf:/c", "--shm-size", "1g").output
    assert f'source: "{tmp_path}"' in out and "create_host_path: false" in out and "shm_size: 1073741824" in out
    assert 'volumes:\n  hf:\n    name: "hf"' in out
    for args, why in ((("--ipc", "host"), "--ipc: a Compose chain"), (("-v", "/anon"), "an anonymous volume")):
        result = run("compose", "--gpus", "none", *args)
        assert result.exit_code == 2 and why in result.output, result.output


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("-v", "/m/stage-{stgae}:/w", "{stgae} is not a field of a host path: did you mean {stage}?"),
        ("-v", "/m/{Stage}:/w:ro", "{Stage} is not a field of a host path: did you mean {stage}?"),
        ("--mount", "type=bind,src=/m/{model},dst=/w", "{model} is not a field of a host path: {stage}"),
    ],
)
def test_an_unknown_field_in_a_host_path_is_a_typo_named_never_a_folder(
    flag: str, value: str, said: str, tmp_path: Path
) -> None:
    """`-v $M/stage-{stgae}:/weights` was answered with `mkdir -p $M/stage-{stgae}`: now exit 2, a did-you-mean."""
    result = run("chain", "--dry-run", "--gpus", "none", flag, value)
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert "mkdir" not in result.output


def test_the_kit_takes_the_chain_files_key_names_and_the_plural_ones_alike() -> None:
    """`pp_chain(..., volume=[...])` (the chain file's key) was a TypeError; one text where the flag repeats is one."""
    plural = c.ContainerOptions.from_keys(2, {"volumes": ["/m/{stage}:/w:ro"], "shm_size": "1g"})
    assert c.ContainerOptions.from_keys(2, {"volume": ["/m/{stage}:/w:ro"], "shm-size": "1g"}) == plural
    assert c.ContainerOptions.from_keys(2, {"volume": "/m/{stage}:/w:ro", "shm_size": "1g"}) == plural
    labelled = c.ContainerOptions.from_keys(1, {"label": {"team": "llm"}, "cap-add": "IPC_LOCK", "ulimit": "nofile=8"})
    assert labelled.labels == (("team", "llm"),) and labelled.cap_add == ("IPC_LOCK",)
    with pytest.raises(c.OptionError, match="'volumez' is not one of docker run's options here"):
        c.ContainerOptions.from_keys(1, {"volumez": ["/a:/b"]})


def test_a_command_and_env_values_take_stage_stages_and_first_peer() -> None:
    """docker run's COMMAND ARG...: {stage} and {stages} filled when planned; {first_peer} once stage 0 announced
    (empty on stage 0); other braces left as written."""
    from pp_launch.core.announce import StageAnnouncement

    command = ("serve", "--rank={stage}", "of {stages}", "{x}", "--m={first_peer}")
    env, last = (("WHO", "{stage}@{first_peer}"),), ((2, "LAST", "{stage}/{stages}"),)
    request = ChainRequest(stages=3, command=command, env=env, stage_env=last)
    plan = build_plan(request, {"HOME": "/h"}, "me", [()] * 3, [()] * 3, "r" * 12)
    assert [s.command for s in plan.stages] == [
        ("serve", f"--rank={k}", "of 3", "{x}", "--m=" if k == 0 else "--m={first_peer}") for k in range(3)
    ]
    assert plan.stages[2].env["LAST"] == "2/3" and plan.stages[1].env["WHO"] == "1@{first_peer}"
    assert plan.stages[0].env["WHO"] == "0@" and "PP_HANDOFF_FILLS" not in plan.stages[0].env  # stage 0: no peer
    assert plan.stages[1].env["PP_HANDOFF_FILLS"] == "WHO" and plan.stages[1].env["PP_HANDOFF_ARGS"] == "1"
    first = StageAnnouncement(node_id_hex="ab" * 32, direct="127.0.0.1:4000,10.0.0.1:4000")
    one = plan.stages[1].with_first_peer(first)
    assert one.command == ("serve", "--rank=1", "of 3", "{x}", "--m=127.0.0.1:4000")
    assert one.env["WHO"] == "1@127.0.0.1:4000"
    assert plan.stages[0].with_first_peer(first).command[-1] == "--m="  # stage 0 is the first peer
    assert plan.stages[1].first_peer_env(first) == {"WHO": "1@127.0.0.1:4000"}
    plain = build_plan(ChainRequest(stages=1), {"HOME": "/h"}, "me", [()], [()], "r" * 12).stages[0]
    assert plain.command is None and "PP_HANDOFF_FILLS" not in plain.env and "PP_HANDOFF_ARGS" not in plain.env


def test_the_command_after_dashes_or_a_chain_files_command_and_first_peer_with_a_late_handoff(tmp_path: Path) -> None:
    shown = run("chain", "--dry-run", "--gpus", "none", "--stages", "2", "--", "serve", "--rank", "{stage}").output
    assert "command: serve --rank 0" in shown and "command: serve --rank 1" in shown, shown
    chain_file = tmp_path / "chain.toml"
    chain_file.write_text('stages = 2\ngpus = "none"\ncommand = "serve --world {stages}"\n')
    assert "command: serve --world 2" in run("chain", "-f", str(chain_file), "--dry-run").output
    chain_file.write_text('command = ["serve", "--world", "{stages}"]\n')
    assert "command: serve --world 2" in run("chain", "-f", str(chain_file), "--dry-run", "--gpus", "none").output
    chain_file.write_text("command = 3\n")
    assert "command is a list of arguments" in run("chain", "-f", str(chain_file), "--dry-run").output
    late = run("chain", "--dry-run", "--gpus", "none", "--handoff", "stdin", "--", "serve", "{first_peer}")
    assert late.exit_code == 2 and "{first_peer} and --handoff stdin do not go together" in late.output


def test_health_options_are_docker_runs_and_reach_the_engine_as_its_healthcheck() -> None:
    o = c.ContainerOptions.parse(2, health_cmd="test -e /ok", health_interval="1m30s", health_timeout="500ms",
                                 health_retries="2", health_start_period="10s")  # fmt: skip
    assert o.config()["Healthcheck"] == {
        "Test": ["CMD-SHELL", "test -e /ok"], "Interval": 90 * 10**9, "Timeout": 5 * 10**8,
        "StartPeriod": 10 * 10**9, "Retries": 2,
    }  # fmt: skip
    assert c.ContainerOptions.parse(1, no_healthcheck=True).config() == {"Healthcheck": {"Test": ["NONE"]}}
    assert c.ContainerOptions.parse(1, health_interval="2s").config() == {"Healthcheck": {"Interval": 2 * 10**9}}
    assert c.ContainerOptions.parse(1).config() == {}  # the image's own HEALTHCHECK, if any
    for bad, said in (
        ({"health_interval": "2x"}, "give a duration as docker does"),
        ({"health_retries": "0"}, "give a count of 1 or more"),
        ({"health_cmd": " "}, "give the command that checks a stage"),
        ({"health_cmd": "true", "no_healthcheck": True}, "do not go together"),
    ):
        with pytest.raises(c.OptionError, match=said):
            c.ContainerOptions.parse(1, **bad)


def test_compose_refuses_health_options_its_own_healthcheck_is_the_announcement() -> None:
    result = run("compose", "--stages", "2", "--gpus", "none", "--health-cmd", "true")
    assert result.exit_code == 2 and "--health-* and --no-healthcheck are chain's" in result.output


def test_a_torch_rendezvous_gives_each_stage_torchruns_variables() -> None:
    from pp_launch.core.chain import rendezvous

    request = ChainRequest(stages=3, rendezvous="torch", env=(("MASTER_PORT", "29400"),))
    plan = build_plan(request, {"HOME": "/h"}, "me", [()] * 3, [()] * 3, "r" * 12)
    one = plan.stages[1].env
    assert (one["RANK"], one["WORLD_SIZE"], one["LOCAL_RANK"], one["LOCAL_WORLD_SIZE"]) == ("1", "3", "1", "3")
    assert (one["MASTER_ADDR"], one["MASTER_PORT"]) == ("127.0.0.1", "29400") and plan.rendezvous == "torch"
    hosts = ("tcp://10.0.0.2:2375", "tcp://10.0.0.2:2375", "ssh://me@gpu3")
    across = build_plan(request, {"HOME": "/h"}, "me", [()] * 3, [()] * 3, "r" * 12, stage_hosts=hosts)
    last = across.stages[2].env
    assert (last["MASTER_ADDR"], last["LOCAL_RANK"], last["LOCAL_WORLD_SIZE"], last["GROUP_RANK"]) == (
        "10.0.0.2", "0", "1", "1"
    )  # fmt: skip
    assert rendezvous.master_host(("ssh://me@gpu3:22",)) == "gpu3" and rendezvous.master_host(("ctx",)) == "ctx"
    met = rendezvous.announced("a" * 64, one)
    assert met.direct == "127.0.0.1:29400" and len(met.node_id_hex) == 64
    plain = build_plan(ChainRequest(stages=1), {"HOME": "/h"}, "me", [()], [()], "r" * 12).stages[0].env
    assert "RANK" not in plain and "MASTER_ADDR" not in plain
