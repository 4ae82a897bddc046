"""Modules loaded on first use: start-up pays only for what a command touches (issue #26, fast start)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module not executed yet; `import name` binds it without running anything
    (Python 3.11's LazyLoader runs the module as soon as the import statement looks at it). The first attribute
    read imports the real module, which then takes its place in sys.modules."""

    def __getattr__(self, attr: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            self.__dict__["_real"] = real
        return getattr(real, attr)


def defer(name: str) -> None:
    """Make `import name` cheap until the module is used. Nothing happens when it is already imported or not
    installed (then `import name` fails as it would have)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    stand_in = _Deferred(name)
    stand_in.__spec__ = None  # the import statement only reads `__spec__._initializing`
    sys.modules[name] = stand_in
