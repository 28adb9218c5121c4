"""Old import paths of what moved into ``single_controller/``: they still work, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable


def moved(old: str, new: str, names: Iterable[str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old`` that hands out ``names`` from ``new``, warning once per use."""
    names = frozenset(names)

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(f"{old}.{name} moved: import it from {new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
