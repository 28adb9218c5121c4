"""Top-level functions mirroring PyTorch/NumPy names (``wgpar.exp(x)``, ``wgpar.cat([...])``).

Every public elementwise op of the registry (ops/registry.py) has its function here, generated;
the others are written out below.
"""

from __future__ import annotations

from .autograd import functions as ops
from .autograd.methods import function
from .ops.registry import OPS
from .tensor import Tensor, dim_arg


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
    return ops.softmax(x, dim_arg(axis, dim), log=False)


def log_softmax(x: Tensor, axis=-1, *, dim=None) -> Tensor:
    return ops.softmax(x, dim_arg(axis, dim), log=True)


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


def _reduction(name: str):
    def f(x: Tensor, axis=None, keepdims: bool = False, *, dim=None, keepdim=None) -> Tensor:
        return ops.reduce(name, x, dim_arg(axis, dim), bool(keepdims if keepdim is None else keepdim))

    f.__name__ = name
    f.__doc__ = f"{name} over an axis, a tuple of axes, or all elements."
    if name == "sum":
        f.__doc__ += " An int32 sum wraps around on overflow (modulo 2**32): see Tensor.sum."
    return f


sum, mean, max, min, argmax, argmin = (_reduction(n) for n in ("sum", "mean", "max", "min", "argmax", "argmin"))

GENERATED = tuple(op.api for op in OPS.values() if op.api and op.function)
globals().update({op.api: function(op) for op in OPS.values() if op.api and op.function})

__all__ = ["matmul", "where", "cat", "concatenate", "stack", "softmax", "log_softmax", "clamp", "index_select",
           "reshape", "transpose", "permute", "sum", "mean", "max", "min", "argmax", "argmin", *GENERATED]
