"""Which engines a housekeeping command (ps, down, gc, logs, wait) looks at: --host and --all-hosts."""

from __future__ import annotations

import sys
from typing import Any

import click

from pp_launch.adapters import host_state
from pp_launch.adapters.docker_engine import ContainerInfo, Engine, connect
from pp_launch.app import housekeeping
from pp_launch.cli.options import host_option
from pp_launch.core import errors, hosts, labels


def host_choice(f: Any) -> Any:
    """--host (repeatable) and --all-hosts, as the housekeeping commands read them (no ring here)."""
    return host_option("Look at these Docker engines instead")(ALL_HOSTS(f))


RAY_OPTION = click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Look at the detached runs on this Ray cluster (HOST:PORT, ray://HOST:PORT, or auto) instead.",
)

ALL_HOSTS = click.option(
    "--all-hosts",
    is_flag=True,
    help="This engine and every host of the chains across hosts started from this machine (or of RUN's).",
)


class Engines:
    """The engines a housekeeping command looks at: the one engine (no --host), the named hosts, or with
    --all-hosts the hosts recorded for the runs started here (and RUN's own, from its labels). A host that does
    not answer is said, and the command goes on with the others and exits 1 at its end."""

    def __init__(self, names: tuple[str, ...], all_hosts: bool, run: str | None = None) -> None:
        wanted = list(hosts.parse_hosts(names))
        self.failed = False
        self.reached: list[tuple[str | None, Engine]] = []
        if all_hosts:
            record = host_state.RunHosts(warn=lambda text: click.echo(f"pp-launch: warning: {text}", err=True))
            self.reached.append((None, connect()))
            recorded = record.of_prefix(run) if run else record.every()
            labelled = self._labelled_hosts(run) if run else ()
            wanted += [h for h in (*recorded, *labelled) if h not in wanted]
        elif not wanted:
            self.reached.append((None, connect()))
        for name in wanted:
            try:
                self.reached.append((name, connect(host=name)))
            except errors.PpLaunchError as exc:
                self.failed = True
                click.echo(f"pp-launch: error: {exc}", err=True)
        self.several = len(self.reached) > 1 or any(name for name, _ in self.reached)

    def _labelled_hosts(self, run: str) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for _, engine in self.reached:
            for c in engine.containers(labels.run_selector()):
                if c.labels.get(labels.RUN, "").startswith(run):
                    found.update(dict.fromkeys(h for h in c.labels.get(labels.HOSTS, "").split(",") if h))
        return tuple(found)

    def finish(self) -> None:
        for _, engine in self.reached:
            engine.close()
        if self.failed:
            sys.exit(errors.EXIT_FAILURE)

    def find_run(self, run_id: str) -> tuple[str, list[tuple[Engine, ContainerInfo]]]:
        """The run (id or unique prefix) on every engine looked at, each container with its engine, in stage
        order. ConfigError when no engine has it, as on one engine."""
        if not self.several:
            engine = self.reached[0][1]
            run, found = housekeeping.find_run(engine, run_id)
            return run, [(engine, c) for c in found]
        runs: set[str] = set()
        every: list[tuple[Engine, ContainerInfo]] = []
        for _, engine in self.reached:
            for c in engine.containers(labels.run_selector()):
                runs.add(c.labels.get(labels.RUN, ""))
                every.append((engine, c))
        run = housekeeping.resolve_run(run_id, runs)
        mine = [(e, c) for e, c in every if c.labels.get(labels.RUN) == run]
        mine.sort(key=lambda item: labels.ascii_int(item[1].labels.get(labels.STAGE, "")) or 0)
        return run, mine
