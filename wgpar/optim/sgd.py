"""SGD with momentum, dampening, Nesterov and weight decay: one fused kernel per parameter."""

from __future__ import annotations

import functools
from typing import Any

from ..runtime.kernels import Kernel, KernelSpec
from ..tensor import Tensor
from .optimizer import Optimizer, ParamsT, check_number, dispatch_step, step_kernel

_SGD = Kernel("optim_sgd", "param: w, grad: r, buf: w, skip: r",
              "numel: u32, off_p: u32, off_g: u32, first: u32, neg_lr: f32, momentum: f32, one_minus_dampening: f32, "
              "weight_decay: f32, maximize: u32")
_MOMENTUM = """  var b = g;
  if (p.first == 0u) {{ b = f32(buf[i]) * p.momentum + p.one_minus_dampening * g; }}  // buf.mul_(m).add_(g, alpha=1-d)
  buf[i] = {P}(b);
  {use}"""


@functools.lru_cache(maxsize=64)
def _kernel(pt: str, gt: str, momentum: bool, nesterov: bool) -> KernelSpec:
    if not momentum:
        return step_kernel(_SGD, (pt, gt), without=("buf",), P=pt, MOMENTUM="")
    use = "g = g + p.momentum * f32({P}(b));" if nesterov else "g = f32({P}(b));"
    return step_kernel(_SGD, (pt, gt, pt), P=pt, MOMENTUM=_MOMENTUM.format(P=pt, use=use.format(P=pt)))


class SGD(Optimizer):
    """Stochastic gradient descent, with PyTorch's ``torch.optim.SGD`` semantics.
    Differs from torch: no ``foreach=``, ``fused=``, ``capturable=`` or ``differentiable=`` (TypeError).

    The momentum buffer starts as the first gradient (no dampening on the first
    step); Nesterov uses ``grad + momentum * buf``; weight decay adds
    ``weight_decay * param`` to the gradient.

    Arguments:
        params: Parameters, or dicts of Parameters with per-group hyperparameters.
        lr: learning rate.
        momentum: momentum factor (0 disables the momentum buffer).
        dampening: dampening of the momentum.
        weight_decay: L2 penalty.
        nesterov: use Nesterov momentum (needs momentum > 0 and dampening 0).
        maximize: ascend the objective instead of descending.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def _validate(self, group: dict[str, Any]) -> None:
        check_number("learning rate", group["lr"])
        momentum = check_number("momentum value", group["momentum"])
        dampening = check_number("dampening value", group["dampening"], low=float("-inf"))
        check_number("weight_decay value", group["weight_decay"])
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        momentum = float(group["momentum"])
        buffers = [p._storage.buffer, grad._storage.buffer]
        first = 0
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = Tensor.empty(p.shape, p.dtype, p.device)
                first = 1
            buffers.append(buf._storage.buffer)
            buf._storage.bump_version()
        k = _kernel(p.dtype.storage, grad.dtype.storage, momentum != 0, bool(group["nesterov"]))
        params = _SGD.pack(numel=p.numel(), off_p=p._offset, off_g=grad._offset, first=first,
                           neg_lr=-float(group["lr"]), momentum=momentum,
                           one_minus_dampening=1.0 - float(group["dampening"]),
                           weight_decay=float(group["weight_decay"]), maximize=int(bool(group["maximize"])))
        dispatch_step(k, p, buffers, params)


Optimizer._GUARDABLE.add(SGD._update)  # only step kernels: a guarded step skips on the device
__all__ = ["SGD"]
