"""pp-launch's pytest plugin (entry point `pytest11: pp_launch`): inert until a project enables it.

Installing pp-launch never changes anyone's pytest: at load this module imports only the standard library and
pytest, registers one ini option and nothing else. A project enables the plugin with `-p pp_launch` on the command
line or `pp_launch = true` in its ini file; only then are its fixtures and its leak guard loaded
(pp_launch/testing/fixtures.py), which need the testing extra: `pip install 'pp-launch[testing]'`.

Fixtures (once enabled; a fixture does nothing until a test asks for it):
  pp_engine          the Docker engine (DOCKER_HOST or the default); fails under CI=true when none answers,
                     skips elsewhere
  pp_stage           factory: pp_stage(image, stage=0, num_stages=1, env=..., gpus=...) -> a started
                     StageContainer, stopped with our teardown at the end of the test
  pp_chain           factory: pp_chain(image, stages=2, ...) -> a RunningChain, torn down at the end of the test
  pp_gpu_inventory   an inventory file (docs/formats.md): PP_LAUNCH_GPU_INVENTORY, else an 8-GPU machine written
                     for the session (pair it with `--gpu-inventory` or `Chain(gpu_inventory=...)`)

The leak guard: a test that uses these fixtures and leaves a pp-launch container of this session's processes, a
testcontainers container of this session, or a launcher process it started fails in its teardown, naming the
container, its image and labels; what it left is then removed.
"""

from __future__ import annotations

import pytest

EXTRA_HINT = "pip install 'pp-launch[testing]'"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "pp_launch",
        "enable pp-launch's fixtures and leak guard (pp_engine, pp_stage, pp_chain, ...)",
        type="bool",
        default=False,
    )


def enabled(config: pytest.Config) -> bool:
    return "pp_launch" in (getattr(config.option, "plugins", None) or []) or bool(config.getini("pp_launch"))


def pytest_configure(config: pytest.Config) -> None:
    if not enabled(config) or config.pluginmanager.has_plugin("pp_launch_fixtures"):
        return
    try:
        from pp_launch.testing import fixtures
    except ImportError as exc:
        raise pytest.UsageError(
            f"pp-launch's pytest plugin is enabled (-p pp_launch or pp_launch = true) but its testing extra is not "
            f"installed ({exc}): {EXTRA_HINT}"
        ) from None
    config.pluginmanager.register(fixtures, "pp_launch_fixtures")
    config.pluginmanager.register(fixtures.LeakGuard(), "pp_launch_leak_guard")
