"""RemovableHandle: what every ``register_*hook`` returns (Module, Tensor and graph-node hooks).

Hooks live in an OrderedDict on the object they are registered on (no global registry), keyed by
an id from one process-wide counter; callers iterate a snapshot of the values, so a hook that
removes itself or another hook while they run is safe (the removal takes effect from the next
call, as in PyTorch).
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Any

_ids = itertools.count()  # next() on itertools.count is atomic under the GIL


class RemovableHandle:
    """Removes one hook from the dict it was added to; ``remove()`` is safe to call twice.

    Holds the dict weakly, so a kept handle does not keep a dropped module's or node's hooks alive.
    Usable as a context manager: the hook is removed on exit.
    """

    __slots__ = ("id", "_dict")

    def __init__(self, hooks: OrderedDict) -> None:
        self.id = next(_ids)
        self._dict = weakref.ref(hooks)

    def remove(self) -> None:
        hooks = self._dict()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<RemovableHandle {self.id}>"


def add_hook(hooks: OrderedDict, value: Any, prepend: bool = False) -> RemovableHandle:
    """Store ``value`` in ``hooks`` (last, or first when ``prepend``) and return its handle.

    Arguments:
        hooks: the owner's hook dict (an OrderedDict: handles refer to it weakly).
        value: what the owner's caller iterates (a hook, or a hook with its flags).
        prepend: run it before the hooks already registered instead of after them.
    """
    handle = RemovableHandle(hooks)
    hooks[handle.id] = value
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle
