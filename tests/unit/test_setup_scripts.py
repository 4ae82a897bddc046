"""The set-up installs the host tools it calls: run its check against a PATH that has none of them, with a
recording stand-in for apt-get, so nothing is installed by the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launcher" / "scripts" / "ensure-host-tools.sh"


def bare_path(tmp_path: Path, *keep: str) -> Path:
    """A PATH folder holding only the named programs (what any root filesystem has)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "id", *keep):
        found = shutil.which(name)
        assert found, name
        (bin_dir / name).symlink_to(found)
    return bin_dir


def run(tmp_path: Path, bin_dir: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp_path / "apt.log"
    apt = tmp_path / "apt-get"
    apt.write_text(f'#!{shutil.which("bash")}\necho "$*" >> {log}\n')
    apt.chmod(0o755)
    result = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)],
        env={"PATH": str(bin_dir), "PP_APT_GET": str(apt)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result, log.read_text().splitlines() if log.exists() else []


def test_missing_tools_are_installed_by_package_name(tmp_path: Path) -> None:
    result, calls = run(tmp_path, bare_path(tmp_path))
    if os.geteuid() == 0 and Path("/etc/debian_version").exists():
        assert result.returncode == 0, result.stderr
        assert calls[0] == "update -qq"
        assert calls[1].split()[:3] == ["install", "-y", "-qq"]
        assert {"debootstrap", "gcc", "tar", "util-linux", "procps", "openssh-server"} <= set(calls[1].split())
    else:
        assert result.returncode == 1
        assert "install the packages debootstrap" in result.stderr


def test_present_tools_are_left_alone(tmp_path: Path) -> None:
    every = ("debootstrap", "gcc", "tar", "setsid", "pgrep", "sshd")
    tools = [t for t in every if shutil.which(t)]
    result, calls = run(tmp_path, bare_path(tmp_path, *tools))
    missing = set(every) - set(tools)
    if not missing:
        assert result.returncode == 0 and calls == []
    else:
        assert all(t not in " ".join(calls) for t in tools if t not in ("setsid", "pgrep"))


def test_groups_add_the_docs_and_browser_tools(tmp_path: Path) -> None:
    every = ("debootstrap", "gcc", "tar", "setsid", "pgrep", "sshd")
    bin_dir = bare_path(tmp_path, *[t for t in every if shutil.which(t)])
    log = tmp_path / "apt.log"
    apt = tmp_path / "apt-get"
    apt.write_text(f'#!{shutil.which("bash")}\necho "$*" >> {log}\n')
    apt.chmod(0o755)
    done = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT), "docs", "browser"],
        env={"PATH": str(bin_dir), "PP_APT_GET": str(apt)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if os.geteuid() == 0 and Path("/etc/debian_version").exists():
        assert done.returncode == 0, done.stderr
        install = log.read_text().splitlines()[-1].split()
        assert {"graphviz", "chromium", "--no-install-recommends"} <= set(install)
    else:
        assert done.returncode == 1 and "graphviz" in done.stderr and "chromium" in done.stderr
    wrong = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT), "desktop"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert wrong.returncode == 2 and "unknown group 'desktop'" in wrong.stderr


ENSURE_DOCKER = ROOT / "launcher" / "scripts" / "ensure-docker.sh"


def test_an_engine_the_user_named_that_does_not_answer_is_one_line_at_once(tmp_path: Path) -> None:
    """DOCKER_HOST or DOCKER_CONTEXT naming an engine that is down: said at once, and no dockerd is started (it would
    listen on the default socket, not where the user pointed) nor any package installed."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    called = tmp_path / "called.log"
    for name in ("dockerd", "apt-get", "docker-init"):
        (fakes / name).write_text(f'#!{shutil.which("bash")}\necho "{name} $*" >> {called}\n')
        (fakes / name).chmod(0o755)
    docker_cli = shutil.which("docker")
    if docker_cli is None:  # no CLI: the script's own check fails the same way; stand one in that never answers
        (fakes / "docker").write_text(f"#!{shutil.which('bash')}\nexit 1\n")
        (fakes / "docker").chmod(0o755)
    silent = tmp_path / "nobody-listens.sock"  # a path no engine serves
    path = f"{fakes}:{os.environ['PATH']}"
    for named, hint in (
        ({"DOCKER_HOST": f"unix://{silent}"}, "unset DOCKER_HOST"),
        ({"DOCKER_CONTEXT": "pp-tests-no-such-context"}, "unset DOCKER_CONTEXT"),
    ):
        env = {"PATH": path, "HOME": str(tmp_path), **named}
        done = subprocess.run(["bash", str(ENSURE_DOCKER)], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "is not answering" in lines[0] and hint in lines[0] and next(iter(named.values())) in lines[0]
        assert not called.exists(), called.read_text()
