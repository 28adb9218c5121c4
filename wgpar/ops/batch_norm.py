"""Batch norm's kernels: per-channel sums (shaders/batch_norm_sums.wgsl) and per-channel affine maps
(shaders/batch_norm_apply.wgsl) over contiguous [N, C, inner] tensors.

Statistics take two passes over the input, the mean first, then the sums of (x - mean)^2 and of
x - mean (the corrected two-pass variance: no cancellation of large squares, as a single pass of
x and x^2 would suffer). Everything per channel is float32, whatever the input's float type. The
differentiable op is ``autograd.nn_ops.BatchNorm``.
"""

from __future__ import annotations

import functools

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, KernelSpec, grid
from ..tensor import Tensor
from .elementwise import clone, run_map
from .reduce import reduce
from .shape import narrow, reshape

_SUMS = Kernel("batch_norm_sums", "part: w, a: r, b: r, mean: r",
               "c: u32, inner: u32, count: u32, off_a: u32, off_b: u32, chunk: u32, groups: u32")
_APPLY = Kernel("batch_norm_apply", "out: w, x: r, g: r, m: r, k1: r, k2: r, k3: r",
                "c: u32, inner: u32, total: u32, off_x: u32, off_g: u32")


def _at_start(t: Tensor) -> Tensor:
    """``t`` if contiguous from its buffer's start (the kernels index per-channel vectors from 0), else a copy."""
    return t if t._offset == 0 and t.is_contiguous() else clone(t)


def column(t: Tensor, j: int) -> Tensor:
    """Column ``j`` of a [C, k] tensor, as a [C] view."""
    return reshape(narrow(t, 1, j, 1), (t.shape[0],))


def _chunking(count: int, channels: int) -> tuple[int, int]:
    """(chunk, chunks per channel): enough workgroups to fill a GPU, no thread looping past MAX_LOOP."""
    groups = max(1, min(-(-count // (8 * WORKGROUP)), 1024 // channels))
    groups = max(groups, -(-count // (WORKGROUP * MAX_LOOP)))
    chunk = -(-count // groups)
    return chunk, -(-count // chunk)


@functools.lru_cache(maxsize=64)
def _sums_kernel(ta: str, tb: str | None, with_mean: bool, term1: str, term2: str) -> KernelSpec:
    without = tuple(n for n, keep in (("b", tb is not None), ("mean", with_mean)) if not keep)
    types = ["f32", ta] + ([tb] if tb is not None else []) + (["f32"] if with_mean else [])
    return _SUMS.spec(types, without=without, MEAN="mean[ch]" if with_mean else "0.0",
                      VB="f32(b[p.off_b + at])" if tb is not None else "0.0", TERM1=term1, TERM2=term2)


def channel_sums(a: Tensor, term1: str, term2: str, b: Tensor | None = None, mean: Tensor | None = None) -> Tensor:
    """Per channel, the sums of ``term1`` and ``term2`` over dims 0 and 2 of [N, C, inner] tensors: float32 [C, 2].

    Arguments:
        a: contiguous [N, C, inner], read as ``va``.
        term1, term2: WGSL f32 expressions over ``va``, ``vb`` and ``m``.
        b: contiguous, a's shape, read as ``vb`` (0 without).
        mean: float32 [C], read as ``m`` (0 without).
    """
    n, c, inner = a.shape
    count = n * inner
    chunk, groups = _chunking(count, c)
    part = Tensor.empty((c, 2, groups), _dt.float32, a.device)
    k = _sums_kernel(a.dtype.storage, None if b is None else b.dtype.storage, mean is not None, term1, term2)
    if mean is not None:
        mean = _at_start(mean)
    bufs = [part._storage.buffer, a._storage.buffer] + [t._storage.buffer for t in (b, mean) if t is not None]
    a.device.dispatch(k, bufs, _SUMS.pack(c=c, inner=inner, count=count, off_a=a._offset,
                                          off_b=0 if b is None else b._offset, chunk=chunk, groups=groups),
                      grid(c * groups, a.device.max_workgroups))
    return reshape(part, (c, 2)) if groups == 1 else reduce("sum", part, 2)


def batch_stats(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, shift, biased variance), float32 [C] each, of contiguous ``x`` [N, C, inner] over dims 0
    and 2. The batch's mean is mean + shift: ``mean`` is the float32 sum divided by the count, within a
    rounding of it, and ``shift`` the mean of x - mean, which normalising with (x - mean) - shift takes
    out (an input far from 0 with a small spread would lose its digits in a float32 mean).

    Arguments:
        x: a float tensor with N * inner >= 1.
    """
    count = x.shape[0] * x.shape[2]
    mean = run_map("mul", [column(channel_sums(x, "va", "0.0"), 0), 1.0 / count])
    d = channel_sums(x, "(va - m) * (va - m)", "va - m", mean=mean)
    shift = run_map("mul", [column(d, 1), 1.0 / count])
    var = run_map("sub", [run_map("mul", [column(d, 0), 1.0 / count]), run_map("mul", [shift, shift])])
    return mean, shift, run_map("clamp_min", [var, 0.0])


def affine(x: Tensor, k2: Tensor, m: Tensor | None = None, k3: Tensor | None = None, g: Tensor | None = None,
           k1: Tensor | None = None) -> Tensor:
    """``g * k1 + (x - m) * k2 + k3`` per channel of contiguous [N, C, inner] tensors, in x's dtype;
    terms whose tensors are None are left out.

    Arguments:
        x: contiguous [N, C, inner].
        k2: [C], the factor of x (or of x - m).
        m: [C] subtracted from x.
        k3: [C] added.
        g, k1: contiguous [N, C, inner] and its factor [C].
    """
    n, c, inner = x.shape
    out = Tensor.empty(x.shape, x.dtype, x.device)
    total = out.numel()
    if not total:
        return out
    xs = "(f32(x[p.off_x + i]) - f32(m[ch]))" if m is not None else "f32(x[p.off_x + i])"
    expr = f"{xs} * f32(k2[ch])"
    if g is not None:
        expr = f"f32(g[p.off_g + i]) * f32(k1[ch]) + {expr}"
    if k3 is not None:
        expr += " + f32(k3[ch])"
    vec = {name: None if t is None else _at_start(t) for name, t in (("m", m), ("k1", k1 if g is not None else None),
                                                                      ("k2", k2), ("k3", k3))}
    named = {"out": out, "x": x, "g": g} | vec
    present = [(name, t) for name, t in named.items() if t is not None]
    k = _APPLY.spec([t.dtype.storage for _, t in present], without=tuple(n for n, t in named.items() if t is None),
                    T=x.dtype.storage, EXPR=expr)
    x.device.dispatch(k, [t._storage.buffer for _, t in present],
                      _APPLY.pack(c=c, inner=inner, total=total, off_x=x._offset, off_g=0 if g is None else g._offset),
                      grid(-(-total // WORKGROUP), x.device.max_workgroups))
    return out
