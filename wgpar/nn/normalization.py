"""Normalisation layers beyond LayerNorm and batch norm: GroupNorm and RMSNorm (as torch.nn)."""

from __future__ import annotations

from .. import creation
from .. import dtypes as _dt
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter


class GroupNorm(Module):
    """Normalise [N, C, *] over groups of ``C / num_groups`` channels, then scale and shift per channel, as
    ``torch.nn.GroupNorm`` (parameters ``weight`` and ``bias`` [C], ones and zeros, so torch state dicts load).

    Arguments:
        num_groups: the groups; must divide num_channels.
        num_channels: C.
        eps: added to the variance.
        affine: learn the per-channel weight (and bias).
        device, dtype: of the parameters.
        bias: with ``affine``, also learn the bias (keyword-only, as torch).
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=_dt.float32, *, bias: bool = True) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = self.bias = None
        if affine:
            self.weight = Parameter(creation.empty(num_channels, dtype=dtype, device=device))
            init.ones_(self.weight)
            if bias:
                self.bias = Parameter(creation.empty(num_channels, dtype=dtype, device=device))
                init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """``x / sqrt(mean(x ** 2) + eps) * weight`` over the trailing ``normalized_shape`` dims, as
    ``torch.nn.RMSNorm`` (``weight`` of that shape, ones).

    Arguments:
        normalized_shape: an int or the trailing shape normalised over.
        eps: added to the mean square; None (default): the input dtype's machine epsilon, as torch.
        elementwise_affine: learn the weight.
        device, dtype: of the weight.
    """

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else (normalized_shape,)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(creation.empty(*shape, dtype=dtype, device=device))
            init.ones_(self.weight)
        else:
            self.weight = None

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
