"""Differentiable collectives: autograd Functions over a ProcessGroup.

Two families, for two ways a loss can depend on the ranks' tensors:

- ``all_reduce``, ``all_gather``, ``reduce_scatter``: every rank computes its own
  loss and the objective is their sum (as in ``torch.distributed.nn``). The
  gradient of a sum over ranks is an all-reduce of the gradients; of a
  gather, the reduce-scatter of the gradients; of a reduce-scatter, the gather.
- Megatron's conjugate pair for tensor parallelism, where one replicated loss
  is computed identically on every rank: ``copy_to_parallel_region`` (f:
  identity forward, all-reduce of the gradient backward) before a
  column-parallel layer, ``reduce_from_parallel_region`` (g: all-reduce
  forward, identity backward) after a row-parallel one, and
  ``gather_from_parallel_region`` / ``scatter_to_parallel_region`` to join or
  split a tensor along a dimension.

Every call is a collective: all ranks of the group must make it, in the same
order, with agreeing shapes (checked).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import ops
from ..autograd.function import Function
from ..tensor import Tensor
from .group import ProcessGroup, check_reduce_op, split_sizes


def _reduced(x: Tensor, group: ProcessGroup, op: str = "sum") -> Tensor:
    return group.all_reduce(ops.clone(x), op)


def _gathered(x: Tensor, group: ProcessGroup, dim: int) -> tuple[Tensor, list[int]]:
    parts = group.all_gather(ops.contiguous(x))
    return ops.cat(parts, dim), [p.shape[dim] for p in parts]


def _own_part(x: Tensor, group: ProcessGroup, dim: int, sizes: list[int]) -> Tensor:
    start = sum(sizes[:group.rank])
    key = (slice(None),) * dim + (slice(start, start + sizes[group.rank]),)
    return ops.contiguous(ops.getitem(x, key))


def _dim(x: Tensor, dim: int) -> int:
    from ..tensor import wrap_dim

    return wrap_dim(dim, x.ndim)


class _AllReduce(Function):
    @staticmethod
    def forward(ctx, x, group, op):
        ctx.group, ctx.op = group, op
        return _reduced(x, group, op)

    @staticmethod
    def backward(ctx, g):
        # d(sum_q L_q)/dx_r = sum_q g_q for a sum, and the mean of the g_q for a mean.
        return _reduced(g, ctx.group, ctx.op), None, None


class _AllGather(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        out, ctx.sizes = _gathered(x, group, dim)
        return out

    @staticmethod
    def backward(ctx, g):
        return _own_part(_reduced(g, ctx.group), ctx.group, ctx.dim, ctx.sizes), None, None


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        ctx.sizes = split_sizes(x.shape[dim], group.world_size)
        return _own_part(_reduced(x, group), group, dim, ctx.sizes)

    @staticmethod
    def backward(ctx, g):
        return _gathered(g, ctx.group, ctx.dim)[0], None, None


class _CopyToParallel(Function):  # Megatron's f
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.detach()  # a view: identity costs no copy of the activation

    @staticmethod
    def backward(ctx, g):
        return _reduced(g, ctx.group), None


class _ReduceFromParallel(Function):  # Megatron's g
    @staticmethod
    def forward(ctx, x, group):
        return _reduced(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromParallel(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        out, ctx.sizes = _gathered(x, group, dim)
        return out

    @staticmethod
    def backward(ctx, g):
        return _own_part(g, ctx.group, ctx.dim, ctx.sizes), None, None


class _ScatterToParallel(Function):
    @staticmethod
    def forward(ctx, x, group, dim, sizes):
        ctx.group, ctx.dim = group, dim
        return _own_part(x, group, dim, sizes)

    @staticmethod
    def backward(ctx, g):
        return _gathered(g, ctx.group, ctx.dim)[0], None, None, None


def all_reduce(x: Tensor, group: ProcessGroup, op: str = "sum") -> Tensor:
    """A new tensor: ``x`` reduced over the ranks (sum or mean). Backward: the gradients all-reduced
    the same way (each rank's loss counts; the objective is their sum)."""
    op = check_reduce_op(op, "all_reduce")
    if op not in ("sum", "mean"):
        raise ValueError(f"differentiable all_reduce supports sum and mean, got {op!r}")
    return _AllReduce.apply(x, group, op)


def all_gather(x: Tensor, group: ProcessGroup, dim: int = 0) -> Tensor:
    """Every rank's ``x`` concatenated along ``dim`` (sizes along dim may differ). Backward: the
    gradient reduced over ranks, each rank keeping its own part."""
    return _AllGather.apply(x, group, _dim(x, dim))


def reduce_scatter(x: Tensor, group: ProcessGroup, dim: int = 0) -> Tensor:
    """``x`` summed over ranks, each rank keeping its part of ``dim`` (split as evenly as possible).
    Backward: the parts' gradients gathered."""
    return _ReduceScatter.apply(x, group, _dim(x, dim))


def copy_to_parallel_region(x: Tensor, group: ProcessGroup) -> Tensor:
    """Megatron's f: identity forward; backward all-reduces (sums) the gradient over the ranks."""
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel_region(x: Tensor, group: ProcessGroup) -> Tensor:
    """Megatron's g: all-reduce (sum) forward; identity backward (the loss is replicated)."""
    return _ReduceFromParallel.apply(x, group)


def gather_from_parallel_region(x: Tensor, group: ProcessGroup, dim: int = -1) -> Tensor:
    """All ranks' parts joined along ``dim``; backward keeps this rank's part of the gradient."""
    return _GatherFromParallel.apply(x, group, _dim(x, dim))


def scatter_to_parallel_region(x: Tensor, group: ProcessGroup, dim: int = -1,
                               sizes: Sequence[int] | None = None) -> Tensor:
    """This rank's part of ``x`` along ``dim``; backward gathers.

    Arguments:
        x: the same tensor on every rank.
        group: this rank's ProcessGroup.
        dim: the dimension to split.
        sizes: each rank's part (summing to ``x.shape[dim]``); default: as evenly as possible, the
            first ranks one more (``split_sizes``).
    """
    d = _dim(x, dim)
    n = x.shape[d]
    if sizes is None:
        sizes = split_sizes(n, group.world_size)
    else:
        sizes = [int(s) for s in sizes]
        if len(sizes) != group.world_size or min(sizes) < 0 or sum(sizes) != n:
            raise ValueError(f"scatter_to_parallel_region on rank {group.rank}: sizes {sizes} do not split dim {d} "
                             f"of shape {x.shape} ({n}) over {group.world_size} ranks")
    return _ScatterToParallel.apply(x, group, d, sizes)


__all__ = ["all_reduce", "all_gather", "reduce_scatter", "copy_to_parallel_region", "reduce_from_parallel_region",
           "gather_from_parallel_region", "scatter_to_parallel_region"]
