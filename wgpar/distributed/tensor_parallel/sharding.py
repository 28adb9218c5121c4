"""How a dimension is split across tensor-parallel ranks, and taking one rank's slice of a full tensor.

A dimension of ``n`` is split into ``world`` parts as evenly as possible, the
first ranks one more (``split_sizes``), in multiples of ``unit`` (an attention
head's width, so no head is cut). ``chunks > 1`` splits each of ``chunks``
equal blocks on its own (a fused q|k|v projection): rank r holds its part of
every block, blocks in order.
"""

from __future__ import annotations

from ...autograd.differentiable import cat, contiguous, getitem
from ...autograd.grad_mode import no_grad
from ...tensor import Tensor
from ..group import split_sizes


def shard_sizes(n: int, world: int, unit: int = 1, *, what: str = "dimension") -> list[int]:
    """Each rank's part of ``n`` (a multiple of ``unit``), as even as possible, the first ranks one more unit.

    Arguments:
        n: the size to split.
        world: the number of ranks.
        unit: the granularity (every part is a multiple of it).
        what: names the dimension in errors.
    Raises ValueError when ``n`` is not a multiple of ``unit`` or a rank would get nothing.
    """
    if unit < 1 or n % unit:
        raise ValueError(f"{what} of {n} is not a multiple of the unit {unit}")
    units = n // unit
    if units < world:
        raise ValueError(f"{what} of {n} ({units} units of {unit}) cannot be split over {world} ranks: every rank "
                         "needs at least one unit")
    return [s * unit for s in split_sizes(units, world)]


def shard_ranges(n: int, world: int, rank: int, unit: int = 1, chunks: int = 1, *,
                 what: str = "dimension") -> list[tuple[int, int]]:
    """The ``[start, stop)`` ranges of ``n`` that ``rank`` holds, one per chunk."""
    if chunks < 1 or n % chunks:
        raise ValueError(f"{what} of {n} does not divide into {chunks} equal chunks")
    block = n // chunks
    sizes = shard_sizes(block, world, unit, what=f"{what} ({'per chunk' if chunks > 1 else 'whole'})")
    start = sum(sizes[:rank])
    return [(c * block + start, c * block + start + sizes[rank]) for c in range(chunks)]


def take_shard(t: Tensor, dim: int, ranges: list[tuple[int, int]], device) -> Tensor:
    """A new contiguous tensor on ``device``: ``t``'s elements in ``ranges`` along ``dim``, joined in order."""
    with no_grad():
        lead = (slice(None),) * dim
        parts = [getitem(t, lead + (slice(lo, hi),)) for lo, hi in ranges]
        out = contiguous(parts[0]) if len(parts) == 1 else cat(parts, dim)
        if out._storage is t._storage:  # a slice covering the whole tensor is still a view of it
            out = out.clone()
        return out.to(device)
