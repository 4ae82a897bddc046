"""Modules loaded on first use: start-up pays only for what a command touches (fast start)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class Deferred(types.ModuleType):
    """Stands in sys.modules for a module not executed yet; `import name` binds it without running anything
    (Python 3.11's LazyLoader runs the module as soon as the import statement looks at it). The first attribute
    read imports the real module, which then takes its place in sys.modules."""

    def load(self) -> types.ModuleType:
        """The real module (imported on the first call), which then takes this stand-in's place in sys.modules."""
        real = self.__dict__.get("_real")
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            self.__dict__["_real"] = real
        return real

    def __getattr__(self, attr: str) -> Any:
        real = self.load()
        sub = sys.modules.get(f"{self.__name__}.{attr}")
        if isinstance(sub, Deferred):  # a deferred submodule (pkg.mod): for real, and so pkg's attribute too
            return sub.load()
        return getattr(real, attr)


def defer(name: str) -> None:
    """Make `import name` cheap until the module is used. Nothing happens when it is already imported or not
    installed (then `import name` fails as it would have). A submodule (`pkg.mod`) is deferred after its package;
    `import pkg.mod` then binds pkg's stand-in, and reading `pkg.mod.x` imports both."""
    if name in sys.modules:
        return
    package, _, sub = name.partition(".")
    if sub:  # pkg.mod: only with pkg deferred (looking for pkg.mod would import pkg), and then as pkg is found
        parent = sys.modules.get(package)
        if not isinstance(parent, Deferred):
            return
        where = parent.__spec__.submodule_search_locations if parent.__spec__ is not None else None
        spec = importlib.machinery.PathFinder.find_spec(name, where) if where is not None else None
    else:
        spec = importlib.util.find_spec(name)
    if spec is None:
        return
    stand_in = Deferred(name)
    # the module's own spec, found without running it: the import statement reads only `_initializing` from it,
    # and importlib.util.find_spec(name) in the user's code answers as if nothing stood in (it raises on None)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in
