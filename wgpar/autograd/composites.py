"""Ops built from the differentiable ops of functions.py, so their gradients come for free: var, std,
repeat, masked_fill, t, bmm. Each costs a few kernels (var: mean, subtract, square, sum, divide)."""

from __future__ import annotations

import math

from .. import dtypes as _dt
from .. import ops as raw
from ..ops.elementwise import broadcast_shape
from ..tensor import Tensor, normalize_shape, wrap_dim
from .engine import record
from .functions import binary, cast, copy_, expand, matmul, reduce, reshape, transpose, where


def _float_input(op: str, a) -> None:
    if not isinstance(a, Tensor):
        raise TypeError(f"{op}: expected a wgpar.Tensor, got {type(a).__name__}")
    if not a.dtype.is_float:
        raise TypeError(f"{op}: needs a float tensor, got {a.dtype.name} (as PyTorch; convert with .float())")


def correction_arg(op: str, unbiased, correction) -> float:
    """The ``correction`` of var / std from PyTorch's two spellings (default 1: Bessel's correction)."""
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}: pass either unbiased= or correction=, not both")
    if unbiased is not None:
        return 1.0 if unbiased else 0.0
    return 1.0 if correction is None else float(correction)


def var(a: Tensor, dim=None, correction: float = 1.0, keepdim: bool = False) -> Tensor:
    """The variance over ``dim`` (an int, a tuple, or None: all), the squared deviations' sum divided by
    max(N - correction, 0) as in PyTorch (so N <= correction gives inf, or NaN for 0 / 0).

    Arguments:
        a: a float tensor.
        dim: the dims to reduce.
        correction: subtracted from the count (1: the unbiased estimate, 0: the population variance).
        keepdim: keep the reduced dims with size 1.
    """
    _float_input("var", a)
    if dim is None:
        n = a.numel()
    elif isinstance(dim, (tuple, list)):
        n = math.prod(a.shape[wrap_dim(d, a.ndim)] for d in dim)
    else:
        n = a.shape[wrap_dim(dim, a.ndim)] if a.ndim else 1
    dev = binary("sub", a, reduce("mean", a, dim, True))
    return binary("div", reduce("sum", binary("mul", dev, dev), dim, keepdim), float(max(n - correction, 0)))


def std(a: Tensor, dim=None, correction: float = 1.0, keepdim: bool = False) -> Tensor:
    """The standard deviation, ``sqrt(var(...))``; arguments as ``var``. Where it is 0 its gradient is 0,
    as in PyTorch (the square root's own would be inf * 0 = NaN)."""
    v = var(a, dim, correction, keepdim)
    out = raw.unary("sqrt", v)
    y = out.detach()

    def bw(g):
        return (raw.where(raw.binary("eq", y, 0.0), 0.0, raw.binary("div", raw.binary("mul", g, 0.5), y)),)

    return record("std", out, [v], bw, [y])


def repeat(a: Tensor, sizes) -> Tensor:
    """``a`` tiled ``sizes[i]`` times along each dim, as PyTorch's Tensor.repeat (more sizes than dims add
    leading dims). One copy kernel: an expanded view made contiguous.

    Arguments:
        a: a tensor.
        sizes: one count per dim (at least a.ndim of them).
    """
    sizes = normalize_shape(sizes)
    if len(sizes) < a.ndim:
        raise ValueError(f"repeat: {len(sizes)} repeat counts {sizes} for a {a.ndim}-d tensor of shape {a.shape}: "
                         "give at least one per dim")
    shape = (1,) * (len(sizes) - a.ndim) + a.shape
    split, tiled = [], []
    for r, n in zip(sizes, shape):
        split += [1, n]
        tiled += [r, n]
    out = expand(reshape(a, split), tiled)
    return reshape(out, tuple(r * n for r, n in zip(sizes, shape)))


def masked_fill(a: Tensor, mask: Tensor, value) -> Tensor:
    """``a`` with ``value`` where the bool ``mask`` (broadcast to a's shape) is True, in a's dtype.

    Arguments:
        a: a tensor.
        mask: a bool tensor that broadcasts to a's shape.
        value: a number or a 0-d tensor (its gradient is the sum of the gradient where mask is True).
    """
    if not isinstance(mask, Tensor) or mask.dtype is not _dt.bool_:
        got = mask.dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"masked_fill: the mask must be a bool tensor, got {got} (compare, e.g. x > 0, to make one)")
    if isinstance(value, Tensor) and value.ndim:
        raise ValueError(f"masked_fill: the value must be a number or a 0-d tensor, got shape {value.shape}")
    if broadcast_shape(a.shape, mask.shape, op="masked_fill") != a.shape:
        raise ValueError(f"masked_fill: a mask of shape {mask.shape} does not broadcast to the tensor's {a.shape}")
    out = where(mask, value, a)
    return out if out.dtype is a.dtype else cast(out, a.dtype)


def masked_fill_(a: Tensor, mask: Tensor, value) -> Tensor:
    """In place: ``a = masked_fill(a, mask, value)``; returns a."""
    from .grad_mode import no_grad

    with no_grad():
        filled = masked_fill(a, mask, value)
    return copy_(a, filled)


def t(a: Tensor) -> Tensor:
    """The transpose of a matrix; a tensor of fewer than 2 dims is returned as it is (PyTorch's t())."""
    if a.ndim > 2:
        raise ValueError(f"t(): expects a tensor of at most 2 dims, got shape {a.shape}; use transpose(d0, d1) "
                         "or mT")
    return transpose(a, 0, 1) if a.ndim == 2 else a


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product of [B, n, m] and [B, m, p] tensors (no broadcasting, as PyTorch's bmm)."""
    for name, x in (("first", a), ("second", b)):
        if not isinstance(x, Tensor):
            raise TypeError(f"bmm: the {name} operand must be a wgpar.Tensor, got {type(x).__name__}")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: needs [B, n, m] and [B, m, p] tensors, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


__all__ = ["var", "std", "repeat", "masked_fill", "masked_fill_", "t", "bmm", "correction_arg"]
