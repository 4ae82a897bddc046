"""Every piece of I/O, and only here (docs/architecture.md): Docker engines (`docker_engine.py`, the only `docker`
import), NVML (`nvml.py`, the only `pynvml` one), Ray (`ray_cluster.py`), the run's guard and watchdog, processes,
files of this user's state, clocks and threads."""
