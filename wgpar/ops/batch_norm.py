"""Batch norm's kernels: per-channel partial sums (shaders/batch_norm_sums.wgsl), per-channel
coefficients from them (shaders/batch_norm_finalize.wgsl: statistics, scale and offset, the running
statistics' update; or the gradients' coefficients) and per-channel affine maps
(shaders/batch_norm_apply.wgsl) over contiguous [N, C, inner] tensors. A training forward is four
dispatches, its backward three.

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
from .elementwise import cast, clone
from .reduce import reduce
from .shape import narrow, reshape

_SUMS = Kernel("batch_norm_sums", "part: w, a: r, b: r, mean: r",
               "c: u32, inner: u32, count: u32, off_a: u32, off_b: u32, chunk: u32, groups: u32, off_m: u32, "
               "mg: u32, minv: f32")
_APPLY = Kernel("batch_norm_apply", "out: w, x: r, g: r, m: r, k1: r, k2: r, k3: r",
                "c: u32, inner: u32, total: u32, off_x: u32, off_g: u32, off_m: u32, off_k1: u32, off_k2: u32, "
                "off_k3: u32")
_FINAL = Kernel("batch_norm_finalize", "st: w, pa: r, pb: r, wt: r, bs: r, rm: w, rv: w, gw: w, gb: w",
                "c: u32, g1: u32, g2: u32, inv: f32, eps: f32, momentum: f32, unbias: f32, batch: u32, off_w: u32, "
                "off_b: u32, off_rm: u32, off_rv: u32")
# Rows of the [6, C] statistics ``stats`` returns and of the [2, C] input-gradient coefficients of
# ``grad_coefficients``.
MEAN, SHIFT, VAR, INVSTD, SCALE, OFFSET = range(6)
K2, K3 = range(2)


def column(t: Tensor, j: int) -> Tensor:
    """Column ``j`` of a [C, k] tensor, as a [C] view."""
    return reshape(narrow(t, 1, j, 1), (t.shape[0],))


def row(t: Tensor, j: int) -> Tensor:
    """Row ``j`` of a [k, C] tensor, as a [C] view."""
    return reshape(narrow(t, 0, j, 1), (t.shape[1],))


def _chunking(count: int, channels: int) -> tuple[int, int]:
    """(chunk, chunks per channel): enough workgroups to fill a GPU, no thread looping past MAX_LOOP."""
    groups = max(1, min(-(-count // (8 * WORKGROUP)), 1024 // channels))
    groups = max(groups, -(-count // (WORKGROUP * MAX_LOOP)))
    chunk = -(-count // groups)
    return chunk, -(-count // chunk)


_MEAN_OF = """fn mean_of(ch: u32) -> f32 {
  var s = 0.0;
  for (var g = 0u; g < p.mg; g = g + 1u) { s = s + mean[p.off_m + 2u * ch * p.mg + g]; }
  return s * p.minv;
}"""


@functools.lru_cache(maxsize=64)
def _sums_kernel(ta: str, tb: str | None, mean: str | None, term1: str, term2: str) -> KernelSpec:
    without = tuple(n for n, keep in (("b", tb is not None), ("mean", mean is not None)) if not keep)
    types = ["f32", ta] + ([tb] if tb is not None else []) + (["f32"] if mean is not None else [])
    m = {None: "0.0", "vec": "mean[p.off_m + ch]", "parts": "mean_of(ch)"}[mean]
    return _SUMS.spec(types, without=without, MEAN=m, FNS=_MEAN_OF if mean == "parts" else "",
                      VB="f32(b[p.off_b + at])" if tb is not None else "0.0", TERM1=term1, TERM2=term2)


def channel_parts(a: Tensor, term1: str, term2: str, b: Tensor | None = None, mean: Tensor | None = None,
                  mean_parts: Tensor | None = None) -> Tensor:
    """Per channel, partial sums of ``term1`` and ``term2`` over dims 0 and 2 of [N, C, inner] tensors:
    float32 [C, 2, parts] (chunks of each channel, summed by the caller: ``channel_sums``, or the
    finalize kernel, which sums them in order).

    Arguments:
        a: contiguous [N, C, inner], read as ``va``.
        term1, term2: WGSL f32 expressions over ``va``, ``vb`` and ``m``.
        b: contiguous, a's shape, read as ``vb`` (0 without).
        mean: float32 [C] (contiguous), read as ``m`` (0 without).
        mean_parts: instead of ``mean``, the parts of the sums of ``a`` (an earlier call with term1 ``va``):
            ``m`` is their sum over the count.
    """
    n, c, inner = a.shape
    count = n * inner
    chunk, groups = _chunking(count, c)
    part = Tensor.empty((c, 2, groups), _dt.float32, a.device)
    mt = mean if mean is not None else mean_parts
    k = _sums_kernel(a.dtype.storage, None if b is None else b.dtype.storage,
                     None if mt is None else ("vec" if mean is not None else "parts"), term1, term2)
    if mt is not None and not mt.is_contiguous():
        mt = clone(mt)
    bufs = [part._storage.buffer, a._storage.buffer] + [t._storage.buffer for t in (b, mt) if t is not None]
    a.device.dispatch(k, bufs, _SUMS.pack(c=c, inner=inner, count=count, off_a=a._offset,
                                          off_b=0 if b is None else b._offset, chunk=chunk, groups=groups,
                                          off_m=0 if mt is None else mt._offset,
                                          mg=0 if mean_parts is None else mean_parts.shape[2], minv=1.0 / count),
                      grid(c * groups, a.device.max_workgroups))
    return part


def channel_sums(a: Tensor, term1: str, term2: str, b: Tensor | None = None, mean: Tensor | None = None) -> Tensor:
    """Per channel, the sums of ``term1`` and ``term2`` over dims 0 and 2 of [N, C, inner] tensors: float32 [C, 2]
    (``channel_parts`` summed)."""
    part = channel_parts(a, term1, term2, b, mean)
    return reshape(part, part.shape[:2]) if part.shape[2] == 1 else reduce("sum", part, 2)


def _finalize(mode: int, rows: int, pa: Tensor, pb: Tensor, c: int, fills: dict, extra: dict, **params) -> Tensor:
    st = Tensor.empty((rows, c), _dt.float32, pa.device)
    named = {"st": st, "pa": pa, "pb": pb} | {k: extra.get(k) for k in ("wt", "bs", "rm", "rv", "gw", "gb")}
    present = [(k, t) for k, t in named.items() if t is not None]
    k = _FINAL.spec([t.dtype.storage for _, t in present], without=tuple(k for k, t in named.items() if t is None),
                    MODE=mode, **({"GRADS": "", "RUNNING": ""} | fills))
    args = dict(g1=0, g2=0, inv=0.0, eps=0.0, momentum=0.0, unbias=0.0, batch=0, off_w=0, off_b=0, off_rm=0,
                off_rv=0) | params
    pa.device.dispatch(k, [t._storage.buffer for _, t in present], _FINAL.pack(c=c, **args),
                       grid(-(-c // WORKGROUP), pa.device.max_workgroups))
    return st


def _vec(t: Tensor | None) -> Tensor | None:
    return t if t is None or t.is_contiguous() else clone(t)


def stats(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, running_mean: Tensor | None = None,
          running_var: Tensor | None = None, momentum: float | None = None, training: bool = True) -> Tensor:
    """Batch norm's per-channel statistics and affine coefficients, float32 [6, C] (rows ``MEAN``, ``SHIFT``,
    ``VAR``, ``INVSTD``, ``SCALE``, ``OFFSET``): the output is ``(x - mean) * scale + offset``.

    Training (x's own statistics): two passes over x, the mean m first, then the sums of (x - m)^2 and
    x - m; shift = mean(x - m) is the float32 mean's rounding error, the variance is taken about
    m + shift and offset = bias - shift * scale takes it out (an input far from 0 with a small spread
    would lose its digits in a float32 mean). With ``momentum`` (a float) the float32 running
    statistics are updated in the same kernel (the variance unbiased). Otherwise (``training``
    False) the running statistics normalise; shift is 0. Four dispatches in training, one otherwise.

    Arguments:
        x: contiguous [N, C, inner] (training: N * inner >= 1).
        weight, bias: [C] or None.
        eps: added to the variance.
        running_mean, running_var: float32 [C] buffers to update (training with ``momentum``), or
            what normalises (not training, any float dtype).
        momentum: the running statistics' update factor, or None to leave them.
        training: use x's statistics.
    """
    n, c, inner = x.shape
    weight, bias = _vec(weight), _vec(bias)
    fills = {"WEIGHT": "1.0" if weight is None else "f32(wt[p.off_w + ch])",
             "BIAS": "0.0" if bias is None else "f32(bs[p.off_b + ch])"}
    params = dict(eps=float(eps), off_w=0 if weight is None else weight._offset,
                  off_b=0 if bias is None else bias._offset)
    if not training:
        rm, rv = (t if t.dtype is _dt.float32 and t.is_contiguous() else clone(cast(t, _dt.float32))
                  for t in (running_mean, running_var))
        if rm._offset or rv._offset:
            rm, rv = clone(rm), clone(rv)
        return _finalize(1, 6, rm, rv, c, fills, {"wt": weight, "bs": bias}, **params)
    count = n * inner
    p1 = channel_parts(x, "va", "0.0")
    p2 = channel_parts(x, "(va - m) * (va - m)", "va - m", mean_parts=p1)
    rm = rv = None
    if momentum is not None:
        rm, rv = running_mean, running_var
        fills["RUNNING"] = "".join(
            f"{r}[p.off_{r} + ch] = {r}[p.off_{r} + ch] + ({value} - {r}[p.off_{r} + ch]) * p.momentum;"
            for r, value, t in (("rm", "(m + shift)", rm), ("rv", "v * p.unbias", rv)) if t is not None)
        params |= dict(momentum=float(momentum), unbias=count / (count - 1) if count > 1 else float("inf"),
                       off_rm=0 if rm is None else rm._offset, off_rv=0 if rv is None else rv._offset)
    return _finalize(0, 6, p1, p2, c, fills, {"wt": weight, "bs": bias, "rm": rm, "rv": rv}, g1=p1.shape[2],
                     g2=p2.shape[2], inv=1.0 / count, **params)


def grad_coefficients(x: Tensor, g: Tensor, st: Tensor, batch_stats: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The weight and bias gradients, float32 [C] each (buffers of their own: they become the parameters'
    .grad without a copy), and the input gradient's coefficients, float32 [2, C] (rows ``K2``, ``K3``:
    gx = g * scale + (x - mean) * k2 + k3), for the output gradient ``g`` of the batch norm of ``x`` with
    statistics ``st`` (from ``stats``). Two dispatches.

    Arguments:
        x, g: contiguous [N, C, inner].
        st: the forward's [6, C] statistics.
        batch_stats: whether they were x's own (the input gradient's two corrections).
    """
    n, c, inner = x.shape
    parts = channel_parts(x, "vb", "vb * (va - m)", b=g, mean=row(st, MEAN))  # sum g, sum g * (x - mean)
    gw, gb = (Tensor.empty((c,), _dt.float32, x.device) for _ in range(2))
    k = _finalize(2, 2, parts, st, c, {"WEIGHT": "1.0", "BIAS": "0.0", "GRADS": "gw[ch] = sgx * invstd; gb[ch] = sg;"},
                  {"gw": gw, "gb": gb}, g1=parts.shape[2], inv=1.0 / (n * inner), batch=int(batch_stats))
    return gw, gb, k


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
    xs = "(f32(x[p.off_x + i]) - f32(m[p.off_m + ch]))" if m is not None else "f32(x[p.off_x + i])"
    expr = f"{xs} * f32(k2[p.off_k2 + ch])"
    if g is not None:
        expr = f"f32(g[p.off_g + i]) * f32(k1[p.off_k1 + ch]) + {expr}"
    if k3 is not None:
        expr += " + f32(k3[p.off_k3 + ch])"
    vec = {name: _vec(t) for name, t in (("m", m), ("k1", k1 if g is not None else None), ("k2", k2), ("k3", k3))}
    named = {"out": out, "x": x, "g": g} | vec
    present = [(name, t) for name, t in named.items() if t is not None]
    k = _APPLY.spec([t.dtype.storage for _, t in present], without=tuple(n for n, t in named.items() if t is None),
                    T=x.dtype.storage, EXPR=expr)
    offs = {f"off_{name}": 0 if t is None else t._offset for name, t in vec.items()}
    x.device.dispatch(k, [t._storage.buffer for _, t in present],
                      _APPLY.pack(c=c, inner=inner, total=total, off_x=x._offset, off_g=0 if g is None else g._offset,
                                  **offs),
                      grid(-(-total // WORKGROUP), x.device.max_workgroups))
    return out
