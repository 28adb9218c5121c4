"""Matmul kernel variants against NumPy float64: each tiling and operand layout, the choice, the fallbacks."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import wgpar

from .helpers import record_dispatches

mm = sys.modules["wgpar.ops.matmul"]  # the module (wgpar.ops.matmul is the function)

LAYOUTS = ("nn", "nt", "tn", "tt")
# Tilings the benchmarks explore beside the ones plan() chooses from: they must be correct too.
EXTRA = {t.name: t for t in map(mm.Tiling.parse, ("64x64x16x4x4", "64x64x8x8x8", "128x64x8x8x4", "64x64x8x4x4d",
                                                         "128x64x8x8x4ud"))}
FAST = sorted(mm.TILINGS)
ALL_FAST = FAST + sorted(EXTRA)
LARGEST, SMALLEST = list(mm.TILINGS)[0], list(mm.TILINGS)[-1]


@pytest.fixture(params=["vec4 loads", "4x4 blocks"])
def blocks(request, monkeypatch):
    """Both ways of loading a k-contiguous operand (row-major A, transposed B): small products load a vec4
    at a time, grids from matmul._BLOCKS_FROM workgroups 4 x 4 blocks; here each runs at any size."""
    monkeypatch.setattr(mm, "_BLOCKS_FROM", 0 if request.param == "4x4 blocks" else 1 << 62)
    mm._RECIPES.clear()  # launches remembered by an earlier test were chosen under the other setting
    yield request.param
    mm._RECIPES.clear()


@pytest.fixture
def extra_tilings(monkeypatch):
    monkeypatch.setattr(mm, "TILINGS", {**mm.TILINGS, **EXTRA})


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.abs(got - want).max() / np.abs(want).max())


def operands(rng, M, K, N, layout, dtype=np.float32, batch=()):
    """wgpar a (.., M, K) and b (.., K, N), each stored row-major or as the transpose of a row-major array."""
    a = rng.standard_normal(batch + (M, K)).astype(dtype)
    b = rng.standard_normal(batch + (K, N)).astype(dtype)

    def put(x, transposed):
        if not transposed:
            return wgpar.tensor(x)
        return wgpar.tensor(np.ascontiguousarray(np.swapaxes(x, -1, -2))).transpose(-1, -2)

    return a, b, put(a, layout[0] == "t"), put(b, layout[1] == "t")


def plan_of(a, b):
    return mm.plan(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))


def tile_shape(name: str) -> tuple[int, int, int]:
    t = {**mm.TILINGS, **EXTRA}[name]
    return t.bm, 3 * t.bk, t.bn  # K of three slices: the prefetch of the next slice is exercised


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", ALL_FAST)
def test_fast_variant_f32(blocks, rng, extra_tilings, variant, layout):
    M, K, N = tile_shape(variant)
    a, b, wa, wb = operands(rng, 2 * M, K, N, layout)
    with mm.force_variant(variant):
        p = plan_of(wa, wb)
        assert (p.variant, p.a_layout + p.b_layout) == (variant, layout)
        got = (wa @ wb).numpy()
    assert got.dtype == np.float32
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("layout", ("nn", "nt"))
@pytest.mark.parametrize("variant", FAST)
def test_fast_variant_f16(blocks, rng, dev, variant, layout):
    if not dev.has_f16:
        pytest.skip(f"{dev} has no shader-f16")
    M, K, N = tile_shape(variant)
    a, b, wa, wb = operands(rng, M, K, N, layout, dtype=np.float16)
    with mm.force_variant(variant):
        assert plan_of(wa, wb).variant == variant
        got = (wa @ wb).numpy()
    assert got.dtype == np.float16
    assert rel_err(got, a.astype(np.float64) @ b.astype(np.float64)) < 1e-2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_general_kernel_any_layout(rng, layout):
    a, b, wa, wb = operands(rng, 128, 48, 64, layout)
    with mm.force_variant("general"):
        assert plan_of(wa, wb).variant == "general"
        got = (wa @ wb).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


def test_choice_prefers_large_tiles_when_the_gpu_fills(dev):
    big = wgpar.empty((2048, 64))
    assert plan_of(big, wgpar.empty((64, 2048))).variant == LARGEST
    assert plan_of(wgpar.empty((256, 64)), wgpar.empty((64, 256))).variant == SMALLEST
    assert plan_of(wgpar.empty((128, 64)), wgpar.empty((64, 64))).variant == SMALLEST


@pytest.mark.parametrize("layout", LAYOUTS)
def test_k_contiguous_operands_load_blocks_from_enough_workgroups(dev, layout):
    """The launch's kernel loads row-major A / transposed B in 4 x 4 blocks exactly when the grid has
    _BLOCKS_FROM workgroups or more (nothing to block when neither operand is contiguous along k)."""
    t = mm.TILINGS[LARGEST]
    for rows, want in ((mm._BLOCKS_FROM // (2048 // t.bn) * t.bm, True), (256, False)):
        wa = wgpar.empty((64, rows)).T if layout[0] == "t" else wgpar.empty((rows, 64))
        wb = wgpar.empty((2048, 64)).T if layout[1] == "t" else wgpar.empty((64, 2048))
        with mm.force_variant(LARGEST):
            p = plan_of(wa, wb)
            kspec = mm._fast_launches(p, t, wgpar.float32, 0)[0]
        groups = -(-rows // t.bm) * (2048 // t.bn)
        assert (groups >= mm._BLOCKS_FROM) == want
        loads = dict(kspec.fills)["LOAD"]
        assert ("pa0_3" in loads) == (want and layout[0] == "n")
        assert ("pb0_3" in loads) == (want and layout[1] == "t")


def test_choice_linear_layer_uses_fast_path_on_transposed_weight(dev):
    x = wgpar.empty((2, 1024, 64))  # batch of activations against a shared weight [out, in]
    w = wgpar.empty((256, 64))
    p = mm.plan(x, wgpar.ops.expand(w.T, (2, 64, 256)))
    assert p.variant in FAST and (p.nb, p.M, p.b_layout) == (1, 2048, "t")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(132, 64, 128), (128, 64, 100), (128, 40, 128), (100, 44, 36), (4, 12, 8)])
@pytest.mark.parametrize("variant", FAST)
def test_fast_edges(blocks, rng, variant, layout, shape):
    """Shapes that are not multiples of the tile: clamped loads, zeros past K, guarded stores."""
    M, K, N = shape
    a, b, wa, wb = operands(rng, M, K, N, layout)
    with mm.force_variant(variant):
        p = plan_of(wa, wb)
        assert (p.variant, p.edge) == (variant, True)
        got = (wa @ wb).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("split", [2, 4])
def test_split_k(blocks, rng, layout, split):
    """K in parts, each a batch entry of a partial product, summed after (the weight-gradient shape)."""
    a, b, wa, wb = operands(rng, 64, 4 * 16 * split, 128, layout)
    with mm.force_variant(SMALLEST, split=split):
        p = plan_of(wa, wb)
        assert (p.variant, p.split) == (SMALLEST, split)
        got = (wa @ wb).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_k_sums_its_parts_in_one_remembered_dispatch(dev, rng, monkeypatch, dtype):
    """A split product is two dispatches on every call, the partial products and their sum (remembered with
    the product's recipe, not planned again each call), the sum accumulated in float32 and rounded once."""
    if dtype == "float16" and not dev.has_f16:
        pytest.skip("no shader-f16")
    a = rng.standard_normal((64, 256)).astype(dtype)
    b = rng.standard_normal((256, 192)).astype(dtype)
    wa, wb = wgpar.tensor(a), wgpar.tensor(b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    calls = record_dispatches(monkeypatch)
    planned = []
    reduce_mod = sys.modules["wgpar.ops.reduce"]
    col_plan = reduce_mod._col_plan
    monkeypatch.setattr(reduce_mod, "_col_plan", lambda *args: (planned.append(args), col_plan(*args))[1])
    with mm.force_variant(SMALLEST, split=4):
        assert plan_of(wa, wb).split == 4
        for _ in range(3):
            calls.clear()
            got = wa @ wb
            assert calls == ["matmul_fast", "reduce_cols"]
            assert len(planned) <= 1, "the parts' sum was planned again on a later call"
            assert got.dtype is getattr(wgpar, dtype) and got.shape == (64, 192)
            assert rel_err(got.numpy(), want) < (1e-3 if dtype == "float16" else 1e-5)


def test_split_k_choice(dev):
    """A GPU splits a product with few tiles and a long K; a CPU adapter never does; nor a batch."""
    p = plan_of(wgpar.empty((64, 8192)), wgpar.empty((8192, 128)))
    if dev.adapter_type.lower() == "cpu":
        assert p.split == 1
    else:
        assert (p.variant, p.split) == (LARGEST, mm._SPLIT_MAX)
    assert plan_of(wgpar.empty((64, 1024)), wgpar.empty((1024, 128))).split == 1  # K too short to split
    with mm.force_variant(None, split=3):  # 3 parts of K 64 are not multiples of BK: not taken
        assert plan_of(wgpar.empty((64, 64)), wgpar.empty((64, 128))).split == 1
    with mm.force_variant(None, split=2):
        assert plan_of(wgpar.empty((2, 64, 64)), wgpar.empty((2, 64, 128))).split == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("shape", [None, (100, 44, 36)])
def test_matmul_bias_epilogue(blocks, rng, variant, layout, shape):
    """The bias added as the fast kernel stores its tiles: one dispatch, equal to product + bias."""
    M, K, N = shape or tile_shape(variant)
    a, b, wa, wb = operands(rng, M, K, N, layout)
    bias = rng.standard_normal(N + 4).astype(np.float32)
    wbias = wgpar.tensor(bias)[4:]  # a view at a whole-vec4 offset
    with mm.force_variant(variant):
        assert plan_of(wa, wb).variant == variant
        n0 = wa.device.num_dispatches
        got = mm.matmul_bias(wa, wb, wbias)
        assert wa.device.num_dispatches - n0 == 1
    assert rel_err(got.numpy(), a.astype(np.float64) @ b + bias[4:]) < 1e-5


@pytest.mark.parametrize("case", ["general", "odd offset", "float16"])
def test_matmul_bias_other_paths(rng, dev, case):
    """Where the epilogue does not apply (the general kernel, a bias off a vec4 boundary) or in float16."""
    M, K, N = (33, 10, 7) if case == "general" else (64, 32, 64)
    dt = np.float16 if case == "float16" else np.float32
    if dt == np.float16 and not dev.has_f16:
        pytest.skip("no shader-f16 on this adapter")
    a, b, wa, wb = operands(rng, M, K, N, "nt", dtype=dt)
    bias = rng.standard_normal(N + 1).astype(dt)
    wbias = wgpar.tensor(bias)[1:] if case == "odd offset" else wgpar.tensor(bias[:N])
    want = a.astype(np.float64) @ b.astype(np.float64) + (bias[1:] if case == "odd offset" else bias[:N])
    got = mm.matmul_bias(wa, wb, wbias)
    assert got.dtype is wa.dtype
    assert rel_err(got.numpy(), want) < (2e-3 if dt == np.float16 else 1e-5)


@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("shape", [None, (100, 44, 36), (67, 20, 12)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_rows_epilogue(blocks, rng, dev, variant, shape, dtype):
    """A [M, K] shared by the batch of B [3, K, N] plus a bias per row (a 1x1 convolution), the bias added
    as the fast kernel stores its tiles at an odd element offset: one dispatch, equal to product + bias."""
    if dtype == np.float16 and not dev.has_f16:
        pytest.skip("no shader-f16 on this adapter")
    M, K, N = shape or tile_shape(variant)
    a = rng.standard_normal((M, K)).astype(dtype)
    b = rng.standard_normal((3, K, N)).astype(dtype)
    bias = rng.standard_normal(M + 3).astype(dtype)
    wdt = wgpar.float16 if dtype == np.float16 else wgpar.float32
    wa, wb, wbias = (wgpar.tensor(x, dtype=wdt) for x in (a, b, bias))
    with mm.force_variant(variant):
        n0 = dev.num_dispatches
        got = mm.matmul_rows(wa, wb, wbias[3:])
        assert dev.num_dispatches - n0 == 1
    want = a.astype(np.float64) @ b.astype(np.float64) + bias[3:, None].astype(np.float64)
    assert got.dtype is wdt and got.shape == (3, M, N)
    assert rel_err(got.numpy(), want) < (2e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("case", ["general", "long K", "mixed dtypes"])
def test_matmul_rows_other_paths(rng, case, monkeypatch):
    """Where one dispatch cannot do it (N not in vec4s: the general kernel; K past the loop limit: products
    summed over parts; a float16 bias on float32 operands) it is a product and an add, with the same values."""
    M, K, N = (9, 10, 7) if case == "general" else (16, 40, 8)
    if case == "long K":
        monkeypatch.setattr(mm, "_MAX_K", 16)
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((2, K, N)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float16 if case == "mixed dtypes" else np.float32)
    got = mm.matmul_rows(wgpar.tensor(a), wgpar.tensor(b), wgpar.tensor(bias, dtype=wgpar.float16 if
                                                                           case == "mixed dtypes" else wgpar.float32))
    assert got.dtype is wgpar.float32
    assert rel_err(got.numpy(), a.astype(np.float64) @ b + bias[:, None].astype(np.float64)) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,split", [((129, 512, 10), 8), ((10, 96, 515), 4), ((3, 34, 5), 2)])
def test_general_split_k(rng, layout, shape, split):
    """The general kernel (N or K not whole vec4s) with K in parts, summed after: a classifier's shapes."""
    M, K, N = shape
    a, b, wa, wb = operands(rng, M, K, N, layout)
    with mm.force_variant("general", split=split):
        p = plan_of(wa, wb)
        assert (p.variant, p.split) == ("general", split)
        got = (wa @ wb).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


def test_general_split_k_choice(dev):
    """On a GPU, few general tiles over a long K are split (parts of at least 32; float16 too, its parts
    float32); a CPU adapter, a batch and a K without a power-of-two factor are not."""
    p = plan_of(wgpar.empty((128, 512)), wgpar.empty((512, 10)))
    assert p.variant == "general"
    assert p.split == (1 if dev.adapter_type.lower() == "cpu" else 16)
    assert plan_of(wgpar.empty((128, 511)), wgpar.empty((511, 10))).split == 1
    assert plan_of(wgpar.empty((2, 128, 512)), wgpar.empty((2, 512, 10))).split == 1
    with mm.force_variant("general", split=3):
        assert plan_of(wgpar.empty((128, 512)), wgpar.empty((512, 10))).split == 1  # 3 does not divide 512
    if dev.has_f16:
        half = plan_of(wgpar.empty((128, 512), dtype=wgpar.float16), wgpar.empty((512, 10), dtype=wgpar.float16))
        assert half.split == p.split


@pytest.mark.parametrize("shapes", [
    ((128, 64), (64, 99)),     # N not a multiple of 4: no vec4 stores
    ((128, 42), (42, 128)),    # K
    ((1, 64), (64, 128)),      # a row vector
    ((64,), (64, 128)),        # 1-d operand
])
def test_awkward_sizes_fall_back_to_general(rng, shapes):
    sa, sb = shapes
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    wa, wb = wgpar.tensor(a), wgpar.tensor(b)
    if wa.ndim == 2 and sa[0] > 1:
        assert plan_of(wa, wb).variant == "general"
    assert rel_err((wa @ wb).numpy(), a.astype(np.float64) @ b) < 1e-5


def test_unaligned_views_fall_back(rng):
    base = rng.standard_normal((128, 70)).astype(np.float32)
    b = rng.standard_normal((64, 128)).astype(np.float32)
    wbase, wb = wgpar.tensor(base), wgpar.tensor(b)
    for lo in (1, 2, 4):  # offsets 1 and 2 break vec4 alignment; rows of 70 floats too
        wa = wbase[:, lo:lo + 64]
        assert plan_of(wa, wb).variant == "general"
        assert rel_err(wa.matmul(wb).numpy(), base[:, lo:lo + 64].astype(np.float64) @ b) < 1e-5
    wide = rng.standard_normal((128, 72)).astype(np.float32)  # rows of 72: vec4-aligned slice at 4
    wa = wgpar.tensor(wide)[:, 4:68]
    assert plan_of(wa, wb).variant in FAST
    assert rel_err(wa.matmul(wb).numpy(), wide[:, 4:68].astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("types", [("float32", "float16"), ("float16", "float32")])
def test_mixed_dtypes_run_the_tiled_kernel(blocks, rng, dev, variant, layout, types):
    """float32 @ float16 (either side, any layout) runs the tiled kernel, each operand loaded in its own type:
    a float32 result within float32 rounding of the float64 product of the same values."""
    if not dev.has_f16:
        pytest.skip(f"{dev} has no shader-f16")
    M, K, N = tile_shape(variant)
    wa = operands(rng, M, K, N, layout, np.dtype(types[0]))[2]
    wb = operands(rng, M, K, N, layout, np.dtype(types[1]))[3]
    assert (wa.dtype.name, wb.dtype.name) == types
    with mm.force_variant(variant):
        assert plan_of(wa, wb).variant == variant
        got = (wa @ wb).numpy()
    assert got.dtype == np.float32
    want = wa.numpy().astype(np.float64) @ wb.numpy().astype(np.float64)
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("bias", [None, "float32", "float16"])
def test_matmul_rows_stores_float16_from_float32_operands(rng, dev, bias):
    """A float16 result of float32 operands (autocast's 1x1 convolution), a bias of either type added: one
    dispatch, the float32 product rounded once."""
    if not dev.has_f16:
        pytest.skip(f"{dev} has no shader-f16")
    M, K, N = 20, 36, 52
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((3, K, N)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    wbias = None
    if bias:
        c = rng.standard_normal(M).astype(bias)
        wbias, want = wgpar.tensor(c, dtype=getattr(wgpar, bias)), want + c[:, None].astype(np.float64)
    n0 = dev.num_dispatches
    got = mm.matmul_rows(wgpar.tensor(a), wgpar.tensor(b), wbias, wgpar.float16)
    assert dev.num_dispatches - n0 == 1
    assert got.dtype is wgpar.float16 and got.shape == (3, M, N)
    assert rel_err(got.numpy(), want) < 1e-3  # float16's rounding of each output (2^-11 of its size)


@pytest.mark.parametrize("layout", ("nn", "tt"))
def test_batched_fast(blocks, rng, layout):
    a, b, wa, wb = operands(rng, 64, 32, 64, layout, batch=(3,))
    with mm.force_variant(SMALLEST):
        p = plan_of(wa, wb)
        assert (p.variant, p.nb) == (SMALLEST, 3)
        got = (wa @ wb).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


def test_batch_folded_into_rows_against_shared_weight(rng):
    x = rng.standard_normal((2, 3, 64, 32)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)  # used transposed, as nn.Linear does
    wx, ww = wgpar.tensor(x), wgpar.tensor(w)
    with mm.force_variant(SMALLEST):
        got = (wx @ ww.T).numpy()
    assert rel_err(got, x.astype(np.float64) @ w.T) < 1e-5


def test_broadcast_operand_batch(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)   # shared by every batch entry of b
    b = rng.standard_normal((2, 32, 64)).astype(np.float32)
    with mm.force_variant(SMALLEST):
        got = (wgpar.tensor(a) @ wgpar.tensor(b)).numpy()
    assert rel_err(got, a.astype(np.float64) @ b) < 1e-5


def test_unknown_variant_is_an_error():
    with pytest.raises(ValueError, match="unknown matmul variant"):
        with mm.force_variant("tile7x7"):
            pass


def test_tiling_parse():
    t = mm.Tiling.parse("128x64x8x8x4u")
    assert (t.bm, t.bn, t.bk, t.tm, t.tn, t.unroll, t.double, t.threads) == (128, 64, 8, 8, 4, True, False, 256)
    assert mm.Tiling.parse("64x64x8x4x4ud").double
    with pytest.raises(ValueError):
        mm.Tiling.parse("128x64x8x6x4")


def test_split_k_choice_float16(dev, monkeypatch):
    """On a GPU a product with few tiles and a long K is split in float16 as in float32 (the parts are
    float32, so splitting changes no rounding)."""
    monkeypatch.setattr(dev, "adapter_type", "DiscreteGPU")
    assert plan_of(wgpar.empty((64, 8192)), wgpar.empty((8192, 128))).split == mm._SPLIT_MAX
    half = plan_of(wgpar.empty((64, 8192), dtype=wgpar.float16), wgpar.empty((8192, 128), dtype=wgpar.float16))
    assert half.split == mm._SPLIT_MAX


@pytest.mark.parametrize("variant,N", [(SMALLEST, 128), ("general", 10)])
def test_split_k_float16_rounds_once(blocks, rng, dev, variant, N):
    """float16 split-K: each part's sum stays float32 and the result is rounded to float16 once. The
    first half of K sums to about +1000 and the second to -1000, so a part rounded to float16 (spacing
    0.5 there) would be off by up to 0.25 in a result near 1."""
    if not dev.has_f16:
        pytest.skip("no shader-f16 on this adapter")
    M, K = 64, 128
    a = np.ones((M, K), np.float16)
    b = np.empty((K, N), np.float16)
    b[: K // 2] = (15.75 + 0.1 * rng.random((K // 2, N))).astype(np.float16)
    b[K // 2:] = -15.75
    want = a.astype(np.float64) @ b.astype(np.float64)
    with mm.force_variant(variant, split=2):
        wa, wb = wgpar.tensor(a), wgpar.tensor(b)
        assert plan_of(wa, wb).split == 2
        got = (wa @ wb).numpy()
    assert got.dtype == np.float16
    # Rounded once: within half a float16 spacing of the exact value (plus float32 summation error).
    spacing = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= 0.5 * spacing + 1e-4)


def _lower_operands(rng, n, M, K, N, layout):
    a, b, wa, wb = operands(rng, M, K, N, layout, batch=(n,))
    return a.astype(np.float64), b.astype(np.float64), wa, wb


@pytest.mark.parametrize("variant", FAST)
@pytest.mark.parametrize("layout", ("nn", "nt"))
@pytest.mark.parametrize("shape", [(3, 200, 20, 300), (2, 130, 16, 72), (1, 256, 32, 256), (2, 72, 8, 516)])
def test_matmul_causal_c_gives_the_lower_triangle(blocks, rng, variant, layout, shape):
    """matmul_causal(a, b, "c") (causal attention's scores): every entry j <= i equals a @ b; the tiles past
    the diagonal are skipped. Rows and columns not multiples of the tile, M < N and M > N, a batch."""
    n, M, K, N = shape
    a, b, wa, wb = _lower_operands(rng, n, M, K, N, layout)
    with mm.force_variant(variant):
        assert plan_of(wa, wb).variant == variant
        got = mm.matmul_causal(wa, wb, "c").numpy()
    keep = np.tril(np.ones((M, N), dtype=bool))
    assert rel_err(got[:, keep], (a @ b)[:, keep]) < 1e-5


@pytest.mark.parametrize("which", ["a", "u"])
@pytest.mark.parametrize("variant", ALL_FAST)
@pytest.mark.parametrize("shape", [(3, 200, 204, 20), (2, 130, 72, 200), (1, 256, 256, 64), (2, 70, 300, 8)])
def test_matmul_causal_triangular_a(blocks, rng, extra_tilings, which, variant, shape):
    """matmul_causal(a, b, "a") (P V, dS K: A lower triangular, each tile row's K loop ends past its last
    row) and "u" (P^T dO, dS^T Q: A upper triangular, the loop starts at the tile's first row), on every
    tiling, double-buffered ones too. A holds NaN beyond the tile band (zeros inside it): any read past
    the limit would show."""
    n, M, K, N = shape
    a, b, wa, wb = _lower_operands(rng, n, M, K, N, "nn")
    bm = mm.TILINGS[variant].bm
    i, j = np.indices((M, K))
    if which == "a":
        a = np.where(j <= i, a, np.where(j < (i // bm + 1) * bm, 0.0, np.nan))
    else:
        a = np.where(j >= i, a, np.where(j >= (i // bm) * bm, 0.0, np.nan))
    wa = wgpar.tensor(a.astype(np.float32))
    with mm.force_variant(variant):
        assert plan_of(wa, wb).variant == variant
        got = mm.matmul_causal(wa, wb, which).numpy()
    want = np.nan_to_num(a, nan=0.0) @ b
    assert np.isfinite(got).all() and rel_err(got, want) < 1e-5


def test_matmul_causal_falls_back_and_checks(rng):
    """Where the tiled kernel does not run (K not whole vec4s) the plain product gives the wanted values;
    bad arguments are errors that name the shapes."""
    a, b, wa, wb = _lower_operands(rng, 2, 40, 13, 40, "nn")
    assert plan_of(wa, wb).variant == "general"
    keep = np.tril(np.ones((40, 40), dtype=bool))
    assert rel_err(mm.matmul_causal(wa, wb, "c").numpy()[:, keep], (a @ b)[:, keep]) < 1e-5
    with pytest.raises(ValueError, match="which"):
        mm.matmul_causal(wa, wb, "b")
    with pytest.raises(ValueError, match=r"\(2, 40, 13\)"):
        mm.matmul_causal(wa, wa, "a")


@pytest.mark.parametrize("variant", FAST)
def test_matmul_causal_into_a_slice_and_band(rng, variant):
    """matmul_causal(..., out=) writes each group's product into its slice of a larger result (the tiled
    kernel, and the plain product's fallback copied in: K not whole vec4s), which="" the whole product;
    causal_band is the tile rows the triangular products read by (0 for the plain product); an out of
    the wrong shape or dtype is an error naming both."""
    a, b, wa, wb = _lower_operands(rng, 4, 72, 36, 40, "nn")
    whole = wgpar.empty((5, 72, 40))
    with mm.force_variant(variant):
        for g0, n in ((0, 2), (2, 2)):
            got = mm.matmul_causal(mm.narrow(wa, 0, g0, n), mm.narrow(wb, 0, g0, n), "",
                                   mm.narrow(whole, 0, g0 + 1, n))
            assert got._storage is whole._storage
        assert mm.causal_band(wa, wb) == mm.TILINGS[variant].bm
    assert rel_err(whole.numpy()[1:], a @ b) < 1e-5
    a2, b2, wa2, wb2 = _lower_operands(rng, 2, 40, 13, 40, "nn")
    assert mm.causal_band(wa2, wb2) == 0
    out = wgpar.empty((3, 40, 40))
    mm.matmul_causal(wa2, wb2, "", mm.narrow(out, 0, 1, 2))
    assert rel_err(out.numpy()[1:], a2 @ b2) < 1e-5
    with pytest.raises(ValueError, match=r"float32 \(2, 40, 40\).*\(2, 40, 39\)"):
        mm.matmul_causal(wa2, wb2, "", wgpar.empty((2, 40, 39)))


@pytest.mark.parametrize("with_bias", [False, True])
def test_wide_tile_for_a_at_w_t_on_nvidia(rng, dev, monkeypatch, with_bias):
    """On an NVIDIA GPU a float32 a @ w.T (both operands contiguous along k) whose 128 x 128 grid is large
    takes the wide two-slab tile (matmul._WIDE); a @ b, float16, a shape off the tile, a small grid and other
    adapters keep TILINGS' choice. F.linear's values (a batch folded into M, with and without a bias) against
    float64: the two-slab loop of an odd and an even number of slices."""
    monkeypatch.setattr(dev, "kind", "nvidia")
    monkeypatch.setattr(mm, "_WIDE_FROM", 4)  # 6 workgroups below: the rule without a huge product
    if not mm._fits(dev, mm._WIDE):  # lavapipe's 32 KiB of workgroup memory: the same tile, 8-deep slices
        monkeypatch.setattr(mm, "_WIDE", mm.Tiling(128, 128, 8, 8, 8, unroll=True, double=True))
    mm._RECIPES.clear()
    try:
        w32 = lambda *s: wgpar.tensor(rng.standard_normal(s).astype(np.float32))  # noqa: E731
        tiles = []  # the tile of every launch planned from here on
        real = mm._fast_launches
        monkeypatch.setattr(mm, "_fast_launches",
                            lambda p, t, *a, **kw: (tiles.append(t.name), real(p, t, *a, **kw))[1])
        for K in (48, 64):  # an odd and an even number of slices (of 16, or 8)
            x, w, b = rng.standard_normal((2, 128, K)), rng.standard_normal((384, K)), rng.standard_normal(384)
            wx, ww, wb = (wgpar.tensor(v.astype(np.float32)) for v in (x, w, b))
            tiles.clear()
            got = wgpar.nn.functional.linear(wx, ww, wb if with_bias else None).numpy()
            assert tiles == [mm._WIDE.name]
            want = x @ w.T + (b if with_bias else 0)
            assert rel_err(got, want) < 1e-5
        assert plan_of(w32(256, 48), w32(48, 384)).variant != mm._WIDE.name  # a @ b
        assert plan_of(w32(250, 48), w32(384, 48).T).variant != mm._WIDE.name  # M off the tile
        assert plan_of(w32(128, 48), w32(128, 48).T).variant != mm._WIDE.name  # one workgroup
        if dev.has_f16:
            h = wgpar.empty((256, 48), dtype=wgpar.float16)
            assert plan_of(h, wgpar.empty((384, 48), dtype=wgpar.float16).T).variant != mm._WIDE.name
        monkeypatch.setattr(dev, "kind", "amd")
        assert plan_of(w32(256, 48), w32(384, 48).T).variant != mm._WIDE.name
    finally:
        mm._RECIPES.clear()
