"""pp-launch: launch pipeline-parallel inference stages as GPU containers, and never leave one behind."""

__version__ = "0.1.0"
