"""parallelize_module: convert an existing model's Linear layers to tensor-parallel ones, in place.

As in PyTorch (torch.distributed.tensor.parallel): a plan maps dotted module
names to styles, ``{"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}``;
a name component may be a glob (``"blocks.*.mlp.fc1"``). Each rank calls it
on its own copy of the same model (a trained single-device model loaded on
every rank) and keeps its slice of each converted layer's weights, so the
parallel model computes what the single-device one did.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from ...nn.attention import CausalSelfAttention
from ...nn.layers import Linear
from ...nn.module import Module
from ..group import ProcessGroup
from .layers import ColumnParallelLinear, RowParallelLinear, _check_group


class ParallelStyle(abc.ABC):
    """How one layer is split; ``parallelize_module`` applies it."""

    @abc.abstractmethod
    def apply(self, module: Module, group: ProcessGroup, src_rank: int | None = 0, name: str = "") -> Module:
        """This rank's tensor-parallel replacement of ``module`` (named ``name`` in errors)."""


def _linear(module: Module, style: ParallelStyle, name: str) -> Linear:
    if not isinstance(module, Linear):
        raise TypeError(f"parallelize_module: {type(style).__name__} shards an nn.Linear, but {name or 'the module'!r} "
                        f"is a {type(module).__name__}")
    return module


@dataclass(frozen=True)
class ColwiseParallel(ParallelStyle):
    """Split a Linear's outputs (ColumnParallelLinear): its input is replicated, its output this rank's slice.

    Arguments:
        gather_output: all-gather the output (the next layer is not row-parallel).
        unit: slices are multiples of it (an attention head's width). Default: what the module holding
            the layer needs (a head for CausalSelfAttention's projections), else 1.
        chunks: the outputs are this many equal blocks split one by one (a fused q|k|v projection: 3).
            Default: the layer's layout (3 for CausalSelfAttention's ``qkv``), else 1.
    """

    gather_output: bool = False
    unit: int | None = None
    chunks: int | None = None

    def apply(self, module: Module, group: ProcessGroup, src_rank: int | None = 0, name: str = "") -> Module:
        """Replace the Linear ``module`` by a ColumnParallelLinear over ``group`` with this style's settings
        (``parallelize_module`` calls it).

        Arguments:
            module: the Linear to split.
            group: the tensor-parallel ProcessGroup.
            src_rank: the rank whose weights every rank takes (None: each keeps its own).
            name: the module's qualified name, for errors and labels.
        """
        return ColumnParallelLinear.from_linear(_linear(module, self, name), group, gather_output=self.gather_output,
                                                unit=_or1(self.unit), chunks=_or1(self.chunks), src_rank=src_rank,
                                                label=name or "linear")


@dataclass(frozen=True)
class RowwiseParallel(ParallelStyle):
    """Split a Linear's inputs (RowParallelLinear): partial outputs are summed over ranks, the bias added once.

    Arguments:
        input_is_parallel: the input is already this rank's slice (a colwise layer's output); False: each
            rank takes its slice of a replicated input.
        unit: slices are multiples of it (an attention head's width). Default: what the module holding
            the layer needs (a head for CausalSelfAttention's ``out_proj``), else 1.
    """

    input_is_parallel: bool = True
    unit: int | None = None

    def apply(self, module: Module, group: ProcessGroup, src_rank: int | None = 0, name: str = "") -> Module:
        """Replace the Linear ``module`` by a RowParallelLinear over ``group`` with this style's settings
        (``parallelize_module`` calls it).

        Arguments:
            module: the Linear to split.
            group: the tensor-parallel ProcessGroup.
            src_rank: the rank whose weights every rank takes (None: each keeps its own).
            name: the module's qualified name, for errors and labels.
        """
        return RowParallelLinear.from_linear(_linear(module, self, name), group,
                                             input_is_parallel=self.input_is_parallel, unit=_or1(self.unit),
                                             src_rank=src_rank, label=name or "linear")


def _or1(value: int | None) -> int:
    return 1 if value is None else value


def _layout(parent: Module, attr: str) -> dict[str, int]:
    """What ``parent``'s forward needs of the split of its Linear ``attr``: ``chunks`` (exactly) and ``unit``
    (a multiple of it). CausalSelfAttention reads q, k and v as three blocks of the fused ``qkv`` output and
    its heads whole, so each block must be split by heads on its own, and ``out_proj`` by heads alike."""
    if isinstance(parent, CausalSelfAttention):
        if attr == "qkv":
            return {"chunks": 3, "unit": parent.head_dim}
        if attr == "out_proj":
            return {"unit": parent.head_dim}
    return {}


def _fit(style: ParallelStyle, parent: Module, attr: str, name: str, key: str) -> ParallelStyle:
    """``style`` with its unset ``unit`` / ``chunks`` taken from the layout ``parent`` needs; a set one that
    contradicts it is refused (it would split q, k, v or heads across ranks: silently wrong outputs)."""
    need = _layout(parent, attr)
    if not need or not isinstance(style, (ColwiseParallel, RowwiseParallel)):
        return style
    hd = need["unit"]
    chunks = need.get("chunks")
    right = f"ColwiseParallel(unit={hd}, chunks={chunks})" if chunks is not None else f"RowwiseParallel(unit={hd})"
    where = (f"parallelize_module: plan[{key!r}] on {name!r} ({type(parent).__name__}.{attr}, "
             f"head_dim {hd}{', fused q|k|v' if chunks else ''})")
    if isinstance(style, ColwiseParallel) != (chunks is not None):
        raise ValueError(f"{where}: {type(parent).__name__} needs its fused qkv column-parallel and its out_proj "
                         f"(which joins the heads) row-parallel; use {right}")
    if chunks is not None and style.chunks is not None and style.chunks != chunks:
        raise ValueError(f"{where}: chunks={style.chunks} would give one rank all of q and part of k; the "
                         f"output is {chunks} blocks split one by one: use {right} (or leave chunks= unset)")
    if style.unit is not None and (style.unit < 1 or style.unit % hd):
        raise ValueError(f"{where}: unit={style.unit} would split a head across ranks; unit= must be a multiple "
                         f"of {hd}: use {right} (or leave unit= unset)")
    fields = {"unit": hd if style.unit is None else style.unit}
    if chunks is not None:
        fields["chunks"] = chunks
    return replace(style, **fields)


def _matches(name: str, pattern: str) -> bool:
    parts, pats = name.split("."), pattern.split(".")
    return len(parts) == len(pats) and all(fnmatchcase(p, q) for p, q in zip(parts, pats))


def parallelize_module(module: Module, group: ProcessGroup, plan: ParallelStyle | Mapping[str, ParallelStyle], *,
                       src_rank: int | None = 0) -> Module:
    """Replace the Linear layers named in ``plan`` by this rank's tensor-parallel slices of them, in place.

    Every rank of ``group`` calls it with its own copy of the same model and the same plan.

    Arguments:
        module: the model (its Linear layers keep nn.Linear's layout, weight [out, in]).
        group: this rank's ProcessGroup (the tensor-parallel group).
        plan: ``{dotted name or glob: ColwiseParallel() | RowwiseParallel()}``; or one style, applied to
            ``module`` itself (then the new layer is returned: a root cannot be replaced in place).
        src_rank: every converted layer is first broadcast from this rank, so the ranks cannot slice
            different weights (the model must be on the group's device); None: no communication, each
            rank slices its own copy, which the caller guarantees is identical.
    Returns ``module`` (converted), or the new layer for a single style.
    Raises KeyError for a plan entry that matches no module or a module matched twice, TypeError for a
    style applied to a module it cannot shard.
    """
    _check_group(group, "parallelize_module")
    if isinstance(plan, ParallelStyle):
        return plan.apply(module, group, src_rank)
    if not isinstance(plan, Mapping):
        raise TypeError(f"parallelize_module: plan must be a dict of name -> ParallelStyle, got {type(plan).__name__}")
    names = [n for n, _ in module.named_modules() if n]
    chosen: dict[str, tuple[str, ParallelStyle]] = {}
    for key, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: plan[{key!r}] must be a ParallelStyle (ColwiseParallel(), "
                            f"RowwiseParallel()), got {type(style).__name__}")
        hits = [n for n in names if _matches(n, key)]
        if not hits:
            linears = [n for n, m in module.named_modules() if isinstance(m, Linear)]
            raise KeyError(f"parallelize_module: plan entry {key!r} matches no sub-module of {type(module).__name__}; "
                           f"its Linear layers are {linears}")
        for n in hits:
            if n in chosen:
                raise KeyError(f"parallelize_module: {n!r} is matched by plan entries {chosen[n][0]!r} and {key!r}")
            chosen[n] = (key, style)
    # In module order, the same on every rank: the broadcasts of src_rank's weights meet in order.
    for name in (n for n in names if n in chosen):
        *path, attr = name.split(".")
        parent = module
        for p in path:
            parent = parent._modules[p]
        key, style = chosen[name]
        new = _fit(style, parent, attr, name, key).apply(parent._modules[attr], group, src_rank, name)
        parent._modules[attr] = new  # in place: a Sequential keeps its order
    return module
