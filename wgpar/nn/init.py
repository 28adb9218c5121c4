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
    return _fill_from_host(t, creation.generator().uniform(a, b, size=t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    return _fill_from_host(t, creation.generator().normal(mean, std, size=t.shape))


def zeros_(t: Tensor) -> Tensor:
    with no_grad():
        return t.zero_()


def ones_(t: Tensor) -> Tensor:
    with no_grad():
        return t.fill_(1.0)


def fan_in(t: Tensor) -> int:
    if t.ndim < 2:
        raise ValueError(f"fan_in needs a tensor of at least 2 dims, got shape {t.shape}")
    return t.shape[1] * math.prod(t.shape[2:])


def kaiming_uniform_(t: Tensor, a: float = 0.0) -> Tensor:
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in(t))
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    fan_out = t.shape[0] * math.prod(t.shape[2:])
    bound = gain * math.sqrt(6.0 / (fan_in(t) + fan_out))
    return uniform_(t, -bound, bound)
