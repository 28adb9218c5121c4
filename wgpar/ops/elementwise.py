"""Elementwise kernels: unary, binary, where, clamp, casts and strided copies.

Two shader families serve them all: shaders/elementwise_block.wgsl when the
output is contiguous and each operand is one contiguous block of memory
(same-shape tensors, a bias over rows, a row statistic, a single element),
moving 4 elements per thread through vec4 loads and stores when sizes and
offsets allow, and shaders/elementwise.wgsl (any strides) otherwise. The host
picks the expression, the operand types and the indexing, then caches one
pipeline per combination.
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

from .. import dtypes as _dt
from ..dtypes import DType
from ..errors import ZeroDivisionRuntimeError
from ..runtime.kernels import F32, WORKGROUP, KernelSpec, dims, grid, load_source, pack, spec
from ..storage import Storage
from ..tensor import Tensor, _check_dtype_supported, check_same_device, contiguous_strides

# kind decides the types: arith (common type), true (float result), float (float unary),
# cmp (bool result), where (condition + common type), copy (explicit output type)
OPS: dict[str, tuple[str, str]] = {
    "add": ("arith", "x0 + x1"),
    "sub": ("arith", "x0 - x1"),
    "mul": ("arith", "x0 * x1"),
    "div": ("true", "div_(x0, x1)"),
    "pow": ("true", "fpow(x0, x1)"),
    "floordiv": ("arith", "floordiv_C(x0, x1)"),  # C( becomes the compute type: floordiv_f32(
    "mod": ("arith", "mod_C(x0, x1)"),
    "maximum": ("arith", "maximum_C(x0, x1)"),
    "minimum": ("arith", "minimum_C(x0, x1)"),
    "eq": ("cmp", "eq_C(x0, x1)"),
    "ne": ("cmp", "ne_C(x0, x1)"),
    "lt": ("cmp", "lt_C(x0, x1)"),
    "le": ("cmp", "le_C(x0, x1)"),
    "gt": ("cmp", "gt_C(x0, x1)"),
    "ge": ("cmp", "ge_C(x0, x1)"),
    "same": ("cmp", "same_C(x0, x1)"),  # equal or both NaN (max / min backward)
    "neg": ("arith", "neg_C(x0)"),
    "abs": ("arith", "abs_C(x0)"),
    "relu": ("arith", "relu_C(x0)"),
    "exp": ("float", "exp_(x0)"),
    "log": ("float", "log_(x0)"),
    "sqrt": ("float", "sqrt_(x0)"),
    "rsqrt": ("float", "rsqrt_(x0)"),
    "tanh": ("float", "tanh_(x0)"),
    "sigmoid": ("float", "sigmoid_(x0)"),
    "gelu": ("float", "gelu_(x0)"),
    "gelu_tanh": ("float", "gelu_tanh_(x0)"),
    "where": ("where", "select(x2, x1, nz_C(x0))"),  # C: the condition's compute type
    "clamp": ("arith", "minimum_C(maximum_C(x0, x1), x2)"),
    "clamp_min": ("arith", "maximum_C(x0, x1)"),
    "clamp_max": ("arith", "minimum_C(x0, x1)"),
    "copy": ("copy", "x0"),
    "sign": ("arith", "sign_C(x0)"),
    # fused backward kernels: x0 = forward input (or output), x1 = incoming gradient
    "relu_bwd": ("arith", "relu_bwd_C(x0, x1)"),
    "gelu_bwd": ("float", "x1 * gelu_grad_(x0)"),
    "gelu_tanh_bwd": ("float", "x1 * gelu_tanh_grad_(x0)"),
    "tanh_bwd": ("float", "x1 * (1.0 - x0 * x0)"),
    "sigmoid_bwd": ("float", "x1 * x0 * (1.0 - x0)"),
}
# WGSL helpers the expressions call: shaders/float_fns.wgsl, then shaders/elementwise_fns.wgsl.
_FNS = "float_fns", "elementwise_fns"


Operand = Tensor | int | float | bool


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float, bool, np.integer, np.floating, np.bool_))


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
        common = _dt.float32 if any(isinstance(v, (float, np.floating)) for v in vals) else _dt.int32
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
        names = " and ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"{op}: shapes {names} cannot be broadcast together") from None


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


def _expr(op: str, cts: tuple[str, ...], out_storage: str, out_is_bool: bool, compute: str,
          cmp_as_i32: bool) -> tuple[str, str]:
    """(type stored, WGSL expression over x0..x2) for ``OPS[op]``."""
    kind, expr = OPS[op]
    expr = expr.replace("C(", f"{cts[0]}(")
    store = out_storage
    if kind == "cmp" and cmp_as_i32:
        expr = f"select(0i, 1i, {expr})"
        store = "i32"
    elif kind == "cmp":
        expr = f"select({store}(0), {store}(1), {expr})"
    elif out_is_bool:
        expr = f"select(0i, 1i, nz_{cts[0] if kind == 'copy' else compute}({expr}))"
    elif store == "i32" and (cts[0] if kind == "copy" else compute) == "f32":
        expr = f"f2i_({expr})"  # saturating, NaN -> 0 (WGSL leaves i32(NaN) indeterminate)
    elif store == "f16" and cts[0] == "i32":
        expr = f"f32({expr})"  # through f32: the one f32 -> f16 rounding every float16 store uses
    return store, expr


def _declare(sig: tuple, out_storage: str, width: int) -> tuple[int, list[str]]:
    """(number of storage bindings, their declarations); binding 0 is the output."""
    vec = (lambda t: f"vec4<{t}>") if width == 4 else (lambda t: t)
    decl = [f"@group(0) @binding(0) var<storage, read_write> bo: array<{vec(out_storage)}>;"]
    seen = {0}
    for s in sig:
        if s is not None and s[0] not in seen:
            seen.add(s[0])
            decl.append(f"@group(0) @binding({s[0]}) var<storage, read> b{s[0]}: array<{vec(s[1])}>;")
    return 1 + max((s[0] for s in sig if s is not None), default=0), decl


@functools.cache
def _fns() -> str:
    return "\n".join(load_source(f) for f in _FNS)


def _name(s) -> str:
    return "bo" if s[0] == 0 else f"b{s[0]}"


@functools.lru_cache(maxsize=4096)
def _map_kernel(op: str, sig: tuple, cts: tuple[str, ...], out_storage: str, out_is_bool: bool,
                compute: str, cmp_as_i32: bool, f16: bool) -> KernelSpec:
    """Generate (once per signature) the strided kernel for ``run_map``.

    ``sig`` has one entry per operand: None for a scalar, else (binding, storage type),
    binding 0 being the output buffer (an input that aliases it is read through it).
    """
    n_buf, decl = _declare(sig, out_storage, 1)
    names = [None if s is None else _name(s) for s in sig]
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
    store, expr = _expr(op, cts, out_storage, out_is_bool, compute, cmp_as_i32)
    return spec("elementwise", tuple("w" if i == 0 else "r" for i in range(n_buf)), f16=f16,
                BINDINGS="\n".join(decl), PARAMS=n_buf, INDEX="\n".join(lines), FNS=_fns(),
                LOADS="\n".join(loads), STORE=store, EXPR=expr)


@functools.lru_cache(maxsize=4096)
def _block_kernel(op: str, sig: tuple, modes: tuple, width: int, cts: tuple[str, ...], out_storage: str,
                  out_is_bool: bool, compute: str, cmp_as_i32: bool, f16: bool) -> KernelSpec:
    """Generate (once per signature) the kernel of shaders/elementwise_block.wgsl.

    ``sig`` as for ``_map_kernel``; ``modes`` names each tensor operand's indexing (see
    ``_block_mode``); ``width`` 4 moves a vec4 per thread (operands' arrays are vec4 arrays, and a
    "div" or "one" operand reads its one element out of one and splats it).
    """
    n_buf, decl = _declare(sig, out_storage, width)
    store, expr = _expr(op, cts, out_storage, out_is_bool, compute, cmp_as_i32)
    unit = "" if width == 1 else " >> 2u"  # offsets come in elements
    index = {"full": f"(p.off[{{k}}]{unit}) + i", "mod": f"(p.off[{{k}}]{unit}) + i % p.md[{{k}}]",
             "div": "p.off[{k}] + (i / p.dv[{k}]) % p.md[{k}]", "one": "p.off[{k}]"}
    body = []
    for k, (s, mode) in enumerate(zip(sig, modes)):
        if s is None:
            continue
        j = index[mode].format(k=k)
        if width == 1:
            body.append(f"  let x{k} = {cts[k]}({_name(s)}[{j}]);")
        elif mode in ("full", "mod"):
            body.append(f"  let v{k} = {_name(s)}[{j}];")
        else:
            body += [f"  let j{k} = {j};", f"  let v{k} = {_name(s)}[j{k} >> 2u][j{k} & 3u];"]
    scalars = [f"let x{k} = bitcast<{ct}>(p.sc[{k}]);" for k, (s, ct) in enumerate(zip(sig, cts)) if s is None]
    if width == 1:
        body += [f"  {x}" for x in scalars] + [f"  bo[p.off_o + i] = {store}({expr});"]
    else:
        body.append(f"  var r: vec4<{store}>;")
        for c in "xyzw":
            loads = [f"let x{k} = {cts[k]}(v{k}{'.' + c if m in ('full', 'mod') else ''});"
                     for k, (s, m) in enumerate(zip(sig, modes)) if s is not None]
            body.append(f"  {{ {' '.join(loads + scalars)} r.{c} = {store}({expr}); }}")
        body.append("  bo[(p.off_o >> 2u) + i] = r;")
    return spec("elementwise_block", tuple("w" if i == 0 else "r" for i in range(n_buf)), f16=f16,
                BINDINGS="\n".join(decl), PARAMS=n_buf, FNS=_fns(), BODY="\n".join(body))


def _block_mode(t: Tensor, shape: tuple[int, ...], numel: int) -> tuple[str, int, int] | None:
    """How ``t``, broadcast to ``shape``, is read at output position i of a contiguous output.

    (mode, dv, md): "full" (position i), "mod" (i % md: a trailing block repeated), "div"
    ((i // dv) % md: each element of a block repeated dv times), "one" (a single element); None when
    the broadcast operand is not one contiguous block of memory (it then takes the strided kernel).
    """
    live = [(n, s) for n, s in zip(shape, broadcast_strides(t, shape)) if n > 1]
    used = [j for j, (_, s) in enumerate(live) if s != 0]
    if not used:
        return ("one", 1, 1)
    md = 1
    for n, s in reversed(live[used[0]:used[-1] + 1]):
        if s != md:
            return None
        md *= n
    dv = math.prod(n for n, _ in live[used[-1] + 1:])
    if dv == 1:
        return ("full", 1, md) if md == numel else ("mod", 1, md)
    return ("div", dv, md)


def _vec_static(numel: int, modes: tuple) -> bool:
    """Whether every unit of 4 output elements maps to 4 consecutive elements (or one splat element)."""
    if numel % 4:
        return False
    for m in modes:
        if m is not None and ((m[0] == "mod" and m[2] % 4) or (m[0] == "div" and m[1] % 4)):
            return False
    return True


def _block_words(numel: int, width: int, out_offset: int, operands: list, modes: tuple, cts) -> list[int]:
    words = [numel // width, out_offset, 0, 0] + [0] * 16
    for k, (x, m) in enumerate(zip(operands, modes)):
        if m is None:
            words[16 + k] = _scalar_bits(x, cts[k])
            continue
        words[4 + k] = x._offset
        words[8 + k] = m[1] // width if m[0] == "div" else 1
        words[12 + k] = m[2] // width if m[0] in ("full", "mod") else m[2]
    return words


def _vec_ok(out_offset: int, operands: list, modes: tuple) -> bool:
    """The per-call half of the vec4 test: 4-aligned offsets of what is read as vec4s.

    Those reads then never pass the tensor's end, so the last whole vec4 of its buffer; an element
    read out of a vec4 array ("div", "one") may lie in a buffer's partial last vec4, so those
    buffers must hold whole vec4s (the allocator's always do, but for the largest tensors).
    """
    if out_offset & 3:
        return False
    for x, m in zip(operands, modes):
        if m is not None and (x._offset & 3 if m[0] in ("full", "mod") else x._storage.buffer.size & 15):
            return False
    return True


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


# The common case (a new output; tensor operands on one device whose broadcast reads are blocks of
# memory, see _block_mode) skips the general checks after its first call: what they decide depends
# only on the op, the operands' dtypes, shapes, strides and devices, and the scalars' types, which
# make the key of this cache. Offsets (and so the vec4 choice) are looked at per call.
_QUICK: dict[tuple, tuple | None] = {}
_QUICK_MAX = 4096
_BLOCK_PARAMS = struct.Struct("<20I")


def _binding(buffers: list, buf) -> int:
    """The binding of ``buf`` (appended if new): operands on one buffer share a binding."""
    for k, b in enumerate(buffers):
        if b is buf:
            return k
    buffers.append(buf)
    return len(buffers) - 1


def _block_modes(operands: list, shape: tuple[int, ...], numel: int) -> tuple | None:
    modes = tuple(_block_mode(x, shape, numel) if isinstance(x, Tensor) else None for x in operands)
    if any(m is None for x, m in zip(operands, modes) if isinstance(x, Tensor)):
        return None
    return modes


def _quick_entry(op: str, operands: list[Operand]) -> tuple | None:
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if not tensors or any(not isinstance(x, Tensor) and not _is_scalar(x) for x in operands):
        return None
    dev = tensors[0].device
    if any(t.device is not dev for t in tensors):
        return None
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        shape = broadcast_shape(*(t.shape for t in tensors), op=op)
    numel = math.prod(shape)
    if numel == 0:
        return None
    modes = _block_modes(operands, shape, numel)
    if modes is None:
        return None
    dtype, cts = _types(op, operands, None)
    if op in _INT_DIVISION and cts[1] == "i32":
        return None  # the divisor is checked for zeros first (run_map)
    _check_dtype_supported(dtype, dev)
    f16 = dtype is _dt.float16 or any(t.dtype is _dt.float16 for t in tensors)
    kernel = functools.partial(_block_kernel, op, modes=tuple(m and m[0] for m in modes), cts=tuple(cts),
                               out_storage=dtype.storage, out_is_bool=dtype is _dt.bool_, compute=dtype.compute,
                               cmp_as_i32=True, f16=f16)
    kernels: dict[tuple, KernelSpec] = {}  # by (binding signature, width)
    # The parameter words that do not change between calls (n, dv, md), for width 1 and 4 (where possible).
    zeros = [0 if m is None else x for x, m in zip(operands, modes)]  # scalars' values do not matter here
    words1 = _block_words(numel, 1, 0, zeros, modes, cts)
    words4 = _block_words(numel, 4, 0, zeros, modes, cts) if _vec_static(numel, modes) else None
    # Per operand: 0 a scalar, 1 a tensor read at unit offsets (its offset must be 4-aligned for vec4),
    # 2 a tensor read element by element (its buffer must hold whole vec4s).
    how = tuple(0 if m is None else 1 if m[0] in ("full", "mod") else 2 for m in modes)
    heads = (words1[:4], words4[:4] if words4 else None)
    mids = (words1[8:16], words4[8:16] if words4 else None)
    lim = dev.max_workgroups
    return (dtype, shape, contiguous_strides(shape), numel, tuple(cts), how, kernel, kernels, heads, mids,
            grid(-(-numel // WORKGROUP), lim), grid(-(-numel // (4 * WORKGROUP)), lim), dev)


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
    dtype, shape, strides, numel, cts, how, kernel, kernels, heads, mids, groups1, groups4, dev = entry
    out = Tensor(Storage(dev, dtype, numel), shape, strides)
    buffers = [out._storage.buffer]
    vec = heads[1] is not None
    sig = []
    offs = [0, 0, 0, 0]
    scal = [0, 0, 0, 0]
    for k, x in enumerate(operands):
        h = how[k]
        if h:
            b = x._storage.buffer
            sig.append((_binding(buffers, b), x._storage.dtype.storage))
            off = offs[k] = x._offset
            if vec and (off & 3 if h == 1 else b.size & 15):
                vec = False
        else:
            sig.append(None)
            scal[k] = _scalar_bits(x, cts[k])
    sig = (tuple(sig), vec)
    kspec = kernels.get(sig)
    if kspec is None:
        kspec = kernels[sig] = kernel(sig[0], width=4 if vec else 1)
    dev.dispatch(kspec, buffers, _BLOCK_PARAMS.pack(*heads[vec], *offs, *mids[vec], *scal), groups4 if vec else groups1)
    return out


_INT_DIVISION = ("floordiv", "mod")


def _check_divisor(op: str, divisor: Operand) -> None:
    """Raise, as PyTorch does, if an integer ``//`` or ``%`` has a zero divisor.

    A scalar is checked here. A tensor is checked on the host when its values' range is known
    there (``_host_range``: tensors made from host data), else with one 4-byte readback of a
    device-side "any zero" reduction. A flag written by the kernel and read at the next sync
    would spare that readback but raise later, at an unrelated op and maybe in another thread;
    integer division by a tensor is rare in training code, so the error stays at its op.
    """
    sym = "//" if op == "floordiv" else "%"
    if not isinstance(divisor, Tensor):
        if int(divisor) == 0:
            raise ZeroDivisionRuntimeError(f"integer {sym} by zero (the divisor is the scalar {divisor!r})")
        return
    if divisor.numel() == 0:
        return
    rng = divisor._host_range
    if rng is not None and (rng[0] > 0 or rng[1] < 0):
        return
    from .reduce import reduce

    if reduce("max", run_map("eq", [divisor, 0])).item():
        raise ZeroDivisionRuntimeError(f"integer {sym} by zero: the divisor tensor of shape {divisor.shape} "
                                       f"on {divisor.device} holds a zero")


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
    if op in _INT_DIVISION and cts[1] == "i32":
        _check_divisor(op, operands[1])
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
    modes = _block_modes(operands, shape, numel) if out.is_contiguous() else None
    if modes is not None:
        width = 4 if _vec_static(numel, modes) and _vec_ok(out._offset, operands, modes) else 1
        kspec = _block_kernel(op, tuple(sig), tuple(m and m[0] for m in modes), width, tuple(cts),
                              out.dtype.storage, out.dtype is _dt.bool_, dtype.compute, out_dtype is None, f16)
        dev.dispatch(kspec, buffers, pack(_block_words(numel, width, out._offset, operands, modes, cts)),
                     grid(-(-numel // (width * WORKGROUP)), dev.max_workgroups))
        return out
    kspec = _map_kernel(op, tuple(sig), tuple(cts), out.dtype.storage, out.dtype is _dt.bool_,
                        dtype.compute, out_dtype is None, f16)
    offs = [x._offset if isinstance(x, Tensor) else 0 for x in operands] + [0] * (3 - len(operands))
    scal = [_scalar_bits(x, ct) if not isinstance(x, Tensor) else 0 for x, ct in zip(operands, cts)]
    scal += [0] * (4 - len(scal))
    strides = [dims(broadcast_strides(x, shape)) if isinstance(x, Tensor) else dims([]) for x in operands]
    strides += [dims([])] * (3 - len(operands))
    params = pack(numel, len(shape), out._offset, offs[0], offs[1], offs[2], 0, 0, scal,
                  dims(shape, 1), dims(out.strides), *strides)
    dev.dispatch(kspec, buffers, params, grid(-(-numel // WORKGROUP), dev.max_workgroups))
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
