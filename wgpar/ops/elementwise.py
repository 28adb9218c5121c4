"""Elementwise kernels: unary, binary, where, clamp, casts and strided copies.

One shader family (shaders/elementwise.wgsl) serves them all; the host picks
the expression, the operand types and whether the fast contiguous indexing
applies, then caches one pipeline per combination.
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

from .. import dtypes as _dt
from ..dtypes import DType
from ..runtime.kernels import F32, WORKGROUP, KernelSpec, dims, grid, pack, spec
from ..storage import Storage
from ..tensor import Tensor, _check_dtype_supported, check_same_device, contiguous_strides

# kind decides the types: arith (common type), true (float result), float (float unary),
# cmp (bool result), where (condition + common type), copy (explicit output type)
OPS: dict[str, tuple[str, str]] = {
    "add": ("arith", "x0 + x1"),
    "sub": ("arith", "x0 - x1"),
    "mul": ("arith", "x0 * x1"),
    "div": ("true", "x0 / x1"),
    "pow": ("true", "fpow(x0, x1)"),
    "maximum": ("arith", "max(x0, x1)"),
    "minimum": ("arith", "min(x0, x1)"),
    "eq": ("cmp", "x0 == x1"),
    "ne": ("cmp", "x0 != x1"),
    "lt": ("cmp", "x0 < x1"),
    "le": ("cmp", "x0 <= x1"),
    "gt": ("cmp", "x0 > x1"),
    "ge": ("cmp", "x0 >= x1"),
    "neg": ("arith", "-x0"),
    "abs": ("arith", "abs(x0)"),
    "relu": ("arith", "max(x0, C(0))"),
    "exp": ("float", "exp(x0)"),
    "log": ("float", "log(x0)"),
    "sqrt": ("float", "sqrt(x0)"),
    "rsqrt": ("float", "inverseSqrt(x0)"),
    "tanh": ("float", "tanh_(x0)"),
    "sigmoid": ("float", "sigmoid_(x0)"),
    "gelu": ("float", "gelu_(x0)"),
    "where": ("where", "select(x2, x1, x0 != X0(0))"),
    "clamp": ("arith", "min(max(x0, x1), x2)"),
    "clamp_min": ("arith", "max(x0, x1)"),
    "clamp_max": ("arith", "min(x0, x1)"),
    "copy": ("copy", "x0"),
    "sign": ("arith", "sign(x0)"),
    # fused backward kernels: x0 = forward input (or output), x1 = incoming gradient
    "relu_bwd": ("arith", "select(C(0), x1, x0 > C(0))"),
    "gelu_bwd": ("float", "x1 * gelu_grad_(x0)"),
    "tanh_bwd": ("float", "x1 * (1.0 - x0 * x0)"),
    "sigmoid_bwd": ("float", "x1 * x0 * (1.0 - x0)"),
}

Operand = Tensor | int | float | bool


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float, bool, np.integer, np.floating))


def _check_operand(x, op: str) -> None:
    if isinstance(x, Tensor) or _is_scalar(x):
        return
    raise TypeError(f"{op}: unsupported operand of type {type(x).__name__}; use a wgpar.Tensor or a Python number")


def _types(op: str, operands: list[Operand], out_dtype: DType | None) -> tuple[DType, list[str]]:
    """(result dtype, compute type each operand is converted to)."""
    kind = OPS[op][0]
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if kind == "copy":
        return out_dtype, [operands[0].dtype.compute if isinstance(operands[0], Tensor) else out_dtype.compute]
    vals = operands[1:] if kind == "where" else operands
    common: DType | None = None
    for x in vals:
        if isinstance(x, Tensor):
            common = x.dtype if common is None else _dt.promote(common, x.dtype)
    if common is None:  # all scalars (where(cond, 1.0, 0.0))
        common = _dt.float32 if any(isinstance(v, float) for v in vals) else _dt.int32
    for x in vals:
        if not isinstance(x, Tensor):
            common = _dt.promote_scalar(common, x)
    if kind in ("true", "float") and not common.is_float:
        common = _dt.float32
    if kind == "arith" and common is _dt.bool_:
        common = _dt.int32
    if kind == "float" and not all(isinstance(x, Tensor) for x in operands) and not tensors:
        common = _dt.float32
    result = _dt.bool_ if kind == "cmp" else common
    cts = [common.compute] * len(operands)
    if kind == "where":
        c = operands[0]
        cts[0] = c.dtype.compute if isinstance(c, Tensor) else "i32"
    return (out_dtype or result), cts


def broadcast_shape(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together") from None


def broadcast_strides(t: Tensor, shape: tuple[int, ...]) -> list[int]:
    lead = len(shape) - t.ndim
    out = [0] * lead
    for n, s, target in zip(t.shape, t.strides, shape[lead:]):
        out.append(0 if n == 1 and target != 1 else s)
    return out


def _scalar_bits(x, ctype: str) -> int:
    if ctype == "f32":
        return int(np.array(float(x), dtype=np.float32).view(np.uint32))
    v = int(x)
    if not -(2**31) <= v < 2**31:
        raise OverflowError(f"scalar {v} does not fit int32")
    return v & 0xFFFFFFFF


@functools.lru_cache(maxsize=4096)
def _map_kernel(op: str, sig: tuple, fast: bool, cts: tuple[str, ...], out_storage: str, out_is_bool: bool,
                compute: str, cmp_as_i32: bool, f16: bool) -> KernelSpec:
    """Generate (once per signature) the kernel for ``run_map``.

    ``sig`` has one entry per operand: None for a scalar, else (binding, storage type),
    binding 0 being the output buffer (an input that aliases it is read through it).
    """
    n_buf = 1 + max((s[0] for s in sig if s is not None), default=0)
    decl = [f"@group(0) @binding(0) var<storage, read_write> bo: array<{out_storage}>;"]
    seen = {0}
    for s in sig:
        if s is not None and s[0] not in seen:
            seen.add(s[0])
            decl.append(f"@group(0) @binding({s[0]}) var<storage, read> b{s[0]}: array<{s[1]}>;")
    names = [None if s is None else ("bo" if s[0] == 0 else f"b{s[0]}") for s in sig]
    if fast:
        lines = ["  let io = p.off_o + i;"] + [f"  let i{k} = p.off{k} + i;" for k in range(len(sig))]
    else:
        acc = [f"i{k}" for k, s in enumerate(sig) if s is not None]
        lines = ["  var rem = i;", "  var io_ = i32(p.off_o);"]
        lines += [f"  var {n}_ = i32(p.off{n[1:]});" for n in acc]
        lines += ["  for (var d = i32(p.ndim) - 1; d >= 0; d = d - 1) {",
                  "    let s = p.shape[d / 4][d % 4];",
                  "    let c = i32(rem % s);",
                  "    rem = rem / s;",
                  "    io_ = io_ + c * p.str_o[d / 4][d % 4];"]
        lines += [f"    {n}_ = {n}_ + c * p.str{n[1:]}[d / 4][d % 4];" for n in acc]
        lines += ["  }", "  let io = u32(io_);"] + [f"  let {n} = u32({n}_);" for n in acc]
    loads = []
    for k, (name, ct) in enumerate(zip(names, cts)):
        if name is None:
            loads.append(f"  let x{k} = bitcast<{ct}>(p.sc[{k}]);")
        else:
            loads.append(f"  let x{k} = {ct}({name}[i{k}]);")
    kind, expr = OPS[op]
    expr = expr.replace("C(", f"{cts[0]}(").replace("X0(", f"{cts[0]}(")
    store = out_storage
    if kind == "cmp" and cmp_as_i32:
        expr = f"select(0i, 1i, {expr})"
        store = "i32"
    elif kind == "cmp":
        expr = f"select({store}(0), {store}(1), {expr})"
    elif out_is_bool:
        expr = f"select(0i, 1i, {expr} != {cts[0] if kind == 'copy' else compute}(0))"
    return spec("elementwise", tuple("w" if i == 0 else "r" for i in range(n_buf)), f16=f16,
                BINDINGS="\n".join(decl), PARAMS=n_buf, INDEX="\n".join(lines),
                LOADS="\n".join(loads), STORE=store, EXPR=expr)


def _extent(t: Tensor) -> tuple[int, int]:
    lo = hi = t._offset
    for n, s in zip(t.shape, t.strides):
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    return lo, hi


def _unalias(x: Tensor, out: Tensor) -> Tensor:
    """``x`` itself, or a copy of it when it overlaps ``out`` other than element for element.

    Threads write ``out`` in no particular order, so an input read at other positions of the same
    memory (``a[1:] += a[:-1]``, ``a += a.T``, ``a += a[0]``) would see values already overwritten.
    """
    if x._storage is not out._storage:
        return x
    strides = broadcast_strides(x, out.shape)
    if x._offset == out._offset and all(n == 1 or s == so for n, s, so in zip(out.shape, strides, out.strides)):
        return x
    (lo, hi), (olo, ohi) = _extent(x), _extent(out)
    if hi < olo or ohi < lo:
        return x
    return run_map("copy", [x], out_dtype=x.dtype)


# The common case (a new output; contiguous tensor operands of one shape) skips the general
# checks after its first call: what they decide depends only on the op, the operands' dtypes,
# shapes, strides and devices, and the scalars' types, which make the key of this cache.
_QUICK: dict[tuple, tuple | None] = {}
_QUICK_MAX = 4096
_QUICK_PARAMS = struct.Struct("<12I")


def _binding(buffers: list, buf) -> int:
    """The binding of ``buf`` (appended if new): operands on one buffer share a binding."""
    for k, b in enumerate(buffers):
        if b is buf:
            return k
    buffers.append(buf)
    return len(buffers) - 1


def _quick_entry(op: str, operands: list[Operand]) -> tuple | None:
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if not tensors or any(not isinstance(x, Tensor) and not _is_scalar(x) for x in operands):
        return None
    shape = tensors[0].shape
    if any(t.shape != shape or not t.is_contiguous() or t.device is not tensors[0].device for t in tensors):
        return None
    numel = math.prod(shape)
    if numel == 0:
        return None
    dtype, cts = _types(op, operands, None)
    dev = tensors[0].device
    _check_dtype_supported(dtype, dev)
    f16 = dtype is _dt.float16 or any(t.dtype is _dt.float16 for t in tensors)
    kernel = functools.partial(_map_kernel, op, fast=True, cts=tuple(cts), out_storage=dtype.storage,
                               out_is_bool=dtype is _dt.bool_, compute=dtype.compute, cmp_as_i32=True, f16=f16)
    kernels: dict[tuple, KernelSpec] = {}  # by binding signature (which operands share a buffer)
    return (dtype, shape, contiguous_strides(shape), numel, tuple(cts), kernel, kernels,
            grid(-(-numel // WORKGROUP)), dev)


def _run_quick(op: str, operands: list[Operand]) -> Tensor | None:
    key: list = [op]
    for x in operands:
        key.append((x._storage.dtype, x._shape, x._strides, x._storage.device) if isinstance(x, Tensor) else type(x))
    key = tuple(key)
    try:
        entry = _QUICK[key]
    except KeyError:
        if len(_QUICK) >= _QUICK_MAX:
            _QUICK.clear()
        entry = _QUICK[key] = _quick_entry(op, operands)
    if entry is None:
        return None
    dtype, shape, strides, numel, cts, kernel, kernels, groups, dev = entry
    out = Tensor(Storage(dev, dtype, numel), shape, strides)
    buffers = [out._storage.buffer]
    sig = []
    words = [numel, len(shape), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    for i, x in enumerate(operands):
        if isinstance(x, Tensor):
            sig.append((_binding(buffers, x._storage.buffer), x._storage.dtype.storage))
            words[3 + i] = x._offset
        else:
            sig.append(None)
            words[8 + i] = _scalar_bits(x, cts[i])
    sig = tuple(sig)
    kspec = kernels.get(sig)
    if kspec is None:
        kspec = kernels[sig] = kernel(sig)
    dev.dispatch(kspec, buffers, _QUICK_PARAMS.pack(*words), groups)
    return out


def run_map(op: str, operands: list[Operand], out: Tensor | None = None, out_dtype: DType | None = None) -> Tensor:
    """Evaluate ``OPS[op]`` elementwise; writes into ``out`` (any strides) when given."""
    if out is None and out_dtype is None:
        quick = _run_quick(op, operands)
        if quick is not None:
            return quick
    for x in operands:
        _check_operand(x, op)
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if out is not None:
        check_same_device(out, *tensors, op=op)
    elif tensors:
        check_same_device(*tensors, op=op)
    if not tensors:
        shape = ()
    elif all(t.shape == tensors[0].shape for t in tensors):
        shape = tensors[0].shape
    else:
        shape = broadcast_shape(*(t.shape for t in tensors), op=op)
    dtype, cts = _types(op, operands, out_dtype)
    if out is None:
        dev = tensors[0].device if tensors else None
        out = Tensor.empty(shape, dtype, dev)
    else:
        if out.shape != shape and broadcast_shape(out.shape, shape, op=op) != out.shape:
            raise ValueError(f"{op}: result of shape {shape} cannot be written into a tensor of shape {out.shape}")
        shape = out.shape
        if out_dtype is None and dtype is not out.dtype:
            dtype = out.dtype
        if any(n > 1 and s == 0 for n, s in zip(out.shape, out.strides)):
            raise ValueError(f"{op}: cannot write into a broadcast (expanded) view of shape {out.shape}: "
                             "several of its elements are one memory location; clone() it first")
        operands = [_unalias(x, out) if isinstance(x, Tensor) else x for x in operands]
        tensors = [x for x in operands if isinstance(x, Tensor)]
    numel = math.prod(shape)
    if numel == 0:
        return out
    dev = out.device
    f16 = dtype is _dt.float16 or any(t.dtype is _dt.float16 for t in tensors)

    # Bindings: output first (read_write); an input on the output's buffer is read through it.
    buffers = [out._storage.buffer]
    sig: list[tuple[int, str] | None] = []
    for x in operands:
        if not isinstance(x, Tensor):
            sig.append(None)
            continue
        sig.append((_binding(buffers, x._storage.buffer), x.dtype.storage))
    fast = out.is_contiguous() and all(t.shape == shape and t.is_contiguous() for t in tensors)
    kspec = _map_kernel(op, tuple(sig), fast, tuple(cts), out.dtype.storage, out.dtype is _dt.bool_,
                        dtype.compute, out_dtype is None, f16)

    offs = [x._offset if isinstance(x, Tensor) else 0 for x in operands] + [0] * (3 - len(operands))
    scal = [_scalar_bits(x, ct) if not isinstance(x, Tensor) else 0 for x, ct in zip(operands, cts)]
    scal += [0] * (4 - len(scal))
    if fast:  # the contiguous kernel reads only these words of Params
        params = pack(numel, len(shape), out._offset, offs[0], offs[1], offs[2], 0, 0, scal)
    else:
        strides = [dims(broadcast_strides(x, shape)) if isinstance(x, Tensor) else dims([]) for x in operands]
        strides += [dims([])] * (3 - len(operands))
        params = pack(numel, len(shape), out._offset, offs[0], offs[1], offs[2], 0, 0, scal,
                      dims(shape, 1), dims(out.strides), *strides)
    dev.dispatch(kspec, buffers, params, grid(-(-numel // WORKGROUP)))
    return out


# -- public entry points --------------------------------------------------------------------
def binary(op: str, a: Operand, b: Operand) -> Tensor:
    return run_map(op, [a, b])


def unary(op: str, a: Tensor) -> Tensor:
    _check_operand(a, op)
    if not isinstance(a, Tensor):
        raise TypeError(f"{op}: expected a wgpar.Tensor, got {type(a).__name__}")
    return run_map(op, [a])


def where(cond: Tensor, a: Operand, b: Operand) -> Tensor:
    if not isinstance(cond, Tensor):
        raise TypeError(f"where: condition must be a wgpar.Tensor, got {type(cond).__name__}")
    return run_map("where", [cond, a, b])


def clamp(a: Tensor, min=None, max=None) -> Tensor:
    if min is None and max is None:
        raise ValueError("clamp: give at least one of min and max")
    if min is None:
        return run_map("clamp_max", [a, max])
    if max is None:
        return run_map("clamp_min", [a, min])
    return run_map("clamp", [a, min, max])


def cast(a: Tensor, dtype: DType) -> Tensor:
    from ..tensor import _check_dtype_supported

    _check_dtype_supported(dtype, a.device)
    return run_map("copy", [a], out_dtype=dtype)


def copy_(dst: Tensor, src: Operand) -> Tensor:
    """Write ``src`` (broadcast, converted to dst's dtype) into ``dst`` in place."""
    if isinstance(src, Tensor) and src.shape != dst.shape:
        broadcast_shape(dst.shape, src.shape, op="copy_")
    run_map("copy", [src], out=dst, out_dtype=dst.dtype)
    dst._storage.version += 1
    return dst


def fill_(dst: Tensor, value) -> Tensor:
    if not _is_scalar(value):
        raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
    return copy_(dst, value)


def inplace(op: str, a: Tensor, b: Operand) -> Tensor:
    """``a op= b`` in place; the result must keep a's shape and dtype."""
    dtype, _ = _types(op, [a, b], None)
    if dtype is not a.dtype and not (a.dtype.is_float and dtype.is_float):
        raise TypeError(f"{op}_: result type {dtype.name} cannot be stored in place in a {a.dtype.name} tensor")
    run_map(op, [a, b], out=a, out_dtype=a.dtype)
    a._storage.version += 1
    return a


def contiguous(a: Tensor) -> Tensor:
    if a.is_contiguous():
        return a
    return run_map("copy", [a], out_dtype=a.dtype)


def clone(a: Tensor) -> Tensor:
    return run_map("copy", [a], out_dtype=a.dtype)


def fill(shape, value, dtype: DType, device) -> Tensor:
    out = Tensor.empty(shape, dtype, device)
    if out.numel():
        run_map("copy", [value], out=out, out_dtype=dtype)
    return out


__all__ = ["binary", "unary", "where", "clamp", "cast", "copy_", "fill_", "inplace", "contiguous",
           "clone", "fill", "run_map", "broadcast_shape", "contiguous_strides", "F32"]
