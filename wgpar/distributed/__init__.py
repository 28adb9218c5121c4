"""Training across several adapters: process groups, data parallelism, and the pieces built on them.

Layering (docs/design.md): ``group.py`` defines the ProcessGroup interface and
its Work handles; ``backends/`` implement it (``threads``: ranks are threads of
one process; ``mpi``: ranks are processes started by mpiexec); ``launch.py``
runs a per-rank program on every rank (``run_spmd``, ``init_process_group``);
``single_controller/`` holds MultiAdapterContext (over the threaded backend) and the
one driver under DataParallel, FSDP and PipelineExecutor. The strategies (AllReduceSync,
DistributedDataParallel, the differentiable collectives in ``functional``, ``fsdp/``,
``tensor_parallel/``, ``pipeline/``) use the ProcessGroup interface only, so they run unchanged
on any backend. ``mesh.py``'s DeviceMesh lays a group's ranks on named dims (the sub-groups that
combine those strategies).
"""

from . import fsdp, functional, pipeline
from .allreduce import AllReduceSync
from .backends.mpi import MPIGroup
from .backends.threads import RankWorkers, ThreadGroup, ThreadRank
from .data_parallel import DistributedDataParallel, broadcast_module, replicate
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
from .launch import default_backend, init_process_group, run_spmd
from .mesh import DeviceMesh
from .pipeline import (
    PipelineExecutor,
    PipelineSchedule,
    PipelineStage,
    Schedule,
    ScheduleError,
    pipeline_mesh,
    split_module,
)
from .single_controller import DataParallel, MultiAdapterContext
from .tensor_parallel import (
    MLP,
    CausalSelfAttention,
    ColumnParallelLinear,
    ColwiseParallel,
    GridGroups,
    ParallelCausalSelfAttention,
    ParallelMLP,
    ParallelStyle,
    RowParallelLinear,
    RowwiseParallel,
    parallelize_module,
    tensor_data_grid,
)

DDP = DistributedDataParallel

__all__ = ["ProcessGroup", "Work", "wait_all", "REDUCE_OPS", "run_spmd", "init_process_group", "default_backend",
           "MultiAdapterContext", "ThreadGroup", "ThreadRank", "MPIGroup", "AllReduceSync", "DataParallel",
           "DistributedDataParallel", "DDP", "broadcast_module", "replicate", "split_sizes", "functional",
           "CollectiveError", "CollectiveTimeoutError", "RankError", "RankWorkers", "ColumnParallelLinear",
           "RowParallelLinear", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "parallelize_module", "MLP",
           "ParallelMLP", "CausalSelfAttention", "ParallelCausalSelfAttention", "GridGroups", "tensor_data_grid",
           "pipeline", "PipelineSchedule", "PipelineExecutor", "PipelineStage", "Schedule", "ScheduleError",
           "split_module", "pipeline_mesh",
           "fsdp", "FSDP", "FSDPModule", "fully_shard", "ShardingStrategy", "MixedPrecisionPolicy",
           "OffloadPolicy", "HostSGD", "HostAdam", "HostAdamW", "full_state_dict", "sharded_state_dict",
           "save_sharded_checkpoint", "load_sharded_checkpoint", "DeviceMesh"]
