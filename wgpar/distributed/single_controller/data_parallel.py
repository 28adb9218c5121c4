"""DataParallel: data-parallel training driven from one thread (the single-controller form of
DistributedDataParallel).

It replicates a model onto the context's devices, splits each batch along dim 0 as evenly as possible,
runs every replica in its rank's thread, and seeds each rank's backward with its share of the batch
(n_r / N) so that the summed gradient is exactly the gradient of the mean loss over the whole batch,
also when the batch does not divide evenly. Every replica then steps its own optimizer with the
identical gradient, so the replicas stay identical without a broadcast of weights.
"""

from __future__ import annotations

import contextlib

from ...nn.module import Module
from ...nn.utils import clip_grad_norm_
from ..allreduce import AllReduceSync
from ..data_parallel import DistributedDataParallel, replicate
from .context import MultiAdapterContext
from .driver import DataDriver


class DataParallel(DataDriver):
    """Data-parallel training of ``module`` over the ranks of a MultiAdapterContext (thread ranks).

    ``dp(x, *rest)`` returns the per-rank outputs (a list, rank order, each on its rank's device).
    ``x`` is the batch: its dim 0 is split as evenly as possible. As in torch's DataParallel, every
    other tensor or array argument is split alike, so its dim 0 must be the batch size too (anything
    else raises a ValueError naming the argument and its shape); other values go to every replica
    unchanged. Compute a loss per rank with ``dp.loss(fn, outputs, *targets)``
    (targets are split the same way), then ``dp.backward(losses)``, then step every replica's optimizer
    (``dp.optimizers(factory)``, ``dp.step(opts)``). ``dp.train_step`` does all of that in one pass
    (with accumulation, AMP and clipping: see ``Driver.train_step``).

    Arguments:
        module: the model; it becomes rank 0's replica (moved to rank 0's device if needed).
        context: a MultiAdapterContext.
        bucket_cap_mb: AllReduceSync's bucket size.
    """

    def __init__(self, module: Module, context: MultiAdapterContext, bucket_cap_mb: float = 25) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel wraps a wgpar.nn.Module, got {type(module).__name__}")
        super().__init__(context)
        dev0 = context.devices[0]
        if module.device is not None and module.device is not dev0:
            module.to(dev0)
        replicas = [module] + [replicate(module, d) for d in context.devices[1:]]
        self.ranks: list[DistributedDataParallel] = context.run(
            lambda r: DistributedDataParallel(replicas[r], context.comm(r), bucket_cap_mb, op="sum"))
        self.modules = self.ranks

    @property
    def replicas(self) -> list[Module]:
        """Every rank's copy of the module, in rank order."""
        return [d.module for d in self.ranks]

    @property
    def module(self) -> Module:
        """Rank 0's copy of the module (like ``torch.nn.DataParallel.module``)."""
        return self.ranks[0].module

    @property
    def sync(self) -> AllReduceSync:
        """Rank 0's AllReduceSync (buckets are identical on every rank)."""
        return self.ranks[0].sync

    def _parameters(self, rank: int):
        return self.replicas[rank].parameters()

    def _rank_no_sync(self, rank: int) -> contextlib.AbstractContextManager:
        return self.ranks[rank].no_sync()

    def _end_backward(self, rank: int) -> None:
        self.ranks[rank].finish()

    def _clip(self, rank: int, max_norm: float) -> None:
        clip_grad_norm_(self.replicas[rank].parameters(), max_norm)  # replicated gradients: no communication

    def zero_grad(self) -> None:
        """``zero_grad()`` on every replica."""
        for m in self.replicas:
            m.zero_grad()
