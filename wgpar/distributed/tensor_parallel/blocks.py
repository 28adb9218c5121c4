"""Tensor-parallel transformer blocks: the MLP and causal self-attention split across ranks.

The dense blocks live in wgpar.nn (``nn.MLP``, ``nn.CausalSelfAttention``, re-exported here). Each
tensor-parallel block is its dense block with the plan of ``tp_plan(block)`` applied: same
attributes, same forward, same state_dict names (holding this rank's slices), so a trained ``MLP``
becomes a ``ParallelMLP`` with ``ParallelMLP.from_dense(mlp, group)``. Attention splits whole heads
across ranks (q|k|v column-parallel in units of a head, the output projection row-parallel); its
forward finds the number of local heads from the projection's width, which is what lets one forward
serve both.
"""

from __future__ import annotations

from collections import OrderedDict

from ... import dtypes as _dt
from ...nn.attention import CausalSelfAttention
from ...nn.layers import GELU, MLP
from ...nn.module import Module
from ..group import ProcessGroup
from .layers import ColumnParallelLinear, RowParallelLinear
from .plan import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module


def _from_dense(cls, dense: Module, group: ProcessGroup, src_rank: int | None) -> Module:
    """A ``cls`` sharing ``dense``'s attributes and sub-modules, then its plan applied (``dense`` keeps its
    own layers; with ``src_rank`` their weights are first overwritten with that rank's)."""
    base = cls.__mro__[1]
    if not isinstance(dense, base):
        raise TypeError(f"{cls.__name__}.from_dense needs a {base.__name__}, got {type(dense).__name__}")
    new = cls.__new__(cls)
    new.__dict__.update(dense.__dict__)
    for store in ("_parameters", "_buffers", "_modules"):
        new.__dict__[store] = OrderedDict(dense.__dict__[store])
    return parallelize_module(new, group, tp_plan(dense), src_rank=src_rank)


def tp_plan(block: Module) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of a dense block: for ``MLP`` fc1 column-parallel and fc2 row-parallel (one
    all-reduce in forward, one in backward); for ``CausalSelfAttention`` whole heads per rank (q|k|v
    column-parallel in units of a head, out_proj row-parallel)."""
    if isinstance(block, MLP):
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if isinstance(block, CausalSelfAttention):
        return {"qkv": ColwiseParallel(unit=block.head_dim, chunks=3),
                "out_proj": RowwiseParallel(unit=block.head_dim)}
    raise TypeError(f"tp_plan: no tensor-parallel plan for a {type(block).__name__}")


class ParallelMLP(MLP):
    """MLP split across ``group``'s ranks: fc1 column-parallel (this rank's slice of the hidden units),
    fc2 row-parallel (partial outputs summed). Input and output are replicated on every rank.

    Arguments:
        d_model, hidden, bias, activation, dtype: as for MLP (hidden need not divide by the ranks).
        group: this rank's ProcessGroup (every rank constructs its own slice).
    """

    def __init__(self, d_model: int, hidden: int, group: ProcessGroup, bias: bool = True,
                 activation: Module | None = None, dtype=_dt.float32) -> None:
        Module.__init__(self)
        self.fc1 = ColumnParallelLinear(d_model, hidden, group, bias, dtype=dtype)
        self.act = activation if activation is not None else GELU()
        self.fc2 = RowParallelLinear(hidden, d_model, group, bias, dtype=dtype)

    @classmethod
    def from_dense(cls, mlp: MLP, group: ProcessGroup, src_rank: int | None = 0) -> ParallelMLP:
        """This rank's slice of ``mlp`` (every rank passes its copy of the same MLP); see parallelize_module."""
        return _from_dense(cls, mlp, group, src_rank)


class ParallelCausalSelfAttention(CausalSelfAttention):
    """CausalSelfAttention with its heads split across ``group``'s ranks (the first ranks one more head when
    n_heads does not divide; every rank needs one). One all-reduce in forward (after out_proj), one in
    backward (before qkv). Input and output are replicated on every rank.

    Arguments:
        d_model, n_heads, bias, dtype: as for CausalSelfAttention.
        group: this rank's ProcessGroup.
    """

    def __init__(self, d_model: int, n_heads: int, group: ProcessGroup, bias: bool = True,
                 dtype=_dt.float32) -> None:
        Module.__init__(self)
        self._setup(d_model, n_heads)
        hd = self.head_dim
        self.qkv = ColumnParallelLinear(d_model, 3 * d_model, group, bias, unit=hd, chunks=3, dtype=dtype)
        self.out_proj = RowParallelLinear(d_model, d_model, group, bias, unit=hd, dtype=dtype)

    @property
    def local_heads(self) -> int:
        """The number of attention heads on this rank."""
        return self.out_proj.local_in_features // self.head_dim

    @classmethod
    def from_dense(cls, attn: CausalSelfAttention, group: ProcessGroup,
                   src_rank: int | None = 0) -> ParallelCausalSelfAttention:
        """This rank's heads of ``attn`` (every rank passes its copy of the same block); see parallelize_module."""
        return _from_dense(cls, attn, group, src_rank)
