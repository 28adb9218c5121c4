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
                    error_if_nonfinite: bool = False, *, group=None, replicated: Iterable[Tensor] = ()) -> Tensor:
    """Scale all gradients in place so that their joint norm is at most ``max_norm`` (PyTorch's semantics).
    Differs from torch: no ``foreach=``; ``group=`` and ``replicated=`` are wgpar's (models spread over ranks).

    The norm is taken over all gradients together as if concatenated; every
    gradient is multiplied by ``min(max_norm / (norm + 1e-6), 1)``. On one
    device this runs entirely there (two reduction kernels, then one scale
    kernel per gradient) with no readback; gradients spread over several
    devices have their partial norms combined on the first one.

    A model spread over ranks (FSDP shards, tensor-parallel layers, pipeline stages) passes ``group``,
    every rank calling with its own parameters: the ranks' folded partials are all-reduced (4 bytes),
    so every rank scales by the norm of the whole model. Gradients every rank holds alike (data
    parallelism) need no group: their local norm already is the whole model's.

    Arguments:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped (None grads are skipped).
        max_norm: the largest allowed total norm.
        norm_type: the order p of the p-norm (> 0), ``float("inf")`` for the largest absolute value.
        error_if_nonfinite: raise RuntimeError if the total norm is nan or inf (costs one readback).
        group: this rank's ProcessGroup over the ranks holding the rest of the model (a collective then:
            every rank of it calls, also one without gradients); None: these parameters are the model.
        replicated: those of ``parameters`` whose gradient rank 0 of ``group`` holds too (replicated
            layers, a tied weight's copy): counted by rank 0 only, scaled everywhere.

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
    if not grads and group is None:
        return ops.fill((), 0.0, _dt.float32, params[0].device if params else _adapters.resolve(None))
    for i, g in enumerate(grads):
        if not g.dtype.is_float:
            raise TypeError(f"clip_grad_norm_: gradient {i} has dtype {g.dtype.name}")
    # The kernels index each gradient as one contiguous run from its offset.
    flats = [g if g.is_contiguous() else ops.contiguous(g) for g in grads]
    if group is not None:
        summary = _norm_over_group(grads, flats, max_norm, norm_type, group, replicated)
        coefs = {group.device: summary}
    else:
        summary, coefs = _norm_over_devices(flats, max_norm, norm_type)
    total = Tensor(summary._storage, ())
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                           f"{total.item()}; pass error_if_nonfinite=False to clip anyway")
    for d, fs in _by_device(flats).items():
        scale_by_coefficient_(fs, coefs[d])
    for g, f in zip(grads, flats):
        if f is not g:
            ops.copy_(g, f)
    return total


def _by_device(flats: list[Tensor]) -> dict[Device, list[Tensor]]:
    by_dev: dict[Device, list[Tensor]] = {}
    for f in flats:
        by_dev.setdefault(f.device, []).append(f)
    return by_dev


def _norm_over_devices(flats: list[Tensor], max_norm: float, norm_type: float) -> tuple[Tensor, dict]:
    by_dev = _by_device(flats)
    dev0 = flats[0].device
    if len(by_dev) == 1:
        summary = norm_finish(norm_partials(dev0, flats, norm_type), max_norm, norm_type)
        return summary, {dev0: summary}
    # Each device folds its own gradients; the folded values meet on the first device.
    folded = [ops.to_device(norm_finish(norm_partials(d, fs, norm_type), max_norm, norm_type)[2:3], dev0)
              for d, fs in by_dev.items()]
    summary = norm_finish(ops.cat(folded), max_norm, norm_type)
    return summary, {d: summary if d is dev0 else ops.to_device(summary, d) for d in by_dev}


def _norm_over_group(grads: list[Tensor], flats: list[Tensor], max_norm: float, norm_type: float, group,
                     replicated: Iterable[Tensor]) -> Tensor:
    """The norm of every rank's gradients together: each rank folds what it counts into one value on its
    device, one all-reduce (sum; max for the inf-norm) joins them, and every rank finishes alike."""
    dev = group.device
    for g in grads:
        if g.device is not dev:
            raise ValueError(f"clip_grad_norm_: a gradient of shape {g.shape} is on {g.device}, but over a group "
                             f"every gradient is on the rank's device, {dev}")
    skip = {id(p.grad) for p in replicated if p.grad is not None} if group.rank != 0 else set()
    counted = [f for g, f in zip(grads, flats) if id(g) not in skip]
    folded = (ops.clone(norm_finish(norm_partials(dev, counted, norm_type), max_norm, norm_type)[2:3]) if counted
              else ops.fill((1,), 0.0, _dt.float32, dev))
    group.all_reduce(folded, "max" if math.isinf(norm_type) else "sum", label="clip_grad_norm_")
    return norm_finish(folded, max_norm, norm_type)


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient in place to ``[-clip_value, clip_value]`` (PyTorch's semantics; NaN stays NaN).
    Differs from torch: no ``foreach=``.

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
