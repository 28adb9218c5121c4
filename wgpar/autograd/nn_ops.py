"""The kernel-backed ops of wgpar.nn as autograd Functions: cross-entropy and dropout.

Their kernels live in ops/ (loss.py, dropout.py); these classes give them their backward.
"""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops as raw
from ..ops.dropout import dropout
from ..ops.loss import cross_entropy_grad, cross_entropy_rows
from ..tensor import Tensor
from .function import Context, Function


class CrossEntropy(Function):
    """Softmax cross-entropy of logits [N, C] against int32 class targets [N] (one fused kernel each way).

    ``apply(logits, target, reduction)``: reduction "mean", "sum" or "none" (the [N] per-row losses).
    The targets are saved with the logits: changing either in place before backward raises.
    """

    name = "cross_entropy"

    @staticmethod
    def forward(ctx: Context, logits: Tensor, target: Tensor, reduction: str) -> Tensor:
        ctx.logits = raw.contiguous(logits)
        ctx.target = raw.contiguous(target)
        ctx.reduction = reduction
        ctx.save_for_backward(logits, target)
        per_row = cross_entropy_rows(ctx.logits, ctx.target)
        if reduction == "none":
            return per_row
        loss = raw.reduce(reduction, per_row)
        return loss if loss.dtype is logits.dtype else raw.cast(loss, logits.dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor):
        logits, target = ctx.logits, ctx.target
        n = logits.shape[0]
        if ctx.reduction == "none":  # the kernel's gradient carries 1/n; rescale each row by n * g[row]
            ones = raw.fill((1,), 1.0, _dt.float32, logits.device)
            grad = raw.binary("mul", cross_entropy_grad(logits, target, ones),
                              raw.binary("mul", raw.unsqueeze(g, 1), float(n)))
        else:
            grad = cross_entropy_grad(logits, target, g)  # (softmax - onehot) * g / n
            if ctx.reduction == "sum":
                grad = raw.binary("mul", grad, float(n))
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
