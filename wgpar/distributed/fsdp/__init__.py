"""Fully sharded data parallelism (FSDP): every rank keeps 1/N of each parameter, gradient and optimizer state.

One role per file, like PyTorch FSDP2's ``_fully_shard/``: ``api.py`` (``fully_shard`` and the
FSDPModule methods), ``policies.py`` (strategies, mixed precision, offload, auto-wrap),
``param.py`` (one sharded parameter), ``param_group.py`` (a unit's gather / reshard /
reduce-scatter lifecycle), ``collectives.py`` (the flat collectives over the ProcessGroup),
``state.py`` (hooks and prefetch), ``sharing.py`` (which unit owns a parameter),
``checkpoint.py`` (full and sharded state dicts and checkpoints), ``offload.py`` (host
optimizers), ``estimate.py`` (memory_estimate); the single-controller FSDP is in single_controller/.
Everything talks to other ranks through one rank's ProcessGroup only. See docs/design.md, FSDP.
"""

from .api import FSDPModule, fully_shard, hybrid_groups
from .checkpoint import (
                         LocalShard,
                         full_state_dict,
                         load_sharded_checkpoint,
                         save_sharded_checkpoint,
                         sharded_state_dict,
)
from .estimate import MemoryEstimate, memory_estimate
from .offload import HostAdam, HostAdamW, HostSGD
from .param import OffloadedShard, ShardedState, ShardGeometry
from .param_group import FSDPParamGroup
from .policies import PERSIST_THRESHOLD, MixedPrecisionPolicy, OffloadPolicy, ShardingStrategy, plan_units

__all__ = ["fully_shard", "FSDP", "FSDPModule", "hybrid_groups", "ShardingStrategy", "MixedPrecisionPolicy",
           "OffloadPolicy", "PERSIST_THRESHOLD", "plan_units", "full_state_dict", "sharded_state_dict",
           "save_sharded_checkpoint", "load_sharded_checkpoint", "LocalShard", "memory_estimate", "MemoryEstimate",
           "HostSGD", "HostAdam", "HostAdamW", "ShardedState", "ShardGeometry", "OffloadedShard", "FSDPParamGroup"]


def __getattr__(name: str):
    # FSDP lives in single_controller/, which imports this package: loaded on first use.
    if name == "FSDP":
        from ..single_controller.fsdp import FSDP

        return FSDP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
