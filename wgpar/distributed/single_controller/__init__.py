"""Single-controller training: one Python thread drives every rank of a MultiAdapterContext.

``context``: MultiAdapterContext (the ranks' threads and their threaded process group). ``driver``:
the one step every strategy runs (split, move, weighted backward, accumulation, AMP, clipping, step).
On it: ``data_parallel`` (DataParallel), ``fsdp`` (FSDP) and ``pipeline`` (PipelineExecutor). The
per-rank (SPMD) strategies they drive live in ``data_parallel.py``, ``fsdp/`` and ``pipeline/``.
"""

from .context import MultiAdapterContext
from .data_parallel import DataParallel
from .driver import DataDriver, Driver, batch_sizes, split_batch, to_device
from .fsdp import FSDP
from .pipeline import PipelineExecutor

__all__ = ["MultiAdapterContext", "Driver", "DataDriver", "DataParallel", "FSDP", "PipelineExecutor",
           "batch_sizes", "split_batch", "to_device"]
