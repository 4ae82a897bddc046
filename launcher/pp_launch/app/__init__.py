"""The use cases (docs/architecture.md): a chain's launch (`launch.py`, over the sites of `site.py`) and the runs
that exist (`runs.py`: ps, down, gc, logs, wait), pp-gpu-node, Compose, the worker driver. They own what a run is
and where it lives; every piece of I/O is an adapter's, every rule the core's."""
