"""Batch normalisation layers: BatchNorm1d and BatchNorm2d (as torch.nn, with running statistics)."""

from __future__ import annotations

from .. import creation
from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter


class _BatchNorm(Module):
    _dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"{type(self).__name__}: num_features must be positive, got {num_features}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be in [0, 1] or None, got {momentum}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(creation.empty(num_features, dtype=dtype, device=device))
            self.bias = Parameter(creation.empty(num_features, dtype=dtype, device=device))
            init.ones_(self.weight)
            init.zeros_(self.bias)
        else:
            self.weight = self.bias = None
        if track_running_stats:
            self.register_buffer("running_mean", creation.zeros(num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", creation.ones(num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", creation.zeros((), dtype=_dt.int32, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batches tracked."""
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1.0)
                self.num_batches_tracked.zero_()

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.ndim not in self._dims:
            dims = " or ".join(f"{d}D" for d in self._dims)
            raise ValueError(f"{type(self).__name__}: expected {dims} input, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        use_batch = self.training or not self.track_running_stats
        track = not self.training or self.track_running_stats
        counter = self.num_batches_tracked if self.training and self.track_running_stats else None
        # The counter's increment and the running statistics' update (momentum None: factor 1 / batches,
        # on the device) happen inside the batch norm's own kernels.
        return F._batch_norm(x, self.running_mean if track else None, self.running_var if track else None,
                             self.weight, self.bias, use_batch, self.momentum, self.eps, counter)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over [N, C] or [N, C, L] per channel C, as ``torch.nn.BatchNorm1d``.

    Training normalises with the batch's mean and biased variance and updates the running
    statistics (unbiased variance) with ``momentum`` (None: a cumulative average); eval mode
    normalises with the running statistics.

    Arguments:
        num_features: the channels C.
        eps: added to the variance.
        momentum: the running statistics' update factor, or None.
        affine: learn a weight and bias per channel.
        track_running_stats: keep running statistics (else batch statistics in eval mode too).
        device, dtype: of the parameters and buffers.
    """

    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over [N, C, H, W] per channel C, as ``torch.nn.BatchNorm2d`` (see BatchNorm1d).

    Arguments: as ``BatchNorm1d``'s (num_features, eps, momentum, affine, track_running_stats, device, dtype).
    """

    _dims = (4,)
