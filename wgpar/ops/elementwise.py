"""The elementwise engine: every op of ops/registry.py (by name) made into kernels and run, and the
unary, where, clamp, cast and copy entry points (binary and in-place ops: arith.py).

Two shader families serve them all: shaders/elementwise_block.wgsl when the
output is contiguous and each operand is one contiguous block of memory
(same-shape tensors, a bias over rows, a row statistic, a single element),
moving 4 elements per thread through vec4 loads and stores when sizes and
offsets allow, and shaders/elementwise.wgsl (any strides) otherwise. The host
picks the expression, the operand types and the indexing, then caches one
pipeline per combination.

``run_map`` is two steps: ``plan`` (cached by the op and the dtypes, shapes, strides and devices of
the operands and of the ``out`` to write, if any: a ``MapPlan``) and ``launch`` (this call's buffers,
offsets and scalars, one dispatch). Everything else (zero sizes, operands to reject, an operand
overlapping ``out`` other than element for element, which is copied first) takes the general path.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import dtypes as _dt
from ..dtypes import DType
from ..runtime.device import Device
from ..runtime.kernels import WORKGROUP, KernelSpec, Params, dims, f32_bits, grid, load_source
from ..storage import Storage
from ..tensor import Tensor, check_dtype_supported, check_same_device, contiguous_strides
from .plans import PlanCache
from .registry import BOOL, CAST, COMMON, FLOAT, INT, OPS, WHERE

# WGSL helpers the expressions call: shaders/float_fns.wgsl, then shaders/elementwise_fns.wgsl.
_FNS = "float_fns", "elementwise_fns"


Operand = Tensor | int | float | bool


def is_scalar(x) -> bool:
    """Whether ``x`` is a number an elementwise op takes as a scalar operand (Python or NumPy)."""
    return isinstance(x, (int, float, bool, np.integer, np.floating, np.bool_))


def _check_operand(x, op: str) -> None:
    if isinstance(x, Tensor) or is_scalar(x):
        return
    raise TypeError(f"{op}: unsupported operand of type {type(x).__name__}; use a wgpar.Tensor or a Python number")


# Ops whose all-bool operands PyTorch keeps bool (add: or, mul: and), and those it refuses on bool tensors.
_BOOL_KEPT = frozenset({"add", "mul", "maximum", "minimum", "sign"})
_BOOL_REFUSED = {
    "sub": "subtracting bool tensors is not supported (as in PyTorch): a != b is their xor; or convert with .int()",
    "neg": "negating a bool tensor is not supported (as in PyTorch): a == 0 is its logical not; or convert with .int()",
    "floordiv": "not supported on bool tensors (as in PyTorch); convert with .int()",
    "mod": "not supported on bool tensors (as in PyTorch); convert with .int()",
    "abs": "not supported on bool tensors (as in PyTorch); convert with .int()",
    "relu": "not supported on bool tensors (as in PyTorch); convert with .int()",
    "bitwise_left_shift": "not supported on bool tensors (as in PyTorch); convert with .int()",
    "bitwise_right_shift": "not supported on bool tensors (as in PyTorch); convert with .int()",
}


def result_type(op: str, operands: list[Operand], out_dtype: DType | None) -> tuple[DType, list[str]]:
    """(result dtype, compute type each operand is converted to), by the op's type rule (registry.py)."""
    rule = OPS[op].types
    if rule == CAST:
        x = operands[0]
        return out_dtype, [x.dtype.compute if isinstance(x, Tensor) else out_dtype.compute]
    vals = operands[1:] if rule == WHERE else operands
    common: DType | None = None
    for x in vals:
        if isinstance(x, Tensor):
            common = x.dtype if common is None else _dt.promote(common, x.dtype)
    if common is None:  # all scalars (where(cond, 1.0, 0.0))
        common = _dt.float32 if any(isinstance(v, (float, np.floating)) for v in vals) else _dt.int32
    for x in vals:
        if not isinstance(x, Tensor):
            common = _dt.promote_scalar(common, x)
    if rule == FLOAT and not common.is_float:
        common = _dt.float32
    if rule == INT and common.is_float:
        raise TypeError(f"{op}: not supported on {common.name} operands (as in PyTorch): it takes int32 and bool "
                        "tensors; convert with .int()")
    if rule == INT and common is _dt.bool_ and op in _BOOL_REFUSED:
        raise TypeError(f"{op}: {_BOOL_REFUSED[op]}")
    result = _dt.bool_ if rule == BOOL else common
    if rule == COMMON and common is _dt.bool_:
        if op in _BOOL_REFUSED:
            raise TypeError(f"{op}: {_BOOL_REFUSED[op]}")
        # bool + bool is logical or, bool * bool and, as PyTorch: computed in int32, stored as bool
        result = _dt.bool_ if op in _BOOL_KEPT else _dt.int32
        common = _dt.int32
    cts = [common.compute] * len(operands)
    if rule == WHERE:
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
        return f32_bits(float(x))
    v = int(x)
    if not -(2**31) <= v < 2**31:
        raise OverflowError(f"scalar {v} does not fit int32")
    return v & 0xFFFFFFFF


def _expr(op: str, cts: tuple[str, ...], out_storage: str, out_is_bool: bool, compute: str,
          cmp_as_i32: bool) -> tuple[str, str]:
    """(type stored, WGSL expression over x0..x3) for ``OPS[op]``: its expression with ``{T}`` the first
    operand's compute type, then converted for the output."""
    rule = OPS[op].types
    expr = OPS[op].expr
    if out_is_bool and OPS[op].on_bool:
        expr = OPS[op].on_bool
    expr = expr.replace("{T}", cts[0])
    store = out_storage
    if rule == BOOL and cmp_as_i32:
        expr = f"select(0i, 1i, {expr})"
        store = "i32"
    elif rule == BOOL:
        expr = f"select({store}(0), {store}(1), {expr})"
    elif out_is_bool:
        expr = f"select(0i, 1i, nz_{cts[0] if rule == CAST else compute}({expr}))"
    elif store == "i32" and (cts[0] if rule == CAST else compute) == "f32":
        expr = f"f2i_({expr})"  # saturating, NaN -> 0 (WGSL leaves i32(NaN) indeterminate)
    elif store == "f16" and cts[0] == "i32":
        expr = f"f32({expr})"  # through f32: the one f32 -> f16 rounding every float16 store uses
    return store, expr


def _buffers(sig: tuple, out_storage: str, width: int) -> tuple[tuple[str, str, str], ...]:
    """The storage bindings (name, access, element type): binding 0 is the output ``bo``."""
    vec = (lambda t: f"vec4<{t}>") if width == 4 else (lambda t: t)
    bufs = [("bo", "w", vec(out_storage))]
    seen = {0}
    for s in sorted((s for s in sig if s is not None), key=lambda s: s[0]):
        if s[0] not in seen:
            seen.add(s[0])
            bufs.append((f"b{s[0]}", "r", vec(s[1])))
    return tuple(bufs)


# The parameter blocks of the two kernel families (their WGSL structs are generated from these):
# per operand k (up to 4) an offset and, for a scalar, its bits; the strided kernel also takes the
# shape and every operand's strides (st[2k], st[2k + 1] for operand k). What a plan fixes comes
# first, what each call brings (off, sc) last, so a launch packs the plan's words and then its own.
_MAP = Params("numel: u32, ndim: u32, off_o: u32, shape: array<vec4<u32>, 2>, str_o: array<vec4<i32>, 2>, "
              "st: array<vec4<i32>, 8>, off: vec4<u32>, sc: vec4<u32>")
_BLOCK = Params("n: u32, off_o: u32, dv: vec4<u32>, md: vec4<u32>, off: vec4<u32>, sc: vec4<u32>")
_CONSTANTS = (("WG", WORKGROUP),)
MAX_OPERANDS = 4


@functools.cache
def _fns() -> str:
    return "\n".join(load_source(f) for f in _FNS)


def _name(s) -> str:
    return "bo" if s[0] == 0 else f"b{s[0]}"


@functools.lru_cache(maxsize=4096)
def _map_kernel(op: str, sig: tuple, width: int = 1, *, cts: tuple[str, ...], out_storage: str,
                out_is_bool: bool, compute: str, cmp_as_i32: bool) -> KernelSpec:
    """Generate (once per signature and width) the strided kernel, shaders/elementwise.wgsl.

    ``sig`` has one entry per operand: None for a scalar, else (binding, storage type),
    binding 0 being the output buffer (an input that aliases it is read through it). ``width`` 4: each
    thread writes 4 consecutive elements of the innermost dimension (its length a multiple of 4).
    """
    tensors = [k for k, s in enumerate(sig) if s is not None]
    lines = [f"  var rem = i * {width}u;", "  var io_ = i32(p.off_o);"]
    lines += [f"  var i{k}_ = i32(p.off[{k}]);" for k in tensors]
    lines += ["  for (var d = i32(p.ndim) - 1; d >= 0; d = d - 1) {",
              "    let s = p.shape[d / 4][d % 4];",
              "    let c = i32(rem % s);",
              "    rem = rem / s;",
              "    io_ = io_ + c * p.str_o[d / 4][d % 4];"]
    lines += [f"    i{k}_ = i{k}_ + c * p.st[{2 * k} + d / 4][d % 4];" for k in tensors]
    lines += ["  }"]
    if width > 1:
        lines += ["  let nd = i32(p.ndim) - 1;", "  let so = p.str_o[nd / 4][nd % 4];"]
        lines += [f"  let s{k} = p.st[{2 * k} + nd / 4][nd % 4];" for k in tensors]
        step = ["    let io = u32(io_ + j * so);"] + [f"    let i{k} = u32(i{k}_ + j * s{k});" for k in tensors]
    else:
        step = ["    let io = u32(io_);"] + [f"    let i{k} = u32(i{k}_);" for k in tensors]
    loads = []
    for k, (s, ct) in enumerate(zip(sig, cts)):
        if s is None:
            loads.append(f"    let x{k} = bitcast<{ct}>(p.sc[{k}]);")
        else:
            loads.append(f"    let x{k} = {ct}({_name(s)}[i{k}]);")
    store, expr = _expr(op, cts, out_storage, out_is_bool, compute, cmp_as_i32)
    fills = dict(INDEX="\n".join(lines), STEP="\n".join(step), W=f"{width}i", FNS=_fns(), LOADS="\n".join(loads),
                 STORE=store, EXPR=expr)
    return KernelSpec("elementwise", _buffers(sig, out_storage, 1), _MAP, tuple(sorted(fills.items())), _CONSTANTS)


def _map_width(shape: tuple[int, ...], out_strides, operands: list) -> int:
    """Elements per thread of the strided kernel: 4 where the innermost length is a multiple of 4 and the
    output and every tensor operand step 1 (or 0: broadcast) along it. A transpose's reads 4 rows apart
    would also spread each warp's stores over 4x the sectors: an H200 ran 4096^2 .T.contiguous() 2x slower
    4 wide."""
    if not shape or shape[-1] % 4 or out_strides[-1] != 1:
        return 1
    for x in operands:
        if isinstance(x, Tensor) and broadcast_strides(x, shape)[-1] not in (0, 1):
            return 1
    return 4


@functools.lru_cache(maxsize=4096)
def _block_kernel(op: str, sig: tuple, width: int = 1, *, modes: tuple, cts: tuple[str, ...], out_storage: str,
                  out_is_bool: bool, compute: str, cmp_as_i32: bool) -> KernelSpec:
    """Generate (once per signature) the kernel of shaders/elementwise_block.wgsl.

    ``sig`` as for ``_map_kernel``; ``modes`` names each tensor operand's indexing (see
    ``_block_mode``); ``width`` 4 moves a vec4 per thread (operands' arrays are vec4 arrays, and a
    "div" or "one" operand reads its one element out of one and splats it).
    """
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
    return KernelSpec("elementwise_block", _buffers(sig, out_storage, width), _BLOCK,
                      (("BODY", "\n".join(body)), ("FNS", _fns())), _CONSTANTS)


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


def _block_modes(operands: list, shape: tuple[int, ...], numel: int) -> tuple | None:
    """Each operand's block mode (None for a scalar); None when some tensor is no block of memory."""
    modes = tuple(_block_mode(x, shape, numel) if isinstance(x, Tensor) else None for x in operands)
    if any(m is None for x, m in zip(operands, modes) if isinstance(x, Tensor)):
        return None
    return modes


def _vec_static(numel: int, modes: tuple) -> bool:
    """Whether every unit of 4 output elements maps to 4 consecutive elements (or one splat element)."""
    if numel % 4:
        return False
    for m in modes:
        if m is not None and ((m[0] == "mod" and m[2] % 4) or (m[0] == "div" and m[1] % 4)):
            return False
    return True


def _block_words(numel: int, width: int, out_offset: int, operands: list, modes: tuple, cts) -> list[int]:
    """The words of _BLOCK: n, off_o, then per operand dv, md, off, sc (4 each)."""
    words = [numel // width, out_offset] + [0] * 16
    for k, (x, m) in enumerate(zip(operands, modes)):
        if m is None:
            words[14 + k] = _scalar_bits(x, cts[k])
            continue
        words[2 + k] = m[1] // width if m[0] == "div" else 1
        words[6 + k] = m[2] // width if m[0] in ("full", "mod") else m[2]
        words[10 + k] = x._offset
    return words


def _map_words(numel: int, shape, out: Tensor | None, operands: list, cts, out_offset: int | None = None) -> list[int]:
    """The words of _MAP (a fresh contiguous output when ``out`` is None; ``out_offset`` in place of out's)."""
    offs, scal, st = [0] * 4, [0] * 4, []
    for k, x in enumerate(operands):
        if isinstance(x, Tensor):
            offs[k] = x._offset
            st += dims(broadcast_strides(x, shape))
        else:
            scal[k] = _scalar_bits(x, cts[k])
            st += dims([])
    st += dims([]) * (MAX_OPERANDS - len(operands))
    out_strides = contiguous_strides(shape) if out is None else out.strides
    off_o = (0 if out is None else out._offset) if out_offset is None else out_offset
    return [numel, len(shape), off_o, *dims(shape, 1), *dims(out_strides), *st, *offs, *scal]


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


def _binding(buffers: list, buf) -> int:
    """The binding of ``buf`` (appended if new): operands on one buffer share a binding."""
    for k, b in enumerate(buffers):
        if b is buf:
            return k
    buffers.append(buf)
    return len(buffers) - 1


def _signature(out: Tensor, operands: list) -> tuple[tuple, list]:
    """(per operand None or (binding, storage type), the buffers in binding order; 0 is ``out``)."""
    buffers = [out._storage.buffer]
    sig = tuple(None if not isinstance(x, Tensor) else (_binding(buffers, x._storage.buffer), x.dtype.storage)
                for x in operands)
    return sig, buffers


# -- plan and launch ------------------------------------------------------------------------------
# How an operand enters a cached plan's kernel (MapPlan.reads).
SCALAR = 0  # a number: its bits travel in the parameters
UNITS = 1  # a block read at whole units ("full", "mod"): vec4 loads need a 4-aligned offset
ELEMENT = 2  # a block read element by element ("div", "one"): from a vec4 array its buffer holds whole vec4s
STRIDED = 3  # read through strides (the strided kernel)


@dataclass(slots=True, eq=False)
class MapPlan:
    """How an elementwise op runs, into a fresh output or into a given one (``out``), for one signature
    of its operands.

    Everything here follows from the op, the requested dtype, per operand its dtype, shape, strides
    and device (or a scalar's type), and the given output's (the plan's cache key). What remains per
    call is the buffers, the offsets and scalar values, and (for the block kernel) whether the offsets
    allow vec4 accesses.
    """

    device: Device
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    numel: int
    reads: tuple[int, ...]  # SCALAR / UNITS / ELEMENT / STRIDED per operand
    ctypes: tuple[str, ...]  # the compute type each operand is converted to
    kernel: Callable[..., KernelSpec]  # (binding signature[, width 4]) -> kernel
    kernels: dict  # (tensor operands' bindings, vec4) -> kernel, filled as calls meet them
    block: bool  # the block kernel runs (else the strided one)
    vec4: bool  # block kernel: sizes allow vec4, offsets checked per call; strided: 4 innermost elements a thread
    prefix: tuple  # the parameter bytes before the offsets, output offset 0, per width (1, 4)
    tail: struct.Struct  # packs the offsets and scalars: each scalar in its compute type (f32 or i32)
    groups: tuple  # the grid, per width (1, 4)
    tensors: tuple[int, ...]  # the positions of the tensor operands
    storages: tuple[str, ...]  # their storage types
    out_at: int = 0  # where the output's offset lies in the parameters (a plan into a given output)
    # per operand: read element for element where the output is written (an operand on the output's
    # storage at its offset, the in-place case, needs no copy then)
    as_out: tuple[bool, ...] = ()

    def params(self, vec: bool, offs: list, scal: list, operands: list, out_offset: int = 0) -> bytes:
        """This call's parameter block: the plan's fixed words, then the offsets and scalars."""
        head = self.prefix[vec]
        if out_offset:
            head = head[:self.out_at] + _U32.pack(out_offset) + head[self.out_at + 4:]
        try:
            return head + self.tail.pack(*offs, *scal)
        except (struct.error, OverflowError, TypeError):  # a scalar struct cannot take as it is: the exact rules
            bits = [_scalar_bits(x, ct) if r == SCALAR else 0 for x, r, ct in zip(operands, self.reads, self.ctypes)]
            return head + _TAIL_BITS.pack(*offs, *bits, *[0] * (MAX_OPERANDS - len(bits)))


_PLANS = PlanCache()  # MapPlan, or None where the general path runs
_TAIL_BYTES = 32  # off and sc (vec4 each) end both parameter blocks
_TAIL_BITS = struct.Struct("<8I")
_U32 = struct.Struct("<I")


def plan(op: str, operands: list, out_dtype: DType | None = None, out: Tensor | None = None) -> MapPlan | None:
    """The cached plan for ``op`` over ``operands`` into a fresh output (or into ``out``); None when the
    general path must run (a zero-size result, operands it has to check or reject)."""
    key: list = [op, out_dtype]
    if out is not None:
        key.append((out._storage.dtype, out._shape, out._strides, out._storage.device))
    for x in operands:
        key.append((x._storage.dtype, x._shape, x._strides, x._storage.device) if isinstance(x, Tensor) else type(x))
    if out is None:
        return _PLANS.remember(tuple(key), _make_plan, op, operands, out_dtype)
    return _PLANS.remember(tuple(key), _make_into, op, operands, out_dtype, out)


def _make_plan(op: str, operands: list, out_dtype: DType | None) -> MapPlan | None:
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if not tensors or any(not isinstance(x, Tensor) and not is_scalar(x) for x in operands):
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
    dtype, cts = result_type(op, operands, out_dtype)
    check_dtype_supported(dtype, dev)
    common = dict(out_storage=dtype.storage, out_is_bool=dtype is _dt.bool_, compute=dtype.compute,
                  cmp_as_i32=out_dtype is None)
    return _assemble(op, operands, tuple(cts), dev, dtype, shape, contiguous_strides(shape), numel, None,
                     _block_modes(operands, shape, numel), common)


def _make_into(op: str, operands: list, out_dtype: DType | None, out: Tensor) -> MapPlan | None:
    """The plan into ``out``: what ``_run_general`` and ``_into`` decide, for operands it would not have to
    copy first; None wherever they would raise (they raise then, with their messages) or copy."""
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if any(not isinstance(x, Tensor) and not is_scalar(x) for x in operands):
        return None
    dev = out.device
    if any(t.device is not dev for t in tensors):
        return None
    try:
        shape = broadcast_shape(*(t.shape for t in tensors), op=op) if tensors else ()
        dtype, cts = result_type(op, operands, out_dtype)
        if out.shape != shape and broadcast_shape(out.shape, shape, op=op) != out.shape:
            return None
    except (ValueError, TypeError):
        return None
    if any(n > 1 and s == 0 for n, s in zip(out.shape, out.strides)):
        return None
    if out_dtype is None and dtype is not out.dtype:
        dtype = out.dtype
    shape = out.shape
    numel = math.prod(shape)
    if numel == 0:
        return None
    common = dict(out_storage=out.dtype.storage, out_is_bool=out.dtype is _dt.bool_, compute=dtype.compute,
                  cmp_as_i32=out_dtype is None)
    as_out = tuple(isinstance(x, Tensor) and all(n == 1 or s == so for n, s, so in
                                                 zip(shape, broadcast_strides(x, shape), out.strides))
                   for x in operands)
    modes = _block_modes(operands, shape, numel) if out.is_contiguous() else None
    return _assemble(op, operands, tuple(cts), dev, out.dtype, shape, out.strides, numel, out, modes, common,
                     as_out)


def _assemble(op: str, operands: list, cts: tuple, dev: Device, dtype: DType, shape, strides, numel: int,
              out: Tensor | None, modes: tuple | None, common: dict, as_out: tuple = ()) -> MapPlan:
    lim = dev.max_workgroups
    groups = (grid(-(-numel // WORKGROUP), lim), grid(-(-numel // (4 * WORKGROUP)), lim))
    zeros = [x if isinstance(x, Tensor) else 0 for x in operands]  # scalars' values are per call
    where = tuple(k for k, x in enumerate(operands) if isinstance(x, Tensor))
    storages = tuple(operands[k].dtype.storage for k in where)
    scalar_fmt = "".join("I" if isinstance(x, Tensor) else "f" if ct == "f32" else "i" for x, ct in zip(operands, cts))
    tail = struct.Struct("<4I" + scalar_fmt + "4x" * (MAX_OPERANDS - len(operands)))
    if modes is None:  # the strided kernel; "vec4" here: 4 innermost elements a thread (any offsets)
        wide = _map_width(shape, strides, operands) == 4
        heads = tuple(_MAP.pack_flat(_map_words(numel // w, shape, out, zeros, cts, 0))[:-_TAIL_BYTES] if w else None
                      for w in (1, 4 if wide else 0))
        reads = tuple(STRIDED if isinstance(x, Tensor) else SCALAR for x in operands)
        kernel = functools.partial(_map_kernel, op, cts=cts, **common)
        return MapPlan(dev, dtype, shape, strides, numel, reads, cts, kernel, {}, False, wide, heads, tail,
                       groups, where, storages, _MAP.offsets["off_o"], as_out)
    vec4 = _vec_static(numel, modes)
    heads = tuple(_BLOCK.pack_flat(_block_words(numel, w, 0, zeros, modes, cts))[:-_TAIL_BYTES] if w else None
                  for w in (1, 4 if vec4 else 0))
    reads = tuple(SCALAR if m is None else UNITS if m[0] in ("full", "mod") else ELEMENT for m in modes)
    kernel = functools.partial(_block_kernel, op, modes=tuple(m and m[0] for m in modes), cts=cts, **common)
    return MapPlan(dev, dtype, shape, strides, numel, reads, cts, kernel, {}, True, vec4, heads, tail, groups, where,
                   storages, _BLOCK.offsets["off_o"], as_out)


def launch(p: MapPlan, operands: list, out: Tensor | None = None) -> Tensor | None:
    """Run a plan: a fresh output (or ``out``), the operands' bindings, offsets and scalars, one dispatch.
    None, with nothing recorded, when an operand overlaps ``out`` other than element for element (the
    general path copies it first)."""
    if out is None:
        out = Tensor(Storage(p.device, p.dtype, p.numel), p.shape, p.strides)
        dst = None
        off_o = 0
        vec = p.vec4
    else:
        dst = out._storage
        off_o = out._offset
        vec = p.vec4 and not (p.block and off_o & 3)  # the strided kernel's width takes any offsets
    buffers = [out._storage.buffer]
    reads = p.reads
    binds = []
    offs = [0, 0, 0, 0]
    for k in p.tensors:
        x = operands[k]
        off = offs[k] = x._offset
        if x._storage is dst:  # written as it is read, element for element, or the general path copies it
            if off != off_o or not p.as_out[k]:
                return None
            binds.append(0)
            b = buffers[0]
        else:
            b = x._storage.buffer
            if b in buffers:  # operands on one buffer share a binding
                binds.append(buffers.index(b))
            else:
                binds.append(len(buffers))
                buffers.append(b)
        if vec and p.block and (off & 3 if reads[k] == UNITS else b.size & 15):
            vec = False
    key = (tuple(binds), vec)
    kspec = p.kernels.get(key)
    if kspec is None:
        sig = [None] * len(operands)
        for k, j, st in zip(p.tensors, binds, p.storages):
            sig[k] = (j, st)
        kspec = p.kernels[key] = p.kernel(tuple(sig), 4) if vec else p.kernel(tuple(sig))
    scal = [0 if r else x for x, r in zip(operands, reads)]
    p.device.dispatch(kspec, buffers, p.params(vec, offs, scal, operands, off_o), p.groups[vec])
    return out


def run_map(op: str, operands: list[Operand], out: Tensor | None = None, out_dtype: DType | None = None) -> Tensor:
    """Evaluate ``OPS[op]`` elementwise into a new tensor (of ``out_dtype`` when given), or into ``out``
    (any strides, converted to its dtype). Integer divisors are not checked for zeros here (a zero
    gives an undefined value): ``arith.binary`` and ``arith.inplace`` check them."""
    p = plan(op, operands, out_dtype, out)
    if p is not None:
        done = launch(p, operands, out)
        if done is not None:
            return done
    return _run_general(op, operands, out, out_dtype)


def _run_general(op: str, operands: list, out: Tensor | None, out_dtype: DType | None) -> Tensor:
    """Everything a plan does not cover: checks that raise, an ``out`` to write, zero sizes."""
    for x in operands:
        _check_operand(x, op)
    tensors = [x for x in operands if isinstance(x, Tensor)]
    if out is not None:
        check_same_device(out, *tensors, op=op)
    elif tensors:
        check_same_device(*tensors, op=op)
    shape = broadcast_shape(*(t.shape for t in tensors), op=op) if tensors else ()
    dtype, cts = result_type(op, operands, out_dtype)
    if out is None:
        out = Tensor.empty(shape, dtype, tensors[0].device if tensors else None)
    else:
        shape, dtype, operands = _into(op, out, shape, dtype, out_dtype, operands)
    numel = math.prod(shape)
    if numel == 0:
        return out
    sig, buffers = _signature(out, operands)
    kernel_args = dict(cts=tuple(cts), out_storage=out.dtype.storage, out_is_bool=out.dtype is _dt.bool_,
                       compute=dtype.compute, cmp_as_i32=out_dtype is None)
    dev = out.device
    modes = _block_modes(operands, shape, numel) if out.is_contiguous() else None
    if modes is not None:
        vec = _vec_static(numel, modes) and _vec_ok(out._offset, operands, modes)
        width = 4 if vec else 1
        kspec = _block_kernel(op, sig, width, modes=tuple(m and m[0] for m in modes), **kernel_args)
        params = _BLOCK.pack_flat(_block_words(numel, width, out._offset, operands, modes, cts))
        dev.dispatch(kspec, buffers, params, grid(-(-numel // (width * WORKGROUP)), dev.max_workgroups))
    else:
        width = _map_width(shape, out.strides, operands)
        kspec = _map_kernel(op, sig, width, **kernel_args)
        params = _MAP.pack_flat(_map_words(numel // width, shape, out, operands, cts))
        dev.dispatch(kspec, buffers, params, grid(-(-numel // (width * WORKGROUP)), dev.max_workgroups))
    return out


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


def _into(op: str, out: Tensor, shape, dtype: DType, out_dtype: DType | None, operands: list):
    """Check that the result fits ``out``; (out's shape, the dtype computed in, operands unaliased)."""
    if out.shape != shape and broadcast_shape(out.shape, shape, op=op) != out.shape:
        raise ValueError(f"{op}: result of shape {shape} cannot be written into a tensor of shape {out.shape}")
    if out_dtype is None and dtype is not out.dtype:
        dtype = out.dtype
    if any(n > 1 and s == 0 for n, s in zip(out.shape, out.strides)):
        raise ValueError(f"{op}: cannot write into a broadcast (expanded) view of shape {out.shape}: "
                         "several of its elements are one memory location; clone() it first")
    return out.shape, dtype, [_unalias(x, out) if isinstance(x, Tensor) else x for x in operands]


# -- public entry points --------------------------------------------------------------------
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
    check_dtype_supported(dtype, a.device)
    return run_map("copy", [a], out_dtype=dtype)


def copy_(dst: Tensor, src: Operand) -> Tensor:
    """Write ``src`` (broadcast, converted to dst's dtype) into ``dst`` in place."""
    if isinstance(src, Tensor) and src.shape != dst.shape:
        broadcast_shape(dst.shape, src.shape, op="copy_")
    run_map("copy", [src], out=dst, out_dtype=dst.dtype)
    dst._storage.bump_version()
    return dst


def fill_(dst: Tensor, value) -> Tensor:
    if not is_scalar(value):
        raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
    return copy_(dst, value)


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


__all__ = ["unary", "where", "clamp", "cast", "copy_", "fill_", "contiguous", "clone", "fill", "run_map",
           "result_type", "broadcast_shape", "contiguous_strides"]
