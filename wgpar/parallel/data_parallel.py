"""DataParallel: one replica per rank, the batch split along dim 0, gradients all-reduced.

Unlike rumus's, it trains: forward runs each replica in its rank's thread and
records that thread's graph; ``backward`` runs each rank's backward in the
same thread, seeded with that rank's share of the batch (n_r / N), and
AllReduceSync sums the gradients while backward is still running. For losses
that are means over their shard (PyTorch's default reduction) the summed
gradient is exactly the gradient of the mean loss over the whole batch, also
when the batch does not divide evenly.

Every replica then steps its own optimizer with the identical reduced
gradient, so all replicas stay identical without a broadcast of weights
(cheaper than stepping on rank 0 and broadcasting every parameter, which
moves the whole model through the host each step).
"""

from __future__ import annotations

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
from .collectives import split_sizes
from .context import MultiAdapterContext


def replicate(module: Module, device) -> Module:
    """A structural copy of ``module`` whose parameters and buffers are new (uninitialised) tensors on
    ``device``; fill them with a broadcast."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = Parameter(Tensor.empty(p.shape, p.dtype, device), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = Tensor.empty(b.shape, b.dtype, device)
    return copy.deepcopy(module, memo)


class DataParallel:
    """Data-parallel training of ``module`` over the ranks of ``context``.

    ``dp(x, *rest)`` returns the per-rank outputs (a list, rank order, each on its rank's device):
    arrays and tensors whose first dim is the batch are split as evenly as possible, anything else
    is passed to every replica unchanged. Compute a loss per rank with ``dp.loss(fn, outputs, *targets)``
    (targets are split the same way), then ``dp.backward(losses)``, then step every replica's optimizer
    (``dp.optimizers(factory)``). ``dp.train_step`` does all of that in one pass over the ranks.

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
        self.replicas: list[Module] = [module] + [replicate(module, d) for d in context.devices[1:]]
        self.sync = AllReduceSync(context, bucket_cap_mb, op="sum")
        self._sizes: list[int] | None = None

        def setup(rank: int) -> None:
            comm = context.comm(rank)
            with no_grad():
                for t in list(self.replicas[rank].parameters()) + list(self.replicas[rank].buffers()):
                    comm.broadcast(t, src=0)
            self.sync.register(rank, list(self.replicas[rank].parameters()))

        context.run(setup)

    @property
    def module(self) -> Module:
        return self.replicas[0]

    # -- splitting ------------------------------------------------------------------------
    def scatter(self, arg, sizes: Sequence[int]) -> list:
        """Split one argument along dim 0 into per-rank pieces on each rank's device."""
        return [self._to_rank(piece, r) for r, piece in enumerate(self._split(arg, sizes))]

    @staticmethod
    def _split(arg, sizes: Sequence[int]) -> list:
        """Per-rank slices along dim 0 (views: nothing is copied yet); non-batch args are repeated."""
        if not isinstance(arg, (Tensor, np.ndarray)):
            return [arg] * len(sizes)
        bounds = np.cumsum([0, *sizes])
        return [arg[int(bounds[r]):int(bounds[r + 1])] for r in range(len(sizes))]

    def _to_rank(self, piece, rank: int):
        """Move one slice to rank ``rank``'s device (called from that rank's thread, so uploads overlap)."""
        dev = self.context.devices[rank]
        if isinstance(piece, Tensor):
            return piece if piece.device is dev else ops.to_device(piece, dev)
        if isinstance(piece, np.ndarray):
            return Tensor.from_numpy(piece, device=dev)
        return piece

    def _batch_sizes(self, x) -> list[int]:
        n = len(x)
        if n < self.context.world_size:
            raise ValueError(f"DataParallel: a batch of {n} rows cannot feed {self.context.world_size} ranks")
        return split_sizes(n, self.context.world_size)

    # -- forward / loss / backward --------------------------------------------------------
    def forward(self, x, *rest) -> list:
        sizes = self._batch_sizes(x)
        args = [self._split(a, sizes) for a in (x, *rest)]
        self._sizes = sizes
        return self.context.run(lambda r, *a: self.replicas[r](*(self._to_rank(p, r) for p in a)), *args)

    __call__ = forward

    def loss(self, fn: Callable, outputs: Sequence, *targets) -> list[Tensor]:
        """Per-rank ``fn(output_r, *targets_r)``; targets are split like the inputs were."""
        if self._sizes is None:
            raise RuntimeError("DataParallel.loss: call forward first")
        args = [self._split(t, self._sizes) for t in targets]
        return self.context.run(lambda r, out, *a: fn(out, *(self._to_rank(p, r) for p in a)), outputs, *args)

    def _backward_rank(self, rank: int, loss: Tensor) -> None:
        total = sum(self._sizes)
        seed = full(loss.shape, float(self._sizes[rank]) / total, dtype=loss.dtype, device=loss.device)
        self.sync.prepare(rank)
        loss.backward(seed)
        self.sync.finish(rank)

    def backward(self, losses: Sequence[Tensor]) -> None:
        """Backward on every rank (weighted by its share of the batch), gradients summed across ranks."""
        if self._sizes is None:
            raise RuntimeError("DataParallel.backward: call forward first")
        if len(losses) != self.context.world_size:
            raise ValueError(f"backward needs one loss per rank ({self.context.world_size}), got {len(losses)}")
        for r, loss in enumerate(losses):
            if loss.numel() != 1:
                raise ValueError(f"rank {r}: the loss must be a scalar, got shape {loss.shape}")
        self.context.run(self._backward_rank, list(losses))

    # -- optimisation ---------------------------------------------------------------------
    def optimizers(self, factory: Callable) -> list:
        """One optimizer per replica: ``factory(replica.parameters())``."""
        return [factory(m.parameters()) for m in self.replicas]

    def step(self, optimizers: Sequence) -> None:
        self.context.run(lambda r, opt: opt.step(), list(optimizers))

    def zero_grad(self, optimizers: Sequence | None = None) -> None:
        for m in self.replicas:
            m.zero_grad()

    def train_step(self, x, y, loss_fn: Callable, optimizers: Sequence) -> Tensor:
        """zero_grad, forward, loss, backward, all-reduce and step, one pass per rank thread.

        Returns the batch's mean loss as a 0-d tensor on rank 0's device.
        """
        sizes = self._batch_sizes(x)
        xs, ys = self._split(x, sizes), self._split(y, sizes)
        self._sizes = sizes

        def work(rank: int, xr, yr, opt):
            xr, yr = self._to_rank(xr, rank), self._to_rank(yr, rank)
            opt.zero_grad()
            loss = loss_fn(self.replicas[rank](xr), yr)
            self._backward_rank(rank, loss)
            opt.step()
            return loss.detach()

        losses = self.context.run(work, xs, ys, list(optimizers))
        total = sum(sizes)
        # Combine the per-rank means on the host: one small readback per rank per step.
        value = sum(float(loss.item()) * n for loss, n in zip(losses, sizes)) / total
        return full((), value, dtype=losses[0].dtype, device=self.context.devices[0])

    def train(self, mode: bool = True) -> DataParallel:
        for m in self.replicas:
            m.train(mode)
        return self

    def eval(self) -> DataParallel:
        return self.train(False)
