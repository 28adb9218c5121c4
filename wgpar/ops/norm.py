"""The norm of several tensors taken together, and scaling by a factor left on the device:
clip_grad_norm_'s kernels (shaders/optim_norm.wgsl, optim_norm_final.wgsl, optim_scale.wgsl).

Nothing is read back: the first pass folds each tensor into partials (one float per workgroup),
the second folds the partials into [norm, clip coefficient, folded partials], and the scale kernel
reads the coefficient where the second pass left it.
"""

from __future__ import annotations

import functools
import math

from .. import dtypes as _dt
from ..runtime.device import Device
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor

_CHUNK = 16 * WORKGROUP  # elements per workgroup in the first pass (at least)
_MAX_GROUPS = 1024  # per tensor; longer tensors get longer chunks
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


def norm_partials(dev: Device, tensors: list[Tensor], norm_type: float) -> Tensor:
    """Fold contiguous ``tensors`` (on ``dev``) into partial power sums (or maxima for the inf-norm),
    one float32 per workgroup.

    Arguments:
        dev: the device they are on.
        tensors: contiguous float tensors.
        norm_type: the order p > 0 of the norm, or inf.
    """
    plan = []
    total = 0
    for g in tensors:
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


def norm_finish(partial: Tensor, max_norm: float, norm_type: float) -> Tensor:
    """[norm, clip coefficient min(max_norm / (norm + 1e-6), 1), folded partials] from the partials
    (of ``norm_partials``, or folded partials of several devices gathered), on their device.

    Arguments:
        partial: float32 partials.
        max_norm: the largest allowed norm.
        norm_type: as for ``norm_partials``.
    """
    dev = partial.device
    out = Tensor.empty((3,), _dt.float32, dev)
    k = _kernels("f32", norm_type)[1]
    inv = 1.0 / norm_type if math.isfinite(norm_type) else 1.0
    dev.dispatch(k, [out._storage.buffer, partial._storage.buffer],
                 _NORM_FINAL.pack(n=partial.numel(), max_norm=max_norm, inv_ord=inv), (1, 1))
    return out


def scale_by_coefficient_(t: Tensor, summary: Tensor) -> None:
    """Multiply the contiguous tensor ``t`` in place by ``summary[1]`` (``norm_finish``'s coefficient),
    read on the device.

    Arguments:
        t: a contiguous float tensor.
        summary: ``norm_finish``'s result, on t's device.
    """
    k = _kernels(t.dtype.storage, 1.0)[2]
    t.device.dispatch(k, [t._storage.buffer, summary._storage.buffer],
                      _SCALE.pack(numel=t.numel(), off_g=t._offset, off_c=summary._offset + 1),
                      grid(-(-t.numel() // WORKGROUP), t.device.max_workgroups))
    t._storage.bump_version()
