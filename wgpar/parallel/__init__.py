"""Training across several adapters: context, collectives, DataParallel, AllReduceSync.

Everything here reaches other devices only through ``collectives`` (the
``Collectives`` interface), so a multi-process backend can replace the
threaded one.
"""

from .allreduce import AllReduceSync
from .collectives import Collectives, ThreadGroup, ThreadRank, split_sizes
from .context import MultiAdapterContext
from .data_parallel import DataParallel, replicate
from .errors import CollectiveError, CollectiveTimeoutError
from .workers import RankError, RankWorkers

__all__ = ["MultiAdapterContext", "Collectives", "ThreadGroup", "ThreadRank", "AllReduceSync", "DataParallel",
           "replicate", "split_sizes", "CollectiveError", "CollectiveTimeoutError", "RankError", "RankWorkers"]
