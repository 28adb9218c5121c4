"""Indexing: basic slicing as views, integer-array indexing along one axis as a gather kernel."""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..runtime.kernels import WORKGROUP, Kernel, grid
from ..tensor import Tensor, check_same_device, wrap_dim
from .elementwise import contiguous, copy_
from .shape import view

_GATHER = Kernel("gather", "out: w, x: r, idx: r", "outer: u32, n: u32, inner: u32, count: u32, off_x: u32, off_i: u32")
_INDEX_ADD = Kernel("index_add", "out: w, g: r, csr: r", "outer: u32, n: u32, inner: u32, count: u32, off_g: u32")


def expand_key(key, ndim: int) -> list:
    """An indexing key as one entry per dim (``...`` expanded, trailing dims as full slices; None kept)."""
    if not isinstance(key, tuple):
        key = (key,)
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    out = []
    for k in key:
        if k is Ellipsis:
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(k)
    if not any(k is Ellipsis for k in key):  # not `in`: a Tensor in the key would compare elementwise
        out.extend([slice(None)] * (ndim - consumed))
    return out


def _is_int(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def getitem(t: Tensor, key) -> Tensor:
    items = expand_key(key, t.ndim)
    shape, strides, offset = [], [], t._offset
    advanced: tuple[int, object] | None = None
    d = 0
    for k in items:
        if k is None:
            shape.append(1)
            strides.append(0)
            continue
        n, s = t.shape[d], t.strides[d]
        if _is_int(k):
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dimension {d} with size {n} (shape {t.shape})")
            offset += (int(k) % n) * s
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            length = len(range(start, stop, step))
            offset += start * s if length else 0
            shape.append(length)
            strides.append(s * step)
        elif isinstance(k, (Tensor, list, np.ndarray)):
            if advanced is not None:
                raise IndexError("only one integer-array index per indexing expression is supported")
            advanced = (len(shape), k)
            shape.append(n)
            strides.append(s)
        else:
            raise IndexError(f"unsupported index {k!r} of type {type(k).__name__}")
        d += 1
    basic = view(t, shape, strides, offset)
    if advanced is None:
        return basic
    return index_select(basic, advanced[0], advanced[1], negative=True, op="indexing")


def setitem(t: Tensor, key, value) -> None:
    items = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, (Tensor, list, np.ndarray)) for k in items):
        raise TypeError("assignment through an integer-array or mask index is not supported; use where()")
    target = getitem(t, key)
    if isinstance(value, (np.ndarray, list, tuple)):  # host values: uploaded to t's device first
        value = Tensor.from_numpy(np.asarray(value), device=t.device, dtype=t.dtype)
    copy_(target, value)


def as_index(index, dev, n: int, what: str, negative: bool = False, noun: str = "index") -> Tensor:
    """``index`` as an int32 tensor on ``dev``, its values checked against a dimension of size ``n``.

    Values must lie in [0, n), or with ``negative`` in [-n, n) (negatives count from the end, as in
    advanced indexing; the gather kernel wraps them). Host values are checked before they are narrowed
    to int32, so 2**32 + 1 never becomes 1; a tensor's values are checked through the range known from
    its upload, else one readback.
    """
    if isinstance(index, Tensor):
        if index.dtype.storage != "i32" or index.dtype is _dt.bool_:
            raise TypeError(f"index tensors must be int32, got {index.dtype.name}")
        _check_range(index, n, what, negative, noun)
        return index
    arr = np.asarray(index)
    if arr.dtype == np.bool_:
        raise TypeError("boolean mask indexing is not supported; use where() or an integer index")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"index arrays must hold integers, got {arr.dtype}")
    if arr.size:
        _raise_if_out_of_range(int(arr.min()), int(arr.max()), n, what, negative, noun)
    return Tensor.from_numpy(arr.astype(np.int32), device=dev)


def _raise_if_out_of_range(lo: int, hi: int, n: int, what: str, negative: bool, noun: str) -> None:
    low = -n if negative else 0
    if lo < low or hi >= n:
        bad = hi if hi >= n else lo
        allowed = f"[{-n}, {n})" if negative else f"[0, {n})"
        raise IndexError(f"{what}: {noun} {bad} is out of range for a dimension of size {n} (allowed {allowed})")


def _check_range(index: Tensor, n: int, what: str, negative: bool = False, noun: str = "index") -> None:
    if index.numel() == 0:
        return
    rng = index._host_range
    if rng is None:  # not made from host data: one readback to validate, remembered until a write
        vals = index.numpy()
        rng = index._host_range = (int(vals.min()), int(vals.max()))
    _raise_if_out_of_range(rng[0], rng[1], n, what, negative, noun)


def index_what(t: Tensor, d: int, op: str | None) -> str:
    return f"{op or 'index_select'} on dim {d} of shape {t.shape}"


def index_select(t: Tensor, dim: int, index, negative: bool = False, op: str | None = None) -> Tensor:
    """Pick entries along ``dim`` by an integer index of any shape (its shape replaces that dim).

    Indices must lie in [0, n) as in ``torch.index_select``; ``negative`` also allows [-n, 0), counted
    from the end (advanced indexing ``t[[-1]]``). ``op`` names the caller in errors.
    """
    d = wrap_dim(dim, t.ndim)
    if isinstance(index, Tensor):
        check_same_device(t, index, op="index_select")
    idx = as_index(index, t.device, t.shape[d], index_what(t, d, op), negative)
    out_shape = t.shape[:d] + idx.shape + t.shape[d + 1:]
    out = Tensor.empty(out_shape, t.dtype, t.device)
    total = out.numel()
    if total == 0:
        return out
    src = contiguous(t)
    idx = contiguous(idx)
    outer, inner = math.prod(t.shape[:d]), math.prod(t.shape[d + 1:])
    k = _GATHER.spec((t.dtype.storage, t.dtype.storage, "i32"))
    t.device.dispatch(k, [out._storage.buffer, src._storage.buffer, idx._storage.buffer],
                      _GATHER.pack(outer=outer, n=t.shape[d], inner=inner, count=idx.numel(), off_x=src._offset,
                                   off_i=idx._offset),
                      grid(-(-total // WORKGROUP), t.device.max_workgroups))
    return out


def index_add_rows(grad: Tensor, dim: int, index: Tensor, n: int, host_index: np.ndarray | None = None) -> Tensor:
    """Sum ``grad`` rows back into a dim of size ``n`` by ``index`` (index_select's backward).

    The kernel wants the index sorted into CSR form on the host: ``host_index`` (the values ``index``
    was uploaded from) spares the readback of ``index``, which would wait for the GPU mid-backward.
    """
    idx = (index.numpy() if host_index is None else np.asarray(host_index)).reshape(-1).astype(np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    d = dim
    outer, inner = math.prod(grad.shape[:d]), math.prod(grad.shape[d + index.ndim:])
    out_shape = grad.shape[:d] + (n,) + grad.shape[d + index.ndim:]
    out = Tensor.empty(out_shape, grad.dtype, grad.device)
    if out.numel() == 0:
        return out
    order = np.argsort(idx, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=n))])
    csr = Tensor.from_numpy(np.concatenate([starts, order]).astype(np.int32), device=grad.device)
    g = contiguous(grad)
    k = _INDEX_ADD.spec((grad.dtype.storage, grad.dtype.storage, "i32"), T=grad.dtype.storage)
    grad.device.dispatch(k, [out._storage.buffer, g._storage.buffer, csr._storage.buffer],
                         _INDEX_ADD.pack(outer=outer, n=n, inner=inner, count=idx.size, off_g=g._offset),
                         grid(-(-out.numel() // WORKGROUP), grad.device.max_workgroups))
    return out
