"""A unit's flat all-gather and reduce-scatter over one rank's ProcessGroup, and the copies around them.

One collective per unit: each rank's shards of all the unit's parameters sit in one flat buffer
of ``chunk`` elements (parameter after parameter, each ``per_rank`` rows of its row length), so
``all_gather_into`` leaves rank r's chunk at elements ``[r * chunk, (r + 1) * chunk)`` of the
gathered buffer. A parameter's rows are thus spread over the ranks' chunks: as a view, its
first ``k = rows // per_rank`` ranks' rows are a 3-d block ``(k, per_rank, row)`` with strides
``(chunk, row, 1)``, and the remaining rows sit at the start of rank k's slot. ``row_blocks``
gives these (at most two) pairs of views, and one strided copy kernel per pair moves a parameter
between its full layout and the flat, rank-major one: gather (copy out), reduce-scatter input
(copy in, zero where nothing is written) and initial sharding all use it.

Only ProcessGroup methods are called, so this runs on any backend. Collectives are labelled
``fsdp:<unit>``: a rank that skips or repeats a unit raises a CollectiveError naming it.
"""

from __future__ import annotations

from ... import ops
from ...creation import zeros
from ...tensor import Tensor
from ..group import ProcessGroup, Work
from .param import ShardGeometry

ALIGN = 4  # a chunk is a whole number of 16-byte (float32) / 8-byte (float16) words: no padding copies


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def label(unit: str) -> str:
    return f"fsdp:{unit}"


def row_blocks(geom: ShardGeometry, full: Tensor, flat: Tensor, chunk: int, offset: int, first_rank: int = 0,
               ranks: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """Pairs (view of ``full``, view of ``flat``) holding the same rows of one parameter.

    ``full`` is the parameter (any shape of ``geom.numel`` elements, contiguous); ``flat`` holds
    ``ranks`` chunks of ``chunk`` elements for ranks ``first_rank, first_rank + 1, ...``, this
    parameter's slot at ``offset`` in each. Rows of the ranks outside that range are left out, and
    so are padding rows.
    """
    c, row = geom.per_rank, geom.row
    ranks = geom.world if ranks is None else ranks
    if c == 0 or row == 0:
        return []
    pairs = []
    lo = min(first_rank * c, geom.rows)  # first full-parameter row held by these chunks
    hi = min((first_rank + ranks) * c, geom.rows)
    whole = (hi - lo) // c  # chunks whose c rows are all real
    if whole:
        pairs.append((Tensor(full._storage, (whole, c, row), (c * row, row, 1), full._offset + lo * row),
                      Tensor(flat._storage, (whole, c, row), (chunk, row, 1), flat._offset + offset)))
    rest = hi - lo - whole * c
    if rest:
        pairs.append((Tensor(full._storage, (rest, row), (row, 1), full._offset + (lo + whole * c) * row),
                      Tensor(flat._storage, (rest, row), (row, 1), flat._offset + whole * chunk + offset)))
    return pairs


def copy_rows_out(geom: ShardGeometry, full: Tensor, flat: Tensor, chunk: int, offset: int) -> None:
    """Write the parameter's rows from the gathered rank-major ``flat`` into ``full`` (casting)."""
    for dst, src in row_blocks(geom, full, flat, chunk, offset):
        ops.copy_(dst, src)


def copy_rows_in(geom: ShardGeometry, full: Tensor, flat: Tensor, chunk: int, offset: int, first_rank: int = 0,
                 ranks: int | None = None) -> None:
    """Write the rows of ``full`` that ranks ``first_rank..`` hold into their slots of ``flat`` (casting)."""
    for src, dst in row_blocks(geom, full, flat, chunk, offset, first_rank, ranks):
        ops.copy_(dst, src)


def all_gather(group: ProcessGroup, send: Tensor, unit: str) -> tuple[Work, Tensor]:
    """Start gathering every rank's flat ``send`` (one collective); returns the Work and the output."""
    out = Tensor.empty((group.world_size * send.numel(),), send.dtype, send.device)
    return group.all_gather_into(out, send, async_op=True, label=label(unit)), out


def reduce_scatter(group: ProcessGroup, flat: Tensor, unit: str) -> tuple[Work, Tensor]:
    """Start summing the ranks' rank-major ``flat`` gradients; this rank receives its own chunk."""
    out = Tensor.empty((flat.numel() // group.world_size,), flat.dtype, flat.device)
    return group.reduce_scatter_into(out, flat, "sum", async_op=True, label=label(unit)), out


def all_reduce(group: ProcessGroup, flat: Tensor, unit: str) -> Work:
    """Start summing ``flat`` over the ranks, in place (replicated parameters, HYBRID_SHARD's second step)."""
    return group.all_reduce(flat, "sum", async_op=True, label=label(unit))


def flat_zeros(numel: int, dtype, device) -> Tensor:
    return zeros(numel, dtype=dtype, device=device)


def flat_empty(numel: int, dtype, device) -> Tensor:
    return Tensor.empty((numel,), dtype, device)
