"""Top-level functions mirroring PyTorch/NumPy names (``wgpar.exp(x)``, ``wgpar.cat([...])``).

Every public elementwise op of the registry (ops/registry.py) has its function here, generated;
the others are written out below.
"""

from __future__ import annotations

from . import linalg
from .autograd import composites
from .autograd import differentiable as D
from .autograd.einsum import einsum
from .autograd.methods import function
from .creation import empty_like, full_like, rand_like, randn_like
from .ops.registry import OPS
from .tensor import Tensor, dim_arg


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """The matrix product ``a @ b`` (NumPy's matmul rules: 1-d operands, broadcast batch dims).

    Arguments:
        a, b: float tensors.
    """
    return D.matmul(a, b)


def where(cond: Tensor, a, b) -> Tensor:
    """``a`` where ``cond`` is nonzero, else ``b``, broadcast together (torch.where / np.where).

    Arguments:
        cond: a tensor (bool or numbers).
        a, b: tensors or numbers.
    """
    return D.where(cond, a, b)


def cat(tensors, dim: int = 0, *, axis: int | None = None) -> Tensor:
    """The tensors joined along an existing dim (torch.cat; ``concatenate`` is NumPy's name).

    Arguments:
        tensors: a sequence of tensors of equal shapes but along ``dim``, on one device.
        dim: the dim (``axis`` its NumPy spelling).
    """
    return D.cat(tensors, dim if axis is None else axis)


concatenate = cat


def stack(tensors, dim: int = 0, *, axis: int | None = None) -> Tensor:
    """The tensors joined along a new dim (torch.stack).

    Arguments:
        tensors: a sequence of tensors of one shape, on one device.
        dim: where the new dim goes (``axis`` its NumPy spelling).
    """
    return D.stack(tensors, dim if axis is None else axis)


def softmax(x: Tensor, axis=-1, *, dim=None) -> Tensor:
    """Softmax along a dim (default the last; torch requires one), one fused kernel per row.

    Arguments:
        x: a float tensor.
        axis, dim: the dim.
    """
    return D.softmax(x, dim_arg(axis, dim), log=False)


def log_softmax(x: Tensor, axis=-1, *, dim=None) -> Tensor:
    """log(softmax) along a dim, computed stably (default the last dim).

    Arguments:
        x: a float tensor.
        axis, dim: the dim.
    """
    return D.softmax(x, dim_arg(axis, dim), log=True)


def clamp(x: Tensor, min=None, max=None) -> Tensor:
    """``x`` limited to [min, max]; NaN stays NaN (torch.clamp).

    Arguments:
        x: a tensor.
        min, max: numbers or tensors (at least one).
    """
    return D.clamp(x, min, max)


def index_select(x: Tensor, dim: int, index) -> Tensor:
    """The entries of ``x`` at ``index`` along ``dim`` (torch.index_select).

    Arguments:
        x: a tensor.
        dim: the dim.
        index: ints in [0, x.shape[dim]): an int32 tensor, a list or a NumPy array.
    """
    return D.index_select(x, dim, index)


def reshape(x: Tensor, shape) -> Tensor:
    """``x`` with a new shape: a view when the strides allow, else a copy (torch.reshape).

    Arguments:
        x: a tensor.
        shape: the new shape (one entry may be -1).
    """
    return D.reshape(x, shape)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """A view of ``x`` with two dims swapped (torch.transpose).

    Arguments:
        x: a tensor.
        dim0, dim1: the dims.
    """
    return D.transpose(x, dim0, dim1)


def permute(x: Tensor, dims) -> Tensor:
    """A view of ``x`` with its dims reordered (torch.permute).

    Arguments:
        x: a tensor.
        dims: the new order.
    """
    return D.permute(x, dims)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product of [B, n, m] and [B, m, p] tensors, without broadcasting (torch.bmm).

    Arguments:
        a, b: the batches of matrices.
    """
    return composites.bmm(a, b)


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """``x.sort(dim, descending)``: the named tuple (values, indices), stable, NaN last ascending.

    Arguments:
        x: a tensor.
        dim: the dim to sort along.
        descending: largest first.
        stable: accepted for PyTorch's signature; the sort is always stable.
    """
    return D.sort(x, dim, descending)


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int32 indices that sort ``x`` along ``dim`` (``sort(...).indices``).

    Arguments:
        x, dim, descending, stable: as ``sort``.
    """
    return x.argsort(dim, descending)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """``x.topk(k, dim, largest)``: the named tuple (values, indices) of the k largest (or smallest).

    Arguments:
        x: a tensor.
        k: how many (0 <= k <= x.shape[dim]).
        dim: the dim to select along.
        largest: the largest (True) or smallest.
        sorted: accepted for PyTorch's signature; the result is always sorted.
    """
    return D.topk(x, k, dim, largest, sorted)


def var(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """The variance over ``dim``, as torch.var (default correction=1; see Tensor.var).

    Arguments:
        x: a float tensor.
        dim: an int, a tuple of ints, or None (every element).
        unbiased: PyTorch's older spelling of correction=1 (True) or 0 (False).
        keepdim: keep the reduced dims with size 1.
        correction: subtracted from the element count before dividing.
    """
    return x.var(dim, unbiased, keepdim, correction=correction)


def std(x: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """The standard deviation over ``dim``, as torch.std; arguments as ``var``."""
    return x.std(dim, unbiased, keepdim, correction=correction)


def masked_fill(x: Tensor, mask: Tensor, value) -> Tensor:
    """``x`` with ``value`` where the bool ``mask`` is True (torch.masked_fill).

    Arguments:
        x: a tensor.
        mask: a bool tensor broadcasting to x's shape.
        value: a number or a 0-d tensor.
    """
    return composites.masked_fill(x, mask, value)


def t(x: Tensor) -> Tensor:
    """The transpose of a matrix; fewer than 2 dims: x itself (torch.t).

    Arguments:
        x: a tensor of at most 2 dims.
    """
    return composites.t(x)


def _reduction(name: str):
    def f(x: Tensor, axis=None, keepdims: bool = False, *, dim=None, keepdim=None) -> Tensor:
        return D.reduce(name, x, dim_arg(axis, dim), bool(keepdims if keepdim is None else keepdim))

    f.__name__ = name
    f.__doc__ = f"{name} over an axis, a tuple of axes, or all elements."
    if name == "sum":
        f.__doc__ += " An int32 sum wraps around on overflow (modulo 2**32): see Tensor.sum."
    return f


sum, mean, argmax, argmin = (_reduction(n) for n in ("sum", "mean", "argmax", "argmin"))
amax, amin = _reduction("max"), _reduction("min")
amax.__name__, amin.__name__ = "amax", "amin"
amax.__doc__ = "The largest values over an axis, a tuple of axes, or all elements (PyTorch's amax: values only)."
amin.__doc__ = "The smallest values over an axis, a tuple of axes, or all elements (PyTorch's amin: values only)."


def _extreme(name: str):
    def f(x: Tensor, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        if isinstance(dim, Tensor):  # torch.max(a, b): the elementwise form
            return D.binary("maximum" if name == "max" else "minimum", x, dim)
        return D.extreme(name, x, dim_arg(axis, dim), bool(keepdim if keepdims is None else keepdims))

    f.__name__ = name
    f.__doc__ = (f"The {name} of every element (0-d), or with one int ``dim`` the named tuple (values, indices) "
                 f"along it, as torch.{name}; ``{name}(a, b)`` with two tensors is ``{name}imum(a, b)``.\n\n"
                 "Arguments:\n    x: a tensor.\n    dim: None, an int, or a second tensor.\n"
                 "    keepdim: keep the reduced dim with size 1.\n")
    return f


max, min = _extreme("max"), _extreme("min")

split, chunk, unbind = composites.split, composites.chunk, composites.unbind
tril, triu, flip, roll = composites.tril, composites.triu, composites.flip, composites.roll
prod, norm, logsumexp, outer, diag = composites.prod, composites.norm, composites.logsumexp, composites.outer, \
    composites.diag
isclose, allclose = composites.isclose, composites.allclose
cumsum, cumprod = composites.cumsum, composites.cumprod
gather, scatter, scatter_add, index_add = composites.gather, composites.scatter, composites.scatter_add, \
    composites.index_add
nonzero, argwhere, masked_select = composites.nonzero, composites.argwhere, composites.masked_select
median = composites.median


def any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether any element (over ``dim``: an int, a tuple, or None) is nonzero, as a bool tensor (torch.any);
    NaN counts as nonzero, an empty reduction is False."""
    return composites.any_(x, dim, keepdim)


def all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether every element (over ``dim``: an int, a tuple, or None) is nonzero, as a bool tensor
    (torch.all); NaN counts as nonzero, an empty reduction is True."""
    return composites.all_(x, dim, keepdim)


def numel(x: Tensor) -> int:
    """The number of elements of ``x`` (torch.numel)."""
    return x.numel()


def clamp_min(x: Tensor, min) -> Tensor:
    """``clamp(x, min=min)`` (torch.clamp_min); NaN stays NaN."""
    return D.clamp(x, min, None)


def clamp_max(x: Tensor, max) -> Tensor:
    """``clamp(x, max=max)`` (torch.clamp_max); NaN stays NaN."""
    return D.clamp(x, None, max)


GENERATED = tuple(op.api for op in OPS.values() if op.api and op.function)
globals().update({op.api: function(op) for op in OPS.values() if op.api and op.function})

__all__ = ["matmul", "bmm", "einsum", "sort", "argsort", "topk", "var", "std", "masked_fill", "t",
           "where", "cat", "concatenate", "stack", "softmax", "log_softmax", "clamp", "index_select",
           "reshape", "transpose", "permute", "split", "chunk", "unbind", "tril", "triu", "flip", "roll",
           "prod", "any", "all", "norm", "logsumexp", "outer", "diag", "isclose", "allclose", "numel", "clamp_min",
           "clamp_max", "cumsum", "cumprod", "gather", "scatter", "scatter_add",
           "index_add", "nonzero", "argwhere", "masked_select", "median",
           "linalg", "full_like", "empty_like", "rand_like", "randn_like",
           "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin",
           *GENERATED]
