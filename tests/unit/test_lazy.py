"""adapters/lazy.defer: `import name` binds a stand-in; the first attribute read runs the real module (how the
Docker adapter keeps docker-py's `import paramiko` from costing every command 0.1 s)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from pp_launch.adapters.lazy import defer
defer("colorsys")
import colorsys
assert type(sys.modules["colorsys"]).__name__ == "Deferred", "executed at import"
assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
assert type(sys.modules["colorsys"]).__name__ == "module", "not replaced by the real module"
defer("no_such_module_pp")
try:
    import no_such_module_pp  # noqa: F401
except ImportError:
    print("ok")
"""


def test_a_deferred_module_runs_on_first_use_and_a_missing_one_still_fails_to_import() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_docker_adapter_leaves_paramiko_unloaded_until_an_ssh_engine_is_used() -> None:
    code = "import sys, pp_launch.adapters.docker_engine\nprint('paramiko.transport' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


PACKAGE = """
import sys
from pp_launch.adapters.lazy import defer
defer("email")
defer("email.utils")
defer("json.decoder")  # json is not deferred: its submodule is left alone (looking for it would import json)
import email.utils
assert type(sys.modules["email"]).__name__ == "Deferred" and type(sys.modules["email.utils"]).__name__ == "Deferred"
assert "email.utils" in sys.modules and "email.message" not in sys.modules, "a submodule ran at import"
assert email.utils.quote('a"b') == 'a\\\\"b'  # the first read: the package, then its submodule, for real
assert type(sys.modules["email.utils"]).__name__ == "module" and type(sys.modules["email"]).__name__ == "module"
assert type(sys.modules.get("json.decoder")).__name__ != "Deferred"
print("ok")
"""


def test_a_submodule_is_deferred_with_its_package_and_runs_on_first_use() -> None:
    done = subprocess.run([sys.executable, "-c", PACKAGE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_docker_adapter_leaves_docker_py_and_requests_unloaded_until_needed() -> None:
    code = (
        "import sys, pp_launch.adapters.docker_engine as d\n"
        "print(sorted(type(sys.modules[m]).__name__ for m in ('docker', 'docker.errors', 'requests')))\n"
        "print(d.REFUSED.NotFound)\n"
        "print(d.docker.errors.NotFound in d.REFUSED.NotFound)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    deferred, before, after = done.stdout.strip().splitlines()
    assert deferred == "['Deferred', 'Deferred', 'Deferred']"
    assert "engine_api.NotFound" in before and "docker" not in before.replace("docker_engine", "")
    assert after == "True"  # once docker-py is imported, its NotFound is caught as ours is


def test_find_spec_works_for_every_module_after_pp_launch_is_imported() -> None:
    """A user's test session imports the kit (and with it the Docker adapter, which defers requests and
    paramiko): importlib.util.find_spec must still answer for those modules as it would without pp-launch."""
    code = (
        "import importlib.util, sys\n"
        "import pp_launch.testing.fixtures, pp_launch.adapters.docker_engine\n"
        "from pp_launch.adapters.lazy import Deferred\n"
        "deferred = [n for n, m in list(sys.modules.items()) if isinstance(m, Deferred)]\n"
        "assert deferred, 'nothing deferred: the test would prove nothing'\n"
        "for name in deferred:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    assert spec is not None and spec.name == name, name\n"
        "print(len(deferred), sorted(deferred)[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
