"""Sorting along a dim on the device (a bitonic network), and moving values along a dim by a
per-element index (take_along: sort's and topk's values; scatter_along: their backward)."""

from __future__ import annotations

import math

from .. import dtypes as _dt
from ..runtime.kernels import WORKGROUP, Kernel, grid, load_source
from ..tensor import Tensor, check_same_device, wrap_dim
from .elementwise import contiguous, fill
from .shape import narrow, permute, reshape

_SORT = Kernel("sort", "idx: w, x: r", "rows: u32, n: u32, P: u32, k: u32, j: u32, off: u32, first: u32")
_SORT_BLOCK = Kernel("sort_block", "idx: w, x: r", "rows: u32, n: u32, P: u32, klo: u32, khi: u32, off: u32, "
                                                   "first: u32")
_BLOCK = 2 * WORKGROUP  # positions per workgroup of sort_block.wgsl
_TAKE = Kernel("take_along", "out: w, x: r, idx: r", "outer: u32, n: u32, inner: u32, count: u32, off_x: u32, "
                                                     "off_i: u32")
_NO_NAN = "fn no_nan(v: i32) -> bool { return false; }"


def _moved_last(t: Tensor, d: int) -> Tensor:
    return t if d == t.ndim - 1 else permute(t, [i for i in range(t.ndim) if i != d] + [d])


def _moved_back(t: Tensor, d: int) -> Tensor:
    if d == t.ndim - 1:
        return t
    order = [i for i in range(t.ndim) if i != d] + [d]
    inv = [0] * t.ndim
    for pos, ax in enumerate(order):
        inv[ax] = pos
    return contiguous(permute(t, inv))


def argsort(x: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    """The int32 positions that sort ``x`` along ``dim``, stably: equal values keep their order; NaN sorts
    after every number ascending and before every number descending (PyTorch's order).

    Arguments:
        x: a tensor (float32, float16, int32 or bool).
        dim: the dim to sort along.
        descending: largest first.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"sort: expected a wgpar.Tensor, got {type(x).__name__}")
    if x.ndim == 0:
        return fill((), 0, _dt.int32, x.device)
    d = wrap_dim(dim, x.ndim)
    n = x.shape[d]
    src = contiguous(_moved_last(x, d))
    rows = src.numel() // n if n else 0
    if rows == 0 or n <= 1:
        return fill(x.shape, 0, _dt.int32, x.device)
    size = 1 << (n - 1).bit_length()
    idx = Tensor.empty((rows, size), _dt.int32, x.device)
    dev = x.device
    if x.dtype.is_float:
        fills = {"T": "f32", "NAN": "isnan_", "FNS": load_source("float_fns")}
    else:
        fills = {"T": "i32", "NAN": "no_nan", "FNS": _NO_NAN}
    fills.update(LT=">" if descending else "<", NAN_FIRST="an" if descending else "bn")
    buffers = [idx._storage.buffer, src._storage.buffer]
    step = _SORT.spec(("i32", x.dtype.storage), **fills)
    block = _SORT_BLOCK.spec(("i32", x.dtype.storage), **fills)
    step_grid = grid(-(-(rows * size // 2) // WORKGROUP), dev.max_workgroups)
    block_grid = grid(-(-(rows * size) // _BLOCK), dev.max_workgroups)

    def in_blocks(klo: int, khi: int, first: int) -> None:
        dev.dispatch(block, buffers, _SORT_BLOCK.pack(rows=rows, n=n, P=size, klo=klo, khi=khi, off=src._offset,
                                                      first=first), block_grid)

    # The network's steps with j < _BLOCK stay within a block: those run in workgroup memory, one
    # dispatch per merge; only the steps with a longer reach go through global memory, one each.
    in_blocks(2, min(size, _BLOCK), 1)
    k = 2 * _BLOCK
    while k <= size:
        j = k // 2
        while j >= _BLOCK:
            dev.dispatch(step, buffers, _SORT.pack(rows=rows, n=n, P=size, k=k, j=j, off=src._offset, first=0),
                         step_grid)
            j //= 2
        in_blocks(k, k, 0)
        k *= 2
    if size != n:
        idx = contiguous(narrow(idx, 1, 0, n))
    return _moved_back(reshape(idx, src.shape), d)


def _launch_take(out: Tensor, x: Tensor, idx: Tensor, d: int, n: int, scatter: bool) -> None:
    outer, inner = math.prod(idx.shape[:d]), math.prod(idx.shape[d + 1:])
    count = idx.shape[d]
    total = outer * count * inner
    if total == 0:
        return
    move = "out[at] = x[p.off_x + i];" if scatter else "out[i] = x[p.off_x + at];"
    kspec = _TAKE.spec((out.dtype.storage, x.dtype.storage, "i32"), MOVE=move)
    x.device.dispatch(kspec, [out._storage.buffer, x._storage.buffer, idx._storage.buffer],
                      _TAKE.pack(outer=outer, n=n, inner=inner, count=count, off_x=x._offset, off_i=idx._offset),
                      grid(-(-total // WORKGROUP), x.device.max_workgroups))


def take_along(x: Tensor, idx: Tensor, dim: int) -> Tensor:
    """``out[..., j, ...] = x[..., idx[..., j, ...], ...]`` along ``dim`` (torch.take_along_dim for an
    index of x's shape except along ``dim``); the indices must lie in [0, x.shape[dim]) (not checked:
    callers pass what argsort made)."""
    d = wrap_dim(dim, x.ndim)
    check_same_device(x, idx, op="take_along")
    out = Tensor.empty(idx.shape, x.dtype, x.device)
    _launch_take(out, contiguous(x), contiguous(idx), d, x.shape[d], scatter=False)
    return out


def scatter_along(g: Tensor, idx: Tensor, dim: int, n: int) -> Tensor:
    """take_along's backward: zeros of g's shape with ``n`` along ``dim``, and ``g[..., j, ...]`` written at
    ``idx[..., j, ...]``; the indices of each line along ``dim`` must be distinct (sort's and topk's are)."""
    d = wrap_dim(dim, g.ndim)
    shape = g.shape[:d] + (n,) + g.shape[d + 1:]
    out = fill(shape, 0, g.dtype, g.device)
    _launch_take(out, contiguous(g), contiguous(idx), d, n, scatter=True)
    return out
