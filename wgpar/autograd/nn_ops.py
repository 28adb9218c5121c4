"""The kernel-backed ops of wgpar.nn with their backward: cross-entropy, dropout, convolution,
pooling and batch norm.

Their kernels live in ops/ (loss.py, dropout.py, conv.py, pool.py, batch_norm.py); these give them
their backward.
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops
from ..ops import batch_norm as bn
from ..ops.conv import conv2d, conv2d_backward, conv_transpose2d, weight_grad
from ..ops.dropout import dropout
from ..ops.loss import cross_entropy_grad, cross_entropy_rows
from ..ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d, max_pool2d_backward
from ..ops.window import Window
from ..tensor import Tensor
from .engine import record
from .function import Context, Function
from .grad_mode import is_grad_enabled


class CrossEntropy(Function):
    """Softmax cross-entropy of logits [N, C] against int32 class targets [N] (one fused kernel each way).

    ``apply(logits, target, reduction)``: reduction "mean", "sum" or "none" (the [N] per-row losses).
    The targets are saved with the logits: changing either in place before backward raises.
    """

    name = "cross_entropy"

    @staticmethod
    def forward(ctx: Context, logits: Tensor, target: Tensor, reduction: str) -> Tensor:
        ctx.logits = ops.contiguous(logits)
        ctx.target = ops.contiguous(target)
        ctx.reduction = reduction
        ctx.save_for_backward(logits, target)
        per_row = cross_entropy_rows(ctx.logits, ctx.target)
        if reduction == "none":
            return per_row
        loss = ops.reduce(reduction, per_row)
        return loss if loss.dtype is logits.dtype else ops.cast(loss, logits.dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        logits, target = ctx.logits, ctx.target
        n = logits.shape[0]
        if ctx.reduction == "none":  # the kernel's gradient carries 1/n; rescale each row by n * g[row]
            ones = ops.fill((1,), 1.0, _dt.float32, logits.device)
            grad = ops.binary("mul", cross_entropy_grad(logits, target, ones),
                              ops.binary("mul", ops.unsqueeze(g, 1), float(n)))
        else:
            grad = cross_entropy_grad(logits, target, g)  # (softmax - onehot) * g / n
            if ctx.reduction == "sum":
                grad = ops.binary("mul", grad, float(n))
        return grad, None, None


class Dropout(Function):
    """Inverted dropout with the mask of ``seed``; backward applies the same mask to the gradient.

    ``apply(x, p, seed)`` with 0 < p < 1.
    """

    name = "dropout"

    @staticmethod
    def forward(ctx: Context, x: Tensor, p: float, seed: int) -> Tensor:
        ctx.p, ctx.seed = p, seed
        return dropout(x, p, seed)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        return dropout(g, ctx.p, ctx.seed), None, None


class Conv2d(Function):
    """2-d convolution (ops/conv.py picks the kernels: depthwise, implicit GEMM, matmul or im2col).

    ``apply(x, weight, bias, window, groups)`` with sizes and dtypes checked by the caller; bias may be None.
    """

    name = "conv2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
        ctx.win, ctx.groups = win, groups
        ctx.save_for_backward(x, weight)
        return conv2d(x, weight, bias, win, groups)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw, gb = conv2d_backward(x, weight, g, ctx.win, ctx.groups, need_x, need_w, need_b)
        return gx, gw, gb, None, None


class ConvTranspose2d(Function):
    """The transposed 2-d convolution, the adjoint of conv2d over ``win`` (ops/conv.py): its input gradient is
    conv2d of the output gradient, its weight gradient conv2d's weight gradient with the roles of input and
    output gradient swapped. ``apply(x, weight, bias, win, groups)``, checked by the caller."""

    name = "conv_transpose2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int) -> Tensor:
        ctx.win, ctx.groups = win, groups
        ctx.save_for_backward(x, weight)
        return conv_transpose2d(x, weight, bias, win, groups)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = conv2d(g, weight, None, ctx.win, ctx.groups) if need_x else None
        gw = weight_grad(g, x, weight, ctx.win, ctx.groups) if need_w else None
        gb = ops.reduce("sum", ops.reshape(g, (g.shape[0], g.shape[1], -1)), (0, 2)) if need_b else None
        return gx, gw, gb, None, None


def max_pool2d_with_indices(x: Tensor, win: Window) -> tuple[Tensor, Tensor]:
    """Max pooling and the int32 index of each output in its input plane; the gradient flows to
    the recorded indices."""
    out, idx = max_pool2d(x, win)
    if is_grad_enabled() and x.requires_grad:
        record("max_pool2d", out, [x], lambda g: (max_pool2d_backward(g, idx, win),), [idx])
    return out, idx


class AdaptiveAvgPool2d(Function):
    """2-d adaptive average pooling of [N, C, H, W]; ``apply(x, (oh, ow))`` (``ops.pool.adaptive_avg_pool2d``)."""

    name = "adaptive_avg_pool2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, out_hw: tuple[int, int]) -> Tensor:
        ctx.hw = tuple(x.shape[2:]), out_hw
        return adaptive_avg_pool2d(x, out_hw)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        in_hw, out_hw = ctx.hw
        return adaptive_avg_pool2d(g, out_hw, backward=True, in_hw=in_hw), None


class AvgPool2d(Function):
    """2-d average pooling; ``apply(x, window, count_include_pad, divisor_override)``."""

    name = "avg_pool2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, win: Window, count_include_pad: bool, divisor: int | None) -> Tensor:
        ctx.args = win, count_include_pad, divisor
        return avg_pool2d(x, win, count_include_pad, divisor)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        return avg_pool2d(g, *ctx.args, backward=True), None, None, None


class BatchNorm(Function):
    """Batch norm of contiguous x [N, C, inner] with given coefficients: ``(x - mean) * scale + offset``.

    ``apply(x, weight, bias, stats, batch_stats)``: ``stats`` the float32 [6, C] rows of
    ``ops.batch_norm.stats`` (mean, shift, variance, invstd, scale = invstd * weight, offset); weight
    and bias [C] or None (their gradients). With ``batch_stats`` the statistics are x's own
    (training), so the input gradient includes their dependence on x; otherwise they are constants
    (running statistics).
    """

    name = "batch_norm"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor | None, bias: Tensor | None, stats: Tensor,
                batch_stats: bool) -> Tensor:
        ctx.x, ctx.stats, ctx.batch_stats = x, stats, batch_stats
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (weight, bias))
        ctx.save_for_backward(x, weight)
        return bn.affine(x, bn.row(stats, bn.SCALE), m=bn.row(stats, bn.MEAN), k3=bn.row(stats, bn.OFFSET))

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, st = ctx.x, ctx.stats
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        g = ops.contiguous(g)
        gx = gw = gb = None
        scale = bn.row(st, bn.SCALE)
        if need_w or need_b or (need_x and ctx.batch_stats):
            gw_all, gb_all, co = bn.grad_coefficients(x, g, st, ctx.batch_stats)
            if need_w:
                gw = _as(gw_all, ctx.dtypes[0])
            if need_b:
                gb = _as(gb_all, ctx.dtypes[1])
            if need_x and ctx.batch_stats:  # d/dx of (x - mean(x)) * invstd(x): two per-channel corrections
                gx = bn.affine(x, bn.row(co, bn.K2), m=bn.row(st, bn.MEAN), k3=bn.row(co, bn.K3), g=g, k1=scale)
        if need_x and gx is None:
            gx = bn.affine(g, scale)
        return gx, gw, gb, None, None


def _as(t: Tensor, dtype: _dt.DType) -> Tensor:
    return t if t.dtype is dtype else ops.cast(t, dtype)
