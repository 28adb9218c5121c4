"""Module containers that hold sub-modules without calling them: ModuleList and ModuleDict (as in torch.nn).

``Sequential`` (layers.py) calls its modules in order; these only register them, so their parameters
appear in ``parameters()`` and ``state_dict()`` under ``name.index`` / ``name.key``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping

from .module import Module


def _check(m, where: str) -> Module:
    if not isinstance(m, Module):
        raise TypeError(f"{where} takes Modules, got {type(m).__name__}")
    return m


class ModuleList(Module):
    """A list of sub-modules, registered as ``"0"``, ``"1"``, ... (torch.nn.ModuleList).

    Arguments:
        modules: an iterable of Modules to start with.
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx: int) -> int:
        idx = operator.index(idx)
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"ModuleList index {idx} is out of range for {n} modules")
        return idx % n

    def __getitem__(self, idx: int | slice) -> Module | ModuleList:
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[str(self._index(idx))]

    def __setitem__(self, idx: int, module: Module) -> None:
        self._modules[str(self._index(idx))] = _check(module, "ModuleList")

    def __delitem__(self, idx: int | slice) -> None:
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            del mods[idx]
        else:
            del mods[self._index(idx)]
        self._modules.clear()  # renumber, as torch does: indices stay 0..n-1
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self, *other])

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end, as ``torch.nn.ModuleList.append``; returns the list.

        Arguments:
            module: a Module (anything else raises TypeError).
        """
        self._modules[str(len(self))] = _check(module, "ModuleList.append")
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append every module of ``modules`` in order, as ``torch.nn.ModuleList.extend``; returns the list.

        Arguments:
            modules: an iterable of Modules.
        """
        try:
            modules = list(modules)
        except TypeError:
            raise TypeError(f"ModuleList.extend takes an iterable of Modules, got {type(modules).__name__}") from None
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (list semantics), as ``torch.nn.ModuleList.insert``.

        Arguments:
            index: the position.
            module: a Module.
        """
        mods = list(self._modules.values())
        mods.insert(index, _check(module, "ModuleList.insert"))
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index``, as ``torch.nn.ModuleList.pop``.

        Arguments:
            index: the position (default the last).
        """
        m = self[index]
        del self[index]
        return m

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList is a container and has no forward(); iterate over it instead")


class ModuleDict(Module):
    """An ordered dict of sub-modules by name (torch.nn.ModuleDict).

    Arguments:
        modules: a mapping or an iterable of (name, Module) pairs to start with.
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise KeyError(f"ModuleDict keys must be non-empty strings without '.', got {key!r}")
        self._modules[key] = _check(module, "ModuleDict")

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self):
        """The names of the modules, in insertion order."""
        return self._modules.keys()

    def values(self):
        """The modules, in insertion order."""
        return self._modules.values()

    def items(self):
        """``(name, module)`` pairs, in insertion order."""
        return self._modules.items()

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()

    def pop(self, key: str) -> Module:
        """Remove the module named ``key`` and return it, as ``torch.nn.ModuleDict.pop``.

        Arguments:
            key: its name.
        """
        m = self[key]
        del self[key]
        return m

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add or replace modules from a mapping, a ModuleDict or ``(name, module)`` pairs, as
        ``torch.nn.ModuleDict.update``.

        Arguments:
            modules: the modules to add.
        """
        pairs = modules.items() if isinstance(modules, (Mapping, ModuleDict)) else modules
        for entry in pairs:
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise TypeError(f"ModuleDict.update takes a mapping or (name, Module) pairs, got {entry!r}")
            self[entry[0]] = entry[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict is a container and has no forward(); index it instead")
