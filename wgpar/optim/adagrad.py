"""Adagrad: one fused kernel per parameter, the decayed learning rate computed on the host."""

from __future__ import annotations

import functools
from typing import Any

from ..runtime.kernels import Kernel, KernelSpec
from ..tensor import Tensor
from .optimizer import Optimizer, ParamsT, dispatch_step, step_kernel

_ADAGRAD = Kernel("optim_adagrad", "param: w, grad: r, state_sum: w, skip: r",
                  "numel: u32, off_p: u32, off_g: u32, fresh: u32, neg_clr: f32, init_acc: f32, eps: f32, "
                  "weight_decay: f32, maximize: u32")


@functools.lru_cache(maxsize=64)
def _kernel(pt: str, gt: str) -> KernelSpec:
    return step_kernel(_ADAGRAD, (pt, gt, pt), P=pt)


class Adagrad(Optimizer):
    """Adagrad, with PyTorch's ``torch.optim.Adagrad`` semantics and state (``step``, ``sum``).
    Differs from torch: no ``foreach=``, ``fused=``, ``capturable=`` or ``differentiable=`` (TypeError).

    ``sum`` starts at ``initial_accumulator_value`` and accumulates ``grad**2``; step t moves the
    parameter by ``-clr * grad / (sqrt(sum) + eps)`` with ``clr = lr / (1 + (t - 1) * lr_decay)``.
    ``weight_decay`` adds ``weight_decay * param`` to the gradient (L2). Two differences from torch,
    which fills ``sum`` when the optimizer is built: the state appears at a parameter's first step
    (``state_dict()`` before any step has none; a torch state loads either way), and a group's own
    ``initial_accumulator_value`` is used, where torch fills every group from the constructor's.

    Arguments:
        params: Parameters, or dicts of Parameters with per-group hyperparameters.
        lr: learning rate.
        lr_decay: learning-rate decay per step.
        weight_decay: L2 penalty.
        initial_accumulator_value: the starting value of the sum of squared gradients.
        eps: added to the denominator.
        maximize: ascend the objective instead of descending.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False) -> None:
        defaults = dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize)
        super().__init__(params, defaults)

    _CHECKS = (("lr", "learning rate"), ("lr_decay", "lr_decay value"), ("weight_decay", "weight_decay value"),
               ("initial_accumulator_value", "initial_accumulator_value"), ("eps", "epsilon value"))

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        fresh = "sum" not in state
        if fresh:
            state["sum"] = Tensor.empty(p.shape, p.dtype, p.device)
        state["sum"]._storage.bump_version()
        state["step"] = step = state.get("step", 0) + 1
        clr = float(group["lr"]) / (1 + (step - 1) * float(group["lr_decay"]))
        params = _ADAGRAD.pack(numel=p.numel(), off_p=p._offset, off_g=grad._offset, fresh=int(fresh), neg_clr=-clr,
                               init_acc=float(group["initial_accumulator_value"]), eps=float(group["eps"]),
                               weight_decay=float(group["weight_decay"]), maximize=int(bool(group["maximize"])))
        dispatch_step(_kernel(p.dtype.storage, grad.dtype.storage), p,
                      [p._storage.buffer, grad._storage.buffer, state["sum"]._storage.buffer], params)


Optimizer._GUARDABLE.add(Adagrad._update)  # only step kernels: a guarded step skips on the device
__all__ = ["Adagrad"]
