"""Data parallelism: DistributedDataParallel, one rank's replica (DataParallel, the single-controller form,
is in ``single_controller/``).

``DistributedDataParallel`` is written against one rank's ProcessGroup, so it
runs on thread ranks and on processes alike: it broadcasts rank 0's
parameters and buffers once, and its AllReduceSync reduces the gradients in
buckets while backward still runs.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from ..autograd.grad_mode import no_grad
from ..nn.module import Module
from ..nn.parameter import Parameter
from ..tensor import Tensor
from ._moved import moved
from .allreduce import AllReduceSync
from .group import ProcessGroup, wait_all


def replicate(module: Module, device) -> Module:
    """A structural copy of ``module`` whose parameters and buffers are new (uninitialised) tensors on
    ``device``; fill them with a broadcast."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = Parameter(Tensor.empty(p.shape, p.dtype, device), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = Tensor.empty(b.shape, b.dtype, device)
    return copy.deepcopy(module, memo)


def broadcast_module(module: Module, group: ProcessGroup, src: int = 0) -> None:
    """Overwrite every parameter and buffer of ``module`` with rank ``src``'s (all in flight at once)."""
    with no_grad():
        tensors = list(module.parameters()) + list(module.buffers())
        wait_all([group.broadcast(t, src, async_op=True, label=f"param{i}") for i, t in enumerate(tensors)])


class DistributedDataParallel(Module):
    """One rank's replica in data-parallel training (every rank constructs its own, SPMD).

    ``ddp(x)`` runs the replica; when ``loss.backward()`` returns, the gradients are reduced over the
    ranks: averaged with ``op="mean"`` (torch's semantics) or summed with ``op="sum"`` (the bucketed
    all-reduce runs during backward, and the end of backward waits for it).

    Arguments:
        module: this rank's replica, on ``group.device`` (moved there if it is elsewhere).
        group: this rank's ProcessGroup.
        bucket_cap_mb: AllReduceSync's bucket size.
        op: "mean" or "sum".
        broadcast: copy rank 0's parameters and buffers to every rank first (default True).
    """

    def __init__(self, module: Module, group: ProcessGroup, bucket_cap_mb: float = 25, op: str = "mean",
                 broadcast: bool = True) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a wgpar.nn.Module, got {type(module).__name__}")
        super().__init__()
        if module.device is not None and module.device is not group.device:
            module.to(group.device)
        self.module = module
        object.__setattr__(self, "group", group)
        if broadcast:
            broadcast_module(module, group)
        object.__setattr__(self, "sync", AllReduceSync(group, module.parameters(), bucket_cap_mb, op))

    def forward(self, *args, **kwargs):
        self.sync.prepare()
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for the gradient all-reduce of the last backward (backward already does; a no-op then)."""
        self.sync.finish()

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally, without communication, for the backward passes inside."""
        return self.sync.no_sync()


__getattr__ = moved(__name__, "wgpar.distributed.single_controller",
                    ("DataParallel", "batch_sizes", "split_batch"))
