"""gather / scatter / scatter_add along a dim (torch's semantics), on the device.

gather is take_along (ops/sort.py) over the input narrowed to the index's extent. Scattering has no
float atomics to lean on (WGSL has none): the index is sorted stably along the dim (ops/sort.py's
argsort), and each output entry finds its run of equal indices by binary search (scatter.wgsl), so
sums come out in index order, the same bits every run, and "set" keeps the last of repeated indices.
"""

from __future__ import annotations

import math

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, grid
from ..tensor import Tensor, check_same_device, wrap_dim
from .elementwise import cast, clone, contiguous, copy_, fill
from .index import _check_range
from .shape import reshape, view
from .sort import argsort, take_along

_SCATTER = Kernel("scatter", "out: w, src: r, sidx: r, perm: r",
                  "outer: u32, n: u32, inner: u32, count: u32, lo: u32, hi: u32, off_src: u32")
_MODES = {"add": "var acc = {ZERO};\n  for (var j = s; j < e; j = j + 1u) {{ acc = acc + value(o, j, k); }}\n"
                 "  out[i] = {STORE}({LOAD}(out[i]) + acc);",
          "set": "out[i] = {STORE}(value(o, e - 1u, k));"}


def _narrowed(t: Tensor, shape: tuple[int, ...], keep: int | None = None) -> Tensor:
    """The view of ``t``'s leading ``shape`` entries in every dim but ``keep``."""
    sizes = tuple(t.shape[d] if d == keep else shape[d] for d in range(t.ndim))
    return t if sizes == t.shape else view(t, sizes, t.strides, t._offset)


def check_index(op: str, x: Tensor, dim: int, index, src_shape: tuple[int, ...] | None = None) -> int:
    """Validate a gather / scatter index as PyTorch does, returning the wrapped dim: an int32 tensor
    (PyTorch: int64) of x's number of dims, no larger than x in the other dims (nor than ``src`` in
    any), values in [0, x.shape[dim]) (checked through the range known from its upload, else one
    readback)."""
    if not isinstance(index, Tensor) or index.dtype is not _dt.int32:
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise TypeError(f"{op}: the index must be an int32 wgpar.Tensor (PyTorch: int64), got {got}")
    check_same_device(x, index, op=op)
    nd = max(x.ndim, 1)
    d = wrap_dim(dim, nd)
    if index.ndim != x.ndim and not (index.ndim <= 1 and x.ndim <= 1):
        raise ValueError(f"{op}: the index ({index.shape}) must have as many dims as the tensor ({x.shape})")
    ishape, xshape = index.shape or (1,), x.shape or (1,)
    if any(i > s for k, (i, s) in enumerate(zip(ishape, xshape)) if k != d):
        raise ValueError(f"{op}: index of shape {index.shape} is larger than the tensor's {x.shape} outside dim {d}")
    if src_shape is not None and any(i > s for i, s in zip(ishape, src_shape or (1,))):
        raise ValueError(f"{op}: index of shape {index.shape} is larger than src's {src_shape}")
    _check_range(index, xshape[d], f"{op} on dim {d} of shape {x.shape}")
    return d


def gather(x: Tensor, d: int, index: Tensor) -> Tensor:
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along dim ``d`` (indices checked by check_index)."""
    if x.ndim == 0:
        return reshape(gather(reshape(x, (1,)), 0, reshape(index, (1,))), ())
    return take_along(_narrowed(x, index.shape, d), contiguous(index), d)


def scatter(x: Tensor, d: int, index: Tensor, src, mode: str) -> Tensor:
    """A copy of ``x`` with ``src`` (a tensor at least index's shape, or a number) scattered along dim ``d``
    at ``index``: added ("add") or written ("set"; of repeated indices the last along ``d`` wins)."""
    if x.ndim == 0:
        src = reshape(src, (1,)) if isinstance(src, Tensor) else src
        return reshape(scatter(reshape(x, (1,)), 0, reshape(index, (1,)), src, mode), ())
    out = clone(x)
    if index.numel() == 0:
        return out
    if isinstance(src, Tensor):
        check_same_device(x, src, op="scatter")
        src = contiguous(_narrowed(src, index.shape))
    else:
        src = fill(index.shape, src, x.dtype, x.device)
    target = _narrowed(out, index.shape, d)
    work = x.dtype if x.dtype in (_dt.float32, _dt.int32) else (_dt.float32 if x.dtype.is_float else _dt.int32)
    region = cast(target, work) if work is not x.dtype or not target.is_contiguous() else target
    if work is not x.dtype:
        src = cast(src, work)
    perm = argsort(index, d)
    sidx = take_along(index, perm, d)
    outer, inner = math.prod(index.shape[:d]), math.prod(index.shape[d + 1:])
    count, n = index.shape[d], x.shape[d]
    c, load, store, zero = ("f32", "", "", "0.0") if work is _dt.float32 else ("u32", "bitcast<u32>", "bitcast<i32>",
                                                                                "0u")
    kspec = _SCATTER.spec((work.storage,) * 2 + ("i32", "i32"), C=c, LOAD=load,
                          MODE=_MODES[mode].format(ZERO=zero, LOAD=load, STORE=store))
    dev = x.device
    for lo in range(0, count, MAX_LOOP):
        dev.dispatch(kspec, [region._storage.buffer, src._storage.buffer, sidx._storage.buffer, perm._storage.buffer],
                     _SCATTER.pack(outer=outer, n=n, inner=inner, count=count, lo=lo, hi=min(count, lo + MAX_LOOP),
                                   off_src=src._offset),
                     grid(-(-outer * n * inner // WORKGROUP), dev.max_workgroups))
    if region is not target:
        copy_(target, region)
    return out
