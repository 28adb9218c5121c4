"""Gradient utilities: clip_grad_norm_ with the clip coefficient computed on the device."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from .. import dtypes as _dt
from .. import ops
from ..autograd.grad_mode import no_grad
from ..runtime import adapters as _adapters
from ..runtime.device import Device
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor

_CHUNK = 16 * WORKGROUP  # elements per workgroup in the first pass (at least)
_MAX_GROUPS = 1024  # per gradient; longer gradients get longer chunks
_NORM = Kernel("optim_norm", "partial: w, grad: r", "numel: u32, off_g: u32, base: u32, chunk: u32, ord: f32")
_NORM_FINAL = Kernel("optim_norm_final", "out: w, partial: r", "n: u32, max_norm: f32, inv_ord: f32")
_SCALE = Kernel("optim_scale", "grad: w, coef: r", "numel: u32, off_g: u32, off_c: u32")


def _ord_text(norm_type: float) -> tuple[str, str, str]:
    """(TERM, JOIN, ROOT) WGSL expressions for the norm's order."""
    if math.isinf(norm_type):
        return "a", "max_nan(x, y)", "raw"  # a NaN gradient gives a NaN norm, as in PyTorch
    term = {1.0: "a", 2.0: "a * a"}.get(norm_type, "select(select(pow(a, p.ord), 0.0, a == 0.0), a, isnan_(a))")
    root = {1.0: "raw", 2.0: "sqrt(raw)"}.get(norm_type, "pow(raw, p.inv_ord)")
    root = f"select({root}, raw, isnan_(raw))"  # pow / sqrt of a NaN are up to the driver
    return term, "x + y", root


@functools.lru_cache(maxsize=64)
def _kernels(gt: str, norm_type: float) -> tuple[KernelSpec, KernelSpec, KernelSpec]:
    term, join, root = _ord_text(norm_type)
    fns = load_source("float_fns")
    return (_NORM.spec(("f32", gt), TERM=term, JOIN=join, FNS=fns),
            _NORM_FINAL.spec(("f32", "f32"), JOIN=join, ROOT=root, FNS=fns),
            _SCALE.spec((gt, "f32"), G=gt))


def _fold(dev: Device, grads: list[Tensor], norm_type: float) -> Tensor:
    """Fold ``grads`` (on ``dev``) into partial powers-sums (or maxima), one float per workgroup."""
    plan = []
    total = 0
    for g in grads:
        n = g.numel()
        chunk = max(_CHUNK, -(-n // _MAX_GROUPS))
        groups = -(-n // chunk)
        plan.append((g, chunk, groups, total))
        total += groups
    partial = Tensor.empty((total,), _dt.float32, dev)
    for g, chunk, groups, base in plan:
        k = _kernels(g.dtype.storage, norm_type)[0]
        dev.dispatch(k, [partial._storage.buffer, g._storage.buffer],
                     _NORM.pack(numel=g.numel(), off_g=g._offset, base=base, chunk=chunk,
                                ord=norm_type if math.isfinite(norm_type) else 1.0),
                     grid(groups, dev.max_workgroups))
    return partial


def _finish(partial: Tensor, max_norm: float, norm_type: float) -> Tensor:
    """[norm, clip coefficient, folded partials] from partials, on their device."""
    dev = partial.device
    out = Tensor.empty((3,), _dt.float32, dev)
    k = _kernels("f32", norm_type)[1]
    inv = 1.0 / norm_type if math.isfinite(norm_type) else 1.0
    dev.dispatch(k, [out._storage.buffer, partial._storage.buffer],
                 _NORM_FINAL.pack(n=partial.numel(), max_norm=max_norm, inv_ord=inv), (1, 1))
    return out


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
        summary = _finish(_fold(dev0, flats, norm_type), max_norm, norm_type)
        coefs = {dev0: summary}
    else:
        # Each device folds its own gradients; the folded values meet on the first device.
        folded = [ops.to_device(_finish(_fold(d, fs, norm_type), max_norm, norm_type)[2:3], dev0)
                  for d, fs in by_dev.items()]
        summary = _finish(ops.cat(folded), max_norm, norm_type)
        coefs = {d: summary if d is dev0 else ops.to_device(summary, d) for d in by_dev}
    total = Tensor(summary._storage, ())
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                           f"{total.item()}; pass error_if_nonfinite=False to clip anyway")
    for g, f in zip(grads, flats):
        k = _kernels(f.dtype.storage, norm_type)[2]
        f.device.dispatch(k, [f._storage.buffer, coefs[f.device]._storage.buffer],
                          _SCALE.pack(numel=f.numel(), off_g=f._offset, off_c=1),
                          grid(-(-f.numel() // WORKGROUP), f.device.max_workgroups))
        if f is not g:
            ops.copy_(g, f)
        g._storage.version += 1
    return total


__all__ = ["clip_grad_norm_"]


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
