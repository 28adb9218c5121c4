"""Plans remembered by the layout of a call's operands.

An op called again with operands of the same layout (shapes, strides, offsets, dtypes, device) makes the
same choices and packs the same kernel parameters; remembering them by that layout leaves a repeated
call's host cost at about one dispatch's (an elementwise op, a product, an attention forward: a training
step repeats every call). The values hold no tensors, only what was decided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ALL: list[PlanCache] = []
_MISSING = object()


class PlanCache:
    """Values by key, started again once ``limit`` keys are held (layouts without end must not grow it)."""

    __slots__ = ("_d", "limit")

    def __init__(self, limit: int = 4096) -> None:
        self._d: dict[Any, Any] = {}
        self.limit = limit
        _ALL.append(self)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._d.get(key, default)

    def remember(self, key: Any, make: Callable[..., Any], *args: Any) -> Any:
        """The value held for ``key``; the first time, ``make(*args)``'s, remembered (None included: a plan
        that says "not this way" is remembered too)."""
        value = self._d.get(key, _MISSING)
        if value is _MISSING:
            value = self.put(key, make(*args))
        return value

    def put(self, key: Any, value: Any) -> Any:
        """Remember ``value`` for ``key``; returns ``value``."""
        if len(self._d) >= self.limit:
            self._d.clear()
        self._d[key] = value
        return value

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self):
        """The keys held."""
        return iter(self._d)


def forget_all() -> None:
    """Clear every plan cache (after a change to what plans read that their keys do not hold, such as a
    device's limits patched by a test)."""
    for cache in _ALL:
        cache.clear()
