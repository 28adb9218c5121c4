"""Top-level functions mirroring PyTorch/NumPy names (``wgpar.exp(x)``, ``wgpar.cat([...])``)."""

from __future__ import annotations

from .autograd import functions as ops
from .tensor import Tensor, _axis


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return ops.matmul(a, b)


def where(cond: Tensor, a, b) -> Tensor:
    return ops.where(cond, a, b)


def cat(tensors, dim: int = 0, *, axis: int | None = None) -> Tensor:
    return ops.cat(tensors, dim if axis is None else axis)


concatenate = cat


def stack(tensors, dim: int = 0, *, axis: int | None = None) -> Tensor:
    return ops.stack(tensors, dim if axis is None else axis)


def softmax(x: Tensor, axis=-1, *, dim=None) -> Tensor:
    return ops.softmax(x, _axis(axis, dim), log=False)


def log_softmax(x: Tensor, axis=-1, *, dim=None) -> Tensor:
    return ops.softmax(x, _axis(axis, dim), log=True)


def maximum(a, b) -> Tensor:
    return ops.binary("maximum", a, b)


def minimum(a, b) -> Tensor:
    return ops.binary("minimum", a, b)


def clamp(x: Tensor, min=None, max=None) -> Tensor:
    return ops.clamp(x, min, max)


def index_select(x: Tensor, dim: int, index) -> Tensor:
    return ops.index_select(x, dim, index)


def reshape(x: Tensor, shape) -> Tensor:
    return ops.reshape(x, shape)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    return ops.transpose(x, dim0, dim1)


def permute(x: Tensor, dims) -> Tensor:
    return ops.permute(x, dims)


def _unary(name: str):
    def f(x: Tensor) -> Tensor:
        return ops.unary(name, x)

    f.__name__ = name
    f.__doc__ = f"Elementwise {name}."
    return f


neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu = (
    _unary(n) for n in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu"))


def _reduction(name: str):
    def f(x: Tensor, axis=None, keepdims: bool = False, *, dim=None, keepdim=None) -> Tensor:
        return ops.reduce(name, x, _axis(axis, dim), bool(keepdims if keepdim is None else keepdim))

    f.__name__ = name
    f.__doc__ = f"{name} over an axis, a tuple of axes, or all elements."
    if name == "sum":
        f.__doc__ += " An int32 sum wraps around on overflow (modulo 2**32): see Tensor.sum."
    return f


sum, mean, max, min, argmax, argmin = (_reduction(n) for n in ("sum", "mean", "max", "min", "argmax", "argmin"))
