"""Reductions (sum, mean, max, min, argmax, argmin) and softmax over any axes."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor, wrap_dim
from .elementwise import contiguous, fill, run_map
from .shape import permute, reshape

_NEG_INF = "bitcast<f32>(0xff800000u)"
_POS_INF = "bitcast<f32>(0x7f800000u)"
_ARG = {"argmax": ">", "argmin": "<"}

_ROWS = Kernel("reduce", "out: w, x: r", "rows: u32, cols: u32, off: u32, chunk: u32, groups: u32, scale: f32",
               constants=(("WG", WORKGROUP), ("L", WORKGROUP)))
_COLS = Kernel("reduce_cols", "out: w, x: r",
               "outer: u32, n: u32, units: u32, off: u32, tiles: u32, slices: u32, rows: u32, scale: f32",
               constants=(("WG", WORKGROUP), ("TC", 64), ("TR", WORKGROUP // 64)))
_SOFTMAX = Kernel("softmax", "y: w, x: r", "rows: u32, cols: u32, off_x: u32, off_y: u32",
                  constants=(("WG", WORKGROUP), ("W", 1)))


@functools.lru_cache(maxsize=64)
def _kernel_text(op: str, ctype: str) -> dict[str, str]:
    """The fills of reduce.wgsl / reduce_cols.wgsl for ``op``: INIT, COMBINE, FINAL (and FNS). Cached:
    callers unpack it, never change it."""
    fns = {"FNS": load_source("float_fns")}
    if op in ("sum", "mean"):
        return {"INIT": f"{ctype}(0)", "COMBINE": "*acc = *acc + v;",
                "FINAL": "acc0 * p.scale" if op == "mean" else "acc0"} | fns
    lo = _NEG_INF if ctype == "f32" else "(-2147483647 - 1)"
    hi = _POS_INF if ctype == "f32" else "2147483647"
    if op in ("max", "min"):
        fold = f"{op}_nan" if ctype == "f32" else op  # a NaN wins, as in PyTorch and NumPy
        return {"INIT": lo if op == "max" else hi, "COMBINE": f"*acc = {fold}(*acc, v);", "FINAL": "acc0"} | fns
    cmp = _ARG[op]
    # Ties go to the first index, as in NumPy; for floats a NaN beats every number (the first NaN's
    # index wins, as in PyTorch), tested on its bits (float_fns.wgsl says why).
    if ctype == "f32":
        combine = ("let vn = isnan_(v); let an = isnan_(*acc); "
                   f"if ((vn && !an) || (!vn && !an && (v {cmp} *acc || (v == *acc && c < *ai))) "
                   "|| (vn && an && c < *ai)) { *acc = v; *ai = c; }")
    else:
        combine = f"if (v {cmp} *acc || (v == *acc && c < *ai)) {{ *acc = v; *ai = c; }}"
    return {"INIT": lo if op == "argmax" else hi, "COMBINE": combine, "FINAL": "ai0"} | fns


def _axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(wrap_dim(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"repeated axis in {tuple(axis)}")
        return tuple(sorted(axes))
    return (wrap_dim(axis, ndim),)


def _out_dtype(op: str, dt: _dt.DType) -> _dt.DType:
    if op in ("argmax", "argmin"):
        return _dt.int32
    if op == "mean":
        return dt if dt.is_float else _dt.float32
    if op == "sum" and dt is _dt.bool_:
        return _dt.int32
    return dt


def reduce(op: str, x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a wgpar.Tensor, got {type(x).__name__}")
    if op in _ARG and isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: axis must be an int or None, got {axis!r}")
    axes = _axes(axis, x.ndim)
    if x.ndim == 0:  # a scalar: axis None, 0, -1 or () all reduce its one element, as in PyTorch
        return reshape(reduce(op, reshape(x, (1,)), 0), ())
    out_dt = _out_dtype(op, x.dtype)
    if not axes:  # axis=(): nothing is reduced (NumPy), only the result type applies
        return run_map("copy", [x], out_dtype=out_dt)
    kept = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    out_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else kept
    n_red = math.prod(x.shape[i] for i in axes)
    if n_red == 0:
        if op in ("sum",):
            return fill(out_shape, 0, out_dt, x.device)
        if op == "mean":
            return fill(out_shape, float("nan"), out_dt, x.device)
        raise ValueError(f"{op}: cannot reduce over a zero-size dimension (shape {x.shape}, axes {axes})")
    if math.prod(kept) == 0:
        return Tensor.empty(out_shape, out_dt, x.device)
    if op in _ARG and axis is None:
        x = reshape(x, (-1,))
        axes = (0,)
    # Reduced axes must be one run of adjacent axes of a contiguous tensor; otherwise move them last.
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        rest = [i for i in range(x.ndim) if i not in axes]
        x = permute(x, rest + list(axes))
        axes = tuple(range(len(rest), x.ndim))
    x = contiguous(x)
    outer = math.prod(x.shape[: axes[0]])
    inner = math.prod(x.shape[axes[-1] + 1:])
    if inner > 1 and n_red > MAX_LOOP and op in _ARG:  # one column pass would loop past MAX_LOOP: make it rows
        rest = [i for i in range(x.ndim) if i not in axes]
        x = contiguous(permute(x, rest + list(axes)))
        outer, inner = outer * inner, 1
    result = _reduce_block(op, x, outer, n_red, inner, out_dt, shape=out_shape)
    return result if result.shape == out_shape else reshape(result, out_shape)


def column_sums(x: Tensor, outer: int, n: int, inner: int, out_dt: _dt.DType) -> Tensor:
    """Contiguous ``x`` viewed as [outer, n, inner] summed over n into [outer, inner] of ``out_dt``, in float32
    for float inputs (a fused kernel's partial sums, finished in at most two dispatches)."""
    out = _reduce_block("sum", x, outer, n, inner, out_dt, "f32" if x.dtype.is_float else None)
    return reshape(out, (outer, inner))


def _reduce_block(op: str, x: Tensor, outer: int, n: int, inner: int, out_dt: _dt.DType,
                  ctype: str | None = None, scale: float | None = None, shape: tuple | None = None) -> Tensor:
    """Reduce x viewed as [outer, n, inner] over n; ``ctype`` is the accumulator type (default: x's
    compute type, f32 for mean, so an integer mean never wraps); a mean multiplies by ``scale``
    (default 1 / n: a second pass over partial sums takes the first pass's count). A row reduction's
    last pass writes a tensor of ``shape`` (of ``outer`` elements) where given, saving the caller a
    reshape; otherwise the result is [outer] (rows) or [outer, inner] (columns)."""
    ctype = ctype or ("f32" if op == "mean" else x.dtype.compute)
    scale = 1.0 / n if scale is None else scale
    dev = x.device
    if inner > 1:
        return _reduce_cols(op, x, outer, n, inner, out_dt, ctype, scale, op not in _ARG)
    plan = _row_plan(op, outer, n, x.dtype.storage, ctype, out_dt, x._offset, scale, dev.max_workgroups)
    if plan[0] is None:  # argmax / argmin of long rows
        return _arg_two_pass(op, x, outer, n, *plan[1:])
    partial_dt, groups, k, params, wgs = plan
    out = Tensor.empty(shape if groups == 1 and shape is not None else (outer * groups,), partial_dt, dev)
    dev.dispatch(k, [out._storage.buffer, x._storage.buffer], params, wgs)
    if groups == 1:
        return out
    return _reduce_block(op, out.reshape(outer, groups), outer, groups, 1, out_dt, scale=scale, shape=shape)


@functools.lru_cache(maxsize=1024)
def _row_plan(op: str, outer: int, n: int, t: str, ctype: str, out_dt: _dt.DType, off: int, scale: float,
              lim: int) -> tuple:
    """The first row pass over [outer, n]: (partial dtype, chunks a row, kernel, parameters, workgroups),
    or (None, chunk, chunks, vec) for argmax / argmin of long rows. Made once per distinct call: a short
    reduction's host cost is then about one dispatch's (a global average pool's forward is host-bound)."""
    # Split long rows into chunks so a few rows still fill the GPU (and no thread loops more
    # than MAX_LOOP times); partials reduced again.
    two_pass = n > 16 * WORKGROUP and (outer < 64 or n > WORKGROUP * MAX_LOOP)
    groups = max(min(-(-n // (4 * WORKGROUP)), 1024), -(-n // (WORKGROUP * MAX_LOOP))) if two_pass else 1
    chunk = -(-n // groups)
    vec = n % 4 == 0 and off % 4 == 0
    if vec and chunk % 4:  # whole vec4s per chunk
        chunk += 4 - chunk % 4
        groups = -(-n // chunk)
    if op in _ARG and groups > 1:
        return None, chunk, groups, vec
    partial_dt = out_dt if groups == 1 else (_dt.float32 if ctype == "f32" else _dt.int32)
    first_op = "sum" if op == "mean" and groups > 1 else op
    lanes = _row_lanes(-(-chunk // 4) if vec else chunk)
    k = _row_kernel(partial_dt.storage, t, ctype, vec, first_op, lanes)
    return (partial_dt, groups, k,
            _ROWS.pack(rows=outer, cols=n, off=off, chunk=chunk, groups=groups, scale=scale),
            grid(-(-outer * groups // (WORKGROUP // lanes)), lim))


def row_reduce(op: str, x: Tensor, rows: int, cols: int, shape: tuple) -> Tensor:
    """Contiguous ``x`` viewed as [rows, cols] reduced over its columns into a tensor of ``shape`` (of
    ``rows`` elements; ``op``'s output dtype), without ``reduce``'s handling of axes: for callers whose
    layout is known (pooling), at the host cost of about one dispatch."""
    return _reduce_block(op, x, rows, cols, 1, _out_dtype(op, x.dtype), shape=shape)


# A first column pass aims at this many workgroups (8 of 256 threads per SM of a 132-SM GPU: enough
# loads in flight to run at memory bandwidth); a pass whose threads would each fold more than _COL_RT
# rows splits the axis into slices instead, each thread then folding 8 or more.
_COL_WG = 1024
_COL_RT = 16


def _pow2ceil(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _col_plan(outer: int, n: int, units: int, split: bool) -> tuple[int, int, int]:
    """(TC column lanes of a workgroup, slices of the reduced axis, rows per slice) for reduce_cols.wgsl.

    One pass takes narrow tiles (at least 8 column lanes: 32 bytes of each row at the least) and as many
    row lanes as leave each about 4 rows, so a short axis (the partials) still spreads over many
    workgroups. A long axis is first cut into slices of wide tiles (up to 64 lanes)."""
    pu = _pow2ceil(units)
    wide, narrow = WORKGROUP // min(pu, 64), WORKGROUP // min(pu, 8)  # row lanes of each tiling
    tr = min(max(_pow2ceil(-(-n // 4)), wide), narrow)
    if split and -(-n // tr) > _COL_RT:
        tiles = -(-units // (WORKGROUP // wide))
        slices = min(-(-_COL_WG // (outer * tiles)), n // (8 * wide))
        slices = max(slices, -(-n // (wide * MAX_LOOP)))  # no thread loops past MAX_LOOP
        if slices > 1:
            per = -(-n // slices)
            rows = -(-per // wide) * wide  # whole steps of the row lanes
            return WORKGROUP // wide, -(-n // rows), rows
    return WORKGROUP // tr, 1, n


def _col_choice(op: str, offset: int, outer: int, n: int, inner: int, split: bool) -> tuple[int, tuple[int, int, int]]:
    """(w: 4 where the columns go as whole vec4s, else 1; _col_plan's tiling) of a column reduction."""
    w = 4 if op in ("sum", "mean") and inner % 4 == 0 and offset % 4 == 0 else 1
    return w, _col_plan(outer, n, inner // w, split)


def _reduce_cols(op: str, x: Tensor, outer: int, n: int, inner: int, out_dt: _dt.DType, ctype: str, scale: float,
                 split: bool) -> Tensor:
    """The column reduction: one dispatch, or (``split``, a long axis) partials over slices of the axis
    and one more over them, which never splits again."""
    w, (tc, slices, rows) = _col_choice(op, x._offset, outer, n, inner, split)
    if slices > 1:
        part_dt = _dt.float32 if ctype == "f32" else _dt.int32
        part = _cols_pass("sum" if op == "mean" else op, x, outer, n, inner, w, part_dt, ctype, 1.0,
                          tc, slices, rows)
        return _reduce_cols(op, part, outer, slices, inner, out_dt, ctype, scale, False)
    return _cols_pass(op, x, outer, n, inner, w, out_dt, ctype, scale, tc, 1, n)


def _cols_pass(op: str, x: Tensor, outer: int, n: int, inner: int, w: int, out_dt: _dt.DType, ctype: str,
               scale: float, tc: int, slices: int, rows: int) -> Tensor:
    """One dispatch of reduce_cols.wgsl: [outer, slices, inner] (flat) from x [outer, n, inner]; ``w`` 4
    reads and writes vec4s of columns."""
    dev = x.device
    out = Tensor.empty((outer * slices * inner,), out_dt, dev)
    k, params, groups = _cols_launch(op, x.dtype, x._offset, outer, n, inner, w, out_dt, ctype, scale, tc, slices,
                                     rows, dev.max_workgroups)
    dev.dispatch(k, [out._storage.buffer, x._storage.buffer], params, groups)
    return out


def _cols_launch(op: str, x_dt: _dt.DType, x_off: int, outer: int, n: int, inner: int, w: int, out_dt: _dt.DType,
                 ctype: str, scale: float, tc: int, slices: int, rows: int, max_groups: int) -> tuple:
    """(kernel, parameters, workgroups) of that dispatch, bound to (out, x)."""
    units = inner // w
    vt = (lambda t: f"vec4<{t}>") if w == 4 else (lambda t: t)
    k = _COLS.spec((vt(out_dt.storage), vt(x_dt.storage)), constants={"TC": tc, "TR": WORKGROUP // tc},
                   O=vt(out_dt.storage), A=vt(ctype), C=ctype, **_kernel_text(op, ctype))
    tiles = -(-units // tc)
    params = _COLS.pack(outer=outer, n=n, units=units, off=x_off // w, tiles=tiles, slices=slices, rows=rows,
                        scale=scale)
    return k, params, grid(outer * slices * tiles, max_groups)


def column_sums_launch(x_dt: _dt.DType, n: int, inner: int, out_dt: _dt.DType, max_groups: int) -> tuple | None:
    """What :func:`column_sums` of a contiguous float ``x`` [n, inner] at offset 0 dispatches, as (kernel,
    parameters, workgroups), where that is one dispatch (None: two): for callers that remember it (a split-K
    product's recipe) and bind their own (out, x) buffers."""
    w, (tc, slices, _) = _col_choice("sum", 0, 1, n, inner, True)
    if slices > 1 or not x_dt.is_float:
        return None
    return _cols_launch("sum", x_dt, 0, 1, n, inner, w, out_dt, "f32", 1.0 / n, tc, 1, n, max_groups)


def _row_lanes(units: int) -> int:
    """Lanes reducing one chunk of ``units`` loads (elements or vec4s): a power of two leaving each lane
    about 4 loads, from 4 up to the whole workgroup. Short rows then share a workgroup: 16384 rows of 49
    (a global average pool) took a workgroup each, 207 of its 256 threads idle, or a thread each, uncoalesced."""
    return min(WORKGROUP, max(4, _pow2ceil(-(-units // 4))))


@functools.lru_cache(maxsize=256)
def _row_kernel(out_t: str, t: str, ctype: str, vec: bool, op: str, lanes: int = WORKGROUP) -> KernelSpec:
    """reduce.wgsl for ``op`` with ``lanes`` lanes a chunk; x is read one element per step, or (``vec``)
    one vec4 of 4 columns."""
    if not vec:
        loop = ("    let base = p.off + row * p.cols;\n"
                "    for (var c = start + lane; c < end; c = c + L) {\n"
                f"      fold(&acc, &ai, {ctype}(x[base + c]), i32(c));\n    }}")
    else:
        folds = "\n".join(f"      fold(&acc, &ai, {ctype}(v.{e}), i32(4u * c + {j}u));" for j, e in enumerate("xyzw"))
        loop = ("    let base = (p.off + row * p.cols) >> 2u;\n"
                "    for (var c = (start >> 2u) + lane; c < (end >> 2u); c = c + L) {\n"
                f"      let v = x[base + c];\n{folds}\n    }}")
    return _ROWS.spec((out_t, f"vec4<{t}>" if vec else t), constants={"L": lanes}, O=out_t, C=ctype, LOOP=loop,
                      **_kernel_text(op, ctype))


def _arg_two_pass(op: str, x: Tensor, outer: int, n: int, chunk: int, groups: int, vec: bool) -> Tensor:
    """argmax/argmin of long rows: per chunk the extreme value and its (first) index, then the first
    chunk holding the row's extreme picks the index, so ties still resolve to the first index."""
    dev = x.device
    ctype = x.dtype.compute
    part_dt = _dt.float32 if ctype == "f32" else _dt.int32
    parts = []
    for first_op, dt in (("max" if op == "argmax" else "min", part_dt), (op, _dt.int32)):
        out = Tensor.empty((outer * groups,), dt, dev)
        k = _row_kernel(dt.storage, x.dtype.storage, ctype, vec, first_op)
        dev.dispatch(k, [out._storage.buffer, x._storage.buffer],
                     _ROWS.pack(rows=outer, cols=n, off=x._offset, chunk=chunk, groups=groups, scale=1.0),
                     grid(outer * groups, dev.max_workgroups))
        parts.append(reshape(out, (outer, groups)))
    values, indices = parts
    best = reshape(_reduce_block(op, values, outer, groups, 1, _dt.int32), (outer, 1))
    columns = Tensor.from_numpy(np.arange(groups, dtype=np.int32), device=dev)
    picked = run_map("where", [run_map("eq", [columns, best]), indices, n])
    return _reduce_block("min", picked, outer, groups, 1, _dt.int32)


def softmax(x: Tensor, axis=-1, log: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"softmax: expected a wgpar.Tensor, got {type(x).__name__}")
    if not x.dtype.is_float:
        raise TypeError(f"{'log_' if log else ''}softmax needs a float tensor, got {x.dtype.name}")
    if axis is None:
        axis = -1
    if x.ndim == 0:
        x = reshape(x, (1,))
        return reshape(softmax(x, 0, log), ())
    d = wrap_dim(axis, x.ndim)
    if 3 * -(-x.shape[d] // WORKGROUP) > MAX_LOOP:  # the row kernel (three passes) would loop too long
        z = run_map("sub", [x, reduce("max", x, d, keepdims=True)])
        lse = run_map("log", [reduce("sum", run_map("exp", [z]), d, keepdims=True)])
        out = run_map("sub", [z, lse])
        return out if log else run_map("exp", [out])
    last = x.ndim - 1
    moved = permute(x, [i for i in range(x.ndim) if i != d] + [d]) if d != last else x
    src = contiguous(moved)
    out = Tensor.empty(src.shape, x.dtype, x.device)
    cols = src.shape[-1] if src.ndim else 1
    rows = src.numel() // cols if cols else 0
    if rows and cols:
        t = x.dtype.storage
        vec = cols % 4 == 0 and src._offset % 4 == 0  # vec4 loads and stores (the output is fresh)
        xt = f"vec4<{t}>" if vec else t
        k = _SOFTMAX.spec((xt, xt), constants={"W": 4 if vec else 1}, LOG="true" if log else "false", X=xt,
                          F="vec4<f32>" if vec else "f32", HMAX="max(max(v.x, v.y), max(v.z, v.w))" if vec else "v",
                          HSUM="dot(exp(v - m), vec4<f32>(1.0))" if vec else "exp(v - m)",
                          BAD="bad4(v)" if vec else "bad1(v)", FNS=load_source("float_fns"),
                          MERGE=load_source("softmax_merge"))
        x.device.dispatch(k, [out._storage.buffer, src._storage.buffer],
                          _SOFTMAX.pack(rows=rows, cols=cols, off_x=src._offset, off_y=0),
                          grid(rows, x.device.max_workgroups))
    if d != last:
        inv = [0] * x.ndim
        order = [i for i in range(x.ndim) if i != d] + [d]
        for pos, ax in enumerate(order):
            inv[ax] = pos
        out = permute(out, inv)
    return out
