"""Fused LayerNorm kernels (shaders/layer_norm_fwd.wgsl, layer_norm_bwd.wgsl) over [rows, cols].

One forward kernel (normalise, scale, shift; save each row's mean and rstd) and one backward kernel
(the input's gradient, and dy * xhat for the weight's) replace the ten-odd elementwise and reduction
kernels of the composed form each way; ``nn.functional.layer_norm`` records them for autograd.
"""

from __future__ import annotations

from .. import dtypes as _dt
from ..runtime.kernels import Kernel, KernelSpec, grid
from ..tensor import Tensor


def threads_per_row(cols: int) -> int:
    """A power of two from 1 to 256: about 8 columns per thread, so short rows share a workgroup."""
    t = 1
    while t < 256 and t * 8 < cols:
        t *= 2
    return t


# 256-thread workgroups sized in the shaders (their shared arrays): no WG override.
_FWD = Kernel("layer_norm_fwd", "y: w, stats: w, x: r, w: r, b: r",  # absent w / b: x bound, never read
              "rows: u32, cols: u32, off_x: u32, off_w: u32, off_b: u32, flags: u32, eps: f32", constants=())
_BWD = Kernel("layer_norm_bwd", "dx: w, gxh: w, x: r, w: r, dy: r, stats: r",
              "rows: u32, cols: u32, off_x: u32, off_w: u32, off_dy: u32, flags: u32", constants=())


def _kernel(backward: bool, dtype: str, tpr: int) -> KernelSpec:
    if backward:
        return _BWD.spec((dtype, "f32", dtype, dtype, dtype, "f32"), T=dtype, TPR=tpr)
    return _FWD.spec((dtype, "f32", dtype, dtype, dtype), T=dtype, TPR=tpr)


def _groups(rows: int, tpr: int, dev) -> tuple[int, int]:
    return grid(-(-rows // (256 // tpr)), dev.max_workgroups)


def layer_norm_forward(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """(y, stats) for a contiguous [rows, cols] ``x`` and contiguous [cols] ``weight`` / ``bias`` of x's
    dtype (or None); ``stats`` float32 [2, rows] holds each row's mean and 1 / sqrt(var + eps)."""
    rows, cols = x.shape
    dev = x.device
    tpr = threads_per_row(cols)
    y = Tensor.empty((rows, cols), x.dtype, dev)
    stats = Tensor.empty((2, rows), _dt.float32, dev)
    if rows == 0 or cols == 0:
        return y, stats
    w = weight if weight is not None else x  # an absent one is bound to x and never read
    b = bias if bias is not None else x
    flags = (1 if weight is not None else 0) | (2 if bias is not None else 0)
    dev.dispatch(_kernel(False, x.dtype.storage, tpr),
                 [y._storage.buffer, stats._storage.buffer, x._storage.buffer, w._storage.buffer, b._storage.buffer],
                 _FWD.pack(rows=rows, cols=cols, off_x=x._offset, off_w=w._offset if weight is not None else 0,
                           off_b=b._offset if bias is not None else 0, flags=flags, eps=eps), _groups(rows, tpr, dev))
    return y, stats


def layer_norm_backward(x: Tensor, weight: Tensor | None, stats: Tensor, dy: Tensor,
                        want_xhat_grad: bool) -> tuple[Tensor, Tensor | None]:
    """(dx, dy * xhat or None) for ``layer_norm_forward``'s ``x``, ``weight`` and ``stats`` and the output
    gradient ``dy`` (contiguous [rows, cols], x's dtype)."""
    rows, cols = x.shape
    dev = x.device
    tpr = threads_per_row(cols)
    dx = Tensor.empty((rows, cols), x.dtype, dev)
    gxh = Tensor.empty((rows, cols) if want_xhat_grad else (1,), _dt.float32, dev)
    if rows == 0 or cols == 0:
        return dx, gxh if want_xhat_grad else None
    w = weight if weight is not None else x
    flags = (1 if weight is not None else 0) | (4 if want_xhat_grad else 0)
    dev.dispatch(_kernel(True, x.dtype.storage, tpr),
                 [dx._storage.buffer, gxh._storage.buffer, x._storage.buffer, w._storage.buffer, dy._storage.buffer,
                  stats._storage.buffer],
                 _BWD.pack(rows=rows, cols=cols, off_x=x._offset, off_w=w._offset if weight is not None else 0,
                           off_dy=dy._offset, flags=flags),
                 _groups(rows, tpr, dev))
    return dx, gxh if want_xhat_grad else None


__all__ = ["layer_norm_forward", "layer_norm_backward", "threads_per_row"]
