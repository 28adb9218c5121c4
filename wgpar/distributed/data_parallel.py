"""Data parallelism: DistributedDataParallel (one rank's replica) and DataParallel (single controller).

``DistributedDataParallel`` is written against one rank's ProcessGroup, so it
runs on thread ranks and on processes alike: it broadcasts rank 0's
parameters and buffers once, and its AllReduceSync reduces the gradients in
buckets while backward still runs.

``DataParallel`` is the single-controller convenience for thread ranks: it
replicates a model onto the context's devices, splits each batch along dim 0
as evenly as possible, runs every replica in its rank's thread, and seeds
each rank's backward with its share of the batch (n_r / N) so that the
summed gradient is exactly the gradient of the mean loss over the whole
batch, also when the batch does not divide evenly. Every replica then steps
its own optimizer with the identical gradient, so the replicas stay
identical without a broadcast of weights.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import ops
from ..autograd.grad_mode import no_grad
from ..creation import full
from ..nn.module import Module
from ..nn.parameter import Parameter
from ..tensor import Tensor
from .allreduce import AllReduceSync
from .context import MultiAdapterContext
from .group import ProcessGroup, split_sizes, wait_all


def replicate(module: Module, device) -> Module:
    """A structural copy of ``module`` whose parameters and buffers are new (uninitialised) tensors on
    ``device``; fill them with a broadcast."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = Parameter(Tensor.empty(p.shape, p.dtype, device), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = Tensor.empty(b.shape, b.dtype, device)
    return copy.deepcopy(module, memo)


def batch_sizes(x, world_size: int, what: str) -> list[int]:
    """Rows per rank for the batch ``x`` (a tensor or array whose dim 0 is the batch), first ranks one more."""
    if not isinstance(x, (Tensor, np.ndarray)) or x.ndim == 0:
        got = f"shape {tuple(x.shape)}" if isinstance(x, (Tensor, np.ndarray)) else type(x).__name__
        raise TypeError(f"{what}: the first argument is the batch, a tensor or array whose dim 0 is split over "
                        f"the ranks; got {got}")
    n = x.shape[0]
    if n < world_size:
        raise ValueError(f"{what}: a batch of {n} rows cannot feed {world_size} ranks")
    return split_sizes(n, world_size)


def split_batch(arg, sizes: Sequence[int], what: str) -> list:
    """Per-rank slices of ``arg`` along dim 0 (views: nothing is copied yet), as torch's DataParallel scatters
    every tensor; anything but a tensor or array goes to every rank unchanged.

    A tensor or array whose dim 0 is not the batch size is refused rather than guessed at: split, a table
    of another length would silently give each rank the wrong rows.
    """
    if not isinstance(arg, (Tensor, np.ndarray)):
        return [arg] * len(sizes)
    n = sum(sizes)
    if arg.ndim == 0 or arg.shape[0] != n:
        raise ValueError(f"{what} of shape {tuple(arg.shape)} cannot be split like the batch of {n} rows: every "
                         "tensor or array argument is split along dim 0, which must be the batch size (keep other "
                         "tensors in the module, e.g. as a buffer)")
    bounds = np.cumsum([0, *sizes])
    return [arg[int(bounds[r]):int(bounds[r + 1])] for r in range(len(sizes))]


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


class DataParallel:
    """Data-parallel training of ``module`` over the ranks of a MultiAdapterContext (thread ranks).

    ``dp(x, *rest)`` returns the per-rank outputs (a list, rank order, each on its rank's device).
    ``x`` is the batch: its dim 0 is split as evenly as possible. As in torch's DataParallel, every
    other tensor or array argument is split alike, so its dim 0 must be the batch size too (anything
    else raises a ValueError naming the argument and its shape); other values go to every replica
    unchanged. Compute a loss per rank with ``dp.loss(fn, outputs, *targets)``
    (targets are split the same way), then ``dp.backward(losses)``, then step every replica's optimizer
    (``dp.optimizers(factory)``, ``dp.step(opts)``). ``dp.train_step`` does all of that in one pass.

    Arguments:
        module: the model; it becomes rank 0's replica (moved to rank 0's device if needed).
        context: a MultiAdapterContext.
        bucket_cap_mb: AllReduceSync's bucket size.
    """

    def __init__(self, module: Module, context: MultiAdapterContext, bucket_cap_mb: float = 25) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel wraps a wgpar.nn.Module, got {type(module).__name__}")
        self.context = context
        dev0 = context.devices[0]
        if module.device is not None and module.device is not dev0:
            module.to(dev0)
        replicas = [module] + [replicate(module, d) for d in context.devices[1:]]
        self.ranks: list[DistributedDataParallel] = context.run(
            lambda r: DistributedDataParallel(replicas[r], context.comm(r), bucket_cap_mb, op="sum"))
        self._sizes: list[int] | None = None

    @property
    def replicas(self) -> list[Module]:
        return [d.module for d in self.ranks]

    @property
    def module(self) -> Module:
        return self.ranks[0].module

    @property
    def sync(self) -> AllReduceSync:
        """Rank 0's AllReduceSync (buckets are identical on every rank)."""
        return self.ranks[0].sync

    # -- splitting ------------------------------------------------------------------------
    def _to_rank(self, piece, rank: int):
        """Move one slice to rank ``rank``'s device (called from that rank's thread, so uploads overlap)."""
        dev = self.context.devices[rank]
        if isinstance(piece, Tensor):
            return piece if piece.device is dev else ops.to_device(piece, dev)
        if isinstance(piece, np.ndarray):
            return Tensor.from_numpy(piece, device=dev)
        return piece

    def _check_per_rank(self, items: Sequence, what: str) -> list:
        items = list(items)
        if len(items) != self.context.world_size:
            raise ValueError(f"DataParallel.{what}: needs one per rank ({self.context.world_size}), got {len(items)}")
        return items

    # -- forward / loss / backward --------------------------------------------------------
    def forward(self, x, *rest) -> list:
        sizes = batch_sizes(x, self.context.world_size, "DataParallel")
        args = [split_batch(a, sizes, f"DataParallel: argument {i}") for i, a in enumerate((x, *rest))]
        self._sizes = sizes
        return self.context.run(lambda r, *a: self.ranks[r](*(self._to_rank(p, r) for p in a)), *args)

    __call__ = forward

    def loss(self, fn: Callable, outputs: Sequence, *targets) -> list[Tensor]:
        """Per-rank ``fn(output_r, *targets_r)``; targets are split like the inputs were."""
        if self._sizes is None:
            raise RuntimeError("DataParallel.loss: call forward first")
        args = [split_batch(t, self._sizes, f"DataParallel.loss: target {i}") for i, t in enumerate(targets)]
        return self.context.run(lambda r, out, *a: fn(out, *(self._to_rank(p, r) for p in a)),
                                self._check_per_rank(outputs, "loss"), *args)

    def _backward_rank(self, rank: int, loss: Tensor) -> None:
        if loss.numel() != 1:
            raise ValueError(f"rank {rank}: the loss must be a scalar, got shape {loss.shape}")
        seed = full(loss.shape, self._sizes[rank] / sum(self._sizes), dtype=loss.dtype, device=loss.device)
        loss.backward(seed)
        self.ranks[rank].finish()
        # Every rank finished its backward before any returns: a rank that failed after its buckets were
        # reduced stops the others here, so replicas never step apart.
        self.context.comm(rank).barrier(label="backward")

    def backward(self, losses: Sequence[Tensor]) -> None:
        """Backward on every rank (weighted by its share of the batch), gradients summed across ranks."""
        if self._sizes is None:
            raise RuntimeError("DataParallel.backward: call forward first")
        self.context.run(self._backward_rank, self._check_per_rank(losses, "backward"))

    # -- optimisation ---------------------------------------------------------------------
    def optimizers(self, factory: Callable) -> list:
        """One optimizer per replica: ``factory(replica.parameters())``."""
        return [factory(m.parameters()) for m in self.replicas]

    def step(self, optimizers: Sequence) -> None:
        self.context.run(lambda r, opt: opt.step(), self._check_per_rank(optimizers, "step"))

    def zero_grad(self) -> None:
        for m in self.replicas:
            m.zero_grad()

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Backward passes inside accumulate each rank's gradients locally; the next one outside reduces
        everything accumulated."""
        stack = contextlib.ExitStack()
        for d in self.ranks:
            stack.enter_context(d.no_sync())
        return stack

    def train_step(self, x, y, loss_fn: Callable, optimizers: Sequence) -> Tensor:
        """zero_grad, forward, loss, backward, all-reduce and step, one pass per rank thread.

        Returns the batch's mean loss as a 0-d tensor on rank 0's device.
        """
        optimizers = self._check_per_rank(optimizers, "train_step")
        sizes = batch_sizes(x, self.context.world_size, "DataParallel.train_step")
        xs = split_batch(x, sizes, "DataParallel.train_step: x")
        ys = split_batch(y, sizes, "DataParallel.train_step: target")
        self._sizes = sizes
        total = sum(sizes)

        def work(rank: int, xr, yr, opt):
            xr, yr = self._to_rank(xr, rank), self._to_rank(yr, rank)
            opt.zero_grad()
            loss = loss_fn(self.ranks[rank](xr), yr)
            # The batch's mean loss (each rank's mean weighted by its share, summed over ranks) goes out
            # now: its readback waits only for the forward, so the step ends without draining the GPU
            # and the next step's uploads and recording overlap this one's tail.
            with no_grad():
                share = ops.binary("mul", loss.detach().reshape(()), sizes[rank] / total)
            mean_loss = self.context.comm(rank).all_reduce(share, "sum", async_op=True, label="loss")
            self._backward_rank(rank, loss)
            opt.step()
            return mean_loss.wait()

        return self.context.run(work, xs, ys, optimizers)[0]

    def train(self, mode: bool = True) -> DataParallel:
        for m in self.replicas:
            m.train(mode)
        return self

    def eval(self) -> DataParallel:
        return self.train(False)
