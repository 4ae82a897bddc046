"""The command line: `main.py` is the `pp-launch` group, one module per command group beside it, each command a
few decorators and one library call; `options.py` what they share; `entry.py` the console scripts. Kept empty
so that `entry.py` can take over the stop signals before anything heavy is imported."""
