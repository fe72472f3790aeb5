"""Names that moved, kept for one release: a module's `__getattr__` that finds the old name's new home and says so
with a DeprecationWarning (README, the "Moved" tables)."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `module`: each old name in `moved` maps to "package.module.NEW", which
    is imported when the old name is read, with a DeprecationWarning naming it."""
    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = moved[name].rpartition(".")
        warnings.warn(f"{module}.{name} moved to {moved[name]}; the old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), new)
    return __getattr__


def deprecated_values(module: str, values: Mapping[str, Callable[[], object]], where: str) -> Callable[[str], object]:
    """A module-level `__getattr__` for old names whose value is now computed from a new home (a table rebuilt
    from the family modules, say): reading one calls its function, with a DeprecationWarning saying `where`."""
    def __getattr__(name: str):
        if name not in values:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated: {where}", DeprecationWarning, stacklevel=2)
        return values[name]()
    return __getattr__


def renamed_method(old: str, new: str) -> Callable:
    """A method `old` kept for one release: it calls the method `new`, with a DeprecationWarning."""
    def method(self, *args, **kwargs):
        warnings.warn(f"{type(self).__name__}.{old}() is now .{new}(); the old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return getattr(self, new)(*args, **kwargs)
    method.__name__ = method.__qualname__ = old
    return method


def renamed_keyword(old: str, new: str) -> Callable[[Callable], Callable]:
    """A decorator: calls that still pass the keyword `old` reach the parameter `new`, with a DeprecationWarning."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def renamed(*args, **kwargs):
            if old in kwargs:
                warnings.warn(f"{fn.__name__}({old}=…) is now {fn.__name__}({new}=…); the old keyword goes in the "
                              f"next release.", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return renamed
    return wrap
