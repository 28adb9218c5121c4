"""Parameter initialisation drawn from wgpar's seeded generator (wgpar.manual_seed)."""

from __future__ import annotations

import math

import numpy as np

from .. import creation
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


def _fill_from_host(t: Tensor, values: np.ndarray) -> Tensor:
    with no_grad():
        t.copy_(Tensor.from_numpy(values.astype(np.float32), device=t.device, dtype=t.dtype))
    return t


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill ``t`` in place with draws from U(a, b); returns t."""
    return _fill_from_host(t, creation.generator().uniform(a, b, size=t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill ``t`` in place with draws from N(mean, std^2); returns t."""
    return _fill_from_host(t, creation.generator().normal(mean, std, size=t.shape))


def zeros_(t: Tensor) -> Tensor:
    """Fill ``t`` with zeros in place; returns t."""
    with no_grad():
        return t.zero_()


def ones_(t: Tensor) -> Tensor:
    """Fill ``t`` with ones in place; returns t."""
    with no_grad():
        return t.fill_(1.0)


def fan_in(t: Tensor) -> int:
    """Inputs per output of a weight [out, in, *kernel]: in times the kernel's size."""
    if t.ndim < 2:
        raise ValueError(f"fan_in needs a tensor of at least 2 dims, got shape {t.shape}")
    return t.shape[1] * math.prod(t.shape[2:])


def kaiming_uniform_(t: Tensor, a: float = 0.0) -> Tensor:
    """He uniform init in place (torch's, fan_in mode, leaky-ReLU gain with slope ``a``); returns t."""
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in(t))
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot uniform init in place, bound ``gain * sqrt(6 / (fan_in + fan_out))``; returns t."""
    fan_out = t.shape[0] * math.prod(t.shape[2:])
    bound = gain * math.sqrt(6.0 / (fan_in(t) + fan_out))
    return uniform_(t, -bound, bound)
