"""Fused LayerNorm kernels (shaders/layer_norm_fwd.wgsl, layer_norm_bwd.wgsl) over [rows, cols].

One forward kernel (normalise, scale, shift; save each row's mean and rstd) and one backward kernel
(the input's gradient, and per-workgroup partial sums of dy * xhat and dy) plus one column reduction
(the weight's and bias's gradients) replace the ten-odd elementwise and reduction kernels of the
composed form each way; ``nn.functional.layer_norm`` records them for autograd.
"""

from __future__ import annotations

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, Kernel, KernelSpec, grid
from ..tensor import Tensor
from .elementwise import fill
from .reduce import column_sums
from .shape import narrow, reshape


def threads_per_row(cols: int) -> int:
    """A power of two from 1 to 256: about 8 columns per thread, so short rows share a workgroup."""
    t = 1
    while t < 256 and t * 8 < cols:
        t *= 2
    return t


# 256-thread workgroups sized in the shaders (their shared arrays): no WG override.
_FWD = Kernel("layer_norm_fwd", "y: w, stats: w, x: r, w: r, b: r",  # absent w / b: x bound, never read
              "rows: u32, cols: u32, off_x: u32, off_w: u32, off_b: u32, flags: u32, eps: f32", constants=())
_BWD = Kernel("layer_norm_bwd", "dx: w, parts: w, x: r, w: r, dy: r, stats: r",
              "rows: u32, cols: u32, off_x: u32, off_w: u32, off_dy: u32, flags: u32, blocks: u32, groups: u32",
              constants=())
# The backward's workgroups when it sums the weight's and bias's gradients: each walks a share of the
# rows, so its partial sums cover many rows (on a 132-SM GPU about 4 workgroups an SM) and the partials,
# [2, 512, cols], stay small enough for one pass to finish.
_PARTS = 512
# Columns a thread keeps those sums of in registers (up to 4096 columns at 256 threads a row); wider
# rows keep them in the workgroup's part row in memory.
_KMAX = 16


def _kernel(backward: bool, dtype: str, tpr: int, k: int = 0) -> KernelSpec:
    if backward:
        kn = str(k) + "u" if k else "(p.cols + TPR - 1u) / TPR"
        return _BWD.spec((dtype, "f32", dtype, dtype, dtype, "f32"), T=dtype, TPR=tpr, K=k, KR=max(k, 1), KN=kn)
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
                        want_param_grads: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, the weight's gradient, the bias's gradient; both [cols] of x's dtype, or None) for
    ``layer_norm_forward``'s ``x``, ``weight`` and ``stats`` and the output gradient ``dy`` (contiguous
    [rows, cols], x's dtype). Three dispatches: the kernel, then one pass over its partial sums for
    each parameter (more where MAX_LOOP asks for more than 512 workgroups: about a million rows).
    Each gradient gets a buffer of its own: autograd then stores it in .grad without a copy."""
    rows, cols = x.shape
    dev = x.device
    dx = Tensor.empty((rows, cols), x.dtype, dev)
    if rows == 0 or cols == 0:
        if not want_param_grads:
            return dx, None, None
        return dx, fill((cols,), 0, x.dtype, dev), fill((cols,), 0, x.dtype, dev)
    tpr = threads_per_row(cols)
    k = -(-cols // tpr)
    k = k if k <= _KMAX else 0
    assert k or tpr == 256  # a part row in memory is race-free only with one row a block
    blocks = -(-rows // (256 // tpr))
    groups = blocks
    if want_param_grads:
        loops = 2 * -(-cols // tpr) + 2 * tpr.bit_length() + 2  # a thread's loop iterations per block
        groups = max(min(blocks, _PARTS), -(-blocks // max(1, MAX_LOOP // loops)))  # lavapipe's loop limit
    parts = Tensor.empty((2, groups, cols) if want_param_grads else (1,), _dt.float32, dev)
    w = weight if weight is not None else x
    flags = (1 if weight is not None else 0) | (4 if want_param_grads else 0)
    dev.dispatch(_kernel(True, x.dtype.storage, tpr, k),
                 [dx._storage.buffer, parts._storage.buffer, x._storage.buffer, w._storage.buffer,
                  dy._storage.buffer, stats._storage.buffer],
                 _BWD.pack(rows=rows, cols=cols, off_x=x._offset, off_w=w._offset if weight is not None else 0,
                           off_dy=dy._offset, flags=flags, blocks=blocks, groups=groups),
                 grid(groups, dev.max_workgroups))
    if not want_param_grads:
        return dx, None, None
    gw, gb = (reshape(column_sums(narrow(parts, 0, i, 1), 1, groups, cols, x.dtype), (cols,)) for i in (0, 1))
    return dx, gw, gb


__all__ = ["layer_norm_forward", "layer_norm_backward", "threads_per_row"]
