"""Training across several adapters: process groups, data parallelism, and the pieces built on them.

Layering (docs/design.md): ``group.py`` defines the ProcessGroup interface and
its Work handles; ``backends/`` implement it (``threads``: ranks are threads of
one process); ``launch.py`` runs a per-rank program on every rank
(``run_spmd``); ``context.py`` is the single-controller MultiAdapterContext
over the threaded backend. Everything above (AllReduceSync, DataParallel,
the differentiable collectives in ``functional``, FSDP in ``fsdp/``) uses the
ProcessGroup interface only, so it runs unchanged on any backend.
"""

from . import fsdp, functional
from .allreduce import AllReduceSync
from .backends.threads import ThreadGroup, ThreadRank
from .context import MultiAdapterContext
from .data_parallel import DataParallel, DistributedDataParallel, broadcast_module, replicate
from .errors import CollectiveError, CollectiveTimeoutError, RankError
from .fsdp import (
    FSDP,
    FSDPModule,
    HostAdam,
    HostAdamW,
    HostSGD,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    full_state_dict,
    fully_shard,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
    sharded_state_dict,
)
from .group import REDUCE_OPS, ProcessGroup, Work, split_sizes, wait_all
from .launch import RankWorkers, run_spmd

DDP = DistributedDataParallel

__all__ = ["ProcessGroup", "Work", "wait_all", "REDUCE_OPS", "run_spmd", "MultiAdapterContext", "ThreadGroup",
           "ThreadRank", "AllReduceSync", "DataParallel", "DistributedDataParallel", "DDP", "broadcast_module",
           "replicate", "split_sizes", "functional", "CollectiveError", "CollectiveTimeoutError", "RankError",
           "RankWorkers", "fsdp", "FSDP", "FSDPModule", "fully_shard", "ShardingStrategy", "MixedPrecisionPolicy",
           "OffloadPolicy", "HostSGD", "HostAdam", "HostAdamW", "full_state_dict", "sharded_state_dict",
           "save_sharded_checkpoint", "load_sharded_checkpoint"]
