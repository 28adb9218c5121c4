"""Views (reshape, permute, expand, squeeze) and copies between layouts (cat, stack, to_device)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..tensor import Tensor, check_same_device, normalize_shape, wrap_dim
from .elementwise import contiguous, copy_


def view(t: Tensor, shape, strides, offset=None) -> Tensor:
    """A tensor over t's storage with the given shape, strides and offset (t's offset by default)."""
    return Tensor(t._storage, tuple(shape), tuple(strides), t._offset if offset is None else offset)


def _infer(shape: Sequence[int], numel: int, src: tuple[int, ...]) -> tuple[int, ...]:
    if type(shape) is tuple:  # the usual case: ints, at most one -1, numel right
        free = -1
        for i, n in enumerate(shape):
            if type(n) is not int or n < 0 and (n != -1 or free >= 0):
                break
            if n == -1:
                free = i
        else:
            if free < 0:
                if math.prod(shape) == numel:
                    return shape
            else:
                rest = -math.prod(shape)
                if rest and not numel % rest:
                    return shape[:free] + (numel // rest,) + shape[free + 1:]
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dimension can be -1, got {tuple(shape)}")
    if -1 in shape:
        rest = math.prod(n for n in shape if n != -1)
        if rest == 0 or numel % rest:
            raise ValueError(f"reshape: cannot reshape tensor of shape {src} into {tuple(shape)}")
        shape[shape.index(-1)] = numel // rest
    shape_t = normalize_shape(shape)
    if math.prod(shape_t) != numel:
        raise ValueError(f"reshape: cannot reshape tensor of shape {src} ({numel} elements) into {shape_t}")
    return shape_t


_VIEWS: dict[tuple, tuple[int, ...] | None] = {}  # (shape, strides, new shape) -> _view_strides


def _view_strides(t: Tensor, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides expressing ``shape`` over t's memory without a copy, or None (NumPy's attempt_nocopy);
    remembered per (shape, strides, new shape): a model reshapes the same few ways every step."""
    key = (t._shape, t._strides, shape)
    try:
        return _VIEWS[key]
    except KeyError:
        pass
    if len(_VIEWS) >= 4096:
        _VIEWS.clear()
    out = _VIEWS[key] = _attempt_nocopy(t._shape, t._strides, shape)
    return out


def _attempt_nocopy(shape_in: tuple[int, ...], strides_in: tuple[int, ...], shape: tuple[int, ...]):
    old = [(n, s) for n, s in zip(shape_in, strides_in) if n != 1]
    new = [0] * len(shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(shape) and oi < len(old):
        np_, op = shape[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                np_ *= shape[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        new[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new[k - 1] = new[k] * shape[k]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    last = new[ni - 1] if ni >= 1 else 1
    for k in range(ni, len(shape)):
        new[k] = last
    return tuple(new)


def reshape(t: Tensor, shape) -> Tensor:
    """``t`` with a new shape: a view where the strides allow one, else a copy. Either holds t's values, so
    their range as known on the host carries over (index ops check it without a readback)."""
    shape = _infer(shape, t.numel(), t.shape)
    if t.numel() == 0:
        return Tensor(t._storage, shape)
    known = t._host_range
    strides = _view_strides(t, shape)
    if strides is None:
        t = contiguous(t)
        strides = _view_strides(t, shape)
    out = view(t, shape, strides)
    if known is not None:
        out._host_range = known
    return out


def reshape_view(t: Tensor, shape) -> Tensor:
    """``t.view(shape)``: t's memory with a new shape, never a copy; a RuntimeError (as in PyTorch) where
    the shape cannot be expressed over t's strides."""
    shape = _infer(shape, t.numel(), t.shape)
    if t.numel() == 0:
        return Tensor(t._storage, shape)
    strides = _view_strides(t, shape)
    if strides is None:
        raise RuntimeError(f"view: shape {shape} cannot be expressed over a tensor of shape {t.shape} with strides "
                           f"{t.strides} without a copy (the dims it merges are not contiguous in memory); use "
                           ".reshape(...), which copies when it must, or .contiguous().view(...)")
    return view(t, shape, strides)


def flatten(t: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if t.ndim == 0:
        return reshape(t, (1,))
    s, e = wrap_dim(start_dim, t.ndim), wrap_dim(end_dim, t.ndim)
    return reshape(t, t.shape[:s] + (math.prod(t.shape[s:e + 1]),) + t.shape[e + 1:])


def permute(t: Tensor, axes) -> Tensor:
    axes = tuple(wrap_dim(a, t.ndim) for a in axes)
    if sorted(axes) != list(range(t.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the {t.ndim} dims of shape {t.shape}")
    return view(t, [t.shape[a] for a in axes], [t.strides[a] for a in axes])


def transpose(t: Tensor, d0: int, d1: int) -> Tensor:
    if t.ndim < 2 and d0 in (-2, -1) and d1 in (-2, -1):
        return t
    axes = list(range(t.ndim))
    a, b = wrap_dim(d0, t.ndim), wrap_dim(d1, t.ndim)
    axes[a], axes[b] = axes[b], axes[a]
    return permute(t, axes)


def expand(t: Tensor, shape) -> Tensor:
    """A broadcast view of ``t`` with ``shape``: sizes >= 0, -1 keeps an existing dim's size."""
    shape = tuple(shape)
    if shape == t._shape and all(type(n) is int for n in shape):  # matmul expands to the same shape
        return view(t, shape, t._strides)
    for n in shape:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"expand: sizes must be ints, got {shape!r}")
    if len(shape) < t.ndim:
        raise ValueError(f"expand: target {shape} has fewer dims than tensor shape {t.shape}")
    lead = len(shape) - t.ndim
    out_shape, out_strides = [], []
    for i, n in enumerate(shape):
        n = int(n)
        if i < lead:
            if n < 0:
                raise ValueError(f"expand: size {n} for new leading dim {i} of {shape}: a new dim needs a size "
                                 ">= 0 (-1 keeps the size of an existing dim only)")
            out_shape.append(n)
            out_strides.append(0)
            continue
        have, stride = t.shape[i - lead], t.strides[i - lead]
        if n == -1 or n == have:
            out_shape.append(have)
            out_strides.append(stride)
        elif n < 0:
            raise ValueError(f"expand: size {n} for dim {i} of {shape} (tensor shape {t.shape}): sizes must be "
                             ">= 0, or -1 to keep the tensor's size")
        elif have == 1:
            out_shape.append(n)
            out_strides.append(0)
        else:
            raise ValueError(f"expand: cannot expand shape {t.shape} to {shape}")
    return view(t, out_shape, out_strides)


def squeeze(t: Tensor, dim=None) -> Tensor:
    if dim is None:
        keep = [i for i, n in enumerate(t.shape) if n != 1]
    else:
        ds = {wrap_dim(d, t.ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        keep = [i for i, n in enumerate(t.shape) if not (i in ds and n == 1)]
    return view(t, [t.shape[i] for i in keep], [t.strides[i] for i in keep])


def unsqueeze(t: Tensor, dim: int) -> Tensor:
    d = wrap_dim(dim, t.ndim + 1)
    shape, strides = list(t.shape), list(t.strides)
    stride = strides[d] * shape[d] if d < t.ndim else 1
    shape.insert(d, 1)
    strides.insert(d, stride)
    return view(t, shape, strides)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty sequence of tensors")
    for x in tensors:
        if not isinstance(x, Tensor):
            raise TypeError(f"cat: expected wgpar.Tensors, got {type(x).__name__}")
    dev = check_same_device(*tensors, op="cat")
    ref = tensors[0]
    if any(x.ndim == 0 for x in tensors):
        raise ValueError("cat: zero-dimensional tensors cannot be concatenated; use stack()")
    d = wrap_dim(dim, ref.ndim)
    for x in tensors[1:]:
        if x.ndim != ref.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, ref.shape)) if i != d):
            raise ValueError(f"cat: shapes {ref.shape} and {x.shape} differ outside dim {d}")
    from .. import dtypes as _dt

    dtype = ref.dtype
    for x in tensors[1:]:
        dtype = _dt.promote(dtype, x.dtype)
    shape = list(ref.shape)
    shape[d] = sum(x.shape[d] for x in tensors)
    out = Tensor.empty(shape, dtype, dev)
    start = 0
    for x in tensors:
        n = x.shape[d]
        if n and x.numel():
            copy_(narrow(out, d, start, n), x)
        start += n
    out._storage.version = 0
    return out


def narrow(t: Tensor, d: int, start: int, length: int) -> Tensor:
    """The view of ``length`` entries of dim ``d`` from ``start``."""
    shape = t._shape
    d = d + len(shape) if d < 0 else d
    return view(t, shape[:d] + (length,) + shape[d + 1:], t._strides, t._offset + start * t._strides[d])


def stack_dim(tensors: Sequence[Tensor], dim: int) -> int:
    """Check tensors for stack (non-empty, one shape) and return the new dim's index."""
    if not tensors:
        raise ValueError("stack: expected a non-empty sequence of tensors")
    shapes = {x.shape for x in tensors}
    if len(shapes) > 1:
        raise ValueError(f"stack: all tensors must have the same shape, got {sorted(shapes)}")
    return wrap_dim(dim, tensors[0].ndim + 1)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    d = stack_dim(tensors, dim)
    return cat([unsqueeze(x, d) for x in tensors], d)


def to_device(t: Tensor, dev) -> Tensor:
    """Copy to another device through the host (WebGPU has no device-to-device copy)."""
    return Tensor.from_numpy(t.numpy(), device=dev, dtype=t.dtype)
