"""Column- and row-parallel linear layers (Megatron-LM), on one rank's ProcessGroup.

Both keep nn.Linear's layout, weight [out_features, in_features]:

- ColumnParallelLinear holds rows of the weight (a slice of the outputs). Its
  input passes Megatron's f (identity forward, all-reduce of the gradient in
  backward: every rank's slice contributes to the input's gradient); its
  output is this rank's slice, or, with ``gather_output``, all slices joined.
- RowParallelLinear holds columns (a slice of the inputs). Each rank's
  partial product is SUMMED over ranks by g (all-reduce forward, identity
  backward), then the bias, replicated on every rank, is added once.

Column then row (an MLP, or attention's projections) costs one all-reduce in
forward and one in backward. Uneven splits are allowed: the first ranks get
one more unit (``sharding.shard_sizes``); every rank must get at least one.
"""

from __future__ import annotations

import math

from ... import creation
from ... import dtypes as _dt
from ...amp.grad_scaler import MODEL_GROUP_ATTR
from ...autograd.differentiable import cat, getitem
from ...autograd.grad_mode import no_grad
from ...nn import functional as F
from ...nn import init
from ...nn.layers import Linear
from ...nn.module import Module
from ...nn.parameter import Parameter
from ...tensor import Tensor
from ..functional import (
    copy_to_parallel_region,
    gather_from_parallel_region,
    reduce_from_parallel_region,
    scatter_to_parallel_region,
)
from ..group import ProcessGroup
from .sharding import shard_ranges, shard_sizes, take_shard


def _check_group(group, what: str) -> ProcessGroup:
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{what} needs this rank's ProcessGroup, got {type(group).__name__}")
    return group


def _check_input(x: Tensor, n: int, layer: Module, what: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{type(layer).__name__}: expected a wgpar.Tensor, got {type(x).__name__}")
    if x.ndim < 1 or x.shape[-1] != n:
        raise ValueError(f"{type(layer).__name__} on rank {layer.group.rank}: input of shape {x.shape} does not end "
                         f"in {what} ({n})")


def _sync_dense(linear: Linear, group: ProcessGroup, src_rank: int | None, label: str) -> None:
    """Overwrite ``linear``'s weights with rank ``src_rank``'s, so that every rank slices the same tensor."""
    if not isinstance(linear, Linear):
        raise TypeError(f"{label}: expected an nn.Linear to shard, got {type(linear).__name__}")
    if src_rank is None:
        return
    for name, p in (("weight", linear.weight), ("bias", linear.bias)):
        if p is None:
            continue
        if p.device is not group.device:
            raise ValueError(f"{label}.{name} on rank {group.rank} is on {p.device}, but the group's device is "
                             f"{group.device}: move the model there first, or pass src_rank=None to slice each "
                             "rank's own copy without a broadcast")
        with no_grad():
            group.broadcast(p, src_rank, label=f"{label}.{name}")


def _param(t: Tensor, like: Tensor) -> Parameter:
    return Parameter(t, like.requires_grad)


def _record_group(layer: Module) -> Module:
    """Record the group on the layer's parameters: a GradScaler then makes every rank skip when one rank's
    slice saw an inf (the ranks hold different slices of one model)."""
    for p in layer.parameters():
        setattr(p, MODEL_GROUP_ATTR, layer.group)
    return layer


class ColumnParallelLinear(Module):
    """A Linear whose weight [out_features, in_features] is split on the output dim across the group's ranks.

    ``y_r = x @ W_r.T + b_r``: this rank's slice of the outputs; with ``gather_output`` every rank
    returns the full output (all slices joined, in order). Fresh weights are drawn like nn.Linear's
    (uniform, bound 1/sqrt(in_features)) independently on each rank; to shard a trained Linear use
    ``from_linear`` (or ``parallelize_module``).

    Arguments:
        in_features, out_features: the full layer's sizes.
        group: this rank's ProcessGroup (every rank of it constructs its own slice).
        bias: whether the layer has a bias (sliced like the outputs).
        gather_output: all-gather the outputs (backward keeps this rank's slice of the gradient).
        unit: every rank's slice is a multiple of it (an attention head's width).
        chunks: the outputs are this many equal blocks (a fused q|k|v projection: 3), each split on its
            own; rank r holds its part of every block, in block order.
        device: must be the group's device (default).
        dtype: parameter dtype.
    """

    def __init__(self, in_features: int, out_features: int, group: ProcessGroup, bias: bool = True,
                 gather_output: bool = False, *, unit: int = 1, chunks: int = 1, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        self._setup(in_features, out_features, group, gather_output, unit, chunks, device)
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's init, from the full fan-in
        self.weight = Parameter(creation.empty(self.local_out_features, in_features, dtype=dtype, device=group.device))
        init.uniform_(self.weight, -bound, bound)
        if bias:
            self.bias = Parameter(creation.empty(self.local_out_features, dtype=dtype, device=group.device))
            init.uniform_(self.bias, -bound, bound)
        else:
            self.bias = None
        _record_group(self)

    def _setup(self, in_features: int, out_features: int, group: ProcessGroup, gather_output: bool, unit: int,
               chunks: int, device) -> None:
        _check_group(group, "ColumnParallelLinear")
        if device is not None and device is not group.device:
            raise ValueError(f"ColumnParallelLinear on rank {group.rank}: device {device} is not the group's device "
                             f"{group.device}")
        if in_features < 1 or out_features < 1:
            raise ValueError(f"ColumnParallelLinear needs positive sizes, got in={in_features}, out={out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.group = group
        self.gather_output, self.unit, self.chunks = bool(gather_output), unit, chunks
        what = "ColumnParallelLinear out_features"
        self.ranges = shard_ranges(out_features, group.world_size, group.rank, unit, chunks, what=what)
        # Every rank's slice of one chunk (to put gathered outputs back in order).
        self.sizes = shard_sizes(out_features // chunks, group.world_size, unit, what=what)
        self.local_out_features = chunks * self.sizes[group.rank]

    @classmethod
    def from_linear(cls, linear: Linear, group: ProcessGroup, *, gather_output: bool = False, unit: int = 1,
                    chunks: int = 1, src_rank: int | None = 0, label: str = "linear") -> ColumnParallelLinear:
        """This rank's slice of an existing ``linear`` (every rank passes its own copy of the same layer).

        Arguments:
            linear: the full nn.Linear.
            group, gather_output, unit, chunks: as for the constructor.
            src_rank: first overwrite every rank's copy with this rank's (a broadcast, so ranks can never
                slice different weights; the copy must be on the group's device); None: no broadcast,
                each rank slices its own copy (which may be on any device).
            label: names the layer in errors and in the broadcasts' kinds.
        """
        _sync_dense(linear, group, src_rank, label)
        self = cls.__new__(cls)
        Module.__init__(self)
        self._setup(linear.in_features, linear.out_features, group, gather_output, unit, chunks, None)
        self.weight = _param(take_shard(linear.weight, 0, self.ranges, group.device), linear.weight)
        b = linear.bias
        self.bias = None if b is None else _param(take_shard(b, 0, self.ranges, group.device), b)
        return _record_group(self)

    def forward(self, x: Tensor) -> Tensor:
        _check_input(x, self.in_features, self, "in_features")
        y = F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
        if not self.gather_output:
            return y
        y = gather_from_parallel_region(y, self.group, -1)
        return self._chunks_in_order(y) if self.chunks > 1 else y

    def _chunks_in_order(self, y: Tensor) -> Tensor:
        """Gathered [rank0: c0 c1 .., rank1: c0 c1 ..] -> [c0: rank0 rank1 .., c1: ..] (the full layer's order)."""
        lead = (slice(None),) * (y.ndim - 1)
        starts = [self.chunks * sum(self.sizes[:r]) for r in range(len(self.sizes))]
        pieces = [getitem(y, lead + (slice(starts[r] + c * s, starts[r] + (c + 1) * s),))
                  for c in range(self.chunks) for r, s in enumerate(self.sizes)]
        return cat(pieces, -1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(rank {self.group.rank}: {self.local_out_features}), bias={self.bias is not None}, "
                f"gather_output={self.gather_output}" + (f", chunks={self.chunks}" if self.chunks > 1 else ""))


class RowParallelLinear(Module):
    """A Linear whose weight [out_features, in_features] is split on the input dim across the group's ranks.

    ``y = sum_r x_r @ W_r.T + b``: each rank's partial product is summed over the ranks (all-reduce),
    then the bias, replicated on every rank, is added once. The gradient of the input is this rank's
    slice, exact (the sum's backward is the identity on every rank). A fresh layer draws its weight
    like nn.Linear (bound 1/sqrt(in_features)) and starts its bias at zero (as Megatron-LM does), so
    ranks agree on it without communicating.

    Arguments:
        in_features, out_features: the full layer's sizes.
        group: this rank's ProcessGroup.
        bias: whether the layer has a bias.
        input_is_parallel: the input is already this rank's slice of the last dim (a column-parallel
            layer's output); False: the full input is given and each rank takes its slice.
        unit: every rank's slice of the inputs is a multiple of it (an attention head's width).
        device: must be the group's device (default).
        dtype: parameter dtype.
    """

    def __init__(self, in_features: int, out_features: int, group: ProcessGroup, bias: bool = True,
                 input_is_parallel: bool = True, *, unit: int = 1, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        self._setup(in_features, out_features, group, input_is_parallel, unit, device)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(creation.empty(out_features, self.local_in_features, dtype=dtype, device=group.device))
        init.uniform_(self.weight, -bound, bound)
        self.bias = Parameter(creation.zeros(out_features, dtype=dtype, device=group.device)) if bias else None
        _record_group(self)

    def _setup(self, in_features: int, out_features: int, group: ProcessGroup, input_is_parallel: bool, unit: int,
               device) -> None:
        _check_group(group, "RowParallelLinear")
        if device is not None and device is not group.device:
            raise ValueError(f"RowParallelLinear on rank {group.rank}: device {device} is not the group's device "
                             f"{group.device}")
        if in_features < 1 or out_features < 1:
            raise ValueError(f"RowParallelLinear needs positive sizes, got in={in_features}, out={out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.group = group
        self.input_is_parallel, self.unit = bool(input_is_parallel), unit
        self.sizes = shard_sizes(in_features, group.world_size, unit, what="RowParallelLinear in_features")
        self.ranges = shard_ranges(in_features, group.world_size, group.rank, unit,
                                   what="RowParallelLinear in_features")
        self.local_in_features = self.sizes[group.rank]

    @classmethod
    def from_linear(cls, linear: Linear, group: ProcessGroup, *, input_is_parallel: bool = True, unit: int = 1,
                    src_rank: int | None = 0, label: str = "linear") -> RowParallelLinear:
        """This rank's slice of an existing ``linear``; arguments as for ColumnParallelLinear.from_linear."""
        _sync_dense(linear, group, src_rank, label)
        self = cls.__new__(cls)
        Module.__init__(self)
        self._setup(linear.in_features, linear.out_features, group, input_is_parallel, unit, None)
        self.weight = _param(take_shard(linear.weight, 1, self.ranges, group.device), linear.weight)
        b = linear.bias
        self.bias = None if b is None else _param(take_shard(b, 0, [(0, b.shape[0])], group.device), b)
        return _record_group(self)

    def forward(self, x: Tensor) -> Tensor:
        if self.input_is_parallel:
            _check_input(x, self.local_in_features, self, f"rank {self.group.rank}'s slice of in_features")
        else:
            _check_input(x, self.in_features, self, "in_features")
            x = scatter_to_parallel_region(x, self.group, -1, self.sizes)
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (rank {self.group.rank}: {self.local_in_features}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")
