"""`python -m pp_launch`: the `pp-launch` command, as its console script runs it (cli/entry.py)."""

from pp_launch.cli.entry import main

main()
