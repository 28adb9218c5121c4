"""The kernel-backed ops of wgpar.nn with their backward: cross-entropy, dropout, convolution,
pooling and batch norm.

Their kernels live in ops/ (loss.py, dropout.py, conv.py, pool.py, batch_norm.py); these give them
their backward.
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops
from ..ops import batch_norm as bn
from ..ops.conv import bias_grad, conv2d, conv2d_backward, conv_transpose2d, weight_grad
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

    ``apply(x, weight, bias, window, groups, out_dtype)`` with sizes and dtypes checked by the caller; bias
    may be None; ``out_dtype`` None (x's dtype) or float16 under autocast, each gradient in its operand's dtype.
    """

    name = "conv2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int,
                out_dtype=None) -> Tensor:
        ctx.win, ctx.groups = win, groups
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(x, weight)
        return conv2d(x, weight, bias, win, groups, out_dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw, gb = conv2d_backward(x, weight, g, ctx.win, ctx.groups, need_x, need_w,
                                     ctx.bias_dtype if need_b else None)
        return gx, gw, gb, None, None, None


class ConvTranspose2d(Function):
    """The transposed 2-d convolution, the adjoint of conv2d over ``win`` (ops/conv.py): its input gradient is
    conv2d of the output gradient, its weight gradient conv2d's weight gradient with the roles of input and
    output gradient swapped. ``apply(x, weight, bias, win, groups, out_dtype)``, checked by the caller
    (``out_dtype`` as for Conv2d)."""

    name = "conv_transpose2d"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, win: Window, groups: int,
                out_dtype=None) -> Tensor:
        ctx.win, ctx.groups = win, groups
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(x, weight)
        return conv_transpose2d(x, weight, bias, win, groups, out_dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = conv2d(g, weight, None, ctx.win, ctx.groups, x.dtype) if need_x else None
        gw = weight_grad(g, x, weight, ctx.win, ctx.groups) if need_w else None
        gb = bias_grad(g, ctx.bias_dtype) if need_b else None
        return gx, gw, gb, None, None, None


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
    """Batch norm of a contiguous x [N, C, ...] (``ops.batch_norm.forward``): ``(x - mean) * invstd * weight +
    bias`` per channel.

    ``apply(x, weight, bias, running_mean, running_var, momentum, training, eps, cumulative, counter, keep)``:
    weight and bias [C] or None (their gradients); the running statistics normalise unless ``training``
    (then x's own statistics do, their dependence on x goes into the input gradient, and the running
    statistics given move by ``momentum``, or by 1 / ``counter`` with ``cumulative``); ``counter``, the
    int32 batch counter, gains 1 in training; ``keep``: whether backward may run (the eval forward then
    keeps its statistics).
    """

    name = "batch_norm"

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                running_var: Tensor | None, momentum: float | Tensor, training: bool, eps: float, cumulative: bool,
                counter: Tensor | None, keep: bool) -> Tensor:
        ctx.batch_stats = training
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (weight, bias))
        ctx.save_for_backward(x, weight)
        if not x.numel():  # (evaluation: training needs two values a channel)
            ctx.stats = None
            return Tensor.empty(x.shape, x.dtype, x.device)
        y, ctx.stats = bn.forward(x, weight, bias, eps, training, running_mean, running_var, momentum, cumulative,
                                  counter, keep)
        return y

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        x = ctx.saved_tensors[0]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        w_dtype, b_dtype = (dt if need else None for dt, need in zip(ctx.dtypes, (need_w, need_b)))
        if ctx.stats is None:  # an empty input
            gx = Tensor.empty(x.shape, x.dtype, x.device) if need_x else None
            gw, gb = (None if dt is None else ops.fill((x.shape[1],), 0.0, dt, x.device) for dt in (w_dtype, b_dtype))
        else:
            gx, gw, gb = bn.backward(x, ops.contiguous(g), ctx.stats, ctx.batch_stats, need_x, w_dtype, b_dtype)
        return (gx, gw, gb) + (None,) * 8
