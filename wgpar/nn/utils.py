"""Gradient utilities: clip_grad_norm_ with the clip coefficient computed on the device, clip_grad_value_."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .. import dtypes as _dt
from .. import ops
from ..autograd.grad_mode import no_grad
from ..ops.norm import norm_finish, norm_partials, scale_by_coefficient_
from ..runtime import adapters as _adapters
from ..runtime.device import Device
from ..tensor import Tensor


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale all gradients in place so that their joint norm is at most ``max_norm`` (PyTorch's semantics).

    The norm is taken over all gradients together as if concatenated; every
    gradient is multiplied by ``min(max_norm / (norm + 1e-6), 1)``. On one
    device this runs entirely there (two reduction kernels, then one scale
    kernel per gradient) with no readback; gradients spread over several
    devices have their partial norms combined on the first one.

    Arguments:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped (None grads are skipped).
        max_norm: the largest allowed total norm.
        norm_type: the order p of the p-norm (> 0), ``float("inf")`` for the largest absolute value.
        error_if_nonfinite: raise RuntimeError if the total norm is nan or inf (costs one readback).

    Returns:
        the total norm of the gradients before clipping, a 0-d float32 tensor.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad_norm_: parameters[{i}] is {type(p).__name__}, not a wgpar Tensor")
    norm_type = float(norm_type)
    if math.isnan(norm_type) or norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    max_norm = float(max_norm)
    grads = [p.grad for p in params if p.grad is not None and p.grad.numel() > 0]
    if not grads:
        return ops.fill((), 0.0, _dt.float32, params[0].device if params else _adapters.resolve(None))
    for i, g in enumerate(grads):
        if not g.dtype.is_float:
            raise TypeError(f"clip_grad_norm_: gradient {i} has dtype {g.dtype.name}")
    # The kernels index each gradient as one contiguous run from its offset.
    flats = [g if g.is_contiguous() else ops.contiguous(g) for g in grads]
    by_dev: dict[Device, list[Tensor]] = {}
    for f in flats:
        by_dev.setdefault(f.device, []).append(f)
    dev0 = flats[0].device
    if len(by_dev) == 1:
        summary = norm_finish(norm_partials(dev0, flats, norm_type), max_norm, norm_type)
        coefs = {dev0: summary}
    else:
        # Each device folds its own gradients; the folded values meet on the first device.
        folded = [ops.to_device(norm_finish(norm_partials(d, fs, norm_type), max_norm, norm_type)[2:3], dev0)
                  for d, fs in by_dev.items()]
        summary = norm_finish(ops.cat(folded), max_norm, norm_type)
        coefs = {d: summary if d is dev0 else ops.to_device(summary, d) for d in by_dev}
    total = Tensor(summary._storage, ())
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                           f"{total.item()}; pass error_if_nonfinite=False to clip anyway")
    for g, f in zip(grads, flats):
        scale_by_coefficient_(f, coefs[f.device])
        if f is not g:
            ops.copy_(g, f)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient in place to ``[-clip_value, clip_value]`` (PyTorch's semantics; NaN stays NaN).

    One clamp kernel per gradient, no readback; parameters without a gradient are skipped.

    Arguments:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped.
        clip_value: the largest allowed absolute value of a gradient element.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad_value_: parameters[{i}] is {type(p).__name__}, not a wgpar Tensor")
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float)):
        raise TypeError(f"clip_grad_value_: clip_value must be a number, got {type(clip_value).__name__}")
    clip_value = float(clip_value)
    with no_grad():
        for p in params:
            if p.grad is not None and p.grad.numel() > 0:
                p.grad.clamp_(-clip_value, clip_value)


__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def zero_grad_(parameters: Iterable[Tensor], set_to_none: bool = True) -> None:
    """Reset gradients: to None (frees memory; the default) or to zeros in place, outside the graph."""
    for p in parameters:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
            continue
        with no_grad():
            if p.grad._node is not None:
                p.grad = p.grad.detach()
            p.grad.requires_grad = False
            p.grad.zero_()
