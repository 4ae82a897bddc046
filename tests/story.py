"""What a failed integration test's runs did, told once for every test (conftest's makereport hook): each launcher
the test started (its command, exit code and last stderr lines), the state of every container of its runs on each
engine it used, and the engine's events for those containers since the test began. A run is the test's when one
of its launchers named it, or when its containers' owner is this process or one of its launchers: never another
pytest-xdist worker's or anyone else's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any

from . import helpers

RUN_ID = re.compile(r"\b[0-9a-f]{12}\b")
TAIL = 15  # stderr lines per launcher
EVENTS = 60  # engine events per engine
ASK = 10  # seconds for each question to an engine: a story never hangs the suite


class Chapter:
    """One test: when it began and which launchers existed before it (the rest are its own)."""

    def __init__(self) -> None:
        self.began = time.time()
        self.first = len(helpers.LAUNCHERS)
        self.first_proc = len(helpers.spawned())

    def launchers(self) -> list[helpers.Launcher]:
        return helpers.LAUNCHERS[self.first :]

    def tell(self) -> str:
        launchers = self.launchers()
        runs: set[str] = set()
        hosts = {""}  # "": the suite's engine (DOCKER_HOST as the suite has it)
        lines: list[str] = []
        for n, launcher in enumerate(launchers):
            code = launcher.proc.poll()
            lines.append(f"launcher {n}: {' '.join(launcher.args)[:200]} -> {'running' if code is None else code}")
            tail = launcher.stderr_lines[-TAIL:]
            lines += [f"    {line[:300]}" for line in tail] or ["    (no stderr)"]
            runs |= _runs_named(launcher)
            hosts.add(launcher.docker_host)
        pids = {os.getpid(), *(p.pid for p in helpers.spawned()[self.first_proc :])}
        for host in sorted(hosts):
            lines += self._engine(host, runs, pids)
        return "\n".join(lines)

    def _engine(self, host: str, runs: set[str], pids: set[int]) -> list[str]:
        where = host or os.environ.get("DOCKER_HOST", "the suite's engine")
        ours = lambda labels: labels.get("pp-launch.run") in runs or _owned_by(labels, pids)  # noqa: E731
        states = _docker(host, "ps", "-a", "--filter", "label=pp-launch.run", "--format", "{{json .}}")
        rows = [json.loads(line) for line in states.splitlines() if line.startswith("{")]
        mine = [r for r in rows if ours(_labels(r.get("Labels", "")))]
        out = [f"engine {where}: {len(mine)} container(s) of the test's runs"]
        out += [f"    {r.get('Names')} {r.get('State')} {r.get('Status')} {r.get('Labels', '')[:160]}" for r in mine]
        events = _docker(
            host,
            "events",
            "--since",
            f"{self.began - 1:.3f}",
            "--until",
            f"{time.time():.3f}",
            "--filter",
            "type=container",
            "--format",
            "{{json .}}",
        )
        seen = []
        for line in events.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            attributes = (event.get("Actor") or {}).get("Attributes") or {}
            if ours(attributes):
                stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", 0)))
                name, code = attributes.get("name", "?"), attributes.get("exitCode")
                seen.append(f"    {stamp} {name} {event.get('Action')}" + (f" exit {code}" if code else ""))
        out.append(f"engine {where}: its events for them since the test began ({len(seen)})")
        return out + seen[-EVENTS:]


def _runs_named(launcher: helpers.Launcher) -> set[str]:
    found = {str(e["run"]) for e in launcher.events if isinstance(e.get("run"), str)}
    for line in [*launcher.stdout_lines, *launcher.stderr_lines]:
        if "run" in line:
            found |= set(RUN_ID.findall(line))
    return found


def _owned_by(labels: dict[str, Any], pids: set[int]) -> bool:
    parts = str(labels.get("pp-launch.owner", "")).split(":")
    return len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids


def _labels(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _docker(host: str, *argv: str) -> str:
    prefix = ["docker", "-H", host] if host else ["docker"]
    try:
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=ASK, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(docker {argv[0]} did not answer: {exc})"
    return done.stdout if done.returncode == 0 else f"(docker {argv[0]}: {done.stderr.strip()[:200]})"
