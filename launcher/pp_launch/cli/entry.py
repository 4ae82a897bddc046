"""Console entry points: take over the stop signals first, then import the CLI (docker, click...)."""

from __future__ import annotations


def main() -> None:
    from pp_launch.cli import signals, streams

    signals.install()
    streams.install()
    from pp_launch.cli.main import main as cli_main

    cli_main()


def gpu_node_main() -> None:
    from pp_launch.cli import signals, streams

    signals.install()
    streams.install()
    from pp_launch.cli.node_cmd import gpu_node_main as node_main

    node_main()
