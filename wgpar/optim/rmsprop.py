"""RMSprop (centred, with momentum): one fused kernel per parameter."""

from __future__ import annotations

import functools
from typing import Any

from ..runtime.kernels import Kernel, KernelSpec
from ..tensor import Tensor
from .optimizer import Optimizer, ParamsT, dispatch_step, step_kernel

_RMSPROP = Kernel("optim_rmsprop", "param: w, grad: r, square_avg: w, grad_avg: w, buf: w, skip: r",
                  "numel: u32, off_p: u32, off_g: u32, fresh: u32, neg_lr: f32, alpha: f32, one_minus_alpha: f32, "
                  "eps: f32, weight_decay: f32, momentum: f32, maximize: u32")
_CENTER = """  // grad_avg.lerp_(grad, 1 - alpha); avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
  let ga = lerp_(select(f32(grad_avg[i]), 0.0, (p.fresh & 2u) != 0u), g, p.one_minus_alpha);
  grad_avg[i] = {P}(ga);
  let gq = f32({P}(ga));
  ms = ms - gq * gq;"""
_PLAIN = "  param[p.off_p + i] = {P}(w + p.neg_lr * (g / avg));  // param.addcdiv_(grad, avg, value=-lr)"
_MOMENTUM = """  // buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)
  let b = select(f32(buf[i]), 0.0, (p.fresh & 4u) != 0u) * p.momentum + g / avg;
  buf[i] = {P}(b);
  param[p.off_p + i] = {P}(w + p.neg_lr * f32({P}(b)));"""


@functools.lru_cache(maxsize=64)
def _kernel(pt: str, gt: str, centered: bool, momentum: bool) -> KernelSpec:
    without = tuple(name for name, on in (("grad_avg", centered), ("buf", momentum)) if not on)
    types = (pt, gt) + (pt,) * (3 - len(without))
    return step_kernel(_RMSPROP, types, without=without, P=pt, CENTER=_CENTER.format(P=pt) if centered else "",
                         UPDATE=(_MOMENTUM if momentum else _PLAIN).format(P=pt))


class RMSprop(Optimizer):
    """RMSprop, with PyTorch's ``torch.optim.RMSprop`` semantics and state (``step``, ``square_avg``,
    ``momentum_buffer`` with momentum, ``grad_avg`` when centred).
    Differs from torch: no ``foreach=``, ``fused=``, ``capturable=`` or ``differentiable=`` (TypeError).

    ``square_avg = alpha * square_avg + (1 - alpha) * grad**2``; the step divides the gradient by
    ``sqrt(square_avg) + eps`` (centred: ``sqrt(square_avg - grad_avg**2) + eps``, ``grad_avg`` the
    running mean of the gradient). With ``momentum > 0`` the quotient accumulates into a momentum
    buffer (``buf = momentum * buf + grad / avg``) and the parameter moves by ``-lr * buf``.
    ``weight_decay`` adds ``weight_decay * param`` to the gradient (L2).

    Arguments:
        params: Parameters, or dicts of Parameters with per-group hyperparameters.
        lr: learning rate.
        alpha: smoothing constant of the squared-gradient average.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        momentum: momentum factor (0 keeps no buffer).
        centered: normalise by the estimated variance of the gradient instead of its raw second moment.
        maximize: ascend the objective instead of descending.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, maximize=maximize)
        super().__init__(params, defaults)

    _CHECKS = (("lr", "learning rate"), ("eps", "epsilon value"), ("momentum", "momentum value"),
               ("weight_decay", "weight_decay value"), ("alpha", "alpha value"))

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        momentum = float(group["momentum"])
        centered = bool(group["centered"])
        fresh = 0
        wanted = [("square_avg", True, 1), ("grad_avg", centered, 2), ("momentum_buffer", momentum > 0, 4)]
        buffers = [p._storage.buffer, grad._storage.buffer]
        for name, on, bit in wanted:
            if not on:
                continue
            if name not in state:
                state[name] = Tensor.empty(p.shape, p.dtype, p.device)
                fresh |= bit
            state[name]._storage.bump_version()
            buffers.append(state[name]._storage.buffer)
        state["step"] = state.get("step", 0) + 1
        alpha = float(group["alpha"])
        params = _RMSPROP.pack(numel=p.numel(), off_p=p._offset, off_g=grad._offset, fresh=fresh,
                               neg_lr=-float(group["lr"]), alpha=alpha, one_minus_alpha=1 - alpha,
                               eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                               momentum=momentum, maximize=int(bool(group["maximize"])))
        k = _kernel(p.dtype.storage, grad.dtype.storage, centered, momentum > 0)
        dispatch_step(k, p, buffers, params)


Optimizer._GUARDABLE.add(RMSprop._update)  # only step kernels: a guarded step skips on the device
__all__ = ["RMSprop"]
