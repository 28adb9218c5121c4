"""scaled_dot_product_attention: the fused kernels and the reference path against a float64 NumPy
attention with analytic gradients (itself checked against finite differences) and, where installed, torch's
SDPA in float64; long sequences split into chunks; NaN; memory without [T, T]."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F
from wgpar.ops import attention as A

from . import gradcheck
from .helpers import np_sdpa, rel_err


def _problem(shape_q, shape_k, rng):
    """q, k, v and an upstream gradient g, float32."""
    return [rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_k, shape_k, shape_q)]


def _run(arrays, causal, dtype=wgpar.float32, mask=None, path=None):
    """wgpar's output and its (q, k, v) leaves, after backward with the problem's g."""
    q, k, v, g = arrays
    Q, K, V = (wgpar.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v))
    with A.force_path(path):
        y = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, is_causal=causal)
    y.backward(wgpar.tensor(g, dtype=dtype))
    return y, (Q, K, V)


def _want(reference, arrays, causal, mask=None):
    """(output, (dq, dk, dv)) in float64: NumPy's (reference None) or torch's SDPA."""
    q, k, v, g = arrays
    if reference is None:
        return np_sdpa(q, k, v, g, mask=mask, causal=causal)
    torch = reference
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    tmask = None if mask is None else torch.tensor(mask if mask.dtype == bool else mask.astype(np.float64))
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, is_causal=causal)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    return ty.detach().numpy(), tuple(t.grad.numpy() for t in (tq, tk, tv))


def _check(y, ins, want, tol=2e-5):
    want_y, want_grads = want
    assert y.shape == want_y.shape
    assert rel_err(y.numpy(), want_y) < tol, "output"
    for name, t, w in zip("qkv", ins, want_grads):
        assert t.grad.shape == t.shape and t.grad.dtype is t.dtype
        assert rel_err(t.grad.numpy(), w) < tol, f"grad {name}"


# (query shape, key shape): awkward lengths, L != S both ways (causal is top-left aligned, as torch's),
# 3-d operands, head dims 4..64.
CASES = [((2, 3, 37, 16), (2, 3, 37, 16)), ((1, 2, 70, 32), (1, 2, 45, 32)), ((2, 1, 19, 8), (2, 1, 80, 8)),
         ((1, 2, 33, 64), (1, 2, 33, 64)), ((3, 21, 4), (3, 29, 4))]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shapes", CASES, ids=lambda s: "x".join(map(str, s[0])) + "-" + str(s[1][-2]))
def test_fused_matches(shapes, causal, rng, reference):
    arrays = _problem(*shapes, rng)
    y, ins = _run(arrays, causal, path="fused")
    assert y.grad_fn.name in ("scaled_dot_product_attention", "squeeze")
    _check(y, ins, _want(reference, arrays, causal))


def test_fused_float16_accumulates_in_float32(rng, reference):
    """float16 operands (autocast's case): only float16 rounding of inputs and outputs remains."""
    arrays = _problem((2, 2, 50, 32), (2, 2, 50, 32), rng)
    y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert y.dtype is wgpar.float16
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)


@pytest.mark.parametrize("mask", ["causal", "bool", "float", None])
def test_numpy_reference_gradients_match_finite_differences(mask, rng):
    """The analytic gradients every test here compares with: against central differences of the same
    float64 forward, with each kind of mask (L != S)."""
    q, k, v, g = (rng.standard_normal(s) for s in ((2, 5, 3), (2, 6, 3), (2, 6, 3), (2, 5, 3)))
    m = {"bool": rng.random((5, 6)) > 0.3, "float": rng.standard_normal((5, 6))}.get(mask)
    if mask == "bool":
        m[:, 0] = True
    _, grads = np_sdpa(q, k, v, g, mask=m, causal=mask == "causal")
    want = gradcheck.numeric_grad(lambda *a: np_sdpa(*a, mask=m, causal=mask == "causal"), [q, k, v], g)
    for name, got, w in zip("qkv", grads, want):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-8, err_msg=f"grad {name}")


@pytest.mark.parametrize("causal", [True, False])
def test_fused_gradients_match_finite_differences(causal, rng):
    """Against central differences of the float64 NumPy attention."""
    arrays = [rng.standard_normal((1, 2, 5, 4)) for _ in range(3)]
    with A.force_path("fused"):
        gradcheck.check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                        lambda q, k, v: np_sdpa(q, k, v, causal=causal), arrays, rng)


@pytest.mark.parametrize("tiles", [{"fwd": "16x16", "dq": "16x16", "dkv": "16x16", "cv": 2},
                                   {"fwd": "32x16", "dq": "16x32", "dkv": "32x16", "cv": 4},
                                   {"fwd": "16x32", "dq": "32x16", "dkv": "16x32", "cv": 1},
                                   {"fwd": "64x32", "dq": "32x32", "dkv": "32x32", "cv": 2}], ids=str)
def test_every_tile_shape_matches(tiles, rng, reference):
    """The tiles and output layouts a GPU picks (more rows or columns per thread; an H200 runs GPT-2's
    attention with fwd 64x32, dq and dkv 32x32, 2 columns per thread) on a problem lavapipe picks others for."""
    arrays = _problem((1, 2, 45, 16), (1, 2, 45, 16), rng)
    with A.force_tiles(**tiles):
        y, ins = _run(arrays, True, path="fused")
    _check(y, ins, _want(reference, arrays, True))


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_keys_and_queries_match(causal, rng, monkeypatch, reference):
    """With a small loop budget every kernel splits its loop into several dispatches: the forward merges
    its chunks by their logsumexps, the gradient chunks add up (lavapipe's case for long sequences)."""
    monkeypatch.setattr(A, "MAX_LOOP", 200)
    dev = wgpar.device(0)
    # Looped inner blocks, as lavapipe runs them: a GPU's unrolled blocks count almost no loop iterations.
    with A.force_tiles(cv=1, unroll=False, fwd="32x16", dq="32x16", dkv="32x16"):
        assert len(A.chunks("fwd", A.pick("fwd", dev, 8, 70, 90), 2, 90)) >= 3
        assert len(A.chunks("dq", A.pick("dq", dev, 8, 70, 90), 2, 90)) >= 2
        assert len(A.chunks("dkv", A.pick("dkv", dev, 8, 90, 70), 2, 70)) >= 2
        arrays = _problem((2, 1, 70, 8), (2, 1, 90, 8), rng)
        y, ins = _run(arrays, causal, path="fused")
    _check(y, ins, _want(reference, arrays, causal))


def test_long_sequence_within_lavapipe_loop_limit(rng):
    """60000 keys: one invocation walking them all passes lavapipe's 65535 loop iterations and silently
    stops early there (measured: wrong from ~50000 keys); the host splits the walk and stays exact."""
    q, k, v = (rng.standard_normal((1, n, 4)).astype(np.float32) for n in (16, 60000, 60000))
    y = F.scaled_dot_product_attention(*(wgpar.tensor(a) for a in (q, k, v))).numpy()
    assert rel_err(y, np_sdpa(q, k, v)) < 5e-5  # float32 sums over 60000 keys (1.4e-5 seen on an H200)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_reference_path_masks_match(kind, rng, reference):
    """Masks run the composed reference path (matmul, mask, softmax, matmul), gradients included."""
    L, S = 9, 13
    mask = rng.random((L, S)) > 0.3
    mask[:, 0] = True  # no fully masked row (tests/test_attention_masks.py has those)
    if kind == "float":
        mask = np.where(mask, 0.0, -1e4).astype(np.float32) + rng.standard_normal((L, S)).astype(np.float32)
    arrays = _problem((2, 3, L, 6), (2, 3, S, 6), rng)
    y, ins = _run(arrays, False, mask=mask)
    assert y.grad_fn.name == "matmul"
    _check(y, ins, _want(reference, arrays, False, mask))


def test_reference_and_fused_agree(rng):
    arrays = _problem((2, 2, 24, 16), (2, 2, 24, 16), rng)
    y1, ins1 = _run(arrays, True, path="reference")
    y2, ins2 = _run(arrays, True, path="fused")
    np.testing.assert_allclose(y1.numpy(), y2.numpy(), rtol=1e-5, atol=1e-6)
    for a, b in zip(ins1, ins2):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_nan_reaches_the_rows_that_see_it(rng):
    """A NaN query makes its row NaN; a NaN key reaches exactly the causal rows that can see it (as in
    torch); the gradients carry both (where a masked pair meets a NaN, 0 * NaN may spread it further, as
    torch's math backend spreads it to every gradient)."""
    q, k, v = (rng.standard_normal((1, 1, 20, 8)).astype(np.float32) for _ in range(3))
    q[0, 0, 3, 2] = np.nan
    k[0, 0, 12, 5] = np.nan
    Q, K, V = (wgpar.tensor(a, requires_grad=True) for a in (q, k, v))
    with A.force_path("fused"):
        y = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    y.sum().backward()
    rows = np.isnan(y.numpy()[0, 0]).any(-1)
    assert rows.tolist() == [i == 3 or i >= 12 for i in range(20)]
    gq = np.isnan(Q.grad.numpy()[0, 0]).any(-1)
    assert gq[3] and gq[12:].all()
    assert np.isnan(K.grad.numpy()[0, 0, 12]).any() and np.isnan(V.grad.numpy()[0, 0, :4]).any()


def _attention_peak(dev, bh: int, T: int, D: int) -> int:
    """Bytes allocated at the peak of a causal forward + backward over [1, bh, T, D], above the operands."""
    rng = np.random.default_rng(0)
    Q, K, V = (wgpar.tensor(rng.standard_normal((1, bh, T, D)).astype(np.float32), requires_grad=True)
               for _ in range(3))
    g = wgpar.tensor(rng.standard_normal((1, bh, T, D)).astype(np.float32))
    wgpar.synchronize(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(dev)
    y = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    y.backward(g)
    return wgpar.memory_stats(dev)["peak_allocated_bytes"] - base


def test_fused_memory_has_no_score_matrix(dev):
    """Causal attention over T = 1024 with the dQ kernel: forward + backward allocate O(T * D), never a
    [T, T] matrix."""
    T, D = 1024, 16
    with A.force_ds_path(False), A.force_matmul_backward(False):
        peak = _attention_peak(dev, 1, T, D)
    assert peak <= 12 * T * D * 4, f"{peak} bytes at peak"  # out, lse, delta, 3 grads, ...
    assert peak < T * T * 4 // 8  # a score matrix alone would be 4 MiB


def test_ds_path_memory_is_one_group(dev, monkeypatch):
    """With dQ = dS K, the backward holds one group's dS at a time: DS_BYTES (here one head's [T, T]) over
    O(T * D), not every head's."""
    T, D, heads = 512, 16, 4
    monkeypatch.setattr(A, "DS_BYTES", T * T * 4)
    with A.force_tiles(dkv="16x16r4t4"), A.force_ds_path(True), A.force_matmul_backward(False):
        peak = _attention_peak(dev, heads, T, D)
    assert T * T * 4 <= peak <= T * T * 4 + 16 * heads * T * D * 4, f"{peak} bytes at peak"


def test_matmul_backward_memory_is_one_group(dev, monkeypatch):
    """The backward as matmuls holds one group's S and dP at a time: DS_BYTES in all (here one head's two
    [T, T] buffers) over O(T * D), not every head's."""
    T, D, heads = 512, 16, 4
    monkeypatch.setattr(A, "DS_BYTES", 2 * T * T * 4)
    with A.force_matmul_backward(True):
        peak = _attention_peak(dev, heads, T, D)
    assert 2 * T * T * 4 <= peak <= 2 * T * T * 4 + 16 * heads * T * D * 4, f"{peak} bytes at peak"


def test_errors(rng):
    x = wgpar.tensor(rng.standard_normal((1, 2, 5, 8)).astype(np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        F.scaled_dot_product_attention(x, x[:, :, :, :4], x)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=np.ones((5, 5), bool), is_causal=True)
    odd = wgpar.tensor(rng.standard_normal((1, 2, 5, 6)).astype(np.float32))
    with A.force_path("fused"), pytest.raises(ValueError, match="head_dim 6"):
        F.scaled_dot_product_attention(odd, odd, odd)
    with pytest.raises(TypeError, match="must be a wgpar.Tensor"):
        F.scaled_dot_product_attention(x, np.zeros((1, 2, 5, 8)), x)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cv", [1, 2, 4])
def test_unrolled_blocks_and_column_split_match(cv, causal, rng, reference):
    """What a GPU runs (straight-line inner blocks, 8-column tiles, cv threads sharing a row's output
    columns), here on lavapipe, with L != S."""
    arrays = _problem((1, 2, 45, 32), (1, 2, 38, 32), rng)
    with A.force_tiles(cv=cv, unroll=True, fwd="64x8", dq="64x8", dkv="32x8"):
        y, ins = _run(arrays, causal, path="fused")
    _check(y, ins, _want(reference, arrays, causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tile", ["16x16r4t4", "32x32r4t4", "64x32r4t4"])
def test_register_tiled_forward_matches(tile, causal, rng, reference):
    """The forward a GPU with subgroups runs (4 rows per thread, TK lanes sharing them, row maxima and
    sums reduced by subgroup shuffles), here on lavapipe, with L != S and ragged tiles."""
    arrays = _problem((2, 2, 45, 16), (2, 2, 38, 16), rng)
    with A.force_tiles(fwd=tile):
        assert A.pick("fwd", wgpar.device(0), 16).rm == 4
        y, ins = _run(arrays, causal, path="fused")
    _check(y, ins, _want(reference, arrays, causal))


def test_register_tiled_forward_float16(rng, reference):
    arrays = _problem((2, 2, 50, 32), (2, 2, 50, 32), rng)
    with A.force_tiles(fwd="32x16r4t4"):
        y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert y.dtype is wgpar.float16
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_register_tiled_float16_forward_and_backward(causal, rng, reference):
    """Every register-tiled kernel (what a GPU runs) with float16 inputs: forward, dQ and dK / dV fused,
    L != S and ragged tiles; float32 accumulation leaves only float16 rounding of inputs and outputs."""
    arrays = _problem((2, 2, 45, 32), (2, 2, 38, 32), rng)
    with A.force_tiles(fwd="32x16r4t4", dq="16x16r4t4", dkv="16x16r4t4"), A.force_ds_path(False), \
            A.force_matmul_backward(False):
        assert all(A.pick(kind, wgpar.device(0), 32).rm == 4 for kind in ("fwd", "dq", "dkv"))
        y, ins = _run(arrays, causal, dtype=wgpar.float16, path="fused")
    assert y.dtype is wgpar.float16 and all(t.grad.dtype is wgpar.float16 for t in ins)
    _check(y, ins, _want(reference, arrays, causal), tol=3e-3)


@pytest.mark.parametrize("ds", [False, True])
@pytest.mark.parametrize("walk_f32", [False, True])
def test_register_tiled_float16_walks_float32_copies(walk_f32, ds, rng, reference, monkeypatch):
    """float16 operands whose K, V (forward) and Q, dO (dK / dV) are cast to float32 before the
    register-tiled kernels walk them (many workgroups a head), or walked as float16: both match the
    reference, from strided views of one packed [B, T, 3, H, D] tensor as a GPT's q, k, v are."""
    b, t, h, d = 2, 41, 2, 32
    qkv = rng.standard_normal((b, t, 3, h, d)).astype(np.float32)
    g = rng.standard_normal((b, h, t, d)).astype(np.float32)
    arrays = [np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3)] + [g]
    casts = []
    f32 = A._f32
    monkeypatch.setattr(A, "_f32", lambda x: casts.append(x.dtype) or f32(x))
    monkeypatch.setattr(A, "WALK_F32_BLOCKS", 1 if walk_f32 else 10 ** 9)
    packed = wgpar.tensor(qkv, dtype=wgpar.float16, requires_grad=True)
    with A.force_tiles(fwd="16x16r4t4", dq="16x16r4t4", dkv="16x16r4t4"), A.force_ds_path(ds), \
            A.force_matmul_backward(False), A.force_matmul_forward(False), A.force_path("fused"):
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(wgpar.tensor(g, dtype=wgpar.float16))
    assert (wgpar.float16 in casts) == walk_f32  # the float16 operands were (or were not) cast
    want_y, want_grads = _want(reference, arrays, True)
    assert rel_err(y.numpy(), want_y) < 3e-3
    grad = packed.grad.numpy().astype(np.float64)
    for i, (name, w) in enumerate(zip("qkv", want_grads)):
        assert rel_err(grad[:, :, i].transpose(0, 2, 1, 3), w) < 3e-3, f"grad {name}"


def test_register_tiled_forward_nan_and_chunks(rng, monkeypatch):
    """A NaN key makes exactly the rows that see it NaN; a small loop budget chunks the keys and the
    chunks merge to the unchunked result."""
    arrays = _problem((1, 2, 40, 16), (1, 2, 40, 16), rng)
    q, k, v = (wgpar.tensor(a) for a in arrays[:3])
    with A.force_tiles(fwd="16x16r4t4"), A.force_path("fused"):
        whole = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
        monkeypatch.setattr(A, "MAX_LOOP", 60)
        assert len(A.chunks("fwd", A.pick("fwd", wgpar.device(0), 16), 4, 40)) >= 2
        chunked = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
        monkeypatch.undo()
        bad = arrays[1].copy()
        bad[0, 1, 7, 3] = np.nan
        y = F.scaled_dot_product_attention(q, wgpar.tensor(bad), v, is_causal=True).numpy()
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)
    assert np.isnan(y[0, 1, 7:]).all() and not np.isnan(y[0, 1, :7]).any() and not np.isnan(y[0, 0]).any()


def test_register_tiled_forward_is_a_gpu_rule():
    """pick gives the register-tiled forward only where subgroups certainly hold its lanes (a GPU with
    the subgroup feature), never to lavapipe's looped path."""
    dev = wgpar.device(0)
    assert A.pick("fwd", dev, 64).rm == (4 if dev.adapter_type != "CPU" and A.subgroup_lanes(dev) >= 4 else 1)
    for kind in ("dq", "dkv"):
        assert A.pick(kind, dev, 64).rm == A.pick("fwd", dev, 64).rm


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tiles", [{"dq": "16x16r4t4", "dkv": "16x16r4t4"}, {"dq": "64x16r4t4", "dkv": "32x32r4t4"},
                                   {"dq": "32x32r4t4", "dkv": "16x32r4t4"}], ids=lambda t: t["dq"] + "-" + t["dkv"])
def test_register_tiled_backward_matches(tiles, causal, rng, reference):
    """The gradient kernels a GPU with subgroups runs (4 query rows, or 4 key rows, per thread group of
    TK lanes; delta's partial sums met by subgroup shuffles), here on lavapipe, with L != S both ways
    and ragged tiles."""
    for shapes in (((2, 2, 45, 16), (2, 2, 38, 16)), ((1, 2, 21, 32), (1, 2, 50, 32))):
        arrays = _problem(*shapes, rng)
        with A.force_tiles(**tiles):
            assert A.pick("dq", wgpar.device(0), 16).rm == A.pick("dkv", wgpar.device(0), 16).rm == 4
            y, ins = _run(arrays, causal, path="fused")
        _check(y, ins, _want(reference, arrays, causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ds", [False, True])
def test_register_tiled_loops_written_out_match(ds, causal, rng, reference):
    """A GPU's register-tiled kernels: their d and key loops written out (// @unroll, Tile.unrolled), here on
    lavapipe, both backward paths, L != S both ways and ragged tiles; the source has no such loop left."""
    dev = wgpar.device(0)
    tiles = {"fwd": "32x16r4t4d", "dq": "16x32r4t4d", "dkv": "16x16r4t4"}
    for shapes in (((2, 2, 45, 16), (2, 2, 36, 16)), ((1, 2, 21, 32), (1, 2, 52, 32))):
        arrays = _problem(*shapes, rng)
        with A.force_tiles(unroll=True, **tiles), A.force_ds_path(ds):
            for kind in A.KINDS:
                t = A.pick(kind, dev, shapes[0][3])
                assert t.rm == 4 and t.unrolled, kind
                src = A._kernel(kind, t, shapes[0][3] // 4, "f32", "f32", ds_out=ds and kind == "dkv").source()
                assert "for (var d = 0u" not in src and "for (var j = 0u" not in src, kind
            y, ins = _run(arrays, causal, path="fused")
        _check(y, ins, _want(reference, arrays, causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dkv", ["16x16r4t4", "32x32r4t4", "16x32r4t4"])
def test_dq_as_ds_times_k_matches(dkv, causal, rng, reference, monkeypatch):
    """dQ = dS K (a GPU's default): the dK / dV kernel writes dS for groups of (batch, head) pairs (a small
    DS_BYTES forces several, ragged ones), a batched matmul makes dQ; L != S both ways, keys in vec4s;
    query chunks of the dK / dV kernel (a small loop budget) write their rows of dS."""
    dev = wgpar.device(0)
    for shapes, groups in ((((2, 3, 45, 16), (2, 3, 36, 16)), 4), (((1, 2, 21, 32), (1, 2, 52, 32)), 1),
                           (((3, 2, 64, 16), (3, 2, 64, 16)), 3), (((1, 2, 140, 16), (1, 2, 200, 16)), 1)):
        arrays = _problem(*shapes, rng)
        lq, lk = shapes[0][2], shapes[1][2]
        monkeypatch.setattr(A, "DS_BYTES", lq * lk * 4 * (shapes[0][0] * shapes[0][1] // groups))
        with A.force_tiles(dkv=dkv), A.force_ds_path(True):
            assert A._use_ds(dev, A.pick("dkv", dev, shapes[0][3]), lq, lk)
            y, ins = _run(arrays, causal, path="fused")
        _check(y, ins, _want(reference, arrays, causal))
    monkeypatch.setattr(A, "MAX_LOOP", 60)
    arrays = _problem((1, 2, 40, 16), (1, 2, 40, 16), rng)
    with A.force_tiles(dkv=dkv), A.force_ds_path(True):
        assert len(A.chunks("dkv", A.pick("dkv", dev, 16), 4, 40)) >= 2
        y, ins = _run(arrays, causal, path="fused")
    _check(y, ins, _want(reference, arrays, causal))


def test_dq_as_ds_times_k_float16_and_nan(rng, reference):
    """float16 operands through dS K (dS and the product in float32); a NaN key makes the dQ rows that see
    it NaN and leaves other heads alone (rows before it meet it as 0 * NaN in the product, as torch's math
    backend)."""
    arrays = _problem((2, 2, 50, 32), (2, 2, 48, 32), rng)
    with A.force_tiles(dkv="32x16r4t4"), A.force_ds_path(True):
        y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert all(t.grad.dtype is wgpar.float16 for t in ins)
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)
    bad = [a.copy() for a in arrays]
    bad[1][0, 1, 7, 3] = np.nan
    with A.force_tiles(dkv="16x16r4t4"), A.force_ds_path(True):
        _, got = _run(bad, True, path="fused")
    dq = got[0].grad.numpy()
    assert np.isnan(dq[0, 1, 7:]).all() and not np.isnan(dq[0, 0]).any() and not np.isnan(dq[1]).any()


@pytest.mark.parametrize("causal", [True, False])
def test_matmul_forward_matches(causal, rng, reference, monkeypatch):
    """The forward as S = Q K^T, a scaled (causal) softmax in place and O = P V (a GPU's choice at head
    dims above 64), in groups of heads (a small DS_BYTES forces several); L != S both
    ways; its logsumexp feeds both backward paths. Sequences past one 64-row tile: causal products skip
    the tiles past the diagonal (ops/matmul.py matmul_causal)."""
    dev = wgpar.device(0)
    for shapes, groups in ((((2, 3, 37, 16), (2, 3, 45, 16)), 4), (((1, 2, 64, 32), (1, 2, 20, 32)), 1),
                           (((2, 2, 50, 64), (2, 2, 52, 64)), 3), (((1, 2, 150, 16), (1, 2, 136, 16)), 2)):
        arrays = _problem(*shapes, rng)
        lq, lk = shapes[0][2], shapes[1][2]
        monkeypatch.setattr(A, "DS_BYTES", lq * lk * 4 * -(-shapes[0][0] * shapes[0][1] // groups))
        for ds in (False, True):
            with A.force_matmul_forward(True), A.force_ds_path(ds), A.force_tiles(dkv="16x16r4t4"):
                assert A._use_matmul_forward(dev, shapes[0][3], causal, lq, lk)
                y, ins = _run(arrays, causal, path="fused")
            _check(y, ins, _want(reference, arrays, causal))


@pytest.mark.parametrize("causal", [True, False])
def test_matmul_forward_long_rows(causal, rng, reference):
    """The softmax pass over rows longer than its threads keep in registers (SOFTMAX_CACHE vec4s each:
    the rest read again), in vec4s (keys a multiple of 4) and in scalars (not)."""
    span = A.SOFTMAX_TPR * 4 * A.SOFTMAX_CACHE
    for lq, lk in ((70, span + 300), (9, span + 301)):
        arrays = _problem((1, 2, lq, 8), (1, 2, lk, 8), rng)
        with A.force_matmul_forward(True):
            y, ins = _run(arrays, causal, path="fused")
        _check(y, ins, _want(reference, arrays, causal))


def test_matmul_band_past_diagonal(rng, monkeypatch):
    """A causal row's zeros past its limit (P in the forward) are written only as far as O = P V reads
    (matmul_causal's tile rows, causal_band): scores buffers that held NaNs before (the allocator's cache)
    leave the output and the gradients right. A band too short lets what the buffers held through (the
    check can fail)."""
    dev = wgpar.device(0)
    n, lq, lk, d = 2, 200, 200, 32
    arrays = _problem((1, n, lq, d), (1, n, lk, d), rng)
    want_y, want_grads = np_sdpa(*arrays, causal=True)

    def errors():
        for _ in range(3):  # NaN buffers of the scores' size into the allocator's cache
            del_me = wgpar.full((n, lq, lk), float("nan"), device=dev)
            del del_me
        with A.force_matmul_forward(True), A.force_matmul_backward(True):
            y, ins = _run(arrays, True, path="fused")
        return [rel_err(y.numpy(), want_y)] + [rel_err(t.grad.numpy(), w) for t, w in zip(ins, want_grads)]

    assert A.causal_band(wgpar.empty((n, lq, lk)), wgpar.empty((n, lk, d))) == 64
    assert max(errors()) < 2e-5
    monkeypatch.setattr(A, "causal_band", lambda a, b: 8)
    assert errors()[0] > 1e-2


def test_matmul_forward_float16_nan_and_choice(rng, reference):
    """float16 operands (scores, P and O in float32); a NaN key makes exactly the rows that see it NaN
    (and their logsumexp), other rows and heads clean; the choice: a GPU at head dims above 64, from
    DS_MIN_PAIRS pairs; a CPU adapter keeps the fused kernel unless forced."""
    arrays = _problem((2, 2, 50, 32), (2, 2, 48, 32), rng)
    with A.force_matmul_forward(True):
        y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert y.dtype is wgpar.float16 and all(t.grad.dtype is wgpar.float16 for t in ins)
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)
    bad = [a.copy() for a in arrays]
    bad[1][0, 1, 7, 3] = np.nan
    Q, K, V = (wgpar.tensor(a) for a in bad[:3])
    with A.force_matmul_forward(True):
        out, lse = A.attention_forward(Q, K, V, True, 0.25)
    out, lse = out.numpy(), lse.numpy()
    assert np.isnan(out[0, 1, 7:]).all() and not np.isnan(out[0, 1, :7]).any() and not np.isnan(out[1]).any()
    assert np.isnan(lse[0, 1, 7:]).all() and not np.isnan(lse[0, 1, :7]).any() and not np.isnan(lse[0, 0]).any()
    dev = wgpar.device(0)
    gpu = dev.adapter_type != "CPU"
    assert A._use_matmul_forward(dev, 128, True, 512, 512) is gpu
    assert A._use_matmul_forward(dev, 128, False, 512, 512) is gpu
    assert not A._use_matmul_forward(dev, 64, False, 1024, 1024)  # head dim 64: the fused kernel
    assert not A._use_matmul_forward(dev, 128, False, 128, 128)  # short: fewer dispatches fused
    with A.force_matmul_forward(True):
        assert not A._use_matmul_forward(dev, 64, False, 8192, 8192)  # one head's scores past DS_HEAD_BYTES


def test_score_groups_hold_many_heads_where_the_binding_limit_allows(monkeypatch):
    """Groups of heads fill DS_BYTES (512 MiB: all 32 heads of a 4x8x2048 batch at once on a GPU), capped by the
    device's binding limit (lavapipe's 128 MiB: 8 heads); one head's scores past DS_HEAD_BYTES keep the fused
    kernels whatever the limit; a group always holds at least one head."""
    dev = wgpar.device(0)
    monkeypatch.setattr(dev, "adapter_type", "DiscreteGPU")
    per_head = 2048 * 2048 * 4
    for binding, group in ((4 << 30, 32), (128 << 20, 8), (per_head // 2, 1)):
        monkeypatch.setattr(dev, "max_binding", binding)
        assert list(A._head_groups(dev, 40, 2048, 2048)) == [(g, min(group, 40 - g)) for g in range(0, 40, group)]
    monkeypatch.setattr(dev, "max_binding", 4 << 30)
    assert A._use_matmul_forward(dev, 128, True, 2048, 2048)
    assert not A._use_matmul_forward(dev, 128, True, 8192, 8192)  # 256 MiB a head
    assert A._use_matmul_backward(dev, 128, 2048, 2048) and not A._use_matmul_backward(dev, 128, 4096, 8192)


@pytest.mark.parametrize("causal", [True, False])
def test_matmul_backward_matches(causal, rng, reference, monkeypatch):
    """The backward as matmuls (a GPU's default at head dims above 64): S and dP per group of heads (a
    small DS_BYTES forces several, ragged ones), P and dS in place, then dV = P^T dO, dK = dS^T Q,
    dQ = dS K; L != S both ways, sequences past one 64-row tile (the causal products skip their
    triangle), keys and queries not in whole vec4s (the plain products); after either forward."""
    for shapes, groups in ((((2, 3, 45, 16), (2, 3, 36, 16)), 4), (((1, 2, 21, 32), (1, 2, 52, 32)), 1),
                           (((1, 2, 140, 16), (1, 2, 200, 16)), 1), (((2, 2, 150, 64), (2, 2, 136, 64)), 3),
                           (((1, 3, 70, 8), (1, 3, 130, 8)), 2)):
        arrays = _problem(*shapes, rng)
        lq, lk = shapes[0][2], shapes[1][2]
        monkeypatch.setattr(A, "DS_BYTES", 2 * lq * lk * 4 * -(-shapes[0][0] * shapes[0][1] // groups))
        for fwd in (False, True):
            with A.force_matmul_backward(True), A.force_matmul_forward(fwd):
                assert A._use_matmul_backward(wgpar.device(0), shapes[0][3], lq, lk)
                y, ins = _run(arrays, causal, path="fused")
            _check(y, ins, _want(reference, arrays, causal))


def test_matmul_backward_float16_nan_and_choice(rng, reference):
    """float16 operands (S, dP and the products in float32, the gradients rounded once); a NaN key makes
    the gradient rows that see it NaN and leaves other heads clean; the choice: a GPU at head dims above
    64 from DS_MIN_PAIRS pairs, both buffers of one head within DS_BYTES; a CPU adapter keeps the kernels
    unless forced."""
    arrays = _problem((2, 2, 50, 32), (2, 2, 48, 32), rng)
    with A.force_matmul_backward(True):
        y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert all(t.grad.dtype is wgpar.float16 for t in ins)
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)
    bad = [a.copy() for a in arrays]
    bad[1][0, 1, 7, 3] = np.nan
    with A.force_matmul_backward(True):
        _, got = _run(bad, True, path="fused")
    dq, dk = got[0].grad.numpy(), got[1].grad.numpy()
    assert np.isnan(dq[0, 1, 7:]).all() and not np.isnan(dq[0, 0]).any() and not np.isnan(dq[1]).any()
    assert not np.isnan(dk[0, 0]).any() and not np.isnan(dk[1]).any()
    dev = wgpar.device(0)
    assert A._use_matmul_backward(dev, 128, 512, 512) is (dev.adapter_type != "CPU")
    assert not A._use_matmul_backward(dev, 64, 1024, 1024)  # head dim 64: the kernels
    assert not A._use_matmul_backward(dev, 128, 128, 128)  # short: the kernels
    with A.force_matmul_backward(True):
        assert not A._use_matmul_backward(dev, 128, 4096, 8192)  # 128 MiB of S and as much of dP for one head


def test_dq_path_choice():
    """dS K needs the register-tiled dK / dV kernel, keys in whole vec4s and one head's dS within DS_BYTES;
    a CPU adapter, or a short sequence, keeps the dQ kernel unless forced."""
    dev = wgpar.device(0)
    rt, rows = A.parse_tile("16x16r4t4"), A.parse_tile("16x16")
    with A.force_ds_path(True):
        assert A._use_ds(dev, rt, 40, 48) and not A._use_ds(dev, rt, 40, 50) and not A._use_ds(dev, rows, 40, 48)
        assert not A._use_ds(dev, rt, 8192, 8192)  # 256 MiB of dS for one head
    assert not A._use_ds(dev, rt, 40, 48)  # few pairs: the dQ kernel
    assert A._use_ds(dev, rt, 512, 512) is (dev.adapter_type != "CPU")


def test_register_tiled_backward_float16(rng, reference):
    arrays = _problem((2, 2, 50, 32), (2, 2, 50, 32), rng)
    with A.force_tiles(fwd="32x16r4t4", dq="32x16r4t4", dkv="32x16r4t4"):
        y, ins = _run(arrays, True, dtype=wgpar.float16, path="fused")
    assert all(t.grad.dtype is wgpar.float16 for t in ins)
    _check(y, ins, _want(reference, arrays, True), tol=3e-3)


def test_register_tiled_backward_nan_and_chunks(rng, monkeypatch, reference):
    """A small loop budget splits dQ's keys and dK / dV's queries into chunks whose gradients add up; a
    NaN key makes the dQ rows that see it NaN, and the gradients NaN where the row-per-thread kernels'
    are."""
    arrays = _problem((1, 2, 40, 16), (1, 2, 40, 16), rng)
    tiles = {"dq": "16x16r4t4", "dkv": "16x16r4t4"}
    monkeypatch.setattr(A, "MAX_LOOP", 60)
    with A.force_tiles(**tiles):
        for kind in ("dq", "dkv"):
            assert len(A.chunks(kind, A.pick(kind, wgpar.device(0), 16), 4, 40)) >= 2
        y, ins = _run(arrays, True, path="fused")
    _check(y, ins, _want(reference, arrays, True))
    monkeypatch.undo()
    bad = [a.copy() for a in arrays]
    bad[1][0, 1, 7, 3] = np.nan
    with A.force_tiles(**tiles):
        _, got = _run(bad, True, path="fused")
    _, old = _run(bad, True, path="fused")  # the row-per-thread kernels (lavapipe's own choice)
    dq = got[0].grad.numpy()
    assert np.isnan(dq[0, 1, 7:]).all() and not np.isnan(dq[0, 0]).any()
    for a, b in zip(got, old):  # masked pairs times the NaN key spread it alike (0 * NaN)
        np.testing.assert_array_equal(np.isnan(a.grad.numpy()), np.isnan(b.grad.numpy()))


@pytest.mark.parametrize("causal", [True, False])
def test_forward_plan_replays_per_layout(causal, rng, reference, monkeypatch):
    """A second call with operands of the same layout (strided views of a packed [B, T, 3, H, D] tensor, as the
    GPT passes them; fresh values) replays the first call's kernel without choosing again (pick and supported
    raise in its forward), forward and backward equal to the reference; another layout, a changed tunable or
    a force_* switch that changes the path does not replay (forcing the fused path does)."""
    b, t, h, d = 2, 45, 3, 16
    scale = A.default_scale(d)

    def views(packed):
        x = wgpar.tensor(packed, requires_grad=True)
        return x, [wgpar.permute(x[:, :, i], (0, 2, 1, 3)) for i in range(3)]

    first = rng.standard_normal((b, t, 3, h, d)).astype(np.float32)
    _, (q, k, v) = views(first)
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert A.replay_forward(q, k, v, causal, scale) is not None
    with A.force_path("reference"):
        assert A.replay_forward(q, k, v, causal, scale) is None  # a switch in effect: choose again
    with A.force_path("fused"):  # the plan is the fused path's: forcing it still replays
        assert A.replay_forward(q, k, v, causal, scale) is not None
    monkeypatch.setattr(A, "MAX_LOOP", A.MAX_LOOP + 1)
    assert A.replay_forward(q, k, v, causal, scale) is None  # a tunable the choice reads changed
    monkeypatch.undo()

    def refuse(*args, **kwargs):
        raise AssertionError("chose again")

    monkeypatch.setattr(A, "pick", refuse)
    monkeypatch.setattr(A, "supported", refuse)
    packed = rng.standard_normal((b, t, 3, h, d)).astype(np.float32)
    g = rng.standard_normal((b, h, t, d)).astype(np.float32)
    x, (q, k, v) = views(packed)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    other = wgpar.tensor(rng.standard_normal((b, h, t + 1, d)).astype(np.float32))
    with pytest.raises(AssertionError, match="chose again"):
        F.scaled_dot_product_attention(other, other, other, is_causal=causal)
    monkeypatch.undo()  # the backward chooses its kernels
    y.backward(wgpar.tensor(g))
    arrays = [np.ascontiguousarray(packed[:, :, i].transpose(0, 2, 1, 3)) for i in range(3)] + [g]
    want_y, want_grads = _want(reference, arrays, causal)
    assert rel_err(y.numpy(), want_y) < 2e-5
    got = x.grad.numpy()
    for i, w in enumerate(want_grads):
        assert rel_err(np.ascontiguousarray(got[:, :, i].transpose(0, 2, 1, 3)), w) < 2e-5, "qkv"[i]
