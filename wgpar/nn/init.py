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


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill ``tensor`` in place with draws from U(a, b); returns it. Differs from torch: no ``generator=``
    (draws come from wgpar's generator, ``wgpar.manual_seed``)."""
    return _fill_from_host(tensor, creation.generator().uniform(a, b, size=tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill ``tensor`` in place with draws from N(mean, std^2); returns it. Differs from torch: no ``generator=``."""
    return _fill_from_host(tensor, creation.generator().normal(mean, std, size=tensor.shape))


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros in place; returns it."""
    with no_grad():
        return tensor.zero_()


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones in place; returns it."""
    with no_grad():
        return tensor.fill_(1.0)


def fan_in(t: Tensor) -> int:
    """Inputs per output of a weight [out, in, *kernel]: in times the kernel's size."""
    if t.ndim < 2:
        raise ValueError(f"fan_in needs a tensor of at least 2 dims, got shape {t.shape}")
    return t.shape[1] * math.prod(t.shape[2:])


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain of an activation, as ``torch.nn.init.calculate_gain``: 1 for linear, conv and
    sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope**2)) for leaky_relu (slope ``param``,
    default 0.01), 3/4 for selu."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """He uniform init in place, as ``torch.nn.init.kaiming_uniform_``: U(-b, b) with
    ``b = calculate_gain(nonlinearity, a) * sqrt(3 / fan)``, fan the weight's fan_in or fan_out (``mode``);
    returns it. Differs from torch: no ``generator=``."""
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan = fan_in(tensor) if mode == "fan_in" else _fan_out(tensor)
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)


def _fan_out(t: Tensor) -> int:
    fan_in(t)  # the same shape check
    return t.shape[0] * math.prod(t.shape[2:])


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot uniform init in place, bound ``gain * sqrt(6 / (fan_in + fan_out))``; returns it. Differs from
    torch: no ``generator=``."""
    bound = gain * math.sqrt(6.0 / (fan_in(tensor) + _fan_out(tensor)))
    return uniform_(tensor, -bound, bound)
