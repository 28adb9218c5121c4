"""Matrix multiplication: 2-D, batched with NumPy broadcasting, 1-D operands as in np.matmul.

Two kernel families:

- ``general`` (shaders/matmul.wgsl): any shape, any strides, bounds-checked.
- ``tile{BM}x{BN}`` (shaders/matmul_fast.wgsl): register-tiled, vec4 loads, for
  operands that are row-major or transposed with vec4-aligned leading dimensions.
  Shapes that are multiples of the tile run without bounds checks; others (N and K
  multiples of 4) clamp their loads and guard their stores at the edges.

On a GPU, a product with too few tiles to fill it (the weight gradients of a linear
layer: small M x N, K = all tokens) is split along K into a batch of partial products
summed after (split-K). :func:`plan` picks the variant; BENCHMARKS.md records why.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from .. import dtypes as _dt
from ..runtime.kernels import MAX_LOOP, Kernel, KernelSpec
from ..tensor import Tensor, check_same_device
from .arith import inplace
from .elementwise import broadcast_shape, cast, copy_, fill
from .plans import PlanCache
from .reduce import column_sums, column_sums_launch
from .shape import expand, narrow, reshape, squeeze

_TILE = 64  # the general kernel's output tile
_GENERAL = Kernel("matmul", "c: w, a: r, b: r",
                  "M: u32, N: u32, K: u32, z0: u32, off_a: u32, off_b: u32, off_c: u32, m0: u32, "
                  "sa_b: i32, sa_m: i32, sa_k: i32, n0: u32, sb_b: i32, sb_k: i32, sb_n: i32", constants=())
# The fast kernel's tile sizes are override constants, set per Tiling (see _generate).
_FAST = Kernel("matmul_fast", "c: w, a: r, b: r",
               "M: u32, N: u32, K: u32, z0: u32, off_a: u32, off_b: u32, off_c: u32, m0: u32, "
               "sa_b: u32, lda: u32, sb_b: u32, ldb: u32, sc_b: u32, ldc: u32, n0: u32", constants=())
# The same with a bias row added to every output row as it is stored (F.linear's forward).
_FAST_BIAS = Kernel("matmul_fast", "c: w, a: r, b: r, bias: r",
                    "M: u32, N: u32, K: u32, z0: u32, off_a: u32, off_b: u32, off_c: u32, m0: u32, "
                    "sa_b: u32, lda: u32, sb_b: u32, ldb: u32, sc_b: u32, ldc: u32, n0: u32, off_bias: u32",
                    constants=())
# Each BK-deep step of K costs about BK + 2 loop iterations (inner loops of constant length are
# unrolled): a longer K is split into parts whose products are summed.
_MAX_K = MAX_LOOP


@dataclass(frozen=True)
class Tiling:
    """One fast-kernel shape: a BM x BN x BK block, TM x TN outputs per thread.

    ``unroll`` writes the BK steps of the inner loop out in WGSL instead of a loop;
    ``double`` keeps two slices in workgroup memory (one barrier per slice instead of two).
    """

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    unroll: bool = False
    double: bool = False

    @property
    def name(self) -> str:
        return (f"tile{self.bm}x{self.bn}x{self.bk}r{self.tm}x{self.tn}" + ("u" if self.unroll else "")
                + ("d" if self.double else ""))

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 16 * self.bk * (self.bm // 4 + 1 + self.bn // 4 + 1) * (2 if self.double else 1)

    @classmethod
    def parse(cls, text: str) -> Tiling:
        """``"128x128x16x8x8"`` (BM x BN x BK x TM x TN), then ``u`` to unroll, ``d`` to double-buffer."""
        body = text.rstrip("ud")
        flags = text[len(body):]
        try:
            bm, bn, bk, tm, tn = (int(v) for v in body.split("x"))
        except ValueError:
            raise ValueError(f"tiling {text!r} should look like 128x128x16x8x8[u][d]") from None
        if tm % 4 or tn % 4 or bm % tm or bn % tn or bk % 4:
            raise ValueError(f"tiling {text!r}: TM, TN, BK must be multiples of 4 dividing BM, BN")
        return cls(bm, bn, bk, tm, tn, "u" in flags, "d" in flags)


# Largest first: plan() takes the first that fits and still fills the GPU. Chosen on an H200
# (BENCHMARKS.md): 8x8 outputs per thread, BK=16, unrolled, one slice buffer; 64x128 beat
# 128x128, 128x64 and 64x64 from 2048 up, and 64x64 keeps more workgroups on smaller shapes.
TILINGS: dict[str, Tiling] = {t.name: t for t in (
    Tiling(64, 128, 16, 8, 8, unroll=True),
    Tiling(64, 64, 16, 8, 8, unroll=True),
)}
# Below this many workgroups a smaller tile keeps more of the GPU busy.
_MIN_WORKGROUPS = 256
# Split-K (GPUs only: a CPU adapter gains nothing from more workgroups and pays the extra pass).
# On an H200 the summing pass costs more than the fuller GPU gains unless the largest tile gives
# fewer than _SPLIT_BELOW workgroups and K is at least _SPLIT_FROM_K (the weight gradients, K = 8192
# tokens: 1.2-2.5x; 1024^3 and the forward shapes got slower); then double the parts, each keeping at
# least _SPLIT_MIN_PART of K, until there are _SPLIT_WORKGROUPS workgroups (BENCHMARKS.md). On an H100
# 16 parts of 512 beat 8 of 1024 where 8 leave fewer (768 x 8192 x 768: 62 -> 68% of torch).
_SPLIT_BELOW = 512
_SPLIT_WORKGROUPS = 1024
_SPLIT_FROM_K = 2048
_SPLIT_MIN_PART = 512
_SPLIT_MAX = 16

# On NVIDIA GPUs a float32 a @ b.T with both operands contiguous along k (F.linear's forward) runs faster in
# 128 x 128 tiles with two slabs once the grid is large: H100, 2026-11-26 (BENCHMARKS.md, "Wide tiles for
# a @ w.T"), 4096^3 72 -> 79% of torch, 8192^3 79 -> 85%, the GPT-2 qkv and MLP forwards 82 -> 87% and 75 -> 79%;
# 3072^3 (576 workgroups) 83 -> 61% and float16 or a @ b lost, so only float32 nt grids of _WIDE_FROM
# workgroups and more take it.
_WIDE = Tiling(128, 128, 16, 8, 8, unroll=True, double=True)
_WIDE_FROM = 1024

_force: str | None = None
_force_split: int | None = None


def _tiling(name: str) -> Tiling:
    """The tile a plan names: one of TILINGS (or a forced one), or the wide tile of a @ w.T."""
    return _WIDE if name == _WIDE.name and name not in TILINGS else TILINGS[name]


@contextlib.contextmanager
def force_variant(name: str | None, split: int | None = None) -> Iterator[None]:
    """Make :func:`plan` use ``name`` ("general" or a TILINGS key) and split K into ``split`` parts
    where it applies (tests, benchmarks).

    A fast variant that cannot run the shape at hand still falls back to "general"; a split that
    does not divide K into multiples of the tile's BK is not taken.
    """
    global _force, _force_split
    if name is not None and name != "general" and name not in TILINGS:
        raise ValueError(f"unknown matmul variant {name!r}; choose 'general' or one of {sorted(TILINGS)}")
    prev = _force, _force_split
    _force, _force_split = name, split
    try:
        yield
    finally:
        _force, _force_split = prev


@dataclass(frozen=True, eq=False)
class Operand:
    """A (nb, rows, cols) view: element (z, i, j) at offset + z*sz + i*si + j*sj."""

    t: Tensor
    offset: int
    sz: int
    si: int
    sj: int

    def layout(self, rows: int, cols: int) -> tuple[str, int] | None:
        """("n", ld) when row-major with vec4-aligned rows, ("t", ld) when transposed so; else None."""
        if self.offset % 4 or self.sz % 4:
            return None
        if (self.sj == 1 or cols == 1) and self.si % 4 == 0 and self.si >= cols:
            return "n", self.si
        if (self.si == 1 or rows == 1) and self.sj % 4 == 0 and self.sj >= rows:
            return "t", self.sj
        return None


@dataclass(frozen=True, eq=False)
class Plan:
    """How one matmul runs: ``variant`` is "general" or a TILINGS key."""

    variant: str
    nb: int
    M: int
    N: int
    K: int
    a: Operand
    b: Operand
    a_layout: str = ""
    b_layout: str = ""
    lda: int = 0
    ldb: int = 0
    edge: bool = False  # the shape is not a multiple of the tile: bounds-checked loads and stores
    split: int = 1  # K in this many parts, each a batch entry of a partial product, summed after
    tri: str = ""  # matmul_causal: "c" (C's lower triangle wanted), "a" / "u" (A lower / upper triangular)


# Products remembered by their operands' layout (ops/plans.py): the recipe a call of that layout made (none
# where it ran otherwise: a vector operand, an empty result, K split over several dispatches; matmul_bias
# remembers None for a bias it adds separately). The key holds
# what plan() reads that tests and benchmarks change: the forced variant and split, the tilings, _MAX_K.
_RECIPES = PlanCache()


def _layout_key(*ts: Tensor) -> tuple:
    key: list = [_force, _force_split, _MAX_K, tuple(TILINGS)]
    for t in ts:
        key += (t._shape, t._strides, t._offset, t._storage.dtype, t._storage.device)
    return tuple(key)


def matmul(a: Tensor, b: Tensor, out_dtype: _dt.DType | None = None) -> Tensor:
    """``a @ b`` (NumPy's matmul rules); ``out_dtype``: the result's dtype (default float16 for two float16
    operands, else float32), rounded to as the product is stored (autocast's linear layers: float16 out of
    float32 operands, float32 gradients out of float16 ones)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two wgpar.Tensors, got {type(a).__name__} and {type(b).__name__}")
    key = _layout_key(a, b) + (out_dtype,)
    r = _RECIPES.get(key)
    if r is not None:
        return r.run(a, b)
    out, r = _matmul(a, b, out_dtype)
    if r is not None:  # (a layout without a recipe plans again: nothing to remember)
        _RECIPES.put(key, r)
    return out


def _matmul(a: Tensor, b: Tensor, out_dtype: _dt.DType | None) -> tuple[Tensor, _Recipe | None]:
    """``a @ b``, and the recipe that repeats it for operands of the same layout (None where there is none)."""
    check_same_device(a, b, op="matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must be at least 1-d, got shapes {a.shape} and {b.shape}")
    for t in (a, b):
        if not t.dtype.is_float:
            raise TypeError(f"matmul: needs float tensors, got {a.dtype.name} and {b.dtype.name}")
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = reshape(a, (1, a.shape[0])) if a_vec else a
    b2 = reshape(b, (b.shape[0], 1)) if b_vec else b
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} are not aligned ({K} != {K2})")
    try:
        batch = broadcast_shape(a2.shape[:-2], b2.shape[:-2], op="matmul")
    except ValueError:
        raise ValueError(f"matmul: the batch dims of shapes {a.shape} and {b.shape} cannot be broadcast") from None
    out_dt = out_dtype or _result_dtype(a, b)
    r = None
    if math.prod(batch) * M * N == 0 or K == 0:
        out = fill(batch + (M, N), 0.0, out_dt, a.device)
    else:
        a3 = reshape(expand(a2, batch + (M, K)), (-1, M, K))
        b3 = reshape(expand(b2, batch + (K, N)), (-1, K, N))
        if K <= _MAX_K:
            r = _recipe(plan(a3, b3, out_dt), batch + (M, N), out_dt)
            out = r.run(a3, b3)
            if a3._storage is not a._storage or b3._storage is not b._storage:
                r = None  # a broadcast batch made a copy: the recipe binds that, not the operands
        else:
            out = None
            for k0 in range(0, K, _MAX_K):
                kk = min(_MAX_K, K - k0)
                part = _run(plan(narrow(a3, 2, k0, kk), narrow(b3, 1, k0, kk), out_dt), batch + (M, N), out_dt)
                out = part if out is None else inplace("add", out, part)
    if a_vec:
        out = squeeze(out, -2)
    if b_vec:
        out = squeeze(out, -1)
    return out, (r if not (a_vec or b_vec) else None)


def matmul_bias(a: Tensor, b: Tensor, bias: Tensor, out_dtype: _dt.DType | None = None) -> Tensor:
    """``a @ b + bias`` for 2-d a [M, K], b [K, N] and bias [N] of the result's dtype (or float32; the
    result in ``out_dtype``, as matmul's): the bias added as the fast kernel stores its tile (no second pass
    over the [M, N] output) where that kernel runs the product in one dispatch, else a product and an
    in-place add."""
    out_dt = out_dtype or _result_dtype(a, b)
    r = _RECIPES.remember(("bias", out_dt) + _layout_key(a, b, bias), _bias_recipe, a, b, bias, out_dt)
    if r is None:
        return inplace("add", matmul(a, b, out_dt), bias)
    return r.run(a, b, bias)


def _bias_recipe(a: Tensor, b: Tensor, bias: Tensor, out_dt: _dt.DType) -> _Recipe | None:
    """matmul_bias's recipe where one fast dispatch runs it, else None."""
    if (a.ndim == 2 and b.ndim == 2 and bias.shape == (b.shape[1],) and bias.dtype in (out_dt, _dt.float32)
            and bias.is_contiguous() and bias._offset % 4 == 0 and 0 < a.shape[1] <= _MAX_K
            and a.shape[0] * b.shape[1] > 0 and a.device is b.device is bias.device):
        p = plan(reshape(a, (1,) + a.shape), reshape(b, (1,) + b.shape), out_dt)
        if p.variant != "general" and p.split == 1:
            return _Recipe(*_fast_launches(p, _tiling(p.variant), out_dt, 0, bias), (p.M, p.N), out_dt)
    return None


def matmul_rows(a: Tensor, b: Tensor, bias: Tensor | None = None, out_dtype: _dt.DType | None = None) -> Tensor:
    """``a @ b + bias[:, None]`` for a [M, K] shared by the batch of b [n, K, N] and bias [M] (or none), the
    result in ``out_dtype`` (default: the operands' result dtype): a 1x1 convolution (filters, the batch's
    channels by positions, a bias per filter), float16 out of float32 operands under autocast. One fast-kernel
    dispatch adding each row's bias and rounding to ``out_dtype`` as it stores, where that kernel runs the
    product in one pass; else a product, an in-place add and a cast."""
    out_dt = out_dtype or _result_dtype(a, b)
    r = _RECIPES.remember(("rows", out_dt) + _layout_key(a, b, *(() if bias is None else (bias,))), _rows_recipe,
                          a, b, bias, out_dt)
    if r is not None:
        return r.run(a, b, bias)
    if bias is None:
        return matmul(a, b, out_dt)  # rounded to out_dt as it is stored: no cast after
    y = inplace("add", matmul(a, b), reshape(bias, (a.shape[0], 1)))
    return y if y.dtype is out_dt else cast(y, out_dt)


def _rows_recipe(a: Tensor, b: Tensor, bias: Tensor | None, out_dt: _dt.DType) -> _Recipe | None:
    """matmul_rows' recipe where one fast dispatch runs it, else None (remembered per layout, as matmul's)."""
    M, K = a.shape
    n, _, N = b.shape
    if ((bias is None or (bias.dtype.is_float and bias.is_contiguous() and bias.device is a.device))
            and 0 < K <= _MAX_K and n * M * N > 0 and a.device is b.device):
        p = plan(expand(reshape(a, (1, M, K)), (n, M, K)), b, out_dt)
        if p.variant != "general" and p.split == 1 and p.nb == n:
            return _Recipe(*_fast_launches(p, _tiling(p.variant), out_dt, 0, bias, rows=bias is not None),
                           (n, M, N), out_dt)
    return None


def matmul_causal(a: Tensor, b: Tensor, which: str, out: Tensor | None = None) -> Tensor:
    """The batched product a [n, M, K] @ b [n, K, N] of causal attention (ops/attention.py), with the work
    its triangle makes needless skipped where the tiled kernel runs it in one dispatch per K (else a plain
    matmul, which gives the same wanted values).

    ``which="c"``: only C's lower triangle (columns j <= row i) is wanted, as for the scores S = Q K^T:
    tiles whose columns all lie past their rows are not computed, so C's upper triangle past the tile band
    is left unwritten (whatever the buffer held). ``which="a"``: A is lower triangular (A[i, j] = 0 for
    j > i), as P or dS: each tile row's K loop ends past its last row. ``which="u"``: A is upper
    triangular (A[i, j] = 0 for j < i), as P^T or dS^T: each tile row's K loop starts at its first row.
    ``which=""``: the whole product. ``out``: a contiguous [n, M, N] tensor of the result's dtype to write
    (a slice of a larger result: no copy where the tiled kernel runs), returned.
    """
    if which not in ("", "a", "c", "u"):
        raise ValueError(f"matmul_causal: which must be '', 'a', 'c' or 'u', got {which!r}")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"matmul_causal: expected [n, M, K] @ [n, K, N], got {a.shape} and {b.shape}")
    shape, out_dt = (a.shape[0], a.shape[1], b.shape[2]), _result_dtype(a, b)
    if out is not None and (out.shape != shape or out.dtype is not out_dt or out.device is not a.device):
        raise ValueError(f"matmul_causal: out must be {out_dt.name} {shape} on {a.device}, got {out.dtype.name} "
                         f"{out.shape} on {out.device}")
    off = None if out is None else (out._offset if out.is_contiguous() and out._offset % 4 == 0 else -1)
    r = _RECIPES.remember(("causal", which, off) + _layout_key(a, b), _causal_launches, a, b, which, off)
    if r is None:
        c = matmul(a, b)
        return c if out is None else copy_(out, c)
    out = Tensor.empty(shape, out_dt, a.device) if out is None else out
    _dispatch(a.device, r[0], _bound(out, a, b, None), r[1])
    return out


def _causal_launches(a: Tensor, b: Tensor, which: str, off: int | None) -> tuple[KernelSpec, tuple] | None:
    """matmul_causal's (kernel, launches) into a contiguous output at element offset ``off`` (None: a fresh
    one), remembered per layout (planning cost a call tens of microseconds of host time); None where a plain
    matmul runs (no fast plan, or an output the kernel cannot write: ``off`` -1)."""
    p = _causal_plan(a, b)
    if p is None or off == -1:
        return None
    return _fast_launches(replace(p, split=1, tri=which), _tiling(p.variant), _result_dtype(a, b), off or 0)


def _causal_plan(a: Tensor, b: Tensor) -> Plan | None:
    """The fast kernel's plan for matmul_causal(a, b), or None where a plain matmul runs instead."""
    n, M, K = a.shape
    N = b.shape[2]
    if n * M * N == 0 or K == 0 or K > _MAX_K:
        return None
    p = plan(a, b, _result_dtype(a, b))
    if p.variant == "general" or p.nb != n or _tiling(p.variant).bm % _tiling(p.variant).bk:
        return None  # (a weight shared over the batch folds it into M; K bounds must fall on slices)
    return p


def causal_band(a: Tensor, b: Tensor) -> int:
    """How far past the diagonal ``matmul_causal(a, b, "a")`` (or "u") reads its triangular A: the tile
    rows BM, row i reading columns j < BM ceil((i + 1) / BM) ("u": the transpose); 0 where it runs a plain
    matmul, which reads all of A. A caller zeroing A's triangle need zero no further."""
    return _RECIPES.remember(("band",) + _layout_key(a, b), _band, a, b)


def _band(a: Tensor, b: Tensor) -> int:
    p = _causal_plan(a, b)  # (a plan holds its operands: only the number is remembered)
    return 0 if p is None else _tiling(p.variant).bm


def _result_dtype(a: Tensor, b: Tensor) -> _dt.DType:
    if a.dtype is _dt.float16 and b.dtype is _dt.float16:
        return _dt.float16
    return _dt.float32


def plan(a3: Tensor, b3: Tensor, out_dtype: _dt.DType | None = None) -> Plan:
    """Choose the kernel for ``a3 @ b3`` (both 3-d, equal batch; batch strides may be 0)."""
    out_dtype = out_dtype or _result_dtype(a3, b3)
    nb, M, K = a3.shape
    N = b3.shape[2]
    a = Operand(a3, a3._offset, *a3.strides)
    b = Operand(b3, b3._offset, *b3.strides)
    # A weight shared by the whole batch against row-major activations: one (nb*M) x K matmul.
    if nb > 1 and b.sz == 0 and a.sj == 1 and a.sz == M * a.si:
        M, nb = nb * M, 1
        a = Operand(a3, a.offset, 0, a.si, a.sj)
    general = _general_plan(a3.device, nb, M, N, K, a, b, out_dtype)
    if _force == "general":
        return general
    dev = a3.device
    # Each operand and the result has its own element type in the tiled kernel (float16 loads unpacked,
    # float32 math): a float32 product may store float16 (autocast's 1x1 convolution) and mixed operands
    # need no copy.
    if _dt.float16 in (a3.dtype, b3.dtype, out_dtype) and not dev.has_f16:
        return general
    if not all(d in (_dt.float16, _dt.float32) for d in (a3.dtype, b3.dtype, out_dtype)):
        return general
    la, lb = a.layout(M, K), b.layout(K, N)
    if la is None or lb is None:
        return general
    # Vec4 loads and stores: N and K whole vec4s, and M too where A's vec4s run along m.
    if N % 4 or K % 4 or (la[0] == "t" and M % 4):
        return general
    candidates = [TILINGS[_force]] if _force else list(TILINGS.values())
    fits = [t for t in candidates if _fits(dev, t)]
    exact = [t for t in fits if M % t.bm == 0 and N % t.bn == 0 and K % t.bk == 0]
    fits = exact or fits  # a tile the shape is a multiple of runs without bounds checks
    if not fits:
        return general
    groups = lambda t: nb * -(-M // t.bm) * -(-N // t.bn)  # noqa: E731
    chosen = fits[-1]
    for t in fits:  # the largest tile that still gives enough workgroups
        if groups(t) >= _MIN_WORKGROUPS or _force:
            chosen = t
            break
    edge = not exact
    split = 1
    if _force_split is not None:
        split = _force_split
    elif (dev.adapter_type.lower() != "cpu" and nb == 1 and not edge and groups(fits[0]) < _SPLIT_BELOW
          and K >= _SPLIT_FROM_K):
        # float16 too: the partial products stay float32 and their sum is rounded once (_run), as one
        # kernel accumulating the whole K in float32 rounds its result once.
        chosen = fits[0]  # the largest tile: its parts give the workgroups
        while (groups(chosen) * split < _SPLIT_WORKGROUPS and K // (2 * split) >= _SPLIT_MIN_PART
               and split < _SPLIT_MAX):
            split *= 2
    if split > 1 and (nb != 1 or edge or K % (split * chosen.bk)):
        split = 1
    if (not _force and split == 1 and nb == 1 and dev.kind == "nvidia" and (la[0], lb[0]) == ("n", "t")
            and a3.dtype is b3.dtype is out_dtype is _dt.float32 and M % _WIDE.bm == 0 and N % _WIDE.bn == 0
            and K % _WIDE.bk == 0 and groups(_WIDE) >= _WIDE_FROM and _fits(dev, _WIDE)):
        chosen = _WIDE
    return Plan(chosen.name, nb, M, N, K, a, b, la[0], lb[0], la[1], lb[1], edge, split)


def _general_plan(dev, nb: int, M: int, N: int, K: int, a: Operand, b: Operand, out_dtype: _dt.DType) -> Plan:
    """The general kernel's plan. Each of its workgroups walks all of K for one 64 x 64 tile, so on a
    GPU a product of few tiles over a long K (a classifier's 128 x 512 @ 512 x 10 took 0.7 ms on an
    H100) is split in K into parts of at least 32, summed after in float32 (as the fast kernels)."""
    split = 1
    if nb == 1 and out_dtype.is_float:
        if _force_split is not None:
            split = _force_split if K % _force_split == 0 else 1
        elif dev.adapter_type.lower() != "cpu":
            tiles = -(-M // _TILE) * -(-N // _TILE)
            while tiles * split < _MIN_WORKGROUPS and K % (2 * split) == 0 and K // (2 * split) >= 32:
                split *= 2
    return Plan("general", nb, M, N, K, a, b, split=split)


# Implicit GEMMs (ops/conv.py) gather one operand through the convolution's window, which costs more per
# element than a matmul's loads: on a GPU, where M (output channels, or input channels for the input
# gradient) reaches 128, a tile of 128 rows shares each gathered slice among twice the outputs. On an
# H100 (BENCHMARKS.md, "Convolution tiles") 128 x 128 tiles with at least _MIN_WORKGROUPS workgroups, else
# 128 x 64 with at least half as many, took 3-25% off the ResNet-18 layers' forward and input gradient,
# and 128 x 64 the weight gradients'.
CONV_TILINGS: dict[str, Tiling] = {t.name: t for t in (
    Tiling(128, 128, 16, 8, 8, unroll=True),
    Tiling(128, 64, 16, 8, 8, unroll=True),
)}


def _fits(dev, t: Tiling) -> bool:
    return (t.threads <= dev.limits.get("max-compute-invocations-per-workgroup", 256)
            and t.shared_bytes <= dev.limits.get("max-compute-workgroup-storage-size", 16384))


def gemm_tiling(dev, M: int, N: int, nb: int, weight_grad: bool = False) -> Tiling | None:
    """The tile of an implicit GEMM of nb products M x N (ops/conv.py), bounds-checked at the edges: on
    a GPU from M = 128 a 128-row tile (CONV_TILINGS; 128 x 64 for a ``weight_grad``, whose caller splits
    K until the workgroups suffice), else as :func:`plan`, the largest that still gives enough
    workgroups; None where none fits the device."""
    if M >= 128 and dev.adapter_type.lower() != "cpu":
        wide, narrow = CONV_TILINGS.values()
        if weight_grad:
            if _fits(dev, narrow):
                return narrow
        else:
            for t, least in ((wide, _MIN_WORKGROUPS), (narrow, _MIN_WORKGROUPS // 2)):
                if _fits(dev, t) and nb * -(-M // t.bm) * -(-N // t.bn) >= least:
                    return t
    fits = [t for t in TILINGS.values() if _fits(dev, t)]
    for t in fits:
        if nb * -(-M // t.bm) * -(-N // t.bn) >= _MIN_WORKGROUPS:
            return t
    return fits[-1] if fits else None


@dataclass(frozen=True, eq=False)
class _Recipe:
    """What a product runs once its plan is made, with no tensor in it: the kernel, each dispatch's
    (parameters, workgroups, (FLOPs, bytes)), and the result's shape and dtype (split-K: its float32 parts
    first, then their sum). Only the operands' buffers and a fresh output are left to bind."""

    kspec: KernelSpec
    launches: tuple
    shape: tuple[int, ...]
    dtype: _dt.DType
    split: int = 1
    mn: int = 0  # M * N, for the split parts' sum
    parts_sum: tuple | None = None  # the parts' sum as one column-sum dispatch (kernel, parameters, workgroups)

    def run(self, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
        dev = a.device
        if self.split == 1:
            out = Tensor.empty(self.shape, self.dtype, dev)
        else:
            out = Tensor.empty((self.split, self.mn), _dt.float32, dev)
        _dispatch(dev, self.kspec, _bound(out, a, b, bias), self.launches)
        if self.split == 1:
            return out
        if self.parts_sum is None:
            return reshape(column_sums(out, 1, self.split, self.mn, self.dtype), self.shape)
        # Remembered with the recipe: a split product's host cost was about 2.5 times an unsplit one's.
        total = Tensor.empty(self.shape, self.dtype, dev)
        kspec, params, groups = self.parts_sum
        dev.dispatch(kspec, [total._storage.buffer, out._storage.buffer], params, groups)
        return total


def _recipe(p: Plan, shape: tuple[int, ...], dtype: _dt.DType) -> _Recipe:
    """``p``'s recipe into a fresh tensor of ``shape`` (its batch and M x N) of ``dtype``."""
    if p.split == 1:
        return _Recipe(*_launches(p, dtype), shape, dtype)
    # Split-K: part s multiplies A's columns and B's rows s*K/S .. (s+1)*K/S, as batch entry s. The parts
    # are float32 whatever the result's type, summed in float32 and rounded once into ``dtype``.
    kp = p.K // p.split
    sp = Plan(p.variant, p.split, p.M, p.N, kp, Operand(p.a.t, p.a.offset, kp * p.a.sj, p.a.si, p.a.sj),
              Operand(p.b.t, p.b.offset, kp * p.b.si, p.b.si, p.b.sj), p.a_layout, p.b_layout, p.lda, p.ldb)
    parts_sum = column_sums_launch(_dt.float32, p.split, p.M * p.N, dtype, p.a.t.device.max_workgroups)
    return _Recipe(*_launches(sp, _dt.float32), shape, dtype, p.split, p.M * p.N, parts_sum)


def _launches(p: Plan, out_dtype: _dt.DType) -> tuple[KernelSpec, tuple]:
    """(kernel, launches) of ``p`` into a fresh output of ``out_dtype`` (element offset 0)."""
    if p.variant == "general":
        return _general_launches(p, out_dtype)
    return _fast_launches(p, _tiling(p.variant), out_dtype, 0)


def _bound(out: Tensor, a: Tensor, b: Tensor, bias: Tensor | None) -> list:
    """A product's buffers in binding order: C, A, B, then the bias where there is one."""
    return [t._storage.buffer for t in (out, a, b, bias) if t is not None]


def _dispatch(dev, kspec: KernelSpec, buffers: list, launches: tuple) -> None:
    for params, groups, (flops, nbytes) in launches:
        dev.dispatch(kspec, buffers, params, groups, flops, nbytes)


def _run(p: Plan, shape: tuple[int, ...], dtype: _dt.DType) -> Tensor:
    """Run ``p`` into a new tensor of ``shape`` (its batch and M x N)."""
    return _recipe(p, shape, dtype).run(p.a.t, p.b.t)


def grid_tiles(nb: int, M: int, N: int, tm: int, tn: int,
               lim: int) -> Iterator[tuple[int, int, int, tuple[int, int, int]]]:
    """(z0, m0, n0, grid) of each dispatch covering nb x M x N in tm x tn tiles, at most ``lim``
    workgroups per grid dimension (Device.max_workgroups); the implicit GEMMs (ops/conv.py) too."""
    gy, gx = -(-M // tm), -(-N // tn)
    for z0 in range(0, nb, lim):
        for y0 in range(0, gy, lim):
            for x0 in range(0, gx, lim):
                yield z0, y0 * tm, x0 * tn, (min(lim, gx - x0), min(lim, gy - y0), min(lim, nb - z0))


def _cost(p: Plan, out_dtype: _dt.DType, m0: int, n0: int, groups: tuple[int, int, int], tm: int,
          tn: int) -> tuple[int, int]:
    """The FLOPs and the least bytes moved of one tile dispatch, for the profiler."""
    rows, cols, nb = min(groups[1] * tm, p.M - m0), min(groups[0] * tn, p.N - n0), groups[2]
    flops = 2 * nb * rows * cols * p.K
    if p.tri:  # the tiles computed (c), the K each tile row runs (a, u)
        ys = range(m0 // tm, m0 // tm + groups[1])
        xs = range(n0 // tn, n0 // tn + groups[0])
        if p.tri == "c":
            flops = 2 * nb * tm * tn * p.K * sum(1 for y in ys for x in xs if x * tn < (y + 1) * tm)
        elif p.tri == "a":
            flops = 2 * nb * tm * cols * sum(min(p.K, (y + 1) * tm) for y in ys)
        else:
            flops = 2 * nb * tm * cols * sum(max(0, p.K - y * tm) for y in ys)
    return flops, nb * (p.K * (rows * p.a.t.dtype.itemsize + cols * p.b.t.dtype.itemsize)
                        + rows * cols * out_dtype.itemsize)


def _general_launches(p: Plan, out_dtype: _dt.DType) -> tuple[KernelSpec, tuple]:
    """The general kernel's (kernel, launches) into a fresh output (element offset 0)."""
    a, b = p.a.t, p.b.t
    k = _GENERAL.spec((out_dtype.storage, a.dtype.storage, b.dtype.storage), TC=out_dtype.storage)
    return k, tuple(
        (_GENERAL.pack(M=p.M, N=p.N, K=p.K, z0=z0, off_a=p.a.offset, off_b=p.b.offset, off_c=0, m0=m0,
                       sa_b=p.a.sz, sa_m=p.a.si, sa_k=p.a.sj, n0=n0, sb_b=p.b.sz, sb_k=p.b.si, sb_n=p.b.sj),
         groups, _cost(p, out_dtype, m0, n0, groups, _TILE, _TILE))
        for z0, m0, n0, groups in grid_tiles(p.nb, p.M, p.N, _TILE, _TILE, a.device.max_workgroups))


def _fast_launches(p: Plan, t: Tiling, out_dtype: _dt.DType, out_offset: int, bias: Tensor | None = None,
                   rows: bool = False) -> tuple[KernelSpec, tuple]:
    """``bias``: a contiguous [N] tensor added to every row as it is stored (offset a whole vec4); with
    ``rows``, a contiguous [M] tensor whose element i is added to row i of every batch entry."""
    a, b = p.a.t, p.b.t
    tiles = list(grid_tiles(p.nb, p.M, p.N, t.bm, t.bn, a.device.max_workgroups))
    blocks = sum(g[0] * g[1] * g[2] for *_, g in tiles) >= _BLOCKS_FROM
    k = _fast_kernel(t, p.a_layout, p.b_layout, a.dtype.storage, b.dtype.storage, out_dtype.storage, p.edge,
                     None if bias is None else bias.dtype.storage, p.tri, rows, blocks)
    kernel = _FAST if bias is None else _FAST_BIAS
    extra = {} if bias is None else {"off_bias": bias._offset if rows else bias._offset // 4}
    return k, tuple(
        (kernel.pack(M=p.M, N=p.N, K=p.K, z0=z0, off_a=p.a.offset // 4, off_b=p.b.offset // 4, off_c=out_offset // 4,
                     m0=m0, sa_b=p.a.sz // 4, lda=p.lda // 4, sb_b=p.b.sz // 4, ldb=p.ldb // 4, sc_b=p.M * p.N // 4,
                     ldc=p.N // 4, n0=n0, **extra),
         groups, _cost(p, out_dtype, m0, n0, groups, t.bm, t.bn))
        for z0, m0, n0, groups in tiles)


_FAST_CACHE: dict[tuple, KernelSpec] = {}
# From this many workgroups a k-contiguous operand is loaded in 4 x 4 blocks (see _generate's `blocks`):
# they hold two more vec4s a thread for A, which can cost a resident workgroup per SM; a grid of about one
# wave then runs longer (H100, 2048^3 a @ w.T: 67 -> 62% of torch at 512 workgroups) while larger grids
# gain (768 and more: the GPT-2 step's forward and dX products 3-6 points, 4096^3 and 8192^3 3-4).
_BLOCKS_FROM = 768
# A workgroup's batch entry and tile: in grid order, or (a triangular A, whose tile rows run K up to their
# last row or from their first) the longest tile row of every batch entry and column first, then the next:
# a product of one or two waves of workgroups otherwise ends with the longest tiles alone on the GPU (an
# H100, P V at 96 x 1024 x 1024 x 128: the K limit alone saved 23% of the time, against 47% of the work).
_IN_ORDER = """  let z = wid.z + p.z0;
  let row0 = p.m0 + wid.y * BM;
  let col0 = p.n0 + wid.x * BN;"""
_LONGEST_FIRST = """  let lin = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
  let z = p.z0 + lin % nwg.z;
  let col0 = p.n0 + (lin / nwg.z) % nwg.x * BN;
  let row0 = p.m0 + (ROW) * BM;"""
_ROW_ORDER = {"a": "nwg.y - 1u - lin / (nwg.z * nwg.x)", "u": "lin / (nwg.z * nwg.x)"}


# float16 operands are bound as pairs of u32 and unpacked (C packed): on an H100 through Vulkan, vec4<f16>
# loads made the GPT-2 step's GEMMs about 10% slower than float32 ones; unpacked they run as fast.
_UNPACK = """
fn NAME_h(i: u32) -> vec4<f32> {
  let v = NAME[i];
  return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
}"""


def _fast_kernel(t: Tiling, la: str, lb: str, ta: str, tb: str, tc: str, edge: bool,
                 tbias: str | None = None, tri: str = "", bias_rows: bool = False, blocks: bool = False) -> KernelSpec:
    key = (t, la, lb, ta, tb, tc, edge, tbias, tri, bias_rows, blocks)
    hit = _FAST_CACHE.get(key)
    if hit is None:
        hit = _FAST_CACHE[key] = _generate(t, la, lb, ta, tb, tc, edge, bias=tbias, tri=tri, bias_rows=bias_rows,
                                           blocks=blocks)
    return hit


def _generate(t: Tiling, la: str, lb: str, ta: str, tb: str, tc: str, edge: bool = False,
              gather: tuple[Kernel, str, tuple[str, ...]] | None = None, bias: str | None = None,
              tri: str = "", bias_rows: bool = False, blocks: bool = False) -> KernelSpec:
    """Fill shaders/matmul_fast.wgsl for one tiling and operand layout (see that file).

    ``edge``: M, N, K need not be multiples of the tile. Loads clamp their row and vec4 column into
    the operand and give zero past K (rows past M or columns past N only feed outputs that are not
    stored); stores skip what lies outside C.

    ``gather``: (kernel, helpers, buffer types) of an implicit GEMM (ops/conv.py). Its WGSL helpers
    replace the array accesses: ``a_prep(m, z)`` / ``b_prep(n, z)`` once per thread and loaded row
    or column (n: the first of four where the vec4 runs along the columns), ``a_load(q, k)`` /
    ``b_load(q, k)`` a vec4 along the layout's direction (zeros outside), ``c_store(m, n, z, v)``
    four outputs of row m from column n. Bounds are the helpers' business.

    ``bias``: the element type of a bias row (binding ``bias``, offset ``p.off_bias`` in vec4s) added
    to every output row as it is stored; with ``bias_rows`` a bias column instead (offset in elements):
    its element m added to row m. Not with ``gather``.

    ``blocks``: an operand contiguous along k (row-major A, transposed B) is loaded as 4 x 4 blocks, 4
    vec4s a thread stored transposed as 4 vec4s, instead of one vec4 a load stored as 4 scalars. Not
    with ``gather``.
    """
    wm, wn = t.bm // t.tm, t.bn // t.tn
    nthreads = wm * wn
    packed = {n: gather is None and ty == "f16" for n, ty in (("a", ta), ("b", tb), ("c", tc))}

    def read(name: str, idx: str) -> str:
        return f"{name}_h({idx})" if packed[name] else f"{name}[{idx}]"

    sa, sb = t.bm // 4 + 1, t.bn // 4 + 1
    decl, load, store = [], [], []
    if gather is None:
        decl += ["  let base_a = p.off_a + z * p.sa_b;", "  let base_b = p.off_b + z * p.sb_b;"]

    def k_load(name: str, base: str, ld: str, row: str, kq: str, lim: str) -> str:
        # The vec4 of 4 k's (from k0 + 4 kq) of one row of an operand contiguous along k; with edges the
        # row is clamped into the operand and k's past K read as zeros.
        if not edge:
            return read(name, f"{base} + ({row}) * {ld} + k0 / 4u + {kq}")
        kv = f"k0 / 4u + {kq}"
        src = read(name, f"{base} + min({row}, {lim} - 1u) * {ld} + min({kv}, p.K / 4u - 1u)")
        return f"select(vec4<f32>(0.0), vec4<f32>({src}), {kv} < p.K / 4u)"

    def operand(name: str, layout: str, base: str, ld: str, outer0: str, outer: int, slab: str, lim: str):
        # One BK-deep slice of an operand: `outer` rows/cols (m for A, n for B) by BK.
        n_vec = outer * t.bk // 4
        if n_vec % nthreads and nthreads % n_vec:
            raise ValueError(f"{t.name}: {n_vec} vec4 loads do not split over {nthreads} threads")
        n_blk = n_vec // 4  # 4 x 4 blocks, where they split over the threads too
        if (name, layout) in (("a", "n"), ("b", "t")) and not gather and blocks and \
                not (n_blk % nthreads and nthreads % n_blk):
            return block_loads(name, base, ld, outer0, slab, lim, n_blk)
        for i in range(-(-n_vec // nthreads)):
            reg = f"p{name}{i}"
            decl.append(f"  var {reg}: vec4<f32>;")
            e = f"(t + {i * nthreads}u)"
            # Fewer vec4s than threads: the first n_vec threads load (no barrier inside the branch).
            guard = f"if (t < {n_vec}u) " if n_vec < nthreads else ""
            if (name, layout) in (("a", "n"), ("b", "t")):
                # Contiguous along k: a vec4 holds 4 k's of one m (or n); store it transposed.
                per = t.bk // 4
                o, kq = f"({e} / {per}u)", f"({e} % {per}u)"
                src = k_load(name, base, ld, f"{outer0} + {o}", kq, lim)
                if gather:
                    decl.append(f"  let {name}q{i} = {name}_prep({outer0} + {o}, z);")
                    src = f"{name}_load({name}q{i}, k0 + {kq} * 4u)"
                load.append(f"  {guard}{{ {reg} = vec4<f32>({src}); }}")
                store.append(f"    {guard}{{")
                for j, comp in enumerate("xyzw"):
                    dst = f"{slab}[KB + {kq} * 4u + {j}u][{o} / 4u][{o} % 4u]"
                    store.append(f"    {dst} = {reg}.{comp};")
                store.append("    }")
            else:
                # Contiguous along m (or n): a vec4 holds 4 m's at one k; store it as is.
                per = outer // 4
                kr, oq = f"({e} / {per}u)", f"({e} % {per}u)"
                src = read(name, f"{base} + (k0 + {kr}) * {ld} + {outer0} / 4u + {oq}")
                if gather:
                    shared = nthreads % per == 0  # every load of this thread has the same columns
                    q = f"{name}q{0 if shared else i}"
                    if i == 0 or not shared:
                        decl.append(f"  let {q} = {name}_prep({outer0} + {oq} * 4u, z);")
                    src = f"{name}_load({q}, k0 + {kr})"
                elif edge:
                    src = read(name, f"{base} + min(k0 + {kr}, p.K - 1u) * {ld} "
                                     f"+ min({outer0} / 4u + {oq}, {lim} / 4u - 1u)")
                    src = f"select(vec4<f32>(0.0), vec4<f32>({src}), k0 + {kr} < p.K)"
                load.append(f"  {guard}{{ {reg} = vec4<f32>({src}); }}")
                store.append(f"    {guard}{{ {slab}[KB + {kr}][{oq}] = {reg}; }}")

    def block_loads(name: str, base: str, ld: str, outer0: str, slab: str, lim: str, n_blk: int):
        # Contiguous along k, in 4 x 4 blocks: a thread loads 4 vec4s (4 k's of 4 consecutive m's, or n's)
        # and stores their transpose as 4 vec4s (4 m's at each k) instead of 16 scalars.
        per = t.bk // 4
        for i in range(-(-n_blk // nthreads)):
            e = f"(t + {i * nthreads}u)"
            guard = f"if (t < {n_blk}u) " if n_blk < nthreads else ""
            oq, kq = f"({e} / {per}u)", f"({e} % {per}u)"
            regs = [f"p{name}{i}_{r}" for r in range(4)]
            decl.extend(f"  var {reg}: vec4<f32>;" for reg in regs)
            for r, reg in enumerate(regs):
                src = k_load(name, base, ld, f"{outer0} + {oq} * 4u + {r}u", kq, lim)
                load.append(f"  {guard}{{ {reg} = vec4<f32>({src}); }}")
            store.append(f"    {guard}{{")
            for j, comp in enumerate("xyzw"):
                col = ", ".join(f"{r}.{comp}" for r in regs)
                store.append(f"    {slab}[KB + {kq} * 4u + {j}u][{oq}] = vec4<f32>({col});")
            store.append("    }")

    operand("a", la, "base_a", "p.lda", "row0", t.bm, "As", "p.M")
    operand("b", lb, "base_b", "p.ldb", "col0", t.bn, "Bs", "p.N")
    ga, gb = t.tm // 4, t.tn // 4
    acc = [[f"acc{r}_{h}" for h in range(gb)] for r in range(t.tm)]
    decl += [f"  var {v} = vec4<f32>(0.0);" for row in acc for v in row]
    def compute(slab: int) -> list[str]:
        # The BK k-rows of one slab (its first k-row ``slab``), indexed by constants when unrolled: the only
        # clamped index (naga's bounds checks) is the thread's column, the same for every k, so each read's
        # address is one register plus an immediate.
        comp = []
        for kk in range(t.bk) if t.unroll else ["kk"]:
            krow = f"{slab + kk}u" if t.unroll else (f"{slab}u + kk" if slab else "kk")
            comp += [f"      {{ let a{g} = As[{krow}][{g * wm}u + ty];" if g == 0 else
                     f"      let a{g} = As[{krow}][{g * wm}u + ty];" for g in range(ga)]
            comp += [f"      let b{h} = Bs[{krow}][{h * wn}u + tx];" for h in range(gb)]
            for g in range(ga):
                for i, ci in enumerate("xyzw"):
                    for h in range(gb):
                        v = acc[g * 4 + i][h]
                        comp.append(f"      {v} = fma(vec4<f32>(a{g}.{ci}), b{h}, {v});")
            comp.append("      }")
        return ["    for (var kk = 0u; kk < KSTEPS; kk = kk + 1u) {  // 1 when unrolled", *comp, "    }"]
    write = [] if gather else ["  let base_c = p.off_c + z * p.sc_b;"]
    for g in range(ga):
        for i in range(4):
            row = f"(row0 + {g * 4 * wm + i}u + ty * 4u)"
            for h in range(gb):
                value = acc[g * 4 + i][h]
                if bias is not None and bias_rows:
                    value = f"{value} + vec4<f32>(f32(bias[p.off_bias + {row}]))"
                elif bias is not None:
                    value = f"{value} + vec4<f32>(bias[p.off_bias + col0 / 4u + {h * wn}u + tx])"
                line = f"c[base_c + {row} * p.ldc + col0 / 4u + {h * wn}u + tx] = vec4<{tc}>({value});"
                if packed["c"]:
                    line = (f"{{ let v = {value}; c[base_c + {row} * p.ldc + col0 / 4u + {h * wn}u + tx] = "
                            "vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw)); }")
                if gather:
                    line = f"c_store({row}, col0 + ({h * wn}u + tx) * 4u, z, {acc[g * 4 + i][h]});"
                elif edge:
                    line = f"if ({row} < p.M && col0 / 4u + {h * wn}u + tx < p.ldc) {{ {line} }}"
                write.append("  " + line)

    def stores(kbase: str) -> list[str]:
        return [line.replace("KB", kbase) for line in store]

    def prefetch(k: str) -> list[str]:
        # The slice from k into the registers (past the end: the last slice again, or zeros with edges).
        nxt = f"{k} + BK" if edge or gather else f"min({k} + BK, p.K - BK)"
        return ["    {", f"      let k0 = {nxt};", *load, "    }"]

    kstart = "min(row0, p.K)" if tri == "u" else "0u"
    kend = "min(p.K, row0 + BM)" if tri == "a" else "p.K"
    if t.double:
        # Slab 0 holds slice k0: prefetch the next, multiply slab 0, store the next into slab 1, one barrier;
        # then the same with the slabs swapped. Two slices an iteration keep every slab index a constant.
        loop = [*stores("0u"), "  workgroupBarrier();",
                f"  for (var k0 = {kstart}; k0 < {kend}; k0 = k0 + 2u * BK) {{",
                *prefetch("k0"), *compute(0), *stores(f"{t.bk}u"), "    workgroupBarrier();",
                f"    if (k0 + BK >= {kend}) {{ break; }}",
                *prefetch("k0 + BK"), *compute(t.bk), *stores("0u"), "    workgroupBarrier();", "  }"]
    else:  # store the slice, barrier, prefetch the next, multiply, barrier
        loop = [f"  for (var k0 = {kstart}; k0 < {kend}; k0 = k0 + BK) {{",
                *stores("0u"), "    workgroupBarrier();", *prefetch("k0"), *compute(0),
                "    workgroupBarrier();", "  }"]
    slabs = 2 if t.double else 1
    # Nested arrays (k-rows of vec4s): an override constant cannot size an array's element type, so the
    # lengths are written out.
    shared = "\n".join(f"var<workgroup> {n}s: array<array<vec4<f32>, {w}>, {t.bk * slabs}>;"
                       for n, w in (("A", sa), ("B", sb)))
    consts = dict(WM=wm, WN=wn, BM=t.bm,
                  BN=t.bn, BK=t.bk, KSTEPS=1 if t.unroll else t.bk)
    kernel, helpers, types = gather or (_FAST, "", tuple("vec2<u32>" if packed[n] else f"vec4<{ty}>"
                                                         for n, ty in (("c", tc), ("a", ta), ("b", tb))))
    helpers += "".join(_UNPACK.replace("NAME", n) for n in "ab" if packed[n])
    if bias is not None:
        kernel, types = _FAST_BIAS, types + (bias if bias_rows else f"vec4<{bias}>",)
    return kernel.spec(types, constants=consts, HELPERS=helpers, SHARED=shared, DECL="\n".join(decl),
                       LOAD="\n".join(load), LOOP="\n".join(loop),
                       TILE=_LONGEST_FIRST.replace("ROW", _ROW_ORDER[tri]) if tri in _ROW_ORDER else _IN_ORDER,
                       SKIP="  if (col0 >= row0 + BM) { return; }" if tri == "c" else "",
                       KSTART=kstart, WRITE="\n".join(write))
