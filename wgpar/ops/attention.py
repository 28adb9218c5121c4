"""Fused scaled-dot-product attention: one forward kernel and two backward kernels, no [T, T] matrix.

shaders/attention_fwd.wgsl computes softmax(scale * Q K^T [causal]) V flash-attention style and
saves each row's logsumexp; shaders/attention_bwd_dq.wgsl and attention_bwd_dkv.wgsl recompute the
probabilities from it (dQ walking keys, dK / dV walking queries: WGSL has no float atomics, so the
two gradients that sum over different axes get one kernel each). docs/design.md ("Attention") has
the design; ``nn.functional.scaled_dot_product_attention`` decides when these run.

Operands are [B, H, T, D] views whose last dimension is contiguous (the heads of a fused q|k|v
projection read in place); tiles are chosen per device from its workgroup-memory limit. A dispatch
whose loops would pass ``MAX_LOOP`` iterations per invocation (lavapipe leaves loops after 65535)
covers a chunk of the keys (forward, dQ) or queries (dK, dV): the forward merges its chunks' outputs
by their logsumexps, the gradient chunks add up.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, Kernel, KernelSpec, load_source
from ..tensor import Tensor
from .arith import binary
from .elementwise import cast, contiguous, copy_, unary
from .index import getitem
from .reduce import reduce
from .shape import permute, reshape, stack

_THREADS = 256
MAX_HEAD_DIM = 256
NEG = -3.4028235e38  # what the kernels write as the logsumexp of a row that saw no key


@dataclass(frozen=True)
class Tile:
    """A kernel's tile: ``rows`` (queries of the forward / dQ kernel, keys of the dK / dV kernel) per
    workgroup, ``cols`` (keys, or queries) per step of its loop; both multiples of 16."""

    rows: int
    cols: int

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}"


# Largest first; pick() takes the first that fits the device's workgroup memory.
CANDIDATES = (Tile(64, 64), Tile(64, 32), Tile(32, 64), Tile(32, 32), Tile(16, 32), Tile(32, 16), Tile(16, 16))
KINDS = ("fwd", "dq", "dkv")
_force: dict[str, Tile] = {}
_path: list[str | None] = [None]  # "fused" / "reference" / None (decide): see force_path
_force_cv: list[int | None] = [None]  # see force_tiles


def shared_bytes(kind: str, t: Tile, dv: int) -> int:
    """Workgroup memory of one kernel (``dv`` = head_dim / 4), as its WGSL declares it."""
    dp, bp = dv + 1, t.cols + 1
    if kind == "fwd":  # Qs, KVs, Ps, red_m + red_l, m_s, l_s, bad_s
        return 16 * dp * (t.rows + t.cols) + 4 * t.rows * bp + 8 * 16 * t.rows + 16 * t.rows
    if kind == "dq":  # Qs, Gs, Ks, Vs, dSs, lse_s, dl_s
        return 16 * dp * 2 * (t.rows + t.cols) + 4 * t.rows * bp + 8 * t.rows
    return 16 * dp * 2 * (t.rows + t.cols) + 8 * t.rows * bp + 8 * t.cols  # dkv: + Ps, dSs [keys x queries]


def output_layout(rows: int, dv: int) -> tuple[int, int, int, int]:
    """(CV, NC, NR, RR) of the output phase: each thread owns RR rows x CV vec4 columns of the rows x dv
    output (NC threads across, NR = 256 / NC down). Chosen for the fewest workgroup-memory loads per
    multiply-add ((RR + CV) / (RR CV)) with every thread busy, at most 8 accumulators per thread (or the
    fewest the tile allows)."""
    budget = max(8, -(-rows * dv // _THREADS))
    best = None
    for cv in (_force_cv[0],) if _force_cv[0] else (1, 2, 4, 8):
        nc = dv // cv
        if dv % cv or nc == 0 or _THREADS % nc:
            continue
        nr = _THREADS // nc
        idle = nr > rows
        if not idle and rows % nr:
            continue
        rr = 1 if idle else rows // nr
        if rr * cv > budget and not _force_cv[0]:
            continue
        key = (idle, nr if idle else 0, (rr + cv) / (rr * cv))
        if best is None or key < best[0]:
            best = (key, (cv, nc, nr, rr))
    if best is None:
        raise ValueError(f"no output layout with {_force_cv[0]} vec4 columns per thread for {rows} x {dv} vec4s")
    return best[1]


def pick(kind: str, dev, head_dim: int, n_rows: int | None = None, n_cols: int | None = None) -> Tile | None:
    """The tile of ``kind`` for ``dev``: the largest whose workgroup memory fits, no larger than the
    rows (queries, or keys for dkv) and columns (what its loop walks) there are; None when none fits."""
    if head_dim % 4 or not 4 <= head_dim <= MAX_HEAD_DIM:
        return None
    limit = int(dev.limits.get("max-compute-workgroup-storage-size", 16384))
    if int(dev.limits.get("max-compute-invocations-per-workgroup", 256)) < _THREADS:
        return None
    forced = _force.get(kind)
    fits = [t for t in ([forced] if forced else CANDIDATES) if shared_bytes(kind, t, head_dim // 4) <= limit]
    if not fits:
        return None
    cap_r = max(16, -(-(n_rows or 16) // 16) * 16) if n_rows else None
    cap_c = max(16, -(-(n_cols or 16) // 16) * 16) if n_cols else None
    for t in fits:  # a 64-row tile over 16 rows would idle three quarters of its threads
        if (cap_r is None or t.rows <= cap_r) and (cap_c is None or t.cols <= cap_c):
            return t
    return fits[-1]


@contextlib.contextmanager
def force_tiles(cv: int | None = None, **tiles: str) -> Iterator[None]:
    """Make :func:`pick` use the given tiles (``fwd="32x32", dkv="16x16"``) where they fit, and the output
    phase ``cv`` vec4 columns per thread (tests and benchmarks: the layouts a GPU's limits choose)."""
    prev, prev_cv = dict(_force), _force_cv[0]
    try:
        for kind, name in tiles.items():
            if kind not in KINDS:
                raise ValueError(f"unknown attention kernel {kind!r}; choose from {KINDS}")
            rows, cols = (int(x) for x in name.split("x"))
            if rows % 16 or cols % 16 or rows < 16 or cols < 16:
                raise ValueError(f"tile {name!r}: both sides must be multiples of 16")
            _force[kind] = Tile(rows, cols)
        _force_cv[0] = cv
        yield
    finally:
        _force.clear()
        _force.update(prev)
        _force_cv[0] = prev_cv


@contextlib.contextmanager
def force_path(path: str | None) -> Iterator[None]:
    """Make ``scaled_dot_product_attention`` take ``"fused"`` (raising where it cannot) or ``"reference"``
    (the composed ops) for the calls inside (tests, benchmarks); None restores the automatic choice."""
    if path not in (None, "fused", "reference"):
        raise ValueError(f"attention path must be 'fused', 'reference' or None, got {path!r}")
    prev, _path[0] = _path[0], path
    try:
        yield
    finally:
        _path[0] = prev


def forced_path() -> str | None:
    return _path[0]


def loop_cost(kind: str, t: Tile, dv: int) -> tuple[int, int]:
    """(per step of the main loop, once) loop iterations of one invocation, counting every loop as
    lavapipe's limiter may (constant-length loops included)."""
    rm, cn = t.rows // 16, t.cols // 16
    cv, _, _, rr = output_layout(t.rows, dv)
    cols_ld = -(-t.cols * dv // _THREADS)
    out_phase = t.cols * (1 + cv + rr * (1 + cv))
    if kind == "fwd":
        step = (2 * cols_ld + dv * (1 + cn + rm * (1 + cn)) + rm * (1 + cn) + 16 + rm * (1 + cn) + 16
                + rr * (1 + cv) + out_phase)
        return step, -(-t.rows * dv // _THREADS) + rr * (1 + cv) + 4
    step = cols_ld + dv * (1 + 2 * cn + rm * (1 + 2 * cn)) + rm * (1 + cn) + out_phase
    return step, 2 * -(-t.rows * dv // _THREADS) + dv + rr * (1 + cv) + 4


def chunks(kind: str, t: Tile, dv: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the looped-over axis (keys for fwd / dq, queries for dkv) per dispatch."""
    step, once = loop_cost(kind, t, dv)
    per = max(1, (MAX_LOOP - once) // step) * t.cols
    return [(lo, min(n, lo + per)) for lo in range(0, n, per)] or [(0, 0)]


def supported(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the fused kernels cannot run these [B, H, T, D] operands on this device, or None if they can."""
    dev = q.device
    d = q.shape[-1]
    if q.dtype is not k.dtype or q.dtype is not v.dtype or not q.dtype.is_float:
        return f"operand dtypes {q.dtype.name}, {k.dtype.name}, {v.dtype.name} differ"
    if v.shape[-1] != d:
        return f"value head_dim {v.shape[-1]} differs from the query's {d}"
    for kind in KINDS:
        if pick(kind, dev, d) is None:
            return (f"head_dim {d} (needs a multiple of 4 up to {MAX_HEAD_DIM} whose tiles fit "
                    f"{dev.limits.get('max-compute-workgroup-storage-size')} bytes of workgroup memory)")
    b, h, lq, _ = q.shape
    if k.shape[2] == 0 or lq == 0 or b * h == 0:
        return "an empty sequence or batch"
    if -(-max(lq, k.shape[2]) // 16) > dev.max_workgroups:
        return f"sequences of {lq} and {k.shape[2]} need more workgroups than the device's {dev.max_workgroups}"
    return None


# -- kernels ------------------------------------------------------------------------------------------
# Every Params block starts with these 8 words ([6] = the first batch * head of a dispatch), then an
# (offset, batch, head, row) layout in vec4 units per operand, then a few words. 256-thread workgroups
# sized in the shaders: no WG override.
def _layouts(*names: str) -> str:
    return ", ".join(f"{n}_off: u32, {n}_sb: u32, {n}_sh: u32, {n}_st: u32" for n in names)


_HEAD = "H: u32, Tq: u32, Tk: u32, causal: u32, {lo}_lo: u32, {lo}_hi: u32, bh0: u32, scale: f32, "
_KERNELS = {
    "fwd": Kernel("attention_fwd", "o: w, lse: w, q: r, k: r, v: r",
                  _HEAD.format(lo="k") + _layouts("q", "k", "v", "o") + ", l_off: u32", constants=()),
    "dq": Kernel("attention_bwd_dq", "dq: w, delta: w, q: r, k: r, v: r, dout: r, o: r, lse: r",
                 _HEAD.format(lo="k") + _layouts("q", "k", "v", "g", "o", "r") + ", l_off: u32, d_off: u32, flags: u32",
                 constants=()),
    "dkv": Kernel("attention_bwd_dkv", "dk: w, dv: w, q: r, k: r, v: r, dout: r, lse: r, delta: r",
                  _HEAD.format(lo="q") + _layouts("q", "k", "v", "g", "rk", "rv") +
                  ", l_off: u32, d_off: u32, flags: u32", constants=()),
}


# -- operands ---------------------------------------------------------------------------------------
def _vec4_layout(t: Tensor) -> tuple[Tensor, list[int]]:
    """``t`` (4-d, or a contiguous copy of it) with [offset, batch, head, row] strides in vec4 units."""
    ok = t._offset % 4 == 0 and (t.shape[3] <= 1 or t.strides[3] == 1)
    ok = ok and all(n == 1 or s % 4 == 0 for n, s in zip(t.shape[:3], t.strides[:3]))
    if not ok:
        t = contiguous(t)
    strides = [0 if n == 1 else s // 4 for n, s in zip(t.shape[:3], t.strides[:3])]
    return t, [t._offset // 4] + strides


def _fills(kind: str, t: Tile, dv: int, dtype: str, out_dtype: str) -> dict[str, str | int]:
    rm, cn = t.rows // 16, t.cols // 16
    cv, nc, nr, rr = output_layout(t.rows, dv)
    fills: dict[str, str | int] = {"T": dtype, "DV": dv, "DP": dv + 1,
                                   "CV": cv, "NC": nc, "NR": nr, "RR": rr, "BP": t.cols + 1,
                                   "PS": t.rows * (t.cols + 1), "FNS": load_source("float_fns")}
    if kind == "fwd":
        return fills | {"TO": out_dtype, "BR": t.rows, "BC": t.cols, "RM": rm, "CN": cn, "QS": t.rows * (dv + 1),
                        "KS": t.cols * (dv + 1), "RS": 16 * t.rows, "M2": 2 * t.rows}
    if kind == "dq":
        return fills | {"TG": out_dtype, "BR": t.rows, "BC": t.cols, "RM": rm, "CN": cn, "QS": t.rows * (dv + 1),
                        "KS": t.cols * (dv + 1)}
    return fills | {"TG": out_dtype, "BK": t.rows, "BQ": t.cols, "RK": rm, "CQ": cn, "KS": t.rows * (dv + 1),
                    "QS": t.cols * (dv + 1)}


@functools.lru_cache(maxsize=64)
def _kernel(kind: str, t: Tile, dv: int, dtype: str, out_dtype: str) -> KernelSpec:
    fills = _fills(kind, t, dv, dtype, out_dtype)
    out_t, in_t = f"vec4<{out_dtype}>", f"vec4<{dtype}>"
    if kind == "fwd":
        types = (out_t, "f32", in_t, in_t, in_t)
    elif kind == "dq":
        types = (out_t, "f32", in_t, in_t, in_t, in_t, in_t, "f32")
    else:
        types = (out_t, out_t, in_t, in_t, in_t, in_t, "f32", "f32")
    return _KERNELS[kind].spec(types, **fills)


def _dispatch(k: KernelSpec, dev, buffers: list, head: list, rest: list, n_x: int, bh: int) -> None:
    """Dispatch over an (n_x, batch * heads) grid, in slices of the device's grid limit; ``head`` is
    the first 8 parameter words with the first batch * head index at [6]."""
    lim = dev.max_workgroups
    for bh0 in range(0, bh, lim):
        words = list(head)
        words[6] = bh0
        dev.dispatch(k, buffers, k.params.pack_flat(words + rest), (n_x, min(lim, bh - bh0), 1))


# -- forward ------------------------------------------------------------------------------------------
def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(scale * q k^T [causal]) v for [B, H, T, D] operands that ``supported`` accepts.

    ``out`` is a [B, H, Lq, D] view of a [B, Lq, H, D] tensor (so joining the heads after a transpose
    is free); ``lse`` [B, H, Lq] float32 is each row's logsumexp (NaN where the row is NaN).
    """
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    dv = d // 4
    t = pick("fwd", dev, d, lq, lk)
    (q, lq4), (k, lk4), (v, lv4) = _vec4_layout(q), _vec4_layout(k), _vec4_layout(v)
    out = Tensor.empty((b, lq, h, d), q.dtype, dev)
    lse = Tensor.empty((b, h, lq), _dt.float32, dev)
    ranges = chunks("fwd", t, dv, lk)
    n_x = -(-lq // t.rows)
    o_layout = [0, lq * h * dv, dv, h * dv]
    if len(ranges) == 1:
        _forward_chunk(q, k, v, out, lse, lq4, lk4, lv4, o_layout, t, causal, scale, 0, lk, n_x)
        return permute(out, (0, 2, 1, 3)), lse
    outs, lses = [], []
    for lo, hi in ranges:  # each chunk normalised over its own keys, merged by the logsumexps
        oc = Tensor.empty((b, h, lq, d), _dt.float32, dev)
        lc = Tensor.empty((b, h, lq), _dt.float32, dev)
        _forward_chunk(q, k, v, oc, lc, lq4, lk4, lv4, [0, h * lq * dv, lq * dv, dv], t, causal, scale, lo, hi, n_x)
        outs.append(oc)
        lses.append(lc)
    ls = stack(lses, 0)
    m = reduce("max", ls, 0, keepdims=True)
    w = unary("exp", binary("sub", ls, m))
    total = reduce("sum", w, 0, keepdims=True)
    merged_lse = binary("add", reshape(m, (b, h, lq)), unary("log", reshape(total, (b, h, lq))))
    w = binary("div", w, total)
    acc = None
    for c, oc in enumerate(outs):
        part = binary("mul", oc, reshape(getitem(w, c), (b, h, lq, 1)))
        acc = part if acc is None else binary("add", acc, part)
    view = permute(out, (0, 2, 1, 3))
    copy_(view, acc if q.dtype is _dt.float32 else cast(acc, q.dtype))
    copy_(lse, merged_lse)
    return view, lse


def _forward_chunk(q, k, v, out, lse, lq4, lk4, lv4, o_layout, t: Tile, causal: bool, scale: float,
                   lo: int, hi: int, n_x: int) -> None:
    b, h, lq, d = q.shape
    kern = _kernel("fwd", t, d // 4, q.dtype.storage, out.dtype.storage)
    head = [h, lq, k.shape[2], int(causal), lo, hi, 0, scale]
    o4 = [out._offset // 4] + o_layout[1:]
    rest = lq4 + lk4 + lv4 + o4 + [lse._offset]
    bufs = [out._storage.buffer, lse._storage.buffer, q._storage.buffer, k._storage.buffer, v._storage.buffer]
    _dispatch(kern, q.device, bufs, head, rest, n_x, b * h)


# -- backward ------------------------------------------------------------------------------------------
def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, causal: bool,
                       scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), contiguous [B, H, T, D] in the operands' dtype, for ``attention_forward``'s
    ``out`` and ``lse`` and the output gradient ``dout``."""
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    dv = d // 4
    if dout.dtype is not q.dtype:
        dout = cast(dout, q.dtype)
    (q, lq4), (k, lk4), (v, lv4) = _vec4_layout(q), _vec4_layout(k), _vec4_layout(v)
    (dout, lg4), (out, lo4) = _vec4_layout(dout), _vec4_layout(out)
    delta = Tensor.empty((b, h, lq), _dt.float32, dev)
    t_dq, t_kv = pick("dq", dev, d, lq, lk), pick("dkv", dev, d, lk, lq)
    q_ranges, k_ranges = chunks("dq", t_dq, dv, lk), chunks("dkv", t_kv, dv, lq)
    # Chunks add into the gradients: in float32 then, cast once at the end.
    gq = Tensor.empty((b, h, lq, d), _dt.float32 if len(q_ranges) > 1 else q.dtype, dev)
    gk = Tensor.empty((b, h, lk, d), _dt.float32 if len(k_ranges) > 1 else q.dtype, dev)
    gv = Tensor.empty((b, h, lk, d), gk.dtype, dev)
    bufs_common = [q._storage.buffer, k._storage.buffer, v._storage.buffer, dout._storage.buffer]

    kern = _kernel("dq", t_dq, dv, q.dtype.storage, gq.dtype.storage)
    gq4 = [gq._offset // 4, h * lq * dv, lq * dv, dv]
    for n, (lo, hi) in enumerate(q_ranges):
        head = [h, lq, lk, int(causal), lo, hi, 0, scale]
        flags = (1 if n else 0) | (2 if n == 0 else 0)  # the first chunk writes dq and computes delta
        rest = lq4 + lk4 + lv4 + lg4 + lo4 + gq4 + [lse._offset, delta._offset, flags]
        _dispatch(kern, dev, [gq._storage.buffer, delta._storage.buffer, *bufs_common, out._storage.buffer,
                              lse._storage.buffer], head, rest, -(-lq // t_dq.rows), b * h)

    kern = _kernel("dkv", t_kv, dv, q.dtype.storage, gk.dtype.storage)
    gk4 = [gk._offset // 4, h * lk * dv, lk * dv, dv]
    gv4 = [gv._offset // 4, h * lk * dv, lk * dv, dv]
    for n, (lo, hi) in enumerate(k_ranges):
        head = [h, lq, lk, int(causal), lo, hi, 0, scale]
        rest = lq4 + lk4 + lv4 + lg4 + gk4 + gv4 + [lse._offset, delta._offset, 1 if n else 0]
        _dispatch(kern, dev, [gk._storage.buffer, gv._storage.buffer, *bufs_common, lse._storage.buffer,
                              delta._storage.buffer], head, rest, -(-lk // t_kv.rows), b * h)
    if gq.dtype is not q.dtype:
        gq = cast(gq, q.dtype)
    if gk.dtype is not q.dtype:
        gk, gv = cast(gk, q.dtype), cast(gv, q.dtype)
    return gq, gk, gv


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


__all__ = ["attention_forward", "attention_backward", "supported", "pick", "force_tiles", "force_path", "forced_path",
           "chunks", "output_layout", "Tile", "default_scale", "NEG"]
