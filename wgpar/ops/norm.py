"""The norm of several tensors taken together, and scaling by a factor left on the device:
clip_grad_norm_'s kernels (shaders/optim_norm.wgsl, optim_norm_final.wgsl, optim_scale.wgsl).

Nothing is read back: the first pass folds the tensors into partials (one float per workgroup), the
second folds the partials into [norm, clip coefficient, folded partials], and the scale kernel reads
the coefficient where the second pass left it. The first and last take several tensors a dispatch
(runtime/slots.py).
"""

from __future__ import annotations

import functools
import math

from .. import dtypes as _dt
from ..runtime import slots
from ..runtime.device import Device
from ..runtime.kernels import WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor

_CHUNK = 16 * WORKGROUP  # elements per workgroup in the first pass (at least)
_MAX_GROUPS = 1024  # per tensor; longer tensors get longer chunks
# The first and last passes take several gradients a dispatch (runtime/slots.py): one a dispatch cost a
# GPT-2 step 296 dispatches, 3.1 ms of GPU time on an H200.
_NORM = Kernel("optim_norm", "partial: w, " + slots.bindings("g", "r"), slots.fields("c") + ", base: u32, ord: f32")
_NORM_FINAL = Kernel("optim_norm_final", "out: w, partial: r", "n: u32, max_norm: f32, inv_ord: f32")
_SCALE = Kernel("optim_scale", slots.bindings("g") + ", coef: r", slots.fields() + ", off_c: u32")


def _ord_text(norm_type: float) -> tuple[str, str, str]:
    """(TERM, JOIN, ROOT) WGSL expressions for the norm's order."""
    if math.isinf(norm_type):
        return "a", "max_nan(x, y)", "raw"  # a NaN gradient gives a NaN norm, as in PyTorch
    term = {1.0: "a", 2.0: "a * a"}.get(norm_type, "select(select(pow(a, p.ord), 0.0, a == 0.0), a, isnan_(a))")
    root = {1.0: "raw", 2.0: "sqrt(raw)"}.get(norm_type, "pow(raw, p.inv_ord)")
    root = f"select({root}, raw, isnan_(raw))"  # pow / sqrt of a NaN are up to the driver
    return term, "x + y", root


@functools.lru_cache(maxsize=256)
def _norm_kernel(types: tuple[str, ...], norm_type: float) -> KernelSpec:
    term, join, _ = _ord_text(norm_type)
    code = slots.chain(len(types), lambda s: f"    let start = lw * p.c{s};\n    live = start < p.n{s};\n"
                                             f"    for (var i = start + lid; i < min(p.n{s}, start + p.c{s}); "
                                             f"i = i + WG) {{ acc = join(acc, term(abs(f32(g{s}[p.o{s} + i])))); }}")
    return _NORM.spec(("f32",) + types, slots.unused("g", len(types)), TERM=term, JOIN=join,
                      FNS=load_source("float_fns"), SLOTS=code)


@functools.lru_cache(maxsize=64)
def _final_kernel(norm_type: float) -> KernelSpec:
    _, join, root = _ord_text(norm_type)
    return _NORM_FINAL.spec(("f32", "f32"), JOIN=join, ROOT=root, FNS=load_source("float_fns"))


@functools.lru_cache(maxsize=256)
def _scale_kernel(types: tuple[str, ...]) -> KernelSpec:
    code = slots.chain(len(types), lambda s: f"    let i = lw * WG + lid;\n    if (i < p.n{s}) "
                                             f"{{ g{s}[p.o{s} + i] = {types[s]}(f32(g{s}[p.o{s} + i]) * c); }}")
    return _SCALE.spec(types + ("f32",), slots.unused("g", len(types)), SLOTS=code)


def norm_partials(dev: Device, tensors: list[Tensor], norm_type: float) -> Tensor:
    """Fold contiguous ``tensors`` (on ``dev``) into partial power sums (or maxima for the inf-norm),
    one float32 per workgroup.

    Arguments:
        dev: the device they are on.
        tensors: contiguous float tensors.
        norm_type: the order p > 0 of the norm, or inf.
    """
    groups, chunks = [], []
    for g in tensors:
        n = g.numel()
        chunks.append(max(_CHUNK, -(-n // _MAX_GROUPS)))
        groups.append(-(-n // chunks[-1]))
    partial = Tensor.empty((sum(groups),), _dt.float32, dev)
    base, i = 0, 0
    for batch in slots.batches(tensors, slots.slots_for(dev, 1)):
        words, n_groups = slots.words(batch, groups[i:i + len(batch)], c=chunks[i:i + len(batch)])
        k = _norm_kernel(tuple(t.dtype.storage for t in batch), norm_type)
        dev.dispatch(k, [partial._storage.buffer] + [t._storage.buffer for t in batch],
                     _NORM.pack(**words, base=base, ord=norm_type if math.isfinite(norm_type) else 1.0),
                     grid(n_groups, dev.max_workgroups))
        base, i = base + n_groups, i + len(batch)
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
    k = _final_kernel(norm_type)
    inv = 1.0 / norm_type if math.isfinite(norm_type) else 1.0
    dev.dispatch(k, [out._storage.buffer, partial._storage.buffer],
                 _NORM_FINAL.pack(n=partial.numel(), max_norm=max_norm, inv_ord=inv), (1, 1))
    return out


def scale_by_coefficient_(tensors: list[Tensor], summary: Tensor) -> None:
    """Multiply contiguous ``tensors`` in place by ``summary[1]`` (``norm_finish``'s coefficient), read on
    the device.

    Arguments:
        tensors: contiguous float tensors on summary's device.
        summary: ``norm_finish``'s result.
    """
    dev = summary.device
    for batch in slots.batches(tensors, slots.slots_for(dev, 1)):
        words, n_groups = slots.words(batch, [-(-t.numel() // WORKGROUP) for t in batch])
        dev.dispatch(_scale_kernel(tuple(t.dtype.storage for t in batch)),
                     [t._storage.buffer for t in batch] + [summary._storage.buffer],
                     _SCALE.pack(**words, off_c=summary._offset + 1), grid(n_groups, dev.max_workgroups))
        for t in batch:
            t._storage.bump_version()
