"""A chain's life, I/O-free: its plan (`plan.py`), the ports it runs through (`ports.py`), its scope and the one
table of how it goes and ends (`scope.py`, `phases.py`), its one teardown, the peers' hand-off and restarts."""
