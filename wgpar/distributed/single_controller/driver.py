"""The one single-controller driver: what DataParallel, FSDP and PipelineExecutor share.

The driver thread holds a wrapper; each part of a step is handed to the ranks' threads with
``MultiAdapterContext.run``. ``Driver.train_step`` is the step every strategy runs, in this order on
each rank: zero_grad; per micro-batch (``accumulate``), under autocast, forward, loss and a backward
seeded with the micro-batch's share of the whole batch times the loss scale (communication deferred
with ``no_sync`` until the last); the batch's mean loss all-reduced, launched before the last
backward; the user's ``after_backward``; unscale (one GradScaler for every rank: ranks holding
different parts of a model agree on skipping through the group recorded on their parameters); clip
over the whole model; step. A strategy fills in how a rank runs a micro-batch and how it clips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np

from ... import ops
from ...autograd.autocast_mode import autocast as _autocast
from ...autograd.grad_mode import no_grad
from ...creation import full
from ...tensor import Tensor
from ..group import split_sizes
from .context import MultiAdapterContext


def to_device(value, device):
    """``value`` on ``device``: a tensor moved, an array uploaded, anything else unchanged (called from the
    rank's own thread, so the ranks' uploads overlap)."""
    if isinstance(value, Tensor):
        return value if value.device is device else ops.to_device(value, device)
    if isinstance(value, np.ndarray):
        return Tensor.from_numpy(value, device=device)
    return value


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


class Driver:
    """Single-controller training over ``context``'s ranks; subclasses say how a rank trains on a micro-batch.

    ``modules`` holds the models (per rank, or per stage); ``train_step`` is the whole step."""

    label = ""  # prefix of the driver's collective labels
    modules: list

    def __init__(self, context: MultiAdapterContext) -> None:
        self.context = context

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self.context.world_size

    def _per_rank(self, items: Sequence, what: str) -> list:
        items = list(items)
        if len(items) != self.world_size:
            raise ValueError(f"{type(self).__name__}.{what}: needs one per rank ({self.world_size}), got {len(items)}")
        return items

    def _run(self, fn: Callable, *per_rank) -> list:
        return self.context.run(fn, *per_rank)

    # -- what a strategy fills in ------------------------------------------------------------
    def _parameters(self, rank: int):
        return self.modules[rank].parameters()

    def _rank_no_sync(self, rank: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def _micro_batches(self, x, y, accumulate: int) -> list[list[tuple]]:
        """Per rank, its (x, y, weight) of each micro-batch; the weights of all ranks sum to 1."""
        raise NotImplementedError

    def _accumulate(self, rank: int, micro: list[tuple], loss_fn: Callable, scale: float, amp: bool):
        """Forward and backward of this rank's micro-batches; returns what ``_result`` reads the loss from."""
        raise NotImplementedError

    def _result(self, per_rank: list) -> Tensor:
        return per_rank[0].wait()

    def _clip(self, rank: int, max_norm: float) -> None:
        raise NotImplementedError

    # -- the step ----------------------------------------------------------------------------
    def optimizers(self, factory: Callable) -> list:
        """One optimizer per rank over the parameters it holds: ``factory(parameters)``."""
        return [factory(self._parameters(r)) for r in range(self.world_size)]

    def _train_step(self, x, y, loss_fn: Callable | None, optimizers: Sequence, *, accumulate: int, scaler,
                    autocast: bool, max_norm: float | None, after_backward: Callable[[int], None] | None) -> Tensor:
        optimizers = self._per_rank(optimizers, "train_step")
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise ValueError(f"{type(self).__name__}.train_step: accumulate must be an int >= 1, got {accumulate!r}")
        micro = self._micro_batches(x, y, accumulate)
        scale = scaler.get_scale() if scaler is not None else 1.0

        def work(rank: int, opt, mine):
            opt.zero_grad()
            out = self._accumulate(rank, mine, loss_fn, scale, autocast)
            if after_backward is not None:
                after_backward(rank)
            if scaler is not None and max_norm is not None:
                scaler.unscale_(opt)  # clip the true gradients
            if max_norm is not None:
                self._clip(rank, max_norm)
            scaler.step(opt) if scaler is not None else opt.step()
            return out

        result = self._result(self._run(work, optimizers, micro))
        if scaler is not None:
            scaler.update()
        return result

    def zero_grad(self) -> None:
        """``zero_grad()`` on every rank's module."""
        for m in self.modules:
            m.zero_grad()

    def train(self, mode: bool = True):
        """``train(mode)`` on every rank's module; returns the driver.

        Arguments:
            mode: training (True) or evaluation mode.
        """
        for m in self.modules:
            m.train(mode)
        return self

    def eval(self):
        """``train(False)``: every rank's module in evaluation mode; returns the driver."""
        return self.train(False)


class DataDriver(Driver):
    """A driver whose ranks each hold the whole model (replicated or sharded) and take their share of every
    batch: DataParallel and FSDP. Each rank's backward is seeded with its share n_r / N."""

    _sizes: list[int] | None = None

    def forward(self, x, *rest) -> list:
        """Split the batch along dim 0 over the ranks, run each rank's module on its part (on its device), and
        return the outputs in rank order.

        Arguments:
            x: the batch (a tensor or array); its rows decide the split.
            rest: more arguments, split like ``x``.
        """
        what = type(self).__name__
        sizes = batch_sizes(x, self.world_size, what)
        args = [split_batch(a, sizes, f"{what}: argument {i}") for i, a in enumerate((x, *rest))]
        self._sizes = sizes
        return self._run(lambda r, *a: self.modules[r](*(to_device(p, self.context.devices[r]) for p in a)), *args)

    __call__ = forward

    def loss(self, fn: Callable, outputs: Sequence, *targets) -> list[Tensor]:
        """Per-rank ``fn(output_r, *targets_r)``; targets are split like the inputs were."""
        what = type(self).__name__
        if self._sizes is None:
            raise RuntimeError(f"{what}.loss: call forward first")
        args = [split_batch(t, self._sizes, f"{what}.loss: target {i}") for i, t in enumerate(targets)]
        return self._run(lambda r, out, *a: fn(out, *(to_device(p, self.context.devices[r]) for p in a)),
                         self._per_rank(outputs, "loss"), *args)

    def _backward_rank(self, rank: int, loss: Tensor, weight: float | None = None) -> None:
        if loss.numel() != 1:
            raise ValueError(f"rank {rank}: the loss must be a scalar, got shape {loss.shape}")
        if weight is None:
            weight = self._sizes[rank] / sum(self._sizes)
        loss.backward(full(loss.shape, weight, dtype=loss.dtype, device=loss.device))
        self._end_backward(rank)

    def _end_backward(self, rank: int) -> None:
        """After a backward that communicated: wait for its reductions."""

    def _barrier(self, rank: int) -> None:
        # Every rank finished its backward before any returns: a rank that failed after its gradients were
        # reduced stops the others here, so ranks never step apart.
        self.context.comm(rank).barrier(label=f"{self.label}backward")

    def backward(self, losses: Sequence[Tensor]) -> None:
        """Backward on every rank (weighted by its share of the batch), gradients summed across ranks."""
        if self._sizes is None:
            raise RuntimeError(f"{type(self).__name__}.backward: call forward first")

        def one(rank: int, loss: Tensor) -> None:
            self._backward_rank(rank, loss)
            self._barrier(rank)

        self._run(one, self._per_rank(losses, "backward"))

    def step(self, optimizers: Sequence) -> None:
        """``step()`` of each rank's optimizer, on that rank's thread.

        Arguments:
            optimizers: one optimizer per rank (see ``optimizers``).
        """
        self.context.run(lambda r, opt: opt.step(), self._per_rank(optimizers, "step"))

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Backward passes inside accumulate each rank's gradients locally; the next one outside reduces
        everything accumulated."""
        stack = contextlib.ExitStack()
        for r in range(self.world_size):
            stack.enter_context(self._rank_no_sync(r))
        return stack

    def train_step(self, x, y, loss_fn: Callable, optimizers: Sequence, *, accumulate: int = 1, scaler=None,
                   autocast: bool = False, max_norm: float | None = None,
                   after_backward: Callable[[int], None] | None = None) -> Tensor:
        """One optimizer step on the batch ``x`` (targets ``y``), equal to single-device training on it.

        Arguments:
            x, y: the whole batch and its targets (dim 0 the batch, split over the ranks).
            loss_fn: ``loss_fn(output, y)``, a scalar mean.
            optimizers: one per rank (``optimizers(factory)``).
            accumulate: micro-batches the batch is cut into (as evenly as possible), one backward each,
                communicating only in the last.
            scaler: a GradScaler (one for every rank), or None.
            autocast: run forward and loss under ``wgpar.autocast()`` (float16).
            max_norm: clip the whole model's gradient norm to this (None: no clipping).
            after_backward: ``after_backward(rank)`` on each rank once its gradients are final, before
                unscaling and clipping.

        Returns the batch's mean loss, a 0-d tensor on rank 0's device.
        """
        return self._train_step(x, y, loss_fn, optimizers, accumulate=accumulate, scaler=scaler, autocast=autocast,
                                max_norm=max_norm, after_backward=after_backward)

    def _micro_batches(self, x, y, accumulate: int) -> list[list[tuple]]:
        what = f"{type(self).__name__}.train_step"
        pieces = batch_sizes(x, accumulate, what)
        xs, ys = split_batch(x, pieces, f"{what}: x"), split_batch(y, pieces, f"{what}: target")
        total = sum(pieces)
        per_rank: list[list[tuple]] = [[] for _ in range(self.world_size)]
        for xi, yi in zip(xs, ys):
            sizes = batch_sizes(xi, self.world_size, what)
            for r, (xr, yr) in enumerate(zip(split_batch(xi, sizes, f"{what}: x"),
                                             split_batch(yi, sizes, f"{what}: target"))):
                per_rank[r].append((xr, yr, sizes[r] / total))
        self._sizes = batch_sizes(x, self.world_size, what)
        return per_rank

    def _accumulate(self, rank: int, micro: list[tuple], loss_fn: Callable, scale: float, amp: bool):
        dev, mean = self.context.devices[rank], None
        for i, (xr, yr, weight) in enumerate(micro):
            last = i == len(micro) - 1
            with contextlib.nullcontext() if last else self._rank_no_sync(rank):
                with _autocast(enabled=amp):
                    loss = loss_fn(self.modules[rank](to_device(xr, dev)), to_device(yr, dev))
                with no_grad():
                    share = ops.binary("mul", loss.detach().reshape(()).float(), weight)
                    mean = share if mean is None else ops.binary("add", mean, share)
                if last:
                    # The batch's mean loss goes out now: its readback waits only for the forward, so the
                    # step ends without draining the GPU and the next step's uploads overlap its tail.
                    mean = self.context.comm(rank).all_reduce(mean, "sum", async_op=True, label=f"{self.label}loss")
                self._backward_rank(rank, loss, weight * scale)
        self._barrier(rank)
        return mean
