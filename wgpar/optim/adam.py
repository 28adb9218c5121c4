"""Adam and AdamW: one fused kernel per parameter, bias corrections computed on the host."""

from __future__ import annotations

import functools
import math
from typing import Any

from .. import ops
from ..runtime.kernels import Kernel, KernelSpec
from ..tensor import Tensor
from .optimizer import Optimizer, ParamsT, check_number, dispatch_step, step_kernel

_ADAM = Kernel("optim_adam", "param: w, grad: r, exp_avg: w, exp_avg_sq: w, max_exp_avg_sq: w, skip: r",
               "numel: u32, off_p: u32, off_g: u32, fresh: u32, weight_decay: f32, decay: f32, one_minus_beta1: f32, "
               "beta2: f32, one_minus_beta2: f32, neg_step_size: f32, bc2_sqrt: f32, eps: f32, maximize: u32")


@functools.lru_cache(maxsize=64)
def _kernel(pt: str, gt: str, amsgrad: bool) -> KernelSpec:
    if not amsgrad:
        return step_kernel(_ADAM, (pt, gt, pt, pt), without=("max_exp_avg_sq",), P=pt, DENOM_SQ="  let vd = vq;")
    return step_kernel(_ADAM, (pt, gt, pt, pt, pt), P=pt,
                      DENOM_SQ=("  let vd = max(select(f32(max_exp_avg_sq[i]), 0.0, fresh), vq);\n"
                                f"  max_exp_avg_sq[i] = {pt}(vd);"))


class Adam(Optimizer):
    """Adam, with PyTorch's ``torch.optim.Adam`` semantics.
    Differs from torch: no ``foreach=``, ``fused=``, ``capturable=`` or ``differentiable=`` (TypeError).

    ``weight_decay`` adds ``weight_decay * param`` to the gradient (L2), unless
    ``decoupled_weight_decay`` (AdamW) multiplies the parameter by
    ``1 - lr * weight_decay`` before the update. The denominator is
    ``sqrt(v) / sqrt(1 - beta2**t) + eps``.

    Arguments:
        params: Parameters, or dicts of Parameters with per-group hyperparameters.
        lr: learning rate.
        betas: decay rates of the first and second moment averages, each in [0, 1).
        eps: added to the denominator.
        weight_decay: L2 penalty (or decoupled decay rate).
        amsgrad: normalise by the running maximum of the second moment.
        maximize: ascend the objective instead of descending.
        decoupled_weight_decay: AdamW's decay.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    _CHECKS = (("lr", "learning rate"), ("eps", "epsilon value"), ("weight_decay", "weight_decay value"))

    def _validate(self, group: dict[str, Any]) -> None:
        super()._validate(group)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for i, b in enumerate(betas):
            check_number(f"beta parameter at index {i}", b, high=1.0)
        group["betas"] = tuple(betas)

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        amsgrad = bool(group["amsgrad"])
        fresh = "exp_avg" not in state
        if fresh:
            state["step"] = 0
            state["exp_avg"] = Tensor.empty(p.shape, p.dtype, p.device)
            state["exp_avg_sq"] = Tensor.empty(p.shape, p.dtype, p.device)
        moments = [state["exp_avg"], state["exp_avg_sq"]]
        if amsgrad:
            if "max_exp_avg_sq" not in state:
                # A checkpoint saved without AMSGrad: the running maximum starts from the current average.
                state["max_exp_avg_sq"] = (Tensor.empty(p.shape, p.dtype, p.device) if fresh
                                           else ops.clone(state["exp_avg_sq"]))
            moments.append(state["max_exp_avg_sq"])
        state["step"] += 1
        step = state["step"]
        lr = float(group["lr"])
        beta1, beta2 = (float(b) for b in group["betas"])
        wd = float(group["weight_decay"])
        decoupled = bool(group["decoupled_weight_decay"])
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        params = _ADAM.pack(numel=p.numel(), off_p=p._offset, off_g=grad._offset, fresh=int(fresh),
                            weight_decay=0.0 if decoupled else wd, decay=1 - lr * wd if decoupled else 1.0,
                            one_minus_beta1=1 - beta1, beta2=beta2, one_minus_beta2=1 - beta2,
                            neg_step_size=-step_size, bc2_sqrt=math.sqrt(bias_correction2),
                            eps=float(group["eps"]), maximize=int(bool(group["maximize"])))
        for t in moments:
            t._storage.bump_version()
        k = _kernel(p.dtype.storage, grad.dtype.storage, amsgrad)
        dispatch_step(k, p, [p._storage.buffer, grad._storage.buffer, *(t._storage.buffer for t in moments)], params)


class AdamW(Adam):
    """AdamW (decoupled weight decay), with PyTorch's ``torch.optim.AdamW`` semantics.
    Differs from torch: no ``foreach=``, ``fused=``, ``capturable=`` or ``differentiable=`` (TypeError).

    Arguments: as for ``Adam``; ``weight_decay`` defaults to 1e-2 and decays the
    parameter by ``1 - lr * weight_decay`` before each update.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Optimizer.load_state_dict; every group keeps AdamW's decoupled weight decay."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True


Optimizer._GUARDABLE.add(Adam._update)  # only step kernels: a guarded step skips on the device
