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
assert type(sys.modules["colorsys"]).__name__ == "_Deferred", "executed at import"
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
