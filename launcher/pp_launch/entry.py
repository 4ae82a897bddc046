"""Console entry points: take over the stop signals first, then import the CLI (docker, click...)."""

from __future__ import annotations


def main() -> None:
    from . import signals

    signals.install()
    from .cli import main as cli_main

    cli_main()


def gpu_node_main() -> None:
    from . import signals

    signals.install()
    from .cli import gpu_node_main as node_main

    node_main()
