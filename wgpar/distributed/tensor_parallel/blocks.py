"""Transformer blocks, on one device and tensor-parallel: the MLP and causal self-attention.

Each tensor-parallel block is its single-device block with the plan of
``tp_plan()`` applied: same attributes, same forward, same state_dict names
(holding this rank's slices), so a trained ``MLP`` becomes a ``ParallelMLP``
with ``ParallelMLP.from_dense(mlp, group)``. Attention splits whole heads
across ranks (q|k|v column-parallel in units of a head, the output projection
row-parallel); its forward finds the number of local heads from the
projection's width, which is what lets one forward serve both.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from ... import dtypes as _dt
from ...autograd.functions import where
from ...nn.layers import GELU, Linear
from ...nn.module import Module
from ...tensor import Tensor
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
    return parallelize_module(new, group, dense.tp_plan(), src_rank=src_rank)


class MLP(Module):
    """The transformer MLP on one device: ``fc2(act(fc1(x)))``, d_model -> hidden -> d_model.

    Arguments:
        d_model: input and output features.
        hidden: the inner width (4 * d_model in GPT-2).
        bias: whether both layers have a bias.
        activation: a parameter-free module (default GELU).
        device, dtype: of the parameters.
    """

    def __init__(self, d_model: int, hidden: int, bias: bool = True, activation: Module | None = None, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, hidden, bias, device=device, dtype=dtype)
        self.act = activation if activation is not None else GELU()
        self.fc2 = Linear(hidden, d_model, bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def tp_plan(self) -> dict[str, ParallelStyle]:
        """fc1 column-parallel, fc2 row-parallel: one all-reduce in forward, one in backward."""
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


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


class CausalSelfAttention(Module):
    """Multi-head causal self-attention on one device (GPT-2's), input and output [batch, seq, d_model].

    A fused projection gives q, k and v (``qkv``: d_model -> 3 * d_model, q|k|v blocks, heads in order
    within each); ``softmax(q k^T / sqrt(head_dim))`` with a causal mask (position i attends to j <= i)
    weights v; ``out_proj`` maps the joined heads back to d_model. Built from matmuls, a mask and
    softmax (no fused attention kernel yet): memory grows with seq^2 per head.

    Arguments:
        d_model: features (a multiple of n_heads).
        n_heads: attention heads.
        bias: whether the projections have biases.
        device, dtype: of the parameters.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        self._setup(d_model, n_heads)
        self.qkv = Linear(d_model, 3 * d_model, bias, device=device, dtype=dtype)
        self.out_proj = Linear(d_model, d_model, bias, device=device, dtype=dtype)

    def _setup(self, d_model: int, n_heads: int) -> None:
        if n_heads < 1 or d_model < 1 or d_model % n_heads:
            raise ValueError(f"attention: d_model {d_model} is not a positive multiple of n_heads {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self._masks: dict = {}

    def _mask(self, t: int, device) -> Tensor:
        key = (t, device)
        if key not in self._masks:
            self._masks = {key: Tensor.from_numpy(np.tril(np.ones((t, t), dtype=bool)), device=device)}
        return self._masks[key]

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.d_model:
            shape = x.shape if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__}: expected input [batch, seq, {self.d_model}], got {shape}")
        b, t, _ = x.shape
        qkv = self.qkv(x)
        width = qkv.shape[-1] // 3  # local heads x head_dim: all heads on one device, this rank's under TP
        hd = self.head_dim
        q, k, v = (qkv[..., i * width:(i + 1) * width].reshape(b, t, -1, hd).transpose(1, 2) for i in range(3))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # [b, heads, t, t]
        weights = where(self._mask(t, x.device), scores, float("-inf")).softmax(-1)
        y = (weights @ v).transpose(1, 2).reshape(b, t, width)
        return self.out_proj(y)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        """Whole heads per rank: q|k|v column-parallel in units of a head, out_proj row-parallel."""
        return {"qkv": ColwiseParallel(unit=self.head_dim, chunks=3), "out_proj": RowwiseParallel(unit=self.head_dim)}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"


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
        return self.out_proj.local_in_features // self.head_dim

    @classmethod
    def from_dense(cls, attn: CausalSelfAttention, group: ProcessGroup,
                   src_rank: int | None = 0) -> ParallelCausalSelfAttention:
        """This rank's heads of ``attn`` (every rank passes its copy of the same block); see parallelize_module."""
        return _from_dense(cls, attn, group, src_rank)
