"""Fused scaled-dot-product attention: one forward kernel and two backward kernels, no [T, T] matrix.
(Each has a register-tiled form, *_rt.wgsl, for GPUs with subgroups: 4 rows per thread.)

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
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, WORKGROUP, Kernel, KernelSpec, grid, load_source
from ..tensor import Tensor
from .arith import binary
from .elementwise import cast, contiguous, copy_, fill, run_map, unary
from .index import getitem
from .matmul import causal_band, matmul, matmul_causal
from .plans import PlanCache
from .reduce import reduce
from .shape import narrow, permute, reshape, stack, transpose

_PLACE = re.compile(r"\{\{(\w+)\}\}")
MAX_HEAD_DIM = 256
MAX_THREADS = 256
NEG = -3.4028235e38  # what the kernels write as the logsumexp of a row that saw no key


@dataclass(frozen=True)
class Tile:
    """A kernel's tile: ``rows`` (queries of the forward / dQ kernel, keys of the dK / dV kernel) per
    workgroup, ``cols`` (keys, or queries) per step of its loop, ``cs`` threads per row (each owning
    1 / cs of the head dim's output columns) and whether the inner loops are ``unrolled`` into
    straight-line code (GPUs) or left as loops (CPU adapters: smaller code, and lavapipe counts loops)."""

    rows: int
    cols: int
    cs: int = 1
    unrolled: bool = False
    rm: int = 1  # rows per thread: 4 is the register-tiled forward (cs = TK lanes share 4 rows)
    diag: bool = False  # register-tiled: the mask's compares only on tiles that cross a row's limit

    @property
    def name(self) -> str:
        if self.rm > 1:
            return f"{self.rows}x{self.cols}r{self.rm}t{self.cs}{'d' if self.diag else ''}"
        return f"{self.rows}x{self.cols}/{self.cs}{'u' if self.unrolled else ''}"

    @property
    def threads(self) -> int:
        return self.rows // self.rm * self.cs


# Rows per thread (one query, or key, row per thread; ONNX Runtime's WebGPU flash attention): the
# rows of a tile are its threads. pick() takes the first that fits. CPU adapters: more rows first (each
# K / V tile loaded serves more queries), then more columns (fewer barriers per key). GPUs: 8 columns
# first, since a thread holds its scores (and dP) for the tile's columns in registers: on an H200,
# 8x12x1024x64 causal measured forward 128x16 3.48 ms, 128x8 3.09, 64x8 2.68; backward 64x16
# 10.5 ms, 64x8 9.6.
CANDIDATES = tuple(Tile(r, c) for r in (128, 64, 32, 16) for c in (32, 16, 8))
GPU_CANDIDATES = tuple(Tile(r, c) for c in (8, 16, 32) for r in (64, 32, 16))
# The register-tiled forward (attention_fwd_rt.wgsl: 4 rows per thread, TK lanes of a subgroup sharing
# them), first choice on a GPU with subgroups whose subgroups hold TK lanes: more rows per workgroup
# first (each K / V tile loaded serves more queries), and among the lanes first those leaving each
# thread 2 output vec4 columns (TK = head_dim / 8). H200, causal forward with the next tile prefetched:
# 8x12x1024x64 64x32r4t8 1.29 ms, 64x16r4t8 1.56, 32x16r4t16 1.39, 16x32r4t8 2.20; 8x12x1024x128
# 32x16r4t16 3.14, 32x16r4t8 4.22.
# The backward's register-tiled kernels (attention_bwd_dq_rt / dkv_rt.wgsl) keep two operands of their own
# rows (Q and dO, or K and V) and both walked ones, padded, in workgroup memory: in 48 KiB at D = 64 the
# largest are dq 64x16 and dkv 32x32, which measured best. H200, 8x12x1024x64 causal backward (forward +
# backward less forward): row per thread 9.7 ms; dq 64x16r4t8 alone 6.7 (32x32 7.6, 32x16 8.0, TK = 4
# 7.2); dkv 32x32r4t8 alone 8.0 (32x16 7.8, 16x32 13.0, TK = 4 10.3); both 4.8. D = 128: 25.5 -> 14.9
# with 16x16r4t16 (TK = 8 no faster than row per thread).
RT_TILES = {"fwd": ((64, 32), (64, 16), (32, 32), (32, 16), (16, 16)),
            "dq": ((64, 16), (32, 32), (32, 16), (16, 32), (16, 16)),
            "dkv": ((32, 32), (32, 16), (16, 16))}
RT_LANES = (16, 8, 4)
KINDS = ("fwd", "dq", "dkv")

# -- register-tiled variants: the one place their tile configuration is chosen -------------------------
# A variant names each kernel's tile: ROWSxCOLS (own rows per workgroup x walked rows per tile), "r4"
# (4 rows per thread), "tTK" (lanes per row group) and "d" (the mask's compares only on a tile that
# crosses a row's limit: the causal diagonal, the end of the keys; other tiles take unmasked code).
# These become the kernels' specialisation constants (ROWS, BC, TK, NT, DV, DP, PR, BCT = BC / TK,
# CN = DV / TK, NL, the workgroup arrays' sizes). benchmarks/sweep_attention.py times every variant of
# a head dim; tests/test_attention_variants.py proves each one on lavapipe; WGPAR_ATTN_VARIANT=<name>
# (or ``variant(name)``) forces one.
RT_VARIANTS: dict[str, dict[str, str]] = {
    # head_dim 64 (TK = 8: 2 output vec4s per thread)
    "d64-base": {"fwd": "64x32r4t8", "dq": "64x16r4t8", "dkv": "32x32r4t8"},   # the rule's choice so far
    "d64-diag": {"fwd": "64x32r4t8d", "dq": "64x16r4t8d", "dkv": "32x32r4t8d"},
    "d64-t4": {"fwd": "64x32r4t4d", "dq": "64x16r4t4d", "dkv": "32x32r4t4d"},  # 4x8 tiles, 4 acc vec4s
    "d64-br32": {"fwd": "32x32r4t8d", "dq": "32x32r4t8d", "dkv": "32x16r4t8d"},  # more workgroups
    "d64-bc16": {"fwd": "64x16r4t8d", "dq": "64x16r4t4d", "dkv": "32x16r4t8d"},
    "d64-t4br32": {"fwd": "32x32r4t4d", "dq": "32x32r4t4d", "dkv": "32x16r4t4d"},  # one warp per workgroup
    "d64-t16": {"fwd": "32x32r4t16d", "dq": "32x32r4t16d", "dkv": "32x32r4t16d"},  # 1 output vec4 per thread
    "d64-k8": {"fwd": "64x8r4t8d", "dq": "32x32r4t16d", "dkv": "32x32r4t16d"},  # 8 keys a tile: 1 per lane
    "d64-short": {"fwd": "32x16r4t16d", "dq": "32x16r4t16d", "dkv": "16x16r4t16d"},  # 16 lanes a row: RT_SHORT
    # head_dim 128 (TK = 16)
    "d128-base": {"fwd": "32x16r4t16", "dq": "16x16r4t16", "dkv": "16x16r4t16"},
    "d128-diag": {"fwd": "32x16r4t16d", "dq": "16x16r4t16d", "dkv": "16x16r4t16d"},
    "d128-t8": {"fwd": "32x16r4t8d", "dq": "16x16r4t8d", "dkv": "16x16r4t8d"},  # 4 output vec4s per thread
    "d128-br16": {"fwd": "16x32r4t16d", "dq": "16x16r4t8d", "dkv": "16x16r4t8d"},
}
# (device kind, head_dim) -> the tile each kernel takes by default (device kinds: Device.kind). After
# a sweep, set a line to the tiles it prints (or to a variant: RT_VARIANTS["d64-diag"]); a shape
# missing here, or whose tile does not fit the device, takes the rule in pick().
RT_DEFAULTS: dict[tuple[str, int], dict[str, str]] = {
    # H100, 2026-11-24 (benchmarks/sweep_attention.py, BENCHMARKS.md): the diagonal-only mask is the fastest
    # forward, 16 columns per thread the fastest dQ and dK/dV. 2026-11-25, with the loops written out and the
    # scores as fmas, 8 keys a tile became the fastest forward (8x12x1024x64 causal, ms: 64x32 1.037, 64x16
    # 0.858, 64x8 0.809, 32x8 0.868; not causal 1.661 / 1.373 / 1.285); the gradient tiles stayed best.
    ("nvidia", 64): RT_VARIANTS["d64-k8"],
    ("nvidia", 128): RT_VARIANTS["d128-base"],
}
# (device kind, head_dim) -> (walked rows at most, tiles): where a kernel walks that few rows (keys for the
# forward and dQ, queries for dK / dV) these tiles come before RT_DEFAULTS'. Short walks are latency-bound,
# each workgroup's chain of keys short: 16 lanes a row halve a thread's work per key. H200, 2026-11-26, GPU
# time per call (`scratch` probe, forced tiles, two rounds): 8x12x128x64 causal forward 64x8r4t8d 36.0 us,
# 32x16r4t16d 32.1; 4x12x128x64 26.7 / 23.8; 8x12x256x64 causal 84.7 / 70.8, not causal 109.1 / 94.1;
# 8x12x384x64 causal 146.3 / 134.4, not causal 230.6 / 202.6; at 512 mixed (causal 228.2 / 214.2, not causal
# 312.7 / 342.1), at 1024 no gain (709.8 / 710.6, 1173.8 / 1284.8). Forward + backward with dq 32x16r4t16d and
# dkv 16x16r4t16d against the default's 32x32r4t16d pair: 8x12x128x64 causal 198.3 / 178.5 us, not causal
# 214.2 / 196.3; 8x12x256x64 causal 429.1 / 401.3; 8x12x384x64 causal 732.2 / 709.2, not causal 1120.1 / 1091.4.
RT_SHORT: dict[tuple[str, int], tuple[int, dict[str, str]]] = {
    ("nvidia", 64): (384, RT_VARIANTS["d64-short"]),
}
ENV_VARIANT = "WGPAR_ATTN_VARIANT"
_force: dict[str, Tile] = {}
_path: list[str | None] = [None]  # "fused" / "reference" / None (decide): see force_path
_force_cv: list[int | None] = [None]  # see force_tiles
_force_unroll: list[bool | None] = [None]


def shared_bytes(kind: str, t: Tile, dv: int) -> int:
    """Workgroup memory of one kernel (``dv`` = head_dim / 4), as its WGSL declares it: the rows a thread
    owns padded by one vec4, the walked tile's rows unpadded (read as broadcasts)."""
    own, walked = 16 * t.rows * (dv + 1), 16 * 2 * t.cols * dv
    if kind == "fwd" and t.rm > 1:  # Qs, Ks padded, Vs, Ps (a padded vec4 per row group and key)
        return own + 16 * t.cols * (2 * dv + 1 + t.rows // 4 + 1)
    if t.rm > 1:  # Qs, Gs (or Ks, Vs) and the walked pair, padded; dS (and P^T), lse_s / dl_s for dkv
        return 2 * own + 2 * 16 * t.cols * (dv + 1) + (1 if kind == "dq" else 2) * 16 * t.cols * (t.rows // 4 + 1) + \
            (8 * t.cols if kind == "dkv" else 0)
    if kind == "fwd":  # Qs, Ks, Vs
        return own + walked
    if kind == "dq":  # Qs, Gs, Ks, Vs
        return 2 * own + walked
    return 2 * own + walked + 8 * t.cols  # dkv: Ks, Vs, Qs, Gs, lse_s, dl_s


def column_split(kind: str, dv: int, gpu: bool) -> int:
    """Threads per row. On a GPU, enough that a thread's accumulators stay within 16 vec4s forward and
    8 for each gradient kernel (dQ; dK and dV hold two: 16 together), each thread recomputing its row's
    scores: fewer registers, more threads in flight (an H200 measured 8x12x1024x128 causal forward
    9.6 -> 6.2 ms with 2 threads per row, the backward of D = 64 11.5 -> 10.4 ms). One on a CPU
    adapter, where the recomputed scores only cost time."""
    if _force_cv[0]:
        return _force_cv[0]
    if not gpu:
        return 1
    return max(1, dv // 16 if kind == "fwd" else dv // 8)


def subgroup_lanes(dev) -> int:
    """Lanes a subgroup certainly has on ``dev`` (0 without the subgroup feature). wgpu-py 0.32 reports
    no real subgroup sizes, so: 32 on NVIDIA, AMD and Apple GPUs (their smallest), else WebGPU's minimum 4."""
    if "subgroup" not in dev.features:
        return 0
    if dev.kind in ("nvidia", "amd", "apple"):
        return 32
    m = re.search(r"llvmpipe \(.*?(\d+) bits\)", dev.adapter_name.lower())  # llvmpipe: subgroup = SIMD width
    return max(4, int(m[1]) // 32) if m else 4




def parse_tile(name: str) -> Tile:
    """``"64x32r4t8d"`` -> the register-tiled Tile (``"64x16"``: a row-per-thread one); its loops are
    written out or not as :func:`pick` decides per device (``Tile.unrolled``)."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:r4t(\d+)(d?))?", name)
    if not m or int(m[1]) % 8 or int(m[2]) % 4 or int(m[1]) < 8 or int(m[2]) < 4:
        raise ValueError(f"tile {name!r}: rows must be a multiple of 8, columns of 4")
    return Tile(int(m[1]), int(m[2]), int(m[3]), False, 4, m[4] == "d") if m[3] else Tile(int(m[1]), int(m[2]))


def _table_tile(kind: str, dev, head_dim: int, walked: int | None = None) -> Tile | None:
    """The tile WGPAR_ATTN_VARIANT, RT_SHORT (where the kernel walks ``walked`` rows or fewer) or
    RT_DEFAULTS gives ``kind`` on ``dev`` at ``head_dim``, if any."""
    env = os.environ.get(ENV_VARIANT)
    if env:
        if env not in RT_VARIANTS:
            raise ValueError(f"{ENV_VARIANT}={env!r}: choose from {sorted(RT_VARIANTS)}")
        return parse_tile(RT_VARIANTS[env][kind])
    short = RT_SHORT.get((dev.kind, head_dim))
    if short and walked is not None and walked <= short[0] and kind in short[1]:
        return parse_tile(short[1][kind])
    row = RT_DEFAULTS.get((dev.kind, head_dim))
    return parse_tile(row[kind]) if row and kind in row else None


def _rt_fits(t: Tile, dv: int, dev) -> bool:
    return t.rm == 4 and t.rows % 4 == 0 and dv % t.cs == 0 and t.cols % t.cs == 0 and t.cs <= subgroup_lanes(dev)


_PICKS = PlanCache()  # Tile, or None where none fits


def pick(kind: str, dev, head_dim: int, n_rows: int | None = None, n_cols: int | None = None) -> Tile | None:
    """The tile of ``kind`` for ``dev``: the first candidate whose workgroup memory and threads fit the
    device's limits, no larger than the rows (queries, or keys for dkv) and columns (what its loop walks)
    there are; None when none fits. Remembered per device, arguments and forced choices (each attention
    call asks four to six times: tens of microseconds of host time each)."""
    key = (kind, dev, head_dim, n_rows, n_cols, tuple(sorted(_force.items())), _force_cv[0],
           _force_unroll[0], os.environ.get(ENV_VARIANT))
    return _PICKS.remember(key, _pick, kind, dev, head_dim, n_rows, n_cols)


def _pick(kind: str, dev, head_dim: int, n_rows: int | None, n_cols: int | None) -> Tile | None:
    dv = head_dim // 4
    if head_dim % 4 or not 4 <= head_dim <= MAX_HEAD_DIM:
        return None
    gpu = dev.adapter_type != "CPU"
    cs = column_split(kind, dv, gpu)
    if dv % cs:
        return None
    limit = int(dev.limits.get("max-compute-workgroup-storage-size", 16384))
    threads = min(MAX_THREADS, int(dev.limits.get("max-compute-invocations-per-workgroup", 256)))
    unroll = _force_unroll[0] if _force_unroll[0] is not None else gpu
    forced = _force.get(kind)
    if forced and forced.rm > 1:
        forced = replace(forced, unrolled=unroll)
        fits = [forced] if _rt_fits(forced, dv, dev) and shared_bytes(kind, forced, dv) <= limit and \
            forced.threads <= threads else []
    else:
        lanes = sorted(RT_LANES, key=lambda tk: tk != dv // 2)
        table = _table_tile(kind, dev, head_dim, n_cols) if gpu and not forced else None
        rt = [t for t in ([replace(table, unrolled=unroll)] if table and table.rm > 1 else []) + [
              Tile(r, c, tk, unroll, 4) for tk in lanes for r, c in RT_TILES[kind]]
              if gpu and not forced and _rt_fits(t, dv, dev)
              and shared_bytes(kind, t, dv) <= limit and t.threads <= threads]
        fits = rt + [Tile(t.rows, t.cols, cs, unroll)
                     for t in ([forced] if forced else GPU_CANDIDATES if gpu else CANDIDATES)
                     if shared_bytes(kind, t, dv) <= limit and t.rows * cs <= threads]
    if not fits:
        return None
    cap_r = max(16, -(-n_rows // 16) * 16) if n_rows else None
    cap_c = max(8, -(-n_cols // 8) * 8) if n_cols else None
    for t in fits:  # a 64-row tile over 16 rows would idle three quarters of its threads
        if (cap_r is None or t.rows <= cap_r) and (cap_c is None or t.cols <= cap_c):
            return t
    return fits[-1]


@contextlib.contextmanager
def force_tiles(cv: int | None = None, unroll: bool | None = None, **tiles: str) -> Iterator[None]:
    """Make :func:`pick` use the given tiles (``fwd="32x32", dkv="16x16"``) where they fit, ``cv`` threads
    per row and unrolled (or looped) inner blocks (tests and benchmarks: the choices a GPU's limits make).
    ``fwd="64x32r4t8"`` is the register-tiled forward: 4 rows per thread, 8 lanes per row group."""
    prev, prev_cv, prev_u = dict(_force), _force_cv[0], _force_unroll[0]
    try:
        for kind, name in tiles.items():
            if kind not in KINDS:
                raise ValueError(f"unknown attention kernel {kind!r}; choose from {KINDS}")
            _force[kind] = parse_tile(name)
        _force_cv[0] = cv
        _force_unroll[0] = unroll
        yield
    finally:
        _force.clear()
        _force.update(prev)
        _force_cv[0] = prev_cv
        _force_unroll[0] = prev_u


def variant(name: str, lanes: int | None = None) -> contextlib.AbstractContextManager:
    """Force the register-tiled variant ``name`` of RT_VARIANTS (as :func:`force_tiles`); ``lanes`` caps
    its TK (a device whose subgroups are narrower: tests on lavapipe)."""
    tiles = dict(RT_VARIANTS[name])
    if lanes:
        tiles = {k: re.sub(r"t(\d+)", lambda m: f"t{min(int(m[1]), lanes)}", v) for k, v in tiles.items()}
    return force_tiles(**tiles)


@contextlib.contextmanager
def _forcing(cell: list, value) -> Iterator[None]:
    """``cell[0] = value`` for the calls inside, then back (the force_* switches below)."""
    prev, cell[0] = cell[0], value
    try:
        yield
    finally:
        cell[0] = prev


def force_path(path: str | None) -> contextlib.AbstractContextManager:
    """Make ``scaled_dot_product_attention`` take ``"fused"`` (raising where it cannot) or ``"reference"``
    (the composed ops) for the calls inside (tests, benchmarks); None restores the automatic choice."""
    if path not in (None, "fused", "reference"):
        raise ValueError(f"attention path must be 'fused', 'reference' or None, got {path!r}")
    return _forcing(_path, path)


def forced_path() -> str | None:
    return _path[0]


def loop_cost(kind: str, t: Tile, dv: int) -> tuple[int, int]:
    """(per step of the main loop, once) loop iterations of one invocation, counting every loop as
    lavapipe's limiter may (constant-length loops included; unrolled blocks are no loops)."""
    dvc = dv // t.cs
    load = -(-t.cols * dv // t.threads)
    if t.rm > 1:  # the d loop, the loop over the tile's keys (queries) after it; dkv loads lse / delta
        return dv + t.cols + (-(-t.cols // t.threads) if kind == "dkv" else 0), -(-t.rows * dv // t.threads) + 4
    if t.unrolled:
        inner = 0
    elif kind == "fwd":  # scores, max, probabilities x V, rescale
        inner = dv * t.cols + t.cols + t.cols * (1 + dvc) + dvc
    else:  # scores and dP, then dS x K (dq) or P x dO and dS x Q (dkv)
        inner = dv * t.cols + t.cols * (1 + dvc)
    step = load + dv + inner + (-(-t.cols // t.threads) if kind == "dkv" else 0)
    return step, -(-t.rows * dv // t.threads) + dv + dvc + 4


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
# (offset, batch, head, row) layout in vec4 units per operand, then a few words. Workgroups of
# rows x cs threads, sized in the shaders by fills: no WG override.
def _layouts(*names: str) -> str:
    return ", ".join(f"{n}_off: u32, {n}_sb: u32, {n}_sh: u32, {n}_st: u32" for n in names)


_HEAD = "H: u32, Tq: u32, Tk: u32, causal: u32, {lo}_lo: u32, {lo}_hi: u32, bh0: u32, scale: f32, "
_KERNELS = {
    "fwd": Kernel("attention_fwd", "o: w, lse: w, q: r, k: r, v: r",
                  _HEAD.format(lo="k") + _layouts("q", "k", "v", "o") + ", l_off: u32", constants=()),
    "fwd_rt": Kernel("attention_fwd_rt", "o: w, lse: w, q: r, k: r, v: r",
                     _HEAD.format(lo="k") + _layouts("q", "k", "v", "o") + ", l_off: u32", constants=()),
    "dq": Kernel("attention_bwd_dq", "dq: w, delta: w, q: r, k: r, v: r, dout: r, o: r, lse: r",
                 _HEAD.format(lo="k") + _layouts("q", "k", "v", "g", "o", "r") + ", l_off: u32, d_off: u32, flags: u32",
                 constants=()),
    "dq_rt": Kernel("attention_bwd_dq_rt", "dq: w, delta: w, q: r, k: r, v: r, dout: r, o: r, lse: r",
                    _HEAD.format(lo="k") + _layouts("q", "k", "v", "g", "o", "r") +
                    ", l_off: u32, d_off: u32, flags: u32", constants=()),
    "dkv": Kernel("attention_bwd_dkv", "dk: w, dv: w, q: r, k: r, v: r, dout: r, lse: r, delta: r",
                  _HEAD.format(lo="q") + _layouts("q", "k", "v", "g", "rk", "rv") +
                  ", l_off: u32, d_off: u32, flags: u32", constants=()),
    # dsg (optional): dS * scale written out for dQ = dS K as a batched matmul (attention_backward)
    "dkv_rt": Kernel("attention_bwd_dkv_rt", "dk: w, dv: w, q: r, k: r, v: r, dout: r, lse: r, delta: r, dsg: w",
                     _HEAD.format(lo="q") + _layouts("q", "k", "v", "g", "rk", "rv") +
                     ", l_off: u32, d_off: u32, flags: u32, s_off: u32, s_bh0: u32, s_st: u32", constants=()),
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


def _rep(n: int, body: str, var: str, unroll: bool) -> str:
    """``body`` for ``#var`` = 0 .. n - 1: straight-line code with constant indices (registers for certain
    on a GPU compiler), or one loop."""
    if unroll:
        return "\n".join(body.replace(f"#{var}", f"{i}u") for i in range(n))
    name = var.lower() + "_"
    return f"for (var {name} = 0u; {name} < {n}u; {name} = {name} + 1u) {{\n{body.replace('#' + var, name)}\n}}"


def _blocks(kind: str, t: Tile, dv: int) -> dict[str, str]:
    """The inner blocks of one kernel: scores (and dP) for one d of the tile, then what they feed."""
    n, dvc, u = t.cols, dv // t.cs, t.unrolled
    if kind == "fwd":
        pv = _rep(dvc, "acc[#X] = acc[#X] + pj * Vs[#J * DV + c0 + #X];", "X", u)
        return {
            "SCORES": _rep(n, "s[#J] = s[#J] + dot(qd, Ks[#J * DV + d]);", "J", u),
            "MAX": _rep(n, "{ let y = s[#J]; let ok = j0 + #J < lim; "
                           "let nb = ok && (isnan_(y) || bitcast<u32>(y) == 0x7f800000u); bad = bad || nb; "
                           "let z = select(NEG, y, ok && !nb); s[#J] = z; mx = max(mx, z); }", "J", u),
            "PV": _rep(n, f"{{ let pj = select(0.0, exp2(s[#J] - m), s[#J] > NEG); l = l + pj;\n{pv}\n}}", "J", u)}
    if kind == "dq":
        dq = _rep(dvc, "acc[#X] = acc[#X] + ds * Ks[#J * DV + c0 + #X];", "X", u)
        return {
            "SCORES": _rep(n, "s[#J] = s[#J] + dot(qd, Ks[#J * DV + d]); dp[#J] = dp[#J] + dot(gd, Vs[#J * DV + d]);",
                           "J", u),
            "DQ": _rep(n, "{ let pj = select(0.0, exp2_nan(s[#J] - lse2), j0 + #J < lim); "
                          f"let ds = pj * (dp[#J] - dl);\n{dq}\n}}", "J", u)}
    dkv = _rep(dvc, "acc_v[#X] = acc_v[#X] + pj * Gs[#J * DV + c0 + #X]; "
                    "acc_k[#X] = acc_k[#X] + ds * Qs[#J * DV + c0 + #X];", "X", u)
    return {
        "SCORES": _rep(n, "s[#J] = s[#J] + dot(kd, Qs[#J * DV + d]); dp[#J] = dp[#J] + dot(vd, Gs[#J * DV + d]);",
                       "J", u),
        "DKV": _rep(n, "{ let pj = select(0.0, exp2_nan(s[#J] - lse_s[#J]), #J >= first && #J < lim); "
                       f"let ds = pj * (dp[#J] - dl_s[#J]);\n{dkv}\n}}", "J", u)}


def _rt_common(t: Tile, dv: int) -> dict[str, str | int]:
    """The sizes shared by the three register-tiled kernels and the COMMON fill that declares them
    (shaders/attention_rt_common.wgsl: constants, float helpers)."""
    sizes: dict[str, str | int] = {"ROWS": t.rows, "BC": t.cols, "TK": t.cs, "NT": t.threads, "DV": dv, "DP": dv + 1,
                                   "PR": t.rows // 4 + 1}
    common = _PLACE.sub(lambda m: str((sizes | {"FNS": load_source("float_fns")})[m[1]]),
                        load_source("attention_rt_common"))
    return sizes | {"COMMON": common, "NACC": 4 * (dv // t.cs), "BCT": t.cols // t.cs,
                    "UNROLL": "@unroll" if t.unrolled else "unrolled on a GPU (Tile.unrolled)"}


def _rt_own(first: str, end: str, scale: str, ops: tuple) -> str:
    """LOAD_OWN of a register-tiled kernel: the workgroup's ROWS own rows from ``first`` (below ``end``)
    of each operand (buffer, base, row stride, workgroup array, scaled) into its workgroup array of rows."""
    load = " ".join(f"{w}[rr][cc] = vec4<f32>({buf}[{base} + ({first} + rr) * p.{st} + cc])"
                    f"{f' * {scale}' if sc else ''};" for buf, base, st, w, sc in ops)
    return (f"  for (var e = tid; e < ROWS * DV; e = e + NT) {{\n    let rr = e / DV;\n    let cc = e % DV;\n"
            f"    let ok = {first} + rr < {end};\n    if (ok) {{ {load} }} else {{ " +
            " ".join(f"{w}[rr][cc] = vec4<f32>(0.0);" for *_, w, _ in ops) + " }\n  }")


def _rt_stage(t: Tile, dv: int, end: str, ops: tuple) -> tuple[int, str, str]:
    """(NL, FETCH, PUT) of a register-tiled kernel: the next tile's rows jn .. jn + cols (below ``end``)
    of each operand (register array, buffer, base, row stride, workgroup array) fetched into NL vec4
    registers per thread, then put into its workgroup array of rows."""
    nl = -(-t.cols * dv // t.threads)
    ld = "let e = tid + NT * {n}u; let rr = e / DV; let cc = e % DV;"
    guard = "" if t.cols * dv % t.threads == 0 else f" && e < {t.cols * dv}u"
    fetch = "\n".join(
        f"{{ {ld.format(n=n)} " + " ".join(f"{r}[{n}] = vec4<f32>(0.0);" for r, *_ in ops) +
        f" if (jn + rr < {end}{guard}) {{ " +
        " ".join(f"{r}[{n}] = vec4<f32>({buf}[{base} + (jn + rr) * p.{st} + cc]);" for r, buf, base, st, _ in ops) +
        " } }" for n in range(nl))
    put = "\n".join(
        f"{{ {ld.format(n=n)} if (e < {t.cols * dv}u) {{ " +
        " ".join(f"{w}[rr][cc] = {r}[{n}];" for r, _, _, _, w in ops) + " } }"
        for n in range(nl))
    return nl, fetch, put


def _rt_init(nl: int, fetch: str, start: str, regs: tuple[str, ...]) -> str:
    """STAGE_INIT: the prefetch registers (NL vec4s per walked operand) and the first tile's fetch, from ``start``."""
    return "\n".join(f"  var {r} = array<vec4<f32>, {nl}>();" for r in regs) + f"\n  var jn = {start};\n{fetch}"


# KEY_LIMITS of the kernels whose rows are queries (fwd, dq): the last key a block walks, each row's limit.
_KEY_LIMITS = """  var k_end = p.k_hi;
  if (p.causal != 0u) { k_end = min(k_end, i0 + ROWS); }  // row i sees keys j <= i
  var lim = vec4<u32>(k_end);
  if (p.causal != 0u) { lim = min(lim, vec4<u32>(ib + 1u, ib + 2u, ib + 3u, ib + 4u)); }"""


# The register-tiled kernels' scores accumulate as four fma()s of vec4s (the 4 rows' d-th components times
# one broadcast component of the walked row), not acc + vec4(dot(), dot(), dot(), dot()): a dot() is a
# multiply and three fmas, and adding it to the accumulator takes a fifth instruction (float addition is
# not reassociated). The products P V, dS K, P^T dO, dS^T Q are written as fma() too, not left to the
# driver to contract. H100, 8x12x1024x64 forward (loops written out first): causal 1.076 -> 1.015 ms,
# not causal 1.775 -> 1.649; forward + backward 3.907 -> 3.717 and 6.167 -> 5.815.
def _dots4(acc: str, rows: str, col: str) -> str:
    """WGSL for ``acc`` (a vec4 over the 4 rows ``rows``0..3) plus each row's dot product with ``col``."""
    out = acc
    for c in "xyzw":
        out = f"fma(vec4<f32>({', '.join(f'{rows}{r}.{c}' for r in range(4))}), vec4<f32>({col}.{c}), {out})"
    return out


def _axpy(acc: str, a: str, x: str) -> str:
    """The WGSL statement ``acc += a * x`` (a scalar times a vec4) as one fma."""
    return f"{acc} = fma(vec4<f32>({a}), {x}, {acc});"


def _rt_fills(t: Tile, dv: int, dtype: str, out_dtype: str) -> dict[str, str | int]:
    """Sizes and straight-line blocks of attention_fwd_rt.wgsl: a row group's 4 rows are the lanes of
    each vec4 (s[jj], m, l, P), its accumulators acc[row * CN + x]."""
    tk, bct, cn = t.cs, t.cols // t.cs, dv // t.cs
    rows = "xyzw"
    key = "kg + TK * {j}u"
    scores = "\n".join(f"{{ let kv = Ks[{key.format(j=j)}][d]; s[{j}] = {_dots4(f's[{j}]', 'q', 'kv')}; }}"
                       for j in range(bct))
    def max_block(masked: bool) -> str:
        ok = "vec4<u32>(j0 + {k}) < lim" if masked else "vec4<bool>(true)"
        return "\n".join(
            f"{{ let y = s[{j}]; let u = bitcast<vec4<u32>>(y); let ok = {ok.format(k=key.format(j=j))}; "
            "let nb = ok & (((u & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u)) | (u == vec4<u32>(0x7f800000u))); "
            f"bad = bad | nb; let z = select(vec4<f32>(NEG), y, ok & !nb); s[{j}] = z; mx = max(mx, z); }}"
            for j in range(bct))
    # diag: a tile wholly below every limit of the thread's rows (lim.x, the smallest) needs no compares
    mx = max_block(True) if not t.diag else \
        f"if (j0 + BC <= lim.x) {{\n{max_block(False)}\n}} else {{\n{max_block(True)}\n}}"
    lanes = [1 << i for i in range(tk.bit_length() - 1)]  # xor distances within a row group
    p = "\n".join(f"{{ let pj = select(vec4<f32>(0.0), exp2(s[{j}] - m), s[{j}] > vec4<f32>(NEG)); l = l + pj; "
                   f"Ps[{key.format(j=j)}][g] = pj; }}" for j in range(bct))
    pv = "\n".join(f"{{ let vv = Vs[j][kg + TK * {x}u];\n" +
                    "\n".join(_axpy(f"acc[{r * cn + x}]", f"pj.{rows[r]}", "vv") for r in range(4)) + " }"
                    for x in range(cn))
    end = "\n".join(f"l = l + subgroupShuffleXor(l, {o}u); bad = bad | (subgroupShuffleXor("
                     f"select(vec4<u32>(0u), vec4<u32>(1u), bad), {o}u) != vec4<u32>(0u));" for o in lanes)
    store = "\n".join(
        f"if (ib + {r}u < p.Tq) {{\n  let ob = p.o_off + b * p.o_sb + h * p.o_sh + (ib + {r}u) * p.o_st + kg;\n" +
        "\n".join(f"  {{ var out = vec4<f32>(0.0); if (l.{rows[r]} > 0.0) {{ out = acc[{r * cn + x}] / l.{rows[r]}; }} "
                   f"if (bad.{rows[r]}) {{ out = vec4<f32>(nan_like(l.{rows[r]})); }} "
                   f"o[ob + TK * {x}u] = vec4<{out_dtype}>(out); }}" for x in range(cn)) +
        f"\n  if (kg == 0u) {{ var val = NEG; "
        f"if (l.{rows[r]} > 0.0) {{ val = (m.{rows[r]} + log2(l.{rows[r]})) * LN2; }} "
        f"if (bad.{rows[r]}) {{ val = nan_like(l.{rows[r]}); }} lse[p.l_off + bh * p.Tq + ib + {r}u] = val; }}\n}}"
        for r in range(4))
    nl, fetch, put = _rt_stage(t, dv, "k_end", (("kr", "k", "kb", "k_st", "Ks"),
                                                 ("vr", "v", "vb", "v_st", "Vs")))
    own = _rt_own("i0", "p.Tq", "qscale", (("q", "qb", "q_st", "Qs", True),))
    return _rt_common(t, dv) | {
        "FETCH": fetch, "PUT": put, "LOAD_OWN": own, "SCORES": scores, "MAX": mx, "KEY_LIMITS": _KEY_LIMITS,
        "STAGE_INIT": _rt_init(nl, fetch, "p.k_lo", ("kr", "vr")),
        "REDUCE_MAX": "\n".join(f"mx = max(mx, subgroupShuffleXor(mx, {o}u));" for o in lanes),
        "RESCALE": "\n".join(f"acc[{r * cn + x}] = acc[{r * cn + x}] * alpha.{rows[r]};"
                              for r in range(4) for x in range(cn)),
        "P": p, "PV": pv, "REDUCE_END": end, "STORE": store}


def _rt_bwd_fills(kind: str, t: Tile, dv: int, out_dtype: str, ds_out: bool = False) -> dict[str, str | int]:
    """Sizes and straight-line blocks of attention_bwd_dq_rt.wgsl / attention_bwd_dkv_rt.wgsl: a row
    group's 4 rows (queries for dq, keys for dkv) are the lanes of each vec4 (s[jj], dp[jj], P, dS), its
    accumulators acc[row * CN + x]. ``ds_out`` (dkv): each dS^T vec4 (4 keys of one query) is also stored,
    times the scale, in row (query) i, keys jb .. jb + 3 of the group's [n, Tq, Tk] buffer dsg."""
    tk, bct, cn = t.cs, t.cols // t.cs, dv // t.cs
    rows = "xyzw"
    col = "kg + TK * {j}u"
    a, b = ("q", "g") if kind == "dq" else ("k", "v")  # the thread's own rows' operands
    w1, w2 = ("Ks", "Vs") if kind == "dq" else ("Qs", "Gs")  # the walked tile's
    scores = "\n".join(
        f"{{ let c1 = {w1}[{col.format(j=j)}][d]; let c2 = {w2}[{col.format(j=j)}][d]; "
        f"s[{j}] = {_dots4(f's[{j}]', a, 'c1')}; dp[{j}] = {_dots4(f'dp[{j}]', b, 'c2')}; }}" for j in range(bct))
    fills: dict[str, str | int] = _rt_common(t, dv) | {"SCORES": scores}
    if kind == "dq":
        lanes = [1 << i for i in range(tk.bit_length() - 1)]
        li = "p.d_off + bh * p.Tq + ib + {r}u"
        stats = "\n".join(
            f"if (ib + {r}u < p.Tq) {{ lse2.{rows[r]} = lse[p.l_off + bh * p.Tq + ib + {r}u] * LOG2E; }}"
                           for r in range(4))
        # delta: lane kg dots its columns kg + TK * x of dO and O, the TK partial sums meet by shuffles
        own = "\n".join(
            f"  if (ib + {r}u < p.Tq) {{ let ob = p.o_off + b * p.o_sb + h * p.o_sh + (ib + {r}u) * p.o_st;\n" +
            "\n".join(f"    dl.{rows[r]} = dl.{rows[r]} + dot(Gs[4u * g + {r}u][{col.format(j=x)}], "
                       f"vec4<f32>(o[ob + {col.format(j=x)}]));" for x in range(cn)) + "\n  }" for r in range(4))
        stats += ("\nif ((p.flags & 2u) != 0u) {\n" + own + "\n" +
                  "\n".join(f"  dl = dl + subgroupShuffleXor(dl, {o}u);" for o in lanes) +
                  "\n  if (kg == 0u) {\n" +
                  "\n".join(f"    if (ib + {r}u < p.Tq) {{ delta[{li.format(r=r)}] = dl.{rows[r]}; }}"
                            for r in range(4)) +
                  "\n  }\n} else {\n" +
                  "\n".join(f"  if (ib + {r}u < p.Tq) {{ dl.{rows[r]} = delta[{li.format(r=r)}]; }}"
                            for r in range(4)) +
                  "\n}")
        def ds_block(masked: bool) -> str:
            return "\n".join(
                f"{{ let pj = {'select(vec4<f32>(0.0), ' if masked else ''}exp2_nan4(s[{j}] - lse2)"
                f"{f', vec4<u32>(j0 + {col.format(j=j)}) < lim)' if masked else ''}; "
                f"Ss[{col.format(j=j)}][g] = pj * (dp[{j}] - dl); }}" for j in range(bct))
        ds = ds_block(True) if not t.diag else \
            f"if (j0 + BC <= lim.x) {{\n{ds_block(False)}\n}} else {{\n{ds_block(True)}\n}}"
        dq = "\n".join(f"{{ let kv = Ks[j][{col.format(j=x)}]; " +
                        " ".join(_axpy(f"acc[{r * cn + x}]", f"ds.{rows[r]}", "kv") for r in range(4)) +
                        " }" for x in range(cn))
        store = "\n".join(
            f"if (ib + {r}u < p.Tq) {{\n  let at = p.r_off + b * p.r_sb + h * p.r_sh + (ib + {r}u) * p.r_st + kg;\n" +
            "\n".join(f"  {{ var gq = acc[{r * cn + x}] * p.scale; "
                       f"if ((p.flags & 1u) != 0u) {{ gq = gq + vec4<f32>(dq[at + TK * {x}u]); }} "
                       f"dq[at + TK * {x}u] = vec4<{out_dtype}>(gq); }}" for x in range(cn)) + "\n}" for r in range(4))
        nl, fetch, put = _rt_stage(t, dv, "k_end", (("kr", "k", "kb", "k_st", "Ks"),
                                                     ("vr", "v", "vb", "v_st", "Vs")))
        own = _rt_own("i0", "p.Tq", "qscale", (("q", "qb", "q_st", "Qs", True), ("dout", "gb", "g_st", "Gs", False)))
        return fills | {"ROW_STATS": stats, "DS": ds, "DQ": dq, "STORE": store, "FETCH": fetch, "PUT": put,
                        "LOAD_OWN": own, "KEY_LIMITS": _KEY_LIMITS,
                        "STAGE_INIT": _rt_init(nl, fetch, "p.k_lo", ("kr", "vr"))}

    def ds_block(masked: bool) -> str:
        ok = ("var ok = key_ok & vec4<bool>(qq < p.q_hi); if (p.causal != 0u) { ok = ok & (vec4<u32>(qq) >= keys); } "
              if masked else "")
        return "\n".join(
            f"{{ let qi = {col.format(j=j)}; let qq = i0 + qi; {ok}"
            f"let pj = {'select(vec4<f32>(0.0), ' if masked else ''}exp2_nan4(s[{j}] - lse_s[qi])"
            f"{', ok)' if masked else ''}; "
            f"Ps[qi][g] = pj; let dsv = pj * (dp[{j}] - dl_s[qi]); Ss[qi][g] = dsv; "
            + ("if (qq < p.q_hi && jb < p.Tk) { dsg[ds_row + qq * p.s_st + jb / 4u] = dsv * p.scale; } "
               if ds_out else "") + "}" for j in range(bct))
    # diag: every query of the tile exists, every key of the group exists and (causal) comes before them all
    ds = ds_block(True) if not t.diag else (
        "if (i0 + BQ <= p.q_hi && all(key_ok) && (p.causal == 0u || i0 >= jb + 3u)) {\n"
        f"{ds_block(False)}\n}} else {{\n{ds_block(True)}\n}}")
    acc = "\n".join(f"{{ let gv = Gs[j][{col.format(j=x)}]; let qv = Qs[j][{col.format(j=x)}]; " +
                     " ".join(_axpy(f"acc_v[{r * cn + x}]", f"pj.{rows[r]}", "gv") + " " +
                              _axpy(f"acc_k[{r * cn + x}]", f"ds.{rows[r]}", "qv") for r in range(4)) +
                     " }"
                     for x in range(cn))
    store = "\n".join(
        f"if (jb + {r}u < p.Tk) {{\n"
        f"  let ak = p.rk_off + b * p.rk_sb + h * p.rk_sh + (jb + {r}u) * p.rk_st + kg;\n"
        f"  let av = p.rv_off + b * p.rv_sb + h * p.rv_sh + (jb + {r}u) * p.rv_st + kg;\n" +
        "\n".join(f"  {{ var gk = acc_k[{r * cn + x}] * p.scale; var gv = acc_v[{r * cn + x}]; "
                   f"if ((p.flags & 1u) != 0u) {{ gk = gk + vec4<f32>(dk[ak + TK * {x}u]); "
                   f"gv = gv + vec4<f32>(dv[av + TK * {x}u]); }} "
                   f"dk[ak + TK * {x}u] = vec4<{out_dtype}>(gk); dv[av + TK * {x}u] = vec4<{out_dtype}>(gv); }}"
                   for x in range(cn)) + "\n}" for r in range(4))
    nl, fetch, put = _rt_stage(t, dv, "p.q_hi", (("qr", "q", "qb", "q_st", "Qs"),
                                                  ("gr", "dout", "gb", "g_st", "Gs")))
    own = _rt_own("j0", "p.Tk", "kscale", (("k", "kb", "k_st", "Ks", True), ("v", "vb", "v_st", "Vs", False)))
    if ds_out:  # the group's first (batch, head) is s_bh0; rows of s_st vec4s
        own += "\n  let ds_row = p.s_off + (bh - p.s_bh0) * p.Tq * p.s_st;"
    return fills | {"DS": ds, "ACC": acc, "STORE": store, "FETCH": fetch, "PUT": put, "LOAD_OWN": own,
                    "STAGE_INIT": _rt_init(nl, fetch, "start", ("qr", "gr"))}


def _fills(kind: str, t: Tile, dv: int, dtype: str, out_dtype: str) -> dict[str, str | int]:
    fills: dict[str, str | int] = {"T": dtype, "ROWS": t.rows, "CS": t.cs, "NT": t.threads, "DV": dv,
                                   "DP": dv + 1, "DVC": dv // t.cs, "FNS": load_source("float_fns")}
    fills |= _blocks(kind, t, dv)
    if kind == "fwd":
        return fills | {"TO": out_dtype, "BC": t.cols, "QS": t.rows * (dv + 1), "KS": t.cols * dv}
    if kind == "dq":
        return fills | {"TG": out_dtype, "BC": t.cols, "QS": t.rows * (dv + 1), "KS": t.cols * dv}
    return fills | {"TG": out_dtype, "BQ": t.cols, "KS": t.rows * (dv + 1), "QS": t.cols * dv}


@functools.lru_cache(maxsize=64)
def _kernel(kind: str, t: Tile, dv: int, dtype: str, out_dtype: str, ds_out: bool = False,
            walked: str | None = None) -> KernelSpec:
    """The kernel for operands of ``dtype``; a register-tiled forward or dK / dV kernel may walk
    operands of another type (``walked``: K, V for the forward, Q, dO for dK / dV)."""
    out_t, in_t = f"vec4<{out_dtype}>", f"vec4<{dtype}>"
    walked = walked or dtype
    w_t = f"vec4<{walked}>"
    if kind == "fwd" and t.rm > 1:
        return _KERNELS["fwd_rt"].spec((out_t, "f32", in_t, w_t, w_t), **_rt_fills(t, dv, walked, out_dtype))
    if t.rm > 1:
        if kind == "dq":
            return _KERNELS["dq_rt"].spec((out_t, "f32", in_t, in_t, in_t, in_t, in_t, "f32"),
                                          **_rt_bwd_fills(kind, t, dv, out_dtype))
        types = (out_t, out_t, w_t, in_t, in_t, w_t, "f32", "f32") + (("vec4<f32>",) if ds_out else ())
        return _KERNELS["dkv_rt"].spec(types, without=() if ds_out else ("dsg",),
                                       **_rt_bwd_fills(kind, t, dv, out_dtype, ds_out))
    fills = _fills(kind, t, dv, dtype, out_dtype)
    if kind == "fwd":
        types = (out_t, "f32", in_t, in_t, in_t)
    elif kind == "dq":
        types = (out_t, "f32", in_t, in_t, in_t, in_t, in_t, "f32")
    else:
        types = (out_t, out_t, in_t, in_t, in_t, in_t, "f32", "f32")
    return _KERNELS[kind].spec(types, **fills)


def _dispatch(k: KernelSpec, dev, buffers: list, head: list, rest: list, n_x: int, bh: int,
              first: int = 0) -> list[tuple[bytes, tuple[int, int, int]]]:
    """Dispatch over an (n_x, batch * heads) grid (``bh`` of them from ``first``), in slices of the device's
    grid limit; ``head`` is the first 8 parameter words with the first batch * head index at [6]. Returns
    each dispatch's (parameters, workgroups)."""
    lim = dev.max_workgroups
    launches = []
    for bh0 in range(first, first + bh, lim):
        words = list(head)
        words[6] = bh0
        launch = (k.params.pack_flat(words + rest), (n_x, min(lim, first + bh - bh0), 1))
        dev.dispatch(k, buffers, *launch)
        launches.append(launch)
    return launches


# -- [Lq, Lk] scores in memory, a group of heads at a time: the matmul forward and dQ = dS K -----------------
# The group's scores (S, or dS) hold at most DS_BYTES; one head's at most DS_HEAD_BYTES (longer sequences
# keep the fused kernels); below DS_MIN_PAIRS (query, key) pairs per head the fused kernels stay (the
# extra dispatches cost more than they save). Larger groups give the products' narrow [T, D] outputs more
# workgroups: an H100, fwd + bwd ms with groups of 128 / 256 / 512 MiB (scratch probe, interleaved rounds):
# 4x8x2048x128 causal 11.10 / 6.87 / 5.32, not causal 10.87 / 9.11 / 8.75; 8x12x1024x128 causal 6.54 /
# 4.55 / 4.19; 8x12x1024x64 causal (dQ = dS K) 3.41 / 3.20 / 3.05, the call's peak 153 / 281 / 409 MiB.
# torch's math path holds all heads' scores at once. A device's binding limit caps both (lavapipe: 128 MiB).
DS_BYTES = 512 << 20
DS_HEAD_BYTES = 128 << 20
DS_MIN_PAIRS = 512 * 512


def _scores_fit(dev, lq: int, lk: int) -> bool:
    """Whether one head's [lq, lk] float32 scores fit DS_HEAD_BYTES, DS_BYTES and the device's binding limit."""
    return lq * lk * 4 <= min(DS_HEAD_BYTES, DS_BYTES, dev.max_binding)


def _head_groups(dev, bh: int, lq: int, lk: int) -> Iterator[tuple[int, int]]:
    """(first, count) of each group of the bh (batch, head) pairs whose scores fit DS_BYTES together."""
    group = max(1, min(DS_BYTES, dev.max_binding) // (lq * lk * 4))
    for g0 in range(0, bh, group):
        yield g0, min(group, bh - g0)


def _f32(x: Tensor) -> Tensor:
    return x if x.dtype is _dt.float32 else cast(x, _dt.float32)


# A register-tiled kernel's walked operands (K, V for the forward, Q, dO for dK / dV: every workgroup of a
# head reads all of them) are cast to float32 first from this many workgroups per head: float16 is widened
# again in each workgroup, and those conversions cost more than one cast (an H100, 8x12x1024x64 causal
# forward, 16 workgroups a head: 1.32 ms walking float16, 1.13 cast first, 1.10 in float32).
WALK_F32_BLOCKS = 8


def _walked(x: Tensor, blocks: int) -> Tensor:
    return _f32(x) if blocks >= WALK_F32_BLOCKS else x


def _product(x: Tensor, y: Tensor, causal: bool, which: str, out: Tensor | None = None) -> Tensor:
    """x @ y of a group's [n, ., .] operands; causal: the triangle ``which`` (matmul_causal) skipped;
    ``out``: the group's slice of the whole result, written."""
    if causal or out is not None:
        return matmul_causal(x, y, which if causal else "", out)
    return matmul(x, y)


def _delta(dout: Tensor, out: Tensor) -> Tensor:
    """rowsum(dO * O) [B, H, Lq] float32: the backward's delta where no kernel computes it on the way.
    float16 operands are multiplied in float32 as they are read (no casts first: two passes fewer)."""
    return contiguous(reduce("sum", run_map("mul", [dout, out], out_dtype=_dt.float32), -1))


# -- forward ------------------------------------------------------------------------------------------
# The forward as matmuls: on a GPU, at head dims above 64, where the fused kernel is weakest (its tiles
# hold one key per thread in 48 KiB of workgroup memory), S = Q K^T of a group of (batch, head) pairs runs
# as a batched matmul, shaders/attention_softmax.wgsl makes P in place (and the logsumexp the backward
# needs), and O = P V is a second matmul; S holds at most DS_BYTES at a time. An H100 (fused / matmuls,
# ms): 8x12x1024x128 causal 3.19 / 2.27, not causal 5.58 / 2.58; 4x8x2048x128 causal 4.00 / 2.92, not
# 7.38 / 2.81. At head dim 64 the fused kernel stays (causal 1.08 / 1.89 at T = 1024; not causal
# 0.75 / 0.98 at T = 512, 2.05 / 1.62 at 1024, 3.43 / 3.82 at 2048: no clear gain).
_SOFTMAX = Kernel("attention_softmax", "s: w, lse: w", "rows: u32, cols: u32, tq: u32, causal: u32, scale: f32, "
                  "off_s: u32, off_l: u32, band: u32")
# The softmax pass: 32 threads a row (8 rows a workgroup), each keeping up to 16 vec4s (a row of 2048 keys)
# in registers between its two passes, vec4 loads and stores, a causal row's zeros only as far as P V reads.
# It replaced one 256-thread workgroup a row with scalar loads writing whole rows (an H100, same process:
# 8x12x1024x128 not causal forward 2.548 -> 2.322 ms; BENCHMARKS "Attention at head dim 128").
SOFTMAX_TPR = 32
SOFTMAX_CACHE = 16


@functools.cache
def _row_access(vec: int, *names: str) -> str:
    """WGSL ``ld_<name>(base, c)`` / ``st_<name>(base, c, y)`` for each f32 row buffer ``name``: columns
    c .. c + 3 of the row at element ``base`` as one vec4 (``vec`` 4: rows and offsets in whole vec4s) or
    four scalars, the store kept within p.cols."""
    if vec == 4:
        return "\n".join(f"fn ld_{n}(base: u32, c: u32) -> vec4<f32> {{ return {n}[(base + c) / 4u]; }}\n"
                         f"fn st_{n}(base: u32, c: u32, y: vec4<f32>) {{ {n}[(base + c) / 4u] = y; }}" for n in names)
    return "\n".join(
        f"fn ld_{n}(base: u32, c: u32) -> vec4<f32> {{\n"
        f"  return vec4<f32>({n}[base + c], {n}[base + c + 1u], {n}[base + c + 2u], {n}[base + c + 3u]);\n}}\n"
        f"fn st_{n}(base: u32, c: u32, y: vec4<f32>) {{\n"
        f"  for (var e = 0u; e < 4u; e = e + 1u) {{ if (c + e < p.cols) {{ {n}[base + c + e] = y[e]; }} }}\n}}"
        for n in names)


def _row_vec(cols: int, *rows: Tensor) -> int:
    """4 where every row of these [., cols] buffers starts on a whole vec4, else 1."""
    return 4 if cols % 4 == 0 and all(t._offset % 4 == 0 for t in rows) else 1


def _softmax_rows(scores: Tensor, lse: Tensor, off_l: int, lq: int, causal: bool, scale: float, band: int) -> None:
    """P = softmax(scale S) in place over the [n, lq, lk] scores and each row's logsumexp to lse (from
    element ``off_l``); a causal row's zeros written up to ``band``'s next multiple past its limit (0: all;
    a row without a limit is written whole whatever the band)."""
    dev = scores.device
    n, _, lk = scores.shape
    vec = _row_vec(lk, scores)
    cache = max(1, min(SOFTMAX_CACHE, -(-lk // (4 * SOFTMAX_TPR))))
    kern = _SOFTMAX.spec(("vec4<f32>" if vec == 4 else "f32", "f32"), FNS=load_source("float_fns"),
                         MERGE=load_source("softmax_merge"), TPR=SOFTMAX_TPR, CACHE=cache, ACCESS=_row_access(vec, "s"),
                         UNROLL="@unroll" if dev.adapter_type != "CPU" else "")
    rows = n * lq
    dev.dispatch(kern, [scores._storage.buffer, lse._storage.buffer],
                 _SOFTMAX.pack(rows=rows, cols=lk, tq=lq, causal=int(causal), scale=scale, off_s=scores._offset,
                               off_l=off_l, band=band),
                 grid(-(-rows // (WORKGROUP // SOFTMAX_TPR)), dev.max_workgroups))


_mm_forward: list[bool | None] = [None]  # force_matmul_forward


def force_matmul_forward(on: bool | None) -> contextlib.AbstractContextManager:
    """Make the forward run as matmuls and a softmax (True), the fused kernel (False), or choose (None; tests)."""
    return _forcing(_mm_forward, on)


def _use_matmul_forward(dev, head_dim: int, causal: bool, lq: int, lk: int) -> bool:
    """Whether the forward runs as matmuls: one head's scores within DS_HEAD_BYTES and the binding limit; on a GPU
    from DS_MIN_PAIRS pairs per head at a head dim above 64, unless forced."""
    if not _scores_fit(dev, lq, lk):
        return False
    if _mm_forward[0] is not None:
        return _mm_forward[0]
    return dev.adapter_type != "CPU" and lq * lk >= DS_MIN_PAIRS and head_dim > 64


def _matmul_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """attention_forward's (out, lse) as S = Q K^T, P = softmax(scale S) and O = P V per group of heads."""
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    q3, k3, v3 = (reshape(_f32(x), (b * h, x.shape[2], d)) for x in (q, k, v))
    lse = Tensor.empty((b, h, lq), _dt.float32, dev)
    o = Tensor.empty((b * h, lq, d), _dt.float32, dev)  # each group's O written into its slice
    for g0, n in _head_groups(dev, b * h, lq, lk):
        qg, kt = narrow(q3, 0, g0, n), transpose(narrow(k3, 0, g0, n), 1, 2)
        scores = _product(qg, kt, causal, "c")  # [n, lq, lk]
        vg = narrow(v3, 0, g0, n)
        _softmax_rows(scores, lse, lse._offset + g0 * lq, lq, causal, scale, causal_band(scores, vg) if causal else 0)
        _product(scores, vg, causal, "a", narrow(o, 0, g0, n))
        del scores
    o = reshape(o, (b, h, lq, d))
    out = Tensor.empty((b, lq, h, d), q.dtype, dev)
    view = permute(out, (0, 2, 1, 3))
    copy_(view, o if q.dtype is _dt.float32 else cast(o, q.dtype))
    return view, lse


# -- a forward's plan, remembered ------------------------------------------------------------------------
# Operands of one layout (shapes, strides, offsets, dtypes, device) with one causal flag and scale run the
# same kernel with the same parameters; only the outputs are new. attention_forward remembers such a plan
# where it launched one kernel on the operands themselves (one key chunk, no cast or copy, no matmuls), and
# scaled_dot_product_attention replays it, skipping the checks and choices in between: at T = 128 the
# host's cost of a call was the forward's whole time (an H100: 0.09-0.11 ms a call, the kernel's about
# 0.05). The key holds what the choices read (the tunables tests change, the variant named in the
# environment); a force_* switch in effect bypasses the plans.
_PLANS = PlanCache()


def _plan_key(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple:
    return (q._shape, q._strides, q._offset, k._shape, k._strides, k._offset, v._shape, v._strides, v._offset,
            q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal, scale, MAX_LOOP, WALK_F32_BLOCKS,
            DS_MIN_PAIRS, DS_BYTES, DS_HEAD_BYTES, os.environ.get(ENV_VARIANT))


def _forced() -> bool:
    """Whether a force_* switch (tests, benchmarks) that changes what a call runs is in effect (forcing the
    "fused" path does not: a remembered plan is the fused path's, so bench_attention times what a user's
    repeated call runs)."""
    return bool(_force) or _force_cv[0] is not None or _force_unroll[0] is not None or _path[0] == "reference" \
        or _mm_forward[0] is not None


def replay_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor] | None:
    """attention_forward's (out, lse) from the plan an earlier call of the same layout left, or None."""
    plan = None if _forced() else _PLANS.get(_plan_key(q, k, v, causal, scale))
    if plan is None:
        return None
    kern, launches, out_shape, view_strides = plan
    dev = q.device
    b, lq, h, d = out_shape
    out = Tensor.empty(out_shape, q.dtype, dev)
    lse = Tensor.empty((b, h, lq), _dt.float32, dev)
    bufs = [out._storage.buffer, lse._storage.buffer, q._storage.buffer, k._storage.buffer, v._storage.buffer]
    for params, groups in launches:
        dev.dispatch(kern, bufs, params, groups)
    return Tensor(out._storage, (b, h, lq, d), view_strides), lse


def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(scale * q k^T [causal]) v for [B, H, T, D] operands that ``supported`` accepts.

    ``out`` is a [B, H, Lq, D] view of a [B, Lq, H, D] tensor (so joining the heads after a transpose
    is free); ``lse`` [B, H, Lq] float32 is each row's logsumexp (NaN where the row is NaN).
    """
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    dv = d // 4
    if _use_matmul_forward(dev, d, causal, lq, lk):
        return _matmul_forward(q, k, v, causal, scale)
    operands = (q, k, v)
    t = pick("fwd", dev, d, lq, lk)
    n_x = -(-lq // t.rows)  # query blocks (workgroups) a head
    if t.rm > 1:
        k, v = _walked(k, n_x), _walked(v, n_x)
    (q, lq4), (k, lk4), (v, lv4) = _vec4_layout(q), _vec4_layout(k), _vec4_layout(v)
    out = Tensor.empty((b, lq, h, d), q.dtype, dev)
    lse = Tensor.empty((b, h, lq), _dt.float32, dev)
    ranges = chunks("fwd", t, dv, lk)
    o_layout = [0, lq * h * dv, dv, h * dv]
    if len(ranges) == 1:
        kern, launches = _forward_chunk(q, k, v, out, lse, lq4, lk4, lv4, o_layout, t, causal, scale, 0, lk, n_x)
        view = permute(out, (0, 2, 1, 3))
        if all(a is b for a, b in zip(operands, (q, k, v))) and out._offset == lse._offset == 0 \
                and not _forced():
            _PLANS.put(_plan_key(q, k, v, causal, scale), (kern, launches, out.shape, view.strides))
        return view, lse
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
                   lo: int, hi: int, n_x: int) -> tuple[KernelSpec, list]:
    b, h, lq, d = q.shape
    kern = _kernel("fwd", t, d // 4, q.dtype.storage, out.dtype.storage, walked=k.dtype.storage)
    head = [h, lq, k.shape[2], int(causal), lo, hi, 0, scale]
    o4 = [out._offset // 4] + o_layout[1:]
    rest = lq4 + lk4 + lv4 + o4 + [lse._offset]
    bufs = [out._storage.buffer, lse._storage.buffer, q._storage.buffer, k._storage.buffer, v._storage.buffer]
    return kern, _dispatch(kern, q.device, bufs, head, rest, n_x, b * h)


# -- backward ------------------------------------------------------------------------------------------
# dQ as a matmul: on a GPU the dK / dV kernel also writes dS (times the scale) for a group of (batch, head)
# pairs, and dQ = dS K runs as a batched matmul, instead of the dQ kernel recomputing S and dP (an H100,
# 8x12x1024x64 causal: dQ kernel 1.73 ms; matmul 0.48 + zero fill 0.13 + the extra stores; D = 128 and
# T = 2048: 6.6 and 8.0 ms against about 1 and 2.2). Below DS_MIN_PAIRS the dQ kernel stays (an H100 at
# T = 512: equal causal, 17% faster not; T = 128 is launch-bound).
_ds_path: list[bool | None] = [None]  # force_ds_path


def force_ds_path(on: bool | None) -> contextlib.AbstractContextManager:
    """Make the backward compute dQ as dS K (True), with the dQ kernel (False), or choose (None; tests)."""
    return _forcing(_ds_path, on)


def _use_ds(dev, t_kv: Tile, lq: int, lk: int) -> bool:
    """Whether dQ runs as dS K: the register-tiled dK / dV kernel, keys in whole vec4s, one head's dS within
    DS_BYTES and the device's binding limit; on a GPU from DS_MIN_PAIRS pairs per head, unless forced."""
    if t_kv.rm == 1 or lk % 4 or not _scores_fit(dev, lq, lk):
        return False
    if _ds_path[0] is not None:
        return _ds_path[0]
    return dev.adapter_type != "CPU" and lq * lk >= DS_MIN_PAIRS


# The backward as matmuls: on a GPU at head dims above 64 the dK / dV kernel reaches a fraction of what the
# matmul does, so for a group of (batch, head) pairs S = Q K^T and dP = dO V^T run as batched matmuls,
# shaders/attention_grad_scores.wgsl turns them in place into P and scale dS, and dV = P^T dO,
# dK = dS^T Q, dQ = dS K are three more; causal products skip their triangle (matmul_causal). The two
# [n, Lq, Lk] buffers hold at most DS_BYTES together. An H100, forward + backward GPU ms (kernels /
# matmuls): 8x12x1024x128 causal 10.4 / 6.2, not 18.6 / 8.2; 4x8x2048x128 causal 13.3 / 9.8, not 24.2 /
# 11.8. At head dim 64 the products' [L, L] stores and loads outweigh their speed (4x12x2048x64 causal
# 8.1 / 12.3, not 12.6 / 15.0; 8x12x512x64 causal 1.1 / 1.3): the kernels stay.
_GRAD_SCORES = Kernel("attention_grad_scores", "s: w, dp: w, lse: r, delta: r",
                      "rows: u32, cols: u32, tq: u32, causal: u32, scale: f32, off_s: u32, off_dp: u32, off_l: u32, "
                      "off_d: u32")
_mm_backward: list[bool | None] = [None]  # force_matmul_backward


def force_matmul_backward(on: bool | None) -> contextlib.AbstractContextManager:
    """Make the backward run as matmuls (True), with the kernels (False), or choose (None; tests)."""
    return _forcing(_mm_backward, on)


def _use_matmul_backward(dev, head_dim: int, lq: int, lk: int) -> bool:
    """Whether the backward runs as matmuls: one head's scores and their gradient within DS_HEAD_BYTES and the
    binding limit; on a GPU from DS_MIN_PAIRS pairs per head at a head dim above 64, unless forced."""
    if not _scores_fit(dev, lq, 2 * lk):
        return False
    if _mm_backward[0] is not None:
        return _mm_backward[0]
    return dev.adapter_type != "CPU" and lq * lk >= DS_MIN_PAIRS and head_dim > 64


def _matmul_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, causal: bool,
                     scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """attention_backward's (dq, dk, dv) as five batched matmuls per group of heads and one pass between."""
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    q3, k3, v3, g3 = (reshape(_f32(x), (b * h, x.shape[2], d)) for x in (q, k, v, dout))
    delta = _delta(dout, out)
    gq, gk, gv = (Tensor.empty((b * h, n, d), _dt.float32, dev) for n in (lq, lk, lk))  # written per group
    for g0, n in _head_groups(dev, b * h, lq, 2 * lk):  # S and dP of the group within DS_BYTES together
        qg, kg, vg, dg = (narrow(x, 0, g0, n) for x in (q3, k3, v3, g3))
        s = _product(qg, transpose(kg, 1, 2), causal, "c")  # [n, lq, lk]
        dp = _product(dg, transpose(vg, 1, 2), causal, "c")
        st, dpt = transpose(s, 1, 2), transpose(dp, 1, 2)
        vec = _row_vec(lk, s, dp)
        kern = _GRAD_SCORES.spec(("vec4<f32>" if vec == 4 else "f32",) * 2 + ("f32", "f32"), TPR=SOFTMAX_TPR,
                                 ACCESS=_row_access(vec, "s", "dp"))
        dev.dispatch(kern, [s._storage.buffer, dp._storage.buffer, lse._storage.buffer, delta._storage.buffer],
                     _GRAD_SCORES.pack(rows=n * lq, cols=lk, tq=lq, causal=int(causal), scale=scale, off_s=s._offset,
                                       off_dp=dp._offset, off_l=lse._offset + g0 * lq, off_d=delta._offset + g0 * lq),
                     grid(-(-n * lq // (WORKGROUP // SOFTMAX_TPR)), dev.max_workgroups))
        _product(st, dg, causal, "u", narrow(gv, 0, g0, n))  # P^T dO
        _product(dpt, qg, causal, "u", narrow(gk, 0, g0, n))  # (scale dS)^T Q
        _product(dp, kg, causal, "a", narrow(gq, 0, g0, n))  # (scale dS) K
        del s, dp, st, dpt
    grads = (reshape(gq, (b, h, lq, d)), reshape(gk, (b, h, lk, d)), reshape(gv, (b, h, lk, d)))
    return tuple(x if q.dtype is _dt.float32 else cast(x, q.dtype) for x in grads)


def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, causal: bool,
                       scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) [B, H, T, D] in the operands' dtype, for ``attention_forward``'s ``out`` and ``lse``
    and the output gradient ``dout``: contiguous, or, where q, k and v are disjoint heads of one buffer
    (a fused q|k|v projection's output), views of one gradient buffer laid out as that buffer (see
    ``_fused_grads``), so the split's backward needs no copies."""
    dev = q.device
    b, h, lq, d = q.shape
    lk = k.shape[2]
    dv = d // 4
    if dout.dtype is not q.dtype:
        dout = cast(dout, q.dtype)
    if _use_matmul_backward(dev, d, lq, lk):
        return _matmul_backward(q, k, v, out, lse, dout, causal, scale)
    k_in = k
    fused = _fused_grads(q, k, v)
    (q, lq4), (k, lk4), (v, lv4) = _vec4_layout(q), _vec4_layout(k), _vec4_layout(v)
    (dout, lg4), (out, lo4) = _vec4_layout(dout), _vec4_layout(out)
    t_dq, t_kv = pick("dq", dev, d, lq, lk), pick("dkv", dev, d, lk, lq)
    k_ranges = chunks("dkv", t_kv, dv, lq)
    ds_path = _use_ds(dev, t_kv, lq, lk)
    if fused is not None and len(k_ranges) == 1:  # the kernel writes dK and dV in their places
        gk, gv = fused[1], fused[2]
    else:
        gk = Tensor.empty((b, h, lk, d), _dt.float32 if len(k_ranges) > 1 else q.dtype, dev)
        gv = Tensor.empty((b, h, lk, d), gk.dtype, dev)
    gk4, gv4 = _vec4_layout(gk)[1], _vec4_layout(gv)[1]  # both layouts take these without a copy
    bufs_common = [q._storage.buffer, k._storage.buffer, v._storage.buffer, dout._storage.buffer]
    if ds_path:  # delta = rowsum(dO * O), which the dQ kernel would have computed
        delta = _delta(dout, out)
        gq = None
    else:
        delta = Tensor.empty((b, h, lq), _dt.float32, dev)
        gq = _dq_kernel(q, k, v, out, lse, dout, delta, lq4, lk4, lv4, lg4, lo4, t_dq, causal, scale, bufs_common,
                        fused[0] if fused is not None else None)

    qw, lqw4, gw, lgw4 = q, lq4, dout, lg4
    if t_kv.rm > 1:
        (qw, lqw4), (gw, lgw4) = (_vec4_layout(_walked(x, -(-lk // t_kv.rows))) for x in (q, dout))
    kern = _kernel("dkv", t_kv, dv, q.dtype.storage, gk.dtype.storage, ds_path, walked=qw.dtype.storage)
    bufs = [gk._storage.buffer, gv._storage.buffer, qw._storage.buffer, k._storage.buffer, v._storage.buffer,
            gw._storage.buffer, lse._storage.buffer, delta._storage.buffer]
    if ds_path:
        keys = reshape(_f32(k_in), (b * h, lk, d))
        gq = Tensor.empty((b * h, lq, d), _dt.float32, dev)  # each group's dQ written into its slice
    for g0, n in _head_groups(dev, b * h, lq, lk) if ds_path else [(0, b * h)]:
        extra, gbufs = [], bufs
        if ds_path:
            ds = fill((n, lq, lk), 0.0, _dt.float32, dev)  # causal: tiles above the diagonal stay 0
            extra, gbufs = [ds._offset // 4, g0, lk // 4], bufs + [ds._storage.buffer]
        elif t_kv.rm > 1:
            extra = [0, 0, 0]
        for c, (lo, hi) in enumerate(k_ranges):
            head = [h, lq, lk, int(causal), lo, hi, 0, scale]
            rest = lqw4 + lk4 + lv4 + lgw4 + gk4 + gv4 + [lse._offset, delta._offset, 1 if c else 0] + extra
            _dispatch(kern, dev, gbufs, head, rest, -(-lk // t_kv.rows), n, g0)
        if ds_path:
            _product(ds, narrow(keys, 0, g0, n), causal, "a", narrow(gq, 0, g0, n))
            del ds
    if ds_path:
        gq = reshape(gq, (b, h, lq, d))
    if fused is not None:
        if gq is not fused[0]:
            copy_(fused[0], gq)  # converts too
        for have, place in ((gk, fused[1]), (gv, fused[2])):
            if have is not place:
                copy_(place, have)
        return fused
    if gq.dtype is not q.dtype:
        gq = cast(gq, q.dtype)
    if gk.dtype is not q.dtype:
        gk, gv = cast(gk, q.dtype), cast(gv, q.dtype)
    return gq, gk, gv


def _fused_grads(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """Gradients for q, k, v as views of one new buffer with q's, k's and v's own strides and relative
    offsets, where the three are disjoint [B, H, T, D] views of one storage whose heads lie side by side
    in each row (a fused q|k|v projection split into heads), else None. The kernels write dK and dV (and
    dQ) in those places, and the split's backward (``_Split.join``) sees three views that tile one tensor:
    six copies a layer fewer in a GPT's backward (five where dQ comes from dS K) than contiguous gradients
    joined after."""
    if not (q._storage is k._storage is v._storage and q.shape == k.shape == v.shape
            and q.strides == k.strides == v.strides and q.dtype is k.dtype is v.dtype):
        return None
    b, h, t, d = q.shape
    sb, sh, st, sd = q.strides
    width = h * d
    if sd != 1 or (h > 1 and sh != d) or (b > 1 and t > 1 and sb != t * st):
        return None
    offs = sorted(x._offset for x in (q, k, v))
    lo = offs[0]
    row = st if t > 1 else sb  # from one (batch, position) row of heads to the next
    if offs[1] - offs[0] < width or offs[2] - offs[1] < width or (b * t > 1 and offs[2] - lo + width > row) \
            or any((o - lo) % 4 for o in offs) or (t > 1 and st % 4) or (b > 1 and sb % 4):
        return None
    span = (b - 1) * sb + (t - 1) * st + offs[2] - lo + width
    whole = Tensor.empty((span,), q.dtype, q.device)
    return tuple(Tensor(whole._storage, x.shape, x.strides, whole._offset + x._offset - lo) for x in (q, k, v))


def _dq_kernel(q, k, v, out, lse, dout, delta, lq4, lk4, lv4, lg4, lo4, t_dq: Tile, causal: bool, scale: float,
               bufs_common: list, into: Tensor | None = None) -> Tensor:
    """dQ by the dQ kernel, which also writes delta (its first chunk); written into ``into`` (a view in
    q's dtype, see ``_fused_grads``) where one chunk covers the keys."""
    dev = q.device
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], d // 4
    q_ranges = chunks("dq", t_dq, dv, lk)
    if into is not None and len(q_ranges) == 1:
        gq = into
    else:
        # Chunks add into the gradient: in float32 then, cast once at the end.
        gq = Tensor.empty((b, h, lq, d), _dt.float32 if len(q_ranges) > 1 else q.dtype, dev)
    gq4 = _vec4_layout(gq)[1]
    kern = _kernel("dq", t_dq, dv, q.dtype.storage, gq.dtype.storage)
    for n, (lo, hi) in enumerate(q_ranges):
        head = [h, lq, lk, int(causal), lo, hi, 0, scale]
        flags = (1 if n else 0) | (2 if n == 0 else 0)  # the first chunk writes dq and computes delta
        rest = lq4 + lk4 + lv4 + lg4 + lo4 + gq4 + [lse._offset, delta._offset, flags]
        _dispatch(kern, dev, [gq._storage.buffer, delta._storage.buffer, *bufs_common, out._storage.buffer,
                              lse._storage.buffer], head, rest, -(-lq // t_dq.rows), b * h)
    return gq


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


__all__ = ["attention_forward", "replay_forward", "attention_backward", "supported", "pick", "force_tiles",
           "force_path", "forced_path", "chunks", "Tile", "default_scale", "NEG", "force_ds_path",
           "force_matmul_forward"]
