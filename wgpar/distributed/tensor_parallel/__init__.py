"""Tensor parallelism (Megatron-LM): layers split across the ranks of one ProcessGroup.

``layers.py``: ColumnParallelLinear / RowParallelLinear; ``plan.py``:
parallelize_module with ColwiseParallel / RowwiseParallel styles;
``blocks.py``: the MLP and causal self-attention blocks, single-device and
tensor-parallel; ``grid.py``: tensor x data sub-groups; ``sharding.py``: how
a dimension is split. Written against one rank's ProcessGroup and the
differentiable collectives only, so it runs on any backend.
"""

from .blocks import MLP, CausalSelfAttention, ParallelCausalSelfAttention, ParallelMLP, tp_plan
from .grid import GridGroups, tensor_data_grid
from .layers import ColumnParallelLinear, RowParallelLinear
from .plan import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module
from .sharding import shard_sizes

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelStyle", "ColwiseParallel", "RowwiseParallel",
           "parallelize_module", "MLP", "ParallelMLP", "CausalSelfAttention", "ParallelCausalSelfAttention",
           "GridGroups", "tensor_data_grid", "shard_sizes", "tp_plan"]
