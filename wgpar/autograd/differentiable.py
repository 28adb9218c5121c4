"""Differentiable versions of the kernel ops: each runs the raw op and records its backward.

Tensor methods (through wgpar.tensor's hook, with ``backward`` and ``retain_grad``) and wgpar's
top-level functions call these; backward closures call the raw ops in wgpar.ops, so they record
nothing themselves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from .. import dtypes as _dt
from .. import ops, return_types
from ..ops.index import as_index, index_add_rows, index_what
from ..ops.reduce import column_sums
from ..ops.registry import GRADS, OPS, SAVES
from ..ops.shape import narrow, stack_dim
from ..tensor import Tensor, contiguous_strides, wrap_dim
from .autocast_mode import get_autocast_dtype, is_autocast_enabled
from .engine import Parts, attach, backward, record, retain_grad
from .grad_mode import is_grad_enabled


def _needs(x) -> bool:
    return isinstance(x, Tensor) and x.requires_grad


def unbroadcast(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum a broadcast gradient back down to ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1]
    if axes:
        g = ops.reduce("sum", g, tuple(axes), keepdims=True)
    return ops.reshape(g, shape)


# -- autocast (autograd/autocast_mode.py; the rules: docs/design.md "AMP") ---------------------------------
def autocast_lower(t):
    """Inside autocast, a float32 tensor cast to the autocast dtype (a recorded cast: its gradient
    comes back float32); anything else unchanged."""
    if not (isinstance(t, Tensor) and t.dtype is _dt.float32 and is_autocast_enabled()):
        return t
    return cast(t, autocast_dtype(t.device))


def autocast_dtype(dev):
    """The autocast dtype, for an op that folds the casts into its kernels (convolutions: float32 operands
    read as they are, a float16 result); TypeError where ``dev`` cannot run float16 kernels."""
    if not dev.has_f16:
        raise TypeError(f"autocast(dtype=float16): {dev} has no shader-f16 feature, so it cannot run float16 "
                        "kernels; train without autocast (--amp) on this adapter")
    return get_autocast_dtype()


def autocast_full(t):
    """Inside autocast, a float16 tensor cast to float32 (ops that need the range: softmax, norms, losses)."""
    if isinstance(t, Tensor) and t.dtype is _dt.float16 and is_autocast_enabled():
        return cast(t, _dt.float32)
    return t


# -- elementwise: every op of ops/registry.py, its backward from its gradient expressions ----------
_AUTOCAST_FP32 = frozenset(name for name, op in OPS.items() if op.autocast_fp32)


def unary(op: str, a: Tensor) -> Tensor:
    if op in _AUTOCAST_FP32 and is_autocast_enabled():
        a = autocast_full(a)
    return _elementwise(op, ops.unary(op, a), (a,))


def binary(op: str, a, b) -> Tensor:
    if op in _AUTOCAST_FP32 and is_autocast_enabled():
        a, b = autocast_full(a), autocast_full(b)
    return _elementwise(op, ops.binary(op, a, b), (a, b))


def where(cond: Tensor, a, b) -> Tensor:
    return _elementwise("where", ops.where(cond, a, b), (cond, a, b))


def clamp(a: Tensor, min=None, max=None) -> Tensor:
    out = ops.clamp(a, min, max)
    if min is None:
        return _elementwise("clamp_max", out, (a, max), "clamp")
    if max is None:
        return _elementwise("clamp_min", out, (a, min), "clamp")
    return _elementwise("clamp", out, (a, min, max))


_PASS = "g"  # a gradient that is the incoming one (registry.GRADS)
_GRAD_PLANS: dict[tuple[str, tuple[bool, ...]], tuple] = {}


def _grad_plan(op: str, needs: tuple[bool, ...]) -> tuple[tuple[int, ...], tuple]:
    """What an elementwise node of ``op`` saves and runs when the operands in ``needs`` need gradients,
    cached per op and mask (as torch saves an operand only for a gradient that reads it): the operands
    to keep (their index, -1 for the output y), and per operand None, ``_PASS`` or (the gradient's op,
    each of its arguments as an index into (g, *kept))."""
    hit = _GRAD_PLANS.get((op, needs))
    if hit is None:
        grads = GRADS[op]
        names = {v for k, kernel in enumerate(grads) if needs[k] and not isinstance(kernel, str) and kernel
                 for v in kernel.operands} - {"g"}
        kept = tuple(v for v in SAVES[op] if v in names)
        runs = tuple(None if kernel is None or not needs[k] else _PASS if kernel == "g" else
                     (kernel.op, tuple(0 if v == "g" else 1 + kept.index(v) for v in kernel.operands))
                     for k, kernel in enumerate(grads))
        hit = _GRAD_PLANS[(op, needs)] = (tuple(-1 if v == "y" else int(v[1]) for v in kept), runs)
    return hit


def _elementwise_backward(runs: tuple, kept: tuple, shapes: tuple, g: Tensor, mask=None) -> tuple:
    """The backward of an elementwise node (a partial of this holds what it needs: one object, not a closure
    and its cells, for the cycle collector to walk). ``mask``: a split backward computes each operand's
    gradient in its own half."""
    result = []
    for k, run in enumerate(runs):
        if run is None or (mask is not None and not mask[k]):
            result.append(None)
        elif run is _PASS:
            result.append(unbroadcast(g, shapes[k]))
        else:
            args = [g if i == 0 else kept[i - 1] for i in run[1]]
            result.append(unbroadcast(ops.run_map(run[0], args), shapes[k]))
    return tuple(result)


def _elementwise(op: str, out: Tensor, operands: tuple, name: str | None = None) -> Tensor:
    """Record ``out = op(*operands)``: each operand that needs a gradient gets one fused kernel of its
    gradient expression (registry.GRADS), summed down to its shape. The node keeps only what the
    expressions of the operands needing a gradient read (registry.SAVES; its tensors saved, so an
    in-place change to one before backward raises): an operand or output they do not read is freed as
    soon as nothing else uses it."""
    for x in operands:  # the common case first, and cheaply: nothing to differentiate
        if isinstance(x, Tensor) and x.requires_grad:
            break
    else:
        return out
    if op not in GRADS or not out.dtype.is_float or not is_grad_enabled():
        return out
    needs = tuple([isinstance(x, Tensor) and x.requires_grad for x in operands])
    reads, runs = _grad_plan(op, needs)
    # y without its node: out -> node -> backward -> out would be a reference cycle
    kept = tuple([out.detach() if k < 0 else operands[k] for k in reads])
    shapes = tuple([x._shape if isinstance(x, Tensor) else () for x in operands])
    saved = [t for t in kept if isinstance(t, Tensor)]
    return attach(name or op, out, [x if need else None for x, need in zip(operands, needs)],
                  functools.partial(_elementwise_backward, runs, kept, shapes), saved, partial=True)


def cast(a: Tensor, dtype: _dt.DType) -> Tensor:
    out = ops.cast(a, dtype)
    if not (is_grad_enabled() and _needs(a) and dtype.is_float):
        return out
    src = a.dtype
    return record("cast", out, [a], lambda g: (ops.cast(g, src),))


def contiguous(a: Tensor) -> Tensor:
    out = ops.contiguous(a)
    if out is a:
        return a
    return record("contiguous", out, [a], lambda g: (g,))


def clone(a: Tensor) -> Tensor:
    return record("clone", ops.clone(a), [a], lambda g: (g,))


def to_device(a: Tensor, dev) -> Tensor:
    src = a.device
    return record("to_device", ops.to_device(a, dev), [a], lambda g: (ops.to_device(g, src),))


# in-place ops: allowed on tensors outside the graph (optimizers run them under no_grad)
def _guard_inplace(t: Tensor, op: str) -> None:
    if is_grad_enabled() and t.requires_grad:
        kind = "a leaf that requires grad" if t._node is None else "a tensor in the autograd graph"
        raise RuntimeError(f"{op}: in-place update of {kind} (shape {t.shape}); wrap it in wgpar.no_grad() "
                           "or use the out-of-place op")


def inplace(op: str, a: Tensor, b) -> Tensor:
    _guard_inplace(a, f"{op}_")
    return ops.inplace(op, a, b)


def copy_(dst: Tensor, src) -> Tensor:
    _guard_inplace(dst, "copy_")
    return ops.copy_(dst, src)


def fill_(dst: Tensor, value) -> Tensor:
    _guard_inplace(dst, "fill_")
    return ops.fill_(dst, value)


def setitem(t: Tensor, key, value) -> None:
    _guard_inplace(t, "__setitem__")
    ops.setitem(t, key, value)


# -- shapes -----------------------------------------------------------------------------------
def reshape(a: Tensor, shape) -> Tensor:
    out = ops.reshape(a, shape)
    src = a.shape
    return record("reshape", out, [a], lambda g: (ops.reshape(g, src),))


def view(a: Tensor, shape) -> Tensor:
    out = ops.reshape_view(a, shape)
    src = a.shape
    return record("view", out, [a], lambda g: (ops.reshape(g, src),))


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    out = ops.flatten(a, start_dim, end_dim)
    src = a.shape
    return record("flatten", out, [a], lambda g: (ops.reshape(g, src),))


def permute(a: Tensor, axes) -> Tensor:
    out = ops.permute(a, axes)
    axes = [wrap_dim(x, a.ndim) for x in axes]
    inv = [0] * len(axes)
    for i, x in enumerate(axes):
        inv[x] = i
    return record("permute", out, [a], lambda g: (ops.permute(g, inv),))


def transpose(a: Tensor, d0: int, d1: int) -> Tensor:
    out = ops.transpose(a, d0, d1)
    if out is a:
        return a
    return record("transpose", out, [a], lambda g: (ops.transpose(g, d0, d1),))


def expand(a: Tensor, shape) -> Tensor:
    out = ops.expand(a, shape)
    src = a.shape
    return record("expand", out, [a], lambda g: (unbroadcast(g, src),))


def squeeze(a: Tensor, dim=None) -> Tensor:
    out = ops.squeeze(a, dim)
    src = a.shape
    return record("squeeze", out, [a], lambda g: (ops.reshape(g, src),))


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    out = ops.unsqueeze(a, dim)
    src = a.shape
    return record("unsqueeze", out, [a], lambda g: (ops.reshape(g, src),))


def getitem(a: Tensor, key) -> Tensor:
    out = ops.getitem(a, key)
    if not (is_grad_enabled() and _needs(a)):
        return out
    items = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, (Tensor, list)) or type(k).__name__ == "ndarray" for k in items):
        # Advanced index: a basic view, then index_select; differentiate them separately.
        return _advanced_getitem(a, key)

    def bw(g):
        full = ops.fill(a.shape, 0.0, g.dtype, g.device)
        ops.copy_(ops.getitem(full, key), g)
        return (full,)

    return record("getitem", out, [a], bw)


def _advanced_getitem(a: Tensor, key) -> Tensor:
    from ..ops.index import expand_key

    items = expand_key(key, a.ndim)
    basic, pos, index = [], None, None
    d_out = 0
    for k in items:
        if isinstance(k, (Tensor, list)) or type(k).__name__ == "ndarray":
            basic.append(slice(None))
            pos, index = d_out, k
            d_out += 1
        else:
            basic.append(k)
            if k is None or isinstance(k, slice):
                d_out += 1
    return index_select(getitem(a, tuple(basic)), pos, index, negative=True, op="indexing")


def index_select(a: Tensor, dim: int, index, negative: bool = False, op: str | None = None) -> Tensor:
    """``ops.index_select`` (``negative`` and ``op`` as there) with its backward, a scatter-add of rows."""
    d = wrap_dim(dim, a.ndim)
    n = a.shape[d]
    if not isinstance(index, Tensor):  # uploaded once, checked against n before narrowing
        index = as_index(index, a.device, n, index_what(a, d, op), negative)
    out = ops.index_select(a, d, index, negative, op)
    # The index is saved: changing it in place before backward would send the gradient to other rows.
    return record(op or "index_select", out, [a], lambda g: (index_add_rows(g, d, index, n),), [index])


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    out = ops.cat(tensors, dim)
    if not (is_grad_enabled() and any(_needs(t) for t in tensors)):
        return out
    d = wrap_dim(dim, tensors[0].ndim)
    sizes = [t.shape[d] for t in tensors]

    def bw(g):
        grads, start = [], 0
        for t, n in zip(tensors, sizes):
            key = (slice(None),) * d + (slice(start, start + n),)
            grads.append(ops.getitem(g, key) if t.requires_grad else None)
            start += n
        return tuple(grads)

    return record("cat", out, tensors, bw)


class _Split:
    """Where the pieces of one split lie along ``dim`` of the whole (``bounds``: [start, stop) each; ``squeezed``:
    the pieces dropped that dim, as unbind's do); joins their gradients (engine.Parts)."""

    __slots__ = ("shape", "dtype", "dim", "bounds", "squeezed", "n")

    def __init__(self, a: Tensor, dim: int, bounds: list[tuple[int, int]], squeezed: bool) -> None:
        self.shape, self.dtype, self.dim, self.bounds, self.squeezed = a.shape, a.dtype, dim, bounds, squeezed
        self.n = len(bounds)

    def join(self, grads: list[Tensor | None]) -> Tensor:
        """The whole's gradient from one gradient or None per piece: each copied into its place of one new
        buffer, one zero fill per run of pieces without one; no copy where the pieces' gradients already
        lie in their places of one contiguous buffer (``_tiled``)."""
        whole = self._tiled(grads)
        if whole is not None:
            return whole
        runs: list[tuple[int, int, Tensor | None]] = []
        for (lo, hi), g in zip(self.bounds, grads):
            if g is None and runs and runs[-1][2] is None:
                runs[-1] = (runs[-1][0], hi, None)
            else:
                runs.append((lo, hi, g))
        device = next(g for g in grads if g is not None).device
        out = Tensor.empty(self.shape, self.dtype, device)
        for lo, hi, g in runs:
            part = narrow(out, self.dim, lo, hi - lo)
            if part.numel() == 0:
                continue
            if g is None:
                ops.fill_(part, 0.0)
            else:
                ops.copy_(part, ops.unsqueeze(g, self.dim) if self.squeezed else g)
        return out

    def _tiled(self, grads: list[Tensor | None]) -> Tensor | None:
        """The whole's gradient as a view, where every piece's gradient is the view of one storage that the
        piece is of a contiguous tensor of the whole's shape and dtype (the attention backward writes a
        fused q|k|v projection's three gradients so: ops.attention._fused_grads), else None."""
        if any(g is None for g in grads):
            return None
        storage = grads[0]._storage
        strides = contiguous_strides(self.shape)
        step = strides[self.dim]
        base = grads[0]._offset - self.bounds[0][0] * step
        if base < 0 or base + math.prod(self.shape) > storage.numel:
            return None
        for (lo, hi), g in zip(self.bounds, grads):
            if self.squeezed:
                g = ops.unsqueeze(g, self.dim)
            shape = self.shape[:self.dim] + (hi - lo,) + self.shape[self.dim + 1:]
            if (g._storage is not storage or g.dtype is not self.dtype or g.shape != shape
                    or g._offset != base + lo * step
                    or any(n > 1 and s != c for n, s, c in zip(shape, g.strides, strides))):
                return None
        return Tensor(storage, self.shape, strides, base)


def split_views(a: Tensor, dim: int, sizes: Sequence[int], op: str = "split",
                keepdim: bool = True) -> tuple[Tensor, ...]:
    """The views of ``a`` of ``sizes`` entries along ``dim``, in order (``keepdim=False``: pieces of one entry
    without that dim, as unbind's); ``op`` names their nodes. Each piece has a node of its own (its hooks, its
    retain_grad); their gradients are joined into one buffer (engine.Parts), not each widened to ``a``'s
    shape and summed."""
    d = wrap_dim(dim, a.ndim)
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    pieces = [narrow(a, d, lo, hi - lo) for lo, hi in bounds]
    if not keepdim:
        pieces = [ops.squeeze(p, d) for p in pieces]
    if not (is_grad_enabled() and _needs(a)):
        return tuple(pieces)
    split = _Split(a, d, bounds, not keepdim)
    return tuple(record(op, p, [a], lambda g, i=i: (Parts(split, i, g),)) for i, p in enumerate(pieces))


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    d = stack_dim(tensors, dim)
    return cat([unsqueeze(t, d) for t in tensors], d)


# -- reductions and softmax -------------------------------------------------------------------
def _reduced_axes(a: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(a.ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(wrap_dim(x, a.ndim) for x in axis))
    return (wrap_dim(axis, a.ndim),)


def _keep_shape(a: Tensor, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(a.shape))


def reduce(op: str, a: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    if op == "sum" and is_autocast_enabled():
        a = autocast_full(a)
    out = ops.reduce(op, a, axis, keepdims)
    if op in ("argmax", "argmin") or not (is_grad_enabled() and _needs(a)):
        return out
    axes = _reduced_axes(a, axis)
    kshape = _keep_shape(a, axes)
    n = math.prod(a.shape[i] for i in axes)

    if op in ("sum", "mean"):
        def bw(g):
            g = ops.reshape(g, kshape)
            if op == "mean":
                g = ops.binary("mul", g, 1.0 / n)
            return (ops.expand(g, a.shape),)
        return record(op, out, [a], bw)

    y = out.detach()

    def bw(g):  # max / min: the gradient goes to the extreme entries (the NaNs if any), split over ties
        hit = ops.cast(ops.binary("same", a, ops.reshape(y, kshape)), g.dtype)
        count = ops.reduce("sum", hit, axes, keepdims=True)
        return (ops.binary("mul", hit, ops.binary("div", ops.reshape(g, kshape), count)),)

    return record(op, out, [a], bw, [a, y])


def extreme(op: str, a: Tensor, dim=None, keepdim: bool = False):
    """``max`` / ``min`` as in PyTorch: without ``dim`` the 0-d extreme of every element (its gradient
    split over ties); with one int ``dim`` the named tuple (values, indices) along it, the indices those
    of the first extreme (of the first NaN if any), which alone receive the values' gradient."""
    if dim is None:
        return reduce(op, a, None, keepdim)
    if isinstance(dim, (tuple, list)):
        raise TypeError(f"{op}(dim=...) takes one int dim and returns (values, indices), as in PyTorch; got "
                        f"{dim!r}: for the {op} over several dims use a{op}(dim={tuple(dim)!r})")
    if not isinstance(a, Tensor):
        raise TypeError(f"{op}: expected a wgpar.Tensor, got {type(a).__name__}")
    d = wrap_dim(dim, a.ndim)
    indices = ops.reduce("arg" + op, a, d, keepdims=keepdim)
    values = ops.reduce(op, a, d, keepdims=keepdim)
    if is_grad_enabled() and _needs(a) and a.ndim:
        kshape = _keep_shape(a, (d,))
        picked = ops.reshape(indices, kshape)
        column = [1] * a.ndim
        column[d] = a.shape[d]

        def bw(g):
            positions = Tensor.from_numpy(np.arange(a.shape[d], dtype=np.int32).reshape(column), device=g.device)
            return (ops.where(ops.binary("eq", positions, picked), ops.reshape(g, kshape), 0.0),)

        values = record(op, values, [a], bw, [picked])
    elif is_grad_enabled() and _needs(a):
        values = record(op, values, [a], lambda g: (g,))
    return (return_types.max if op == "max" else return_types.min)(values, indices)


def _take(a: Tensor, indices: Tensor, d: int) -> Tensor:
    """``a``'s values at ``indices`` along dim ``d`` (distinct per line), the gradient scattered back."""
    out = ops.take_along(a, indices, d)
    if not (is_grad_enabled() and _needs(a)):
        return out
    n = a.shape[d]
    return record("take_along", out, [a], lambda g: (ops.scatter_along(g, indices, d, n),), [indices])


def sort(a: Tensor, dim: int = -1, descending: bool = False):
    """The named tuple (values, indices) of ``a`` sorted along ``dim``, stably (see ops.sort.argsort)."""
    if not isinstance(a, Tensor):
        raise TypeError(f"sort: expected a wgpar.Tensor, got {type(a).__name__}")
    if a.ndim == 0:
        return return_types.sort(clone(a), ops.argsort(a))
    d = wrap_dim(dim, a.ndim)
    indices = ops.argsort(a, d, descending)
    return return_types.sort(_take(a, indices, d), indices)


def topk(a: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """The named tuple (values, indices) of the ``k`` largest (or smallest) entries along ``dim``, in
    order (``sorted=False`` is accepted and gives them in order too); ties keep the first positions."""
    if not isinstance(a, Tensor):
        raise TypeError(f"topk: expected a wgpar.Tensor, got {type(a).__name__}")
    d = wrap_dim(dim, a.ndim) if a.ndim else 0
    n = a.shape[d] if a.ndim else 1
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n:
        raise ValueError(f"topk: k={k!r} is out of range for dim {dim} of size {n} (shape {a.shape})")
    if a.ndim == 0:
        return return_types.topk(*sort(a))
    indices = ops.contiguous(narrow(ops.argsort(a, d, descending=largest), d, 0, int(k)))
    return return_types.topk(_take(a, indices, d), indices)


def softmax(a: Tensor, axis=-1, log: bool = False) -> Tensor:
    if is_autocast_enabled():
        a = autocast_full(a)
    out = ops.softmax(a, axis, log)
    if not (is_grad_enabled() and _needs(a)):
        return out
    ax = wrap_dim(-1 if axis is None else axis, max(a.ndim, 1))
    y = out.detach()

    def bw(g):
        if a.ndim == 0:
            return (ops.binary("mul", g, 0.0),)
        if log:
            s = ops.reduce("sum", g, ax, keepdims=True)
            return (ops.binary("sub", g, ops.binary("mul", ops.unary("exp", y), s)),)
        s = ops.reduce("sum", ops.binary("mul", g, y), ax, keepdims=True)
        return (ops.binary("mul", y, ops.binary("sub", g, s)),)

    return record("log_softmax" if log else "softmax", out, [a], bw, [y])


# -- matmul -----------------------------------------------------------------------------------
def _transposed(x: Tensor, other: Tensor) -> bool:
    """Whether ``x`` is a 2-d matrix stored transposed (column-major: a Linear's ``weight.T``), multiplied by
    another 2-d one. Its gradient is then computed transposed too (as torch's mm backward does), so it
    comes back to the weight contiguous and becomes ``.grad`` without a copy."""
    return x.ndim == 2 and other.ndim == 2 and x.strides == (1, x.shape[0]) and x.shape[0] > 1


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if is_autocast_enabled():
        a, b = autocast_lower(a), autocast_lower(b)
    if not (is_grad_enabled() and (_needs(a) or _needs(b))):
        return ops.matmul(a, b)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        return ops.matmul(a, b)  # raises the TypeError
    if a.ndim == 1 or b.ndim == 1:  # as in np.matmul: promote, multiply, drop the added dim
        a2 = unsqueeze(a, 0) if a.ndim == 1 else a
        b2 = unsqueeze(b, -1) if b.ndim == 1 else b
        out = matmul(a2, b2)
        if a.ndim == 1:
            out = squeeze(out, -2)
        if b.ndim == 1:
            out = squeeze(out, -1)
        return out
    out = ops.matmul(a, b)

    def bw(g, mask=(True, True)):  # partial: a split backward computes each side in its own half
        ga = gb = None
        if mask[0] and _needs(a):
            ga = ops.transpose(ops.matmul(b, ops.transpose(g, -2, -1)), -2, -1) if _transposed(a, b) else \
                unbroadcast(ops.matmul(g, ops.transpose(b, -2, -1)), a.shape)
        if mask[1] and _needs(b):
            gb = ops.transpose(ops.matmul(ops.transpose(g, -2, -1), a), -2, -1) if _transposed(b, a) else \
                unbroadcast(ops.matmul(ops.transpose(a, -2, -1), g), b.shape)
        return ga, gb

    return record("matmul", out, [a, b], bw, [a, b], partial=True)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` for a 2-d x as one graph node, its gradients as torch's linear computes
    them: the weight's as ``g.T @ x``, contiguous [out, in] (through matmul's node it was the transpose
    of ``x.T @ g``, a strided view that .grad copied), the bias's as one column sum of g. Other dtype
    mixes go through matmul and add, whose type promotion they need."""
    operands = [x, weight] + ([bias] if bias is not None else [])
    plain = (x.ndim == 2 and weight.ndim == 2 and (bias is None or bias.ndim == 1)
             and all(isinstance(t, Tensor) and t.dtype.is_float for t in operands))
    out_dt = None
    if is_autocast_enabled():
        if plain:  # float16 out, x read as stored (no float16 copy of it), the weight rounded below
            out_dt = autocast_dtype(x.device)
        else:
            x, weight, bias = autocast_lower(x), autocast_lower(weight), autocast_lower(bias)
            operands = [x, weight] + ([bias] if bias is not None else [])
    if not plain or (out_dt is None and any(t.dtype is not x.dtype for t in operands)):
        y = matmul(x, transpose(weight, 0, 1))
        return y if bias is None else binary("add", y, bias)
    # Autocast: the weight rounded to float16 once a call (torch's autocast casts it too) for the forward and the
    # input's gradient: a float16 operand beside a float32 one made the GPT-2 step's GEMMs up to 11% slower
    # on an H200 than two float16 (or two float32) ones (BENCHMARKS.md, "Where the autocast step loses").
    w16 = ops.cast(weight, out_dt) if out_dt is not None and weight.dtype is not out_dt else None
    wt = ops.transpose(weight if w16 is None else w16, 0, 1)
    # the bias added as tiles are stored
    out = ops.matmul(x, wt, out_dt) if bias is None else ops.matmul_bias(x, wt, bias, out_dt)
    if not (is_grad_enabled() and any(_needs(t) for t in operands)):
        return out
    wx = (weight if w16 is None else w16) if _needs(x) else None  # what the input's gradient multiplies by
    del w16  # (held only for that)

    def bw(g, mask=(True, True, True)):  # partial: a split backward computes each side in its own half
        # each gradient in its operand's dtype (autocast: float32 ones from a float16 g, rounded once)
        gx = ops.matmul(g, wx, x.dtype) if mask[0] and wx is not None else None
        gw = ops.matmul(ops.transpose(g, 0, 1), x, weight.dtype) if mask[1] and _needs(weight) else None
        gb = None
        if bias is not None and mask[2] and _needs(bias):
            n, m = g.shape
            gb = ops.reshape(column_sums(ops.contiguous(g), 1, n, m, bias.dtype), bias.shape) if n else \
                ops.fill(bias.shape, 0.0, bias.dtype, g.device)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return record("linear", out, operands, bw, [x, weight], partial=True)


__all__ = ["unary", "binary", "where", "clamp", "cast", "contiguous", "clone", "to_device", "inplace", "copy_", "fill_",
           "setitem", "reshape", "view", "flatten", "permute", "transpose", "expand", "squeeze", "unsqueeze", "getitem",
           "index_select", "cat", "split_views", "stack", "reduce", "extreme", "sort", "topk", "softmax", "matmul",
           "linear", "unbroadcast", "backward", "retain_grad"]
