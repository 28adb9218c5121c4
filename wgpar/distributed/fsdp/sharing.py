"""Which unit owns which parameter: claiming a unit's parameters, and parameters shared across units.

``fully_shard`` is applied bottom-up, so when a unit is made its inner units exist already: it
claims every parameter of its sub-tree that no inner unit owns. A parameter used by modules of
two units (tied weights) must belong to a unit around both, or one unit's forward would run with
the other's freed copy: when the unit being made finds, in its sub-tree, a module holding a
parameter owned by an inner unit that does not enclose that module, it takes the parameter over
(gathering it from its old unit, which is rebuilt without it). So the innermost unit enclosing
every use owns a shared parameter, the ranks agree on it (every rank makes the same calls), and
sharing that no unit encloses is reported at the first forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ...nn.module import Module
from ...nn.parameter import Parameter
from .param import FSDPParam, fsdp_param_of
from .param_group import FSDPParamGroup, _Entry


def _state_of(module: Module):
    return module.__dict__.get("_fsdp_state")


def walk_units(module: Module) -> Iterator[tuple[str, Module, tuple]]:
    """(name, module, enclosing FSDP states, innermost last) for ``module`` and every module below it,
    each module once (the first path that reaches it)."""
    seen: set[int] = set()
    top = _state_of(module)
    stack: list[tuple[str, Module, tuple]] = [("", module, (top,) if top is not None else ())]
    while stack:
        name, m, chain = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield name, m, chain
        for k, child in reversed(list(m._modules.items())):
            if child is None:
                continue
            st = _state_of(child)
            stack.append((f"{name}.{k}" if name else k, child, chain + (st,) if st is not None else chain))


def claim(module: Module, values: Callable[[Parameter], np.ndarray | None] | None) -> list[_Entry]:
    """The parameters a unit about to be made on ``module`` owns, each with its full value.

    Parameters shared with modules outside their owner's sub-tree are taken over from their inner
    units (a collective per such unit: every rank makes the same fully_shard calls).
    """
    entries: dict[int, _Entry] = {}
    moving: dict[int, tuple[FSDPParamGroup, FSDPParam, list]] = {}
    for mname, m, chain in walk_units(module):
        for attr, p in m._parameters.items():
            if p is None:
                continue
            qual = f"{mname}.{attr}" if mname else attr
            fp = fsdp_param_of(p)
            if fp is None:
                e = entries.get(id(p))
                if e is None:
                    value = values(p) if values is not None else None
                    e = entries[id(p)] = _Entry(qual, tuple(p.shape), p.dtype, p.requires_grad, [],
                                                p if value is None else value, original=p)
                e.refs.append((m, attr))
                continue
            grp = fp.group
            if grp.owner in chain:
                continue  # used only inside the unit that owns it
            moving.setdefault(id(fp), (grp, fp, []))[2].append((m, attr, p))
    for grp, fps in _by_group(moving).items():
        values_by_fp = dict(zip(grp.params, grp.full_values()))
        keep = [fp for fp in grp.params if all(fp is not f for f, _ in fps)]
        for fp, refs in fps:
            aliases = [fp.registered, fp.unsharded] + [p for _, _, p in refs]
            entries[id(fp)] = _Entry(fp.name, fp.shape, grp.dtype, fp.requires_grad,
                                     fp.module_infos + [(m, a) for m, a, _ in refs], values_by_fp[fp],
                                     aliases=aliases)
        rebuilt = [_Entry(fp.name, fp.shape, grp.dtype, fp.requires_grad, fp.module_infos, values_by_fp[fp],
                          aliases=[fp.registered, fp.unsharded]) for fp in keep]
        grp.reshard()
        new = FSDPParamGroup(grp.name, rebuilt, grp.comms, grp.device, grp.mp, grp.offload,
                             grp.reshard_after_forward)
        new.sync = grp.sync
        grp.owner.attach(new if new.params else None)
    return list(entries.values())


def _by_group(moving: dict) -> dict[FSDPParamGroup, list[tuple[FSDPParam, list]]]:
    out: dict[FSDPParamGroup, list] = {}
    for grp, fp, refs in moving.values():
        out.setdefault(grp, []).append((fp, refs))
    return out


def check_sharing(root: Module) -> None:
    """Raise if a module uses a parameter whose unit does not enclose it (no unit encloses both uses)."""
    for mname, m, chain in walk_units(root):
        for attr, p in m._parameters.items():
            fp = fsdp_param_of(p) if p is not None else None
            if fp is None:
                continue
            if fp.group.owner not in chain:
                where = f"module {mname!r}" if mname else f"the {type(root).__name__} being run"
                raise ValueError(
                    f"FSDP: {where} uses parameter {attr!r} of FSDP unit {fp.group.owner.name!r}, which does not "
                    f"enclose it, and no unit encloses both uses; apply fully_shard to a module around both "
                    "(their common parent), so that it owns the parameter")
