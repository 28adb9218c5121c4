"""Ops built from the differentiable ops of differentiable.py, so their gradients come for free: var, std,
repeat, masked_fill, t, bmm, split / chunk / unbind, tril / triu, prod, logsumexp, norm, outer. Each costs a
few kernels (var: mean, subtract, square, sum, divide). A few (flip, roll, diag, the norms) run raw ops and
record a backward of their own where the composition would waste memory or get an edge wrong."""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..ops import mask as mask_ops
from ..ops import scatter as scatter_ops
from ..ops.elementwise import broadcast_shape
from ..ops.index import as_index
from ..tensor import Tensor, normalize_shape, wrap_dim
from .differentiable import (
    _take,
    binary,
    cast,
    cat,
    copy_,
    expand,
    getitem,
    matmul,
    permute,
    reduce,
    reshape,
    split_views,
    transpose,
    unary,
    where,
)
from .engine import record


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
    out = ops.unary("sqrt", v)
    y = out.detach()

    def bw(g):
        return (ops.where(ops.binary("eq", y, 0.0), 0.0, ops.binary("div", ops.binary("mul", g, 0.5), y)),)

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



# -- splitting: views of the input, their gradients joined (differentiable.split_views) ----------------------
def _tensor_input(op: str, a) -> None:
    if not isinstance(a, Tensor):
        raise TypeError(f"{op}: expected a wgpar.Tensor, got {type(a).__name__}")


def split(a: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """``a`` cut along ``dim`` into pieces of ``split_size_or_sections`` entries (an int: the last piece
    may be shorter) or of the listed sizes (which must add up to the dim's size), as torch.split.
    The pieces are views; backward joins their gradients into one buffer (a cat), as torch's.

    Arguments:
        a: a tensor of at least one dim.
        split_size_or_sections: an int > 0 (0 only for an empty dim), or a list of ints >= 0.
        dim: the dim to cut.
    """
    _tensor_input("split", a)
    if a.ndim == 0:
        raise ValueError("split: a 0-d tensor cannot be split")
    d = wrap_dim(dim, a.ndim)
    n = a.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, bool):
        size = int(split_size_or_sections)
        if size < 0 or (size == 0 and n):
            raise ValueError(f"split: split_size must be > 0 for a dim of size {n}, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else []) if size else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} must be >= 0 and add up to dim {d}'s size {n} (shape {a.shape})")
    return split_views(a, d, sizes)


def chunk(a: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """``a`` cut along ``dim`` into ``chunks`` views of ceil(n / chunks) entries, the last shorter, as
    torch.chunk: so fewer than ``chunks`` pieces where n does not allow more (chunk(5 entries, 4)
    gives 3 of 2, 2, 1).

    Arguments:
        a: a tensor of at least one dim.
        chunks: how many pieces at most (> 0).
        dim: the dim to cut.
    """
    _tensor_input("chunk", a)
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be an int > 0, got {chunks!r}")
    if a.ndim == 0:
        raise ValueError("chunk: a 0-d tensor cannot be chunked")
    d = wrap_dim(dim, a.ndim)
    n = a.shape[d]
    if n == 0:  # as torch: `chunks` empty pieces
        return split_views(a, d, [0] * int(chunks), "chunk")
    size = -(-n // int(chunks))
    return split_views(a, d, [min(size, n - s) for s in range(0, n, size)], "chunk")


def unbind(a: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``a`` along ``dim``, that dim removed (views), as torch.unbind.

    Arguments:
        a: a tensor of at least one dim.
        dim: the dim to take apart.
    """
    _tensor_input("unbind", a)
    if a.ndim == 0:
        raise ValueError("unbind: a 0-d tensor has no dim to unbind")
    d = wrap_dim(dim, a.ndim)
    return split_views(a, d, [1] * a.shape[d], "unbind", keepdim=False)


# -- triangles, flips, rolls ----------------------------------------------------------------------
def _triangle(op: str, a: Tensor, diagonal: int, upper: bool) -> Tensor:
    _tensor_input(op, a)
    if a.ndim < 2:
        raise ValueError(f"{op}: needs a tensor of at least 2 dims (a batch of matrices), got shape {a.shape}")
    n, m = a.shape[-2:]
    rows = Tensor.from_numpy(np.arange(n, dtype=np.int32).reshape(n, 1), device=a.device)
    cols = Tensor.from_numpy(np.arange(m, dtype=np.int32).reshape(1, m), device=a.device)
    offset = ops.binary("sub", cols, rows)  # j - i: 0 on the main diagonal, k on the k-th
    drop = ops.binary("lt" if upper else "gt", offset, int(diagonal))
    return masked_fill(a, drop, 0)


def tril(a: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (entries with j - i <= diagonal), zeros above, as
    torch.tril. One mask (from two small index uploads) and one where kernel.

    Arguments:
        a: a tensor of at least 2 dims.
        diagonal: which diagonal bounds it (0 the main one, > 0 above it, < 0 below).
    """
    return _triangle("tril", a, diagonal, upper=False)


def triu(a: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (entries with j - i >= diagonal), zeros below, as
    torch.triu.

    Arguments:
        a: a tensor of at least 2 dims.
        diagonal: which diagonal bounds it (0 the main one, > 0 above it, < 0 below).
    """
    return _triangle("triu", a, diagonal, upper=True)


def _dims(op: str, dims, ndim: int) -> tuple[int, ...]:
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    out = tuple(wrap_dim(d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: dim {dims} repeated")
    return out


def _flip_raw(a: Tensor, dims: tuple[int, ...]) -> Tensor:
    out = a
    for d in dims:
        if a.shape[d] > 1:
            out = ops.index_select(out, d, np.arange(a.shape[d] - 1, -1, -1, dtype=np.int32))
    return ops.clone(out) if out is a else out


def flip(a: Tensor, dims) -> Tensor:
    """``a`` with the order of entries reversed along each of ``dims``, a copy (as torch.flip; NumPy's
    flip returns a view). One gather kernel per flipped dim; the backward flips the gradient back.

    Arguments:
        a: a tensor.
        dims: an int or a sequence of ints.
    """
    _tensor_input("flip", a)
    ds = _dims("flip", dims, a.ndim)
    return record("flip", _flip_raw(a, ds), [a], lambda g: (_flip_raw(g, ds),))


def _roll_raw(a: Tensor, shifts: tuple[int, ...], dims: tuple[int, ...]) -> Tensor:
    out = a
    for s, d in zip(shifts, dims):
        n = a.shape[d]
        s = s % n if n else 0
        if s:
            lead = (slice(None),) * d
            out = ops.cat([ops.getitem(out, lead + (slice(n - s, n),)), ops.getitem(out, lead + (slice(0, n - s),))],
                          d)
    return ops.clone(out) if out is a else out


def roll(a: Tensor, shifts, dims=None) -> Tensor:
    """``a`` shifted along ``dims`` by ``shifts`` entries, wrapping around, a copy (torch.roll); with
    ``dims=None`` the flattened tensor is rolled and the shape restored. The backward rolls back.

    Arguments:
        a: a tensor.
        shifts: an int, or one int per dim of ``dims``.
        dims: an int, a sequence of ints, or None.
    """
    _tensor_input("roll", a)
    if dims is None:
        if not isinstance(shifts, (int, np.integer)):
            if len(shifts) != 1:
                raise ValueError(f"roll: without dims, shifts must be one int, got {shifts!r}")
            shifts = shifts[0]
        return reshape(roll(reshape(a, (-1,)), shifts, 0), a.shape)
    ds = _dims("roll", dims, a.ndim)
    ss = (int(shifts),) if isinstance(shifts, (int, np.integer)) else tuple(int(s) for s in shifts)
    if len(ss) != len(ds):
        raise ValueError(f"roll: {len(ss)} shifts for {len(ds)} dims")
    back = tuple(-s for s in ss)
    return record("roll", _roll_raw(a, ss, ds), [a], lambda g: (_roll_raw(g, back, ds),))


# -- products, logical reductions, norms, logsumexp ------------------------------------------------
def _reduce_shape(a: Tensor, dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if i in dims else n for i, n in enumerate(a.shape) if keepdim or i not in dims)


def _dim_tuple(a: Tensor, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(a.ndim))
    return _dims("reduction", dim, a.ndim) if a.ndim else ()


def prod(a: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The product over ``dim`` (an int, or None: every element, a 0-d result), as torch.prod.

    A tree of multiplications (the dim moved last and padded with ones to a power of two, then halves
    multiplied, log2(n) times), so its gradient is the multiplications' own: exact where the input
    holds zeros (one zero: the product of the others; two: zero), where PyTorch's dividing formula
    needs a special case. An int32 product wraps modulo 2**32 (PyTorch's is int64); bool gives int32.

    Arguments:
        a: a tensor.
        dim: an int or None.
        keepdim: keep the reduced dim with size 1.
        dtype: cast to this dtype first.
    """
    _tensor_input("prod", a)
    if dtype is not None:
        a = cast(a, _dt.as_dtype(dtype))
    if dim is None:
        out = prod(reshape(a, (-1,)), 0)
        return reshape(out, (1,) * a.ndim) if keepdim else out
    if a.ndim == 0:
        return binary("mul", a, 1)
    d = wrap_dim(dim, a.ndim)
    x = permute(a, [i for i in range(a.ndim) if i != d] + [d]) if d != a.ndim - 1 else a
    n = x.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    if size != n:
        ones = ops.fill(x.shape[:-1] + (size - n,), 1, x.dtype, x.device)
        x = cat([x, ones], -1)
    if x.dtype is _dt.bool_:
        x = cast(x, _dt.int32)
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = binary("mul", getitem(x, (..., slice(0, h))), getitem(x, (..., slice(h, 2 * h))))
    out = reshape(x, x.shape[:-1])
    return reshape(out, _reduce_shape(a, (d,), True)) if keepdim else out


def _count_nonzero(a: Tensor, dim, keepdim: bool, zero: bool) -> Tensor:
    hit = ops.cast(ops.binary("eq" if zero else "ne", a, 0), _dt.int32)
    return ops.reduce("sum", hit, None if dim is None else _dim_tuple(a, dim), keepdim)


def any_(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether any element is nonzero (NaN counts), over ``dim`` (an int, a tuple, or None), as a bool
    tensor (torch.any); empty: False. Not differentiable.

    Arguments:
        a: a tensor.
        dim: the dims to reduce.
        keepdim: keep the reduced dims with size 1.
    """
    _tensor_input("any", a)
    return ops.binary("gt", _count_nonzero(a, dim, keepdim, zero=False), 0)


def all_(a: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Whether every element is nonzero (NaN counts), over ``dim`` (an int, a tuple, or None), as a bool
    tensor (torch.all); empty: True. Not differentiable.

    Arguments: as ``any``'s (a, dim, keepdim).
    """
    _tensor_input("all", a)
    return ops.binary("eq", _count_nonzero(a, dim, keepdim, zero=True), 0)


def vector_norm(a: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The ``ord``-norm of ``a`` over ``dim`` (an int, a tuple, or None: every element), as
    torch.linalg.vector_norm: ord 2 (default), 1, inf (the largest |x|), -inf (the smallest), 0 (the count
    of nonzeros), any other p: sum(|x|**p) ** (1 / p).

    The gradient is PyTorch's: zero where the norm is zero (ord != 0); for inf / -inf it is split
    evenly over the entries that reach the extreme. Float tensors only.

    Arguments:
        a: a float tensor.
        ord: the order (a number; "fro" is 2).
        dim: the dims to reduce.
        keepdim: keep the reduced dims with size 1.
        dtype: cast to this dtype first.
    """
    if dtype is not None:
        a = cast(a, _dt.as_dtype(dtype))
    _float_input("vector_norm", a)
    p = 2.0 if ord == "fro" else ord
    if isinstance(p, str) or isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise ValueError(f"vector_norm: ord must be a number (or 'fro'), got {ord!r}")
    p = float(p)
    dims = None if dim is None else _dim_tuple(a, dim)
    if p == 1.0:
        return reduce("sum", unary("abs", a), dims, keepdim)
    if math.isinf(p):
        return reduce("max" if p > 0 else "min", unary("abs", a), dims, keepdim)
    if p == 0.0:
        return ops.cast(_count_nonzero(a, dims, keepdim, zero=False), a.dtype)
    mag = ops.unary("abs", a)
    total = ops.reduce("sum", mag if p == 1.0 else ops.binary("pow", mag, p), dims, True)
    y = ops.binary("pow", total, 1.0 / p)  # keepdim shape, for the backward
    out = y if keepdim else ops.reshape(y, _reduce_shape(a, dims if dims is not None else tuple(range(a.ndim)),
                                                         False))

    def bw(g):
        g = ops.reshape(g, y.shape)
        # d/dx = x |x|^(p-2) / norm^(p-1), zero where the norm is zero (PyTorch's rule).
        scale = ops.binary("div", g, ops.binary("pow", y, p - 1.0))
        scale = ops.where(ops.binary("eq", y, 0.0), 0.0, scale)
        local = a if p == 2.0 else ops.binary("mul", a, ops.binary("pow", mag, p - 2.0))
        return (ops.binary("mul", local, scale),)

    return record("vector_norm", out, [a], bw, [a, y])


def norm(a: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Tensor.norm as in PyTorch: ``p`` "fro" (default) or a number is ``vector_norm(a, p, dim)`` over
    ``dim`` (None: every element, a flattened matrix's Frobenius norm included); "nuc" (the nuclear
    norm) is not supported and raises.

    Arguments:
        a: a float tensor.
        p: "fro" or a number.
        dim: an int, a tuple, or None.
        keepdim: keep the reduced dims with size 1.
        dtype: cast to this dtype first.
    """
    if p == "nuc":
        raise ValueError("norm(p='nuc'): the nuclear norm needs a singular value decomposition, which wgpar "
                         "does not have")
    return vector_norm(a, p, dim, keepdim, dtype=dtype)


def logsumexp(a: Tensor, dim, keepdim: bool = False) -> Tensor:
    """log(sum(exp(a))) over ``dim`` (an int or a tuple; torch.logsumexp requires it), stably: the
    largest entry of each slice is subtracted before exp and added back (0 where it is infinite, so a
    slice of -inf gives -inf and one holding +inf gives +inf, as PyTorch). The gradient is softmax's.
    An integer tensor gives float32.

    Arguments:
        a: a tensor.
        dim: the dims to reduce.
        keepdim: keep the reduced dims with size 1.
    """
    _tensor_input("logsumexp", a)
    if not a.dtype.is_float:
        a = cast(a, _dt.float32)
    dims = _dim_tuple(a, dim)
    if not dims and a.ndim:
        return binary("add", a, 0.0)  # nothing reduced: log(exp(a)) is a
    m = ops.reduce("max", a.detach(), dims or None, True)
    m = ops.where(ops.unary("isinf", m), 0.0, m)
    s = reduce("sum", unary("exp", binary("sub", a, m)), dims or None, True)
    out = binary("add", unary("log", s), m)
    return out if keepdim else reshape(out, _reduce_shape(a, dims, False))


def outer(a: Tensor, b: Tensor) -> Tensor:
    """The outer product of two 1-d tensors, ``out[i, j] = a[i] * b[j]`` (torch.outer): one broadcast
    multiplication.

    Arguments:
        a, b: 1-d tensors.
    """
    for name, x in (("first", a), ("second", b)):
        _tensor_input("outer", x)
        if x.ndim != 1:
            raise ValueError(f"outer: the {name} operand must be 1-d, got shape {x.shape}")
    return binary("mul", reshape(a, (a.shape[0], 1)), reshape(b, (1, b.shape[0])))


def _diagonal_view(t: Tensor, k: int) -> Tensor:
    """The k-th diagonal of a matrix as a strided view."""
    n, m = t.shape
    s0, s1 = t.strides
    length = max(min(n, m - k) if k >= 0 else min(n + k, m), 0)
    start = t._offset + (k * s1 if k >= 0 else -k * s0)
    return Tensor(t._storage, (length,), (s0 + s1,), start if length else t._offset)


def _diag_matrix(v: Tensor, k: int) -> Tensor:
    size = v.shape[0] + abs(k)
    out = ops.fill((size, size), 0, v.dtype, v.device)
    if v.shape[0]:
        ops.copy_(_diagonal_view(out, k), v)
    return out


def diag(a: Tensor, diagonal: int = 0) -> Tensor:
    """As torch.diag: a 1-d ``a`` becomes the square matrix with ``a`` on its ``diagonal``-th diagonal
    (zeros elsewhere); a 2-d ``a`` gives a copy of its ``diagonal``-th diagonal (0 the main one, > 0
    above, < 0 below). The backward reads or writes the same diagonal.

    Arguments:
        a: a 1-d or 2-d tensor.
        diagonal: which diagonal.
    """
    _tensor_input("diag", a)
    k = int(diagonal)
    if a.ndim == 1:
        return record("diag", _diag_matrix(a, k), [a], lambda g: (ops.clone(_diagonal_view(g, k)),))
    if a.ndim != 2:
        raise ValueError(f"diag: needs a 1-d or 2-d tensor, got shape {a.shape}")
    shape = a.shape

    def bw(g):
        full = ops.fill(shape, 0, g.dtype, g.device)
        if g.shape[0]:
            ops.copy_(_diagonal_view(full, k), g)
        return (full,)

    return record("diag", ops.clone(_diagonal_view(a, k)), [a], bw)


# -- running sums and products -------------------------------------------------------------------
def _scan_input(op: str, a, dim, dtype) -> tuple[Tensor, int]:
    _tensor_input(op, a)
    if dtype is not None:
        a = cast(a, _dt.as_dtype(dtype))
    return a, wrap_dim(dim, a.ndim) if a.ndim else 0


def _revcumsum(g: Tensor, d: int) -> Tensor:
    """sum over j >= i of g[j] along d: cumsum's backward."""
    if g.ndim == 0:
        return g
    return _flip_raw(ops.scan("sum", _flip_raw(g, (d,)), d), (d,))


def cumsum(a: Tensor, dim: int, dtype=None) -> Tensor:
    """The running sum of ``a`` along ``dim`` (torch.cumsum), a blocked scan on the device: O(n) work in
    log_1024(n) levels, summed as a tree (not left to right: float32 results differ from a sequential sum
    by rounding only). int32 and bool give int32 that wraps modulo 2**32, where PyTorch gives int64;
    float16 sums in float32. The gradient is the reversed running sum of the incoming one.

    Arguments:
        a: a tensor.
        dim: the dim to run along.
        dtype: cast to this dtype first.
    """
    a, d = _scan_input("cumsum", a, dim, dtype)
    return record("cumsum", ops.scan("sum", a, d), [a], lambda g: (_revcumsum(g, d),))


def _cumprod_grad(x: Tensor, y: Tensor, g: Tensor, d: int) -> Tensor:
    # d y[j] / d x[k] = prod over i <= j, i != k of x[i] (j >= k). Before a row's first zero that is
    # y[j] / x[k]; at the first zero it is the running product with that zero replaced by 1; after it,
    # every term holds that zero.
    zero = ops.binary("eq", x, 0.0)
    seen = ops.scan("sum", ops.cast(zero, _dt.int32), d)
    before = ops.binary("eq", seen, 0)
    first = ops.where(zero, ops.binary("eq", seen, 1), False)
    at_before = ops.binary("div", _revcumsum(ops.binary("mul", g, y), d), ops.where(before, x, 1.0))
    y_first = ops.scan("prod", ops.where(first, 1.0, x), d)
    at_first = _revcumsum(ops.binary("mul", g, y_first), d)
    return ops.where(before, at_before, ops.where(first, at_first, 0.0))


def cumprod(a: Tensor, dim: int, dtype=None) -> Tensor:
    """The running product of ``a`` along ``dim`` (torch.cumprod), a blocked scan on the device (see
    cumsum). In float32 throughout, where PyTorch's CPU kernel accumulates in double: a long product of
    numbers near 1 drifts by up to the float32 bound n * 2**-24 relative (70001 factors of 1 +- 1e-4: 5e-4).
    int32 and bool give int32 that wraps modulo 2**32, where PyTorch gives int64. The gradient
    is exact with zeros in the input: before a row's first zero it is the reversed running sum of g * y
    divided by x, at the first zero the same sum over the products with that zero taken as 1, after it 0
    (PyTorch's rule too, without a readback).

    Arguments:
        a: a tensor.
        dim: the dim to run along.
        dtype: cast to this dtype first.
    """
    a, d = _scan_input("cumprod", a, dim, dtype)
    out = ops.scan("prod", a, d)
    x, y = a.detach(), out.detach()
    return record("cumprod", out, [a], lambda g: (_cumprod_grad(x, y, g, d),), [x, y])


# -- gather and scatter along a dim ------------------------------------------------------------------
def _padded(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``g`` in the leading corner of zeros of ``shape`` (a src larger than the index gets no gradient
    outside it)."""
    if g.shape == shape:
        return g
    full = ops.fill(shape, 0, g.dtype, g.device)
    ops.copy_(ops.getitem(full, tuple(slice(0, n) for n in g.shape)), g)
    return full


def gather(a: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j][k] = a[i][index[i][j][k]][k]`` for dim 1 (any dim alike), as torch.gather: ``index`` has
    a's number of dims and is no larger outside ``dim``; the result has its shape. The index is int32
    (PyTorch: int64); its values must lie in [0, a.shape[dim]), checked through the range known from its
    upload, else one readback (a host sync, as the other index checks of wgpar). The gradient is a
    scatter_add of the incoming one.

    Arguments:
        a: a tensor.
        dim: the dim to gather along.
        index: an int32 tensor.
        sparse_grad: accepted for PyTorch's signature; the gradient is dense.
    """
    _tensor_input("gather", a)
    d = scatter_ops.check_index("gather", a, dim, index)
    shape = a.shape
    return record("gather", scatter_ops.gather(a, d, index), [a],
                  lambda g: (scatter_ops.scatter(ops.fill(shape, 0, g.dtype, g.device), d, index, g, "add"),),
                  [index])


def _scatter_src(op: str, a: Tensor, src, value):
    if (src is None) == (value is None):
        raise TypeError(f"{op}: pass one of src (a tensor) and value (a number)")
    src = value if src is None else src
    if isinstance(src, Tensor) and src.dtype is not a.dtype:
        raise TypeError(f"{op}: src's dtype {src.dtype.name} differs from the tensor's {a.dtype.name} (as PyTorch)")
    if not isinstance(src, Tensor) and not isinstance(src, (int, float, bool, np.number)):
        raise TypeError(f"{op}: src must be a wgpar.Tensor or a number, got {type(src).__name__}")
    return src


def scatter_add(a: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``a`` with ``out[i][index[i][j][k]][k] += src[i][j][k]`` for dim 1 (any dim alike), as
    torch.scatter_add: index int32 (PyTorch: int64) with a's number of dims, no larger than src anywhere
    nor than a outside ``dim``, checked as gather's. Without float atomics: repeated indices add up in
    index order, so results repeat bit for bit (torch's CUDA kernel's order varies). Gradients: a gets
    the incoming one, src its gather at ``index``.

    Arguments:
        a: a tensor.
        dim: the dim to scatter along.
        index: an int32 tensor.
        src: a tensor of a's dtype.
    """
    _tensor_input("scatter_add", a)
    src = _scatter_src("scatter_add", a, src, None)
    _tensor_input("scatter_add", src)
    d = scatter_ops.check_index("scatter_add", a, dim, index, src.shape)
    src_shape = src.shape

    def bw(g):
        return g, _padded(scatter_ops.gather(g, d, index), src_shape)

    return record("scatter_add", scatter_ops.scatter(a, d, index, src, "add"), [a, src], bw, [index])


def scatter(a: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """A copy of ``a`` with ``out[i][index[i][j][k]][k] = src[i][j][k]`` for dim 1 (any dim alike), as
    torch.scatter; ``src`` may be a number (or pass ``value=``). Index rules as scatter_add's. Where an
    index repeats along ``dim``, PyTorch leaves the result undefined; wgpar writes the last of them (the
    largest position along ``dim``), every time, and only that src entry gets a gradient (PyTorch's
    formula sends the gradient to all of them). ``reduce="add"`` is scatter_add; "multiply" is refused.
    Gradients: a gets the incoming one except where something was written, src its gather at ``index``.

    Arguments:
        a: a tensor.
        dim: the dim to scatter along.
        index: an int32 tensor.
        src: a tensor of a's dtype, or a number.
        value: a number, PyTorch's other spelling.
        reduce: None or "add".
    """
    _tensor_input("scatter", a)
    if reduce == "add":
        if not isinstance(src, Tensor):
            src = ops.fill(index.shape, src if value is None else value, a.dtype, a.device)
        return scatter_add(a, dim, index, src)
    if reduce is not None:
        raise ValueError(f"scatter: reduce={reduce!r} is not supported (None or 'add'; see scatter_add)")
    src = _scatter_src("scatter", a, src, value)
    d = scatter_ops.check_index("scatter", a, dim, index, src.shape if isinstance(src, Tensor) else None)
    out = scatter_ops.scatter(a, d, index, src, "set")
    if not isinstance(src, Tensor):
        return record("scatter", out, [a], lambda g: (scatter_ops.scatter(g, d, index, 0, "set"),), [index])
    src_shape, a_shape = src.shape, a.shape

    def bw(g):
        # The entries that won their output slot: the position along d each slot kept, compared with
        # each entry's own.
        pos = ops.contiguous(ops.expand(ops.reshape(
            Tensor.from_numpy(np.arange(index.shape[d] if index.ndim else 1, dtype=np.int32), device=g.device),
            tuple(-1 if k == d else 1 for k in range(index.ndim))), index.shape))
        kept = scatter_ops.scatter(ops.fill(a_shape, -1, _dt.int32, g.device), d, index, pos, "set")
        won = ops.binary("eq", scatter_ops.gather(kept, d, index), pos)
        g_src = ops.where(won, scatter_ops.gather(g, d, index), 0.0)
        return scatter_ops.scatter(g, d, index, 0, "set"), _padded(ops.cast(g_src, g.dtype), src_shape)

    return record("scatter", out, [a, src], bw, [index])


def index_add(a: Tensor, dim: int, index, source: Tensor, *, alpha=1) -> Tensor:
    """A copy of ``a`` with ``alpha * source`` added at the positions ``index`` along ``dim``
    (torch.index_add): ``index`` is 1-d (an int32 tensor, a list or an array; values in
    [0, a.shape[dim])) and ``source`` is a's shape with len(index) along ``dim``. Repeated indices add
    up in index order (a scatter_add, no atomics: the same bits every run). Gradients: a gets the
    incoming one, source alpha times its index_select.

    Arguments:
        a: a tensor.
        dim: the dim.
        index: 1-d int32 indices.
        source: a tensor of a's dtype.
        alpha: a number scaling source.
    """
    _tensor_input("index_add", a)
    _tensor_input("index_add", source)
    if a.ndim == 0:
        raise ValueError("index_add: needs a tensor of at least 1 dim")
    d = wrap_dim(dim, a.ndim)
    idx = as_index(index, a.device, a.shape[d], f"index_add on dim {d} of shape {a.shape}")
    if idx.ndim != 1:
        raise ValueError(f"index_add: the index must be 1-d, got shape {idx.shape}")
    want = tuple(idx.numel() if k == d else s for k, s in enumerate(a.shape))
    if source.shape != want:
        raise ValueError(f"index_add: source of shape {source.shape} must be {want} (a's {a.shape} with "
                         f"len(index) = {idx.numel()} along dim {d})")
    scaled = source if alpha == 1 else binary("mul", source, alpha)
    full = ops.contiguous(ops.expand(ops.reshape(idx, tuple(-1 if k == d else 1 for k in range(a.ndim))), want))
    full._host_range = idx._host_range
    return scatter_add(a, d, full, scaled)


def _in_place(a: Tensor, f, *args, **kwargs) -> Tensor:
    from .grad_mode import no_grad

    with no_grad():
        result = f(a, *args, **kwargs)
    return copy_(a, result)


def scatter_(a: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """In place: ``a = scatter(a, dim, index, src)``, outside the autograd graph; returns a."""
    return _in_place(a, scatter, dim, index, src, value=value, reduce=reduce)


def scatter_add_(a: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """In place: ``a = scatter_add(a, dim, index, src)``, outside the autograd graph; returns a."""
    return _in_place(a, scatter_add, dim, index, src)


def index_add_(a: Tensor, dim: int, index, source: Tensor, *, alpha=1) -> Tensor:
    """In place: ``a = index_add(a, dim, index, source, alpha=alpha)``, outside the autograd graph; returns a."""
    return _in_place(a, index_add, dim, index, source, alpha=alpha)


# -- nonzero and boolean masks ------------------------------------------------------------------------
def nonzero(a: Tensor, *, as_tuple: bool = False):
    """The positions of the nonzero entries of ``a`` (NaN counts), in row-major order, as torch.nonzero:
    an int32 [count, a.ndim] tensor (PyTorch: int64), or with ``as_tuple`` one 1-d tensor per dim. The
    count sizes the result, so this waits for the device and reads it back (4 bytes; a host sync, as in
    PyTorch on CUDA); the positions themselves are found on the device (a running count and a
    compaction). Not differentiable.

    Arguments:
        a: a tensor.
        as_tuple: return one index tensor per dim.
    """
    _tensor_input("nonzero", a)
    flat = mask_ops.flat_nonzero(ops.reshape(ops.binary("ne", a, 0), (-1,)))
    if a.ndim == 0:
        return (flat,) if as_tuple else Tensor.empty((flat.shape[0], 0), _dt.int32, a.device)
    cols, stride = [], a.numel()
    for n in a.shape:
        stride //= n or 1
        cols.append(ops.binary("mod", ops.binary("floordiv", flat, stride), n) if flat.numel() else flat)
    return tuple(cols) if as_tuple else ops.stack(cols, 1)


def argwhere(a: Tensor) -> Tensor:
    """``nonzero(a)``: the [count, a.ndim] int32 positions of the nonzero entries (torch.argwhere; reads
    the count back)."""
    return nonzero(a)


def _check_mask(op: str, a: Tensor, mask: Tensor) -> None:
    if mask.ndim > a.ndim or a.shape[:mask.ndim] != mask.shape:
        raise IndexError(f"{op}: a boolean mask of shape {mask.shape} must match the leading dims of the indexed "
                         f"tensor's shape {a.shape}")
    if mask.device is not a.device:
        raise ValueError(f"{op}: the mask is on {mask.device}, the tensor on {a.device}")


def _selected_rank(flat_mask: Tensor, rows: int) -> Tensor:
    """For each entry of a 1-d mask, its rank among the set entries (0 where unset), as an index into
    ``rows`` rows (the gather kernel keeps any surplus in bounds)."""
    at = ops.where(flat_mask, ops.binary("sub", mask_ops.running_count(flat_mask), 1), 0)
    at._host_range = (0, rows - 1)
    return at


def mask_getitem(a: Tensor, mask: Tensor) -> Tensor:
    """``a[mask]`` for a bool mask over a's leading dims: the selected entries (or rows), [count, *rest],
    in row-major order. Reads the count back (4 bytes; the result's shape depends on it), so it waits
    for the device, as in PyTorch on CUDA. The gradient goes back to the selected places, gathered by
    each one's rank, with no readback."""
    _check_mask("indexing", a, mask)
    rest = a.shape[mask.ndim:]
    flat_mask = ops.reshape(mask, (-1,))
    out = ops.index_select(ops.reshape(a, (-1,) + rest), 0, mask_ops.flat_nonzero(flat_mask))
    shape = a.shape

    def bw(g):
        if g.shape[0] == 0:
            return (ops.fill(shape, 0, g.dtype, g.device),)
        rows = ops.index_select(g, 0, _selected_rank(flat_mask, g.shape[0]))
        keep = ops.reshape(flat_mask, (-1,) + (1,) * len(rest))
        return (ops.reshape(ops.where(keep, rows, 0.0), shape),)

    return record("mask_getitem", out, [a], bw, [mask])


def mask_setitem(a: Tensor, mask: Tensor, value) -> None:
    """``a[mask] = value`` in place, outside the autograd graph: ``value`` a number, a tensor (or array)
    broadcasting to the selected rows' shape a.shape[mask.ndim:], or one row per selected entry
    ([count, *rest], taken in order by each entry's rank). No readback: the count is never needed, so a
    [k, *rest] value with k different from the count is not detected (PyTorch raises): with fewer set
    entries the last rows go unused, with more the last row repeats."""
    _check_mask("index assignment", a, mask)
    rest = a.shape[mask.ndim:]
    if isinstance(value, (np.ndarray, list, tuple)):
        value = Tensor.from_numpy(np.asarray(value), device=a.device, dtype=a.dtype)
    if isinstance(value, Tensor) and value.ndim == 1 + len(rest) and value.shape[0] != 1:
        if value.shape[1:] != rest:
            raise ValueError(f"index assignment: a value of shape {value.shape} for rows of shape {rest}")
        if value.shape[0] == 0:
            return
        flat_mask = ops.reshape(mask, (-1,))
        value = ops.reshape(ops.index_select(value, 0, _selected_rank(flat_mask, value.shape[0])), a.shape)
    keep = ops.reshape(mask, mask.shape + (1,) * len(rest))
    copy_(a, ops.where(keep, value, a))


def masked_select(a: Tensor, mask: Tensor) -> Tensor:
    """The entries of ``a`` where the bool ``mask`` is True, both broadcast together, as a 1-d tensor
    (torch.masked_select): ``a[mask]`` flattened. Reads the count back (a host sync). Differentiable.

    Arguments:
        a: a tensor.
        mask: a bool tensor broadcasting with a.
    """
    _tensor_input("masked_select", a)
    if not isinstance(mask, Tensor) or mask.dtype is not _dt.bool_:
        raise TypeError("masked_select: the mask must be a bool tensor")
    shape = broadcast_shape(a.shape, mask.shape, op="masked_select")
    flat_mask = ops.reshape(ops.contiguous(ops.expand(mask, shape)), (-1,))
    return mask_getitem(reshape(expand(a, shape), (-1,)), flat_mask)


def isclose(a: Tensor, b, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """Where ``|a - b| <= atol + rtol * |b|`` (or a == b, which covers equal infinities), as a bool tensor
    broadcast from both (torch.isclose); NaN is close to NaN only with ``equal_nan``. Integers are
    compared exactly for equality and in float32 for the tolerance. Not differentiable.

    Arguments:
        a: a tensor.
        b: a tensor or a number.
        rtol, atol: the relative and absolute tolerances.
        equal_nan: whether two NaNs are close.
    """
    _tensor_input("isclose", a)
    same = ops.binary("eq", a, b)
    fa = a if a.dtype.is_float else ops.cast(a, _dt.float32)
    fb = b if not isinstance(b, Tensor) or b.dtype.is_float else ops.cast(b, _dt.float32)
    gap = ops.unary("abs", ops.binary("sub", fa, fb))
    bound = ops.binary("add", ops.binary("mul", ops.unary("abs", fb) if isinstance(fb, Tensor) else abs(fb),
                                         float(rtol)), float(atol))
    # Where either is NaN or infinite the gap is NaN or inf (-inf against inf: inf <= inf), so not close.
    close = ops.where(ops.unary("isfinite", gap), ops.binary("le", gap, bound), False)
    out = ops.where(same, True, close)
    if equal_nan:
        b_nan = ops.unary("isnan", fb) if isinstance(fb, Tensor) else math.isnan(fb)
        out = ops.where(ops.unary("isnan", fa), b_nan, out)
    return ops.cast(out, _dt.bool_)


def allclose(a: Tensor, b, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether ``isclose(a, b, ...)`` holds everywhere, as a Python bool (torch.allclose): waits for the
    device and reads one value back.

    Arguments:
        a, b, rtol, atol, equal_nan: as ``isclose``.
    """
    return bool(all_(isclose(a, b, rtol, atol, equal_nan)).item())


def median(a: Tensor, dim=None, keepdim: bool = False):
    """The median, as torch.median: of an even count the lower of the two middle values. Without ``dim``
    the 0-d median of every element (NaN for an empty tensor); with ``dim`` the named tuple (values,
    indices) along it, indices int32 (PyTorch: int64). A line holding a NaN has the median NaN at its
    first NaN, as PyTorch. One stable sort along the dim: the index of tied values is the one a stable
    sort puts in the middle (PyTorch leaves which one open). The gradient goes to the chosen entry.

    Arguments:
        a: a tensor (float32, float16, int32).
        dim: the dim to reduce, or None for every element.
        keepdim: keep the reduced dim with size 1.
    """
    from .. import return_types

    if not isinstance(a, Tensor):
        raise TypeError(f"median: expected a wgpar.Tensor, got {type(a).__name__}")
    if a.dtype is _dt.bool_:
        raise TypeError("median: not supported on bool tensors (as in PyTorch); convert with .int()")
    if dim is None:
        if a.numel() == 0:
            return ops.fill((), float("nan"), a.dtype if a.dtype.is_float else _dt.float32, a.device)
        return median(reshape(a, (-1,)), 0).values
    if a.ndim == 0:
        wrap_dim(dim, 1)
        return return_types.median(reshape(a, ()), ops.fill((), 0, _dt.int32, a.device))
    d = wrap_dim(dim, a.ndim)
    n = a.shape[d]
    if n == 0:
        raise ValueError(f"median: dim {dim} of shape {a.shape} is empty (as PyTorch, no median of nothing)")
    order = ops.argsort(a, d)  # stable, NaN last
    line = a.shape[:d] + (1,) + a.shape[d + 1:]
    pos = ops.fill(line, (n - 1) // 2, _dt.int32, a.device)
    if a.dtype.is_float:  # the first NaN (sorted after the rest) where a line holds one
        nans = ops.reduce("sum", ops.cast(ops.unary("isnan", a), _dt.int32), (d,), keepdims=True)
        pos = ops.where(ops.binary("gt", nans, 0), ops.binary("sub", n, nans), pos)
    index = ops.take_along(order, pos, d)
    values = _take(a, index, d)
    if not keepdim:
        values, index = reshape(values, line[:d] + line[d + 1:]), ops.reshape(index, line[:d] + line[d + 1:])
    return return_types.median(values, index)


__all__ = ["var", "std", "repeat", "masked_fill", "masked_fill_", "t", "bmm", "correction_arg", "split", "chunk",
           "unbind", "tril", "triu", "flip", "roll", "prod", "any_", "all_", "vector_norm", "norm", "logsumexp",
           "outer", "diag", "isclose", "allclose", "cumsum", "cumprod", "gather", "scatter", "scatter_",
           "scatter_add", "scatter_add_", "index_add", "index_add_", "nonzero", "argwhere",
           "mask_getitem", "mask_setitem", "masked_select", "median"]
