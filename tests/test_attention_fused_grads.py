"""Attention over a fused q|k|v projection (a GPT block's): the backward writes the three gradients into
one buffer laid out as the projection's output, so the split's backward joins them without copies (six
copies a layer before: three reshapes of transposed gradients, three into the joined buffer). Every path
(dQ kernel or dS K, key chunks, float16, heads that overlap or live apart) still matches float64."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F
from wgpar.ops import attention as A
from wgpar.ops import elementwise as E

from .helpers import np_sdpa, rel_err


def _problem(rng, b, t, e, h, d):
    return (rng.standard_normal((b, t, e)).astype(np.float32),
            (rng.standard_normal((e, 3 * h * d)) / np.sqrt(e)).astype(np.float32),
            rng.standard_normal((b, h, t, d)).astype(np.float32))


def _want(x, w, g, h, d, causal):
    """float64 gradients of x and w through qkv = x @ w, split into heads, attention, output gradient g."""
    b, t, _ = x.shape
    qkv = x.astype(np.float64) @ w
    q, k, v = (p.reshape(b, t, h, d).transpose(0, 2, 1, 3) for p in np.split(qkv, 3, axis=-1))
    y, grads = np_sdpa(q, k, v, g, causal=causal)
    dqkv = np.concatenate([gr.transpose(0, 2, 1, 3).reshape(b, t, h * d) for gr in grads], axis=-1)
    return y, dqkv @ w.T.astype(np.float64), np.einsum("bte,btf->ef", x.astype(np.float64), dqkv)


def _run(x, w, g, h, d, causal, dtype=wgpar.float32, copies=None):
    """wgpar's (y, x.grad, w.grad); ``copies``: a list that gets one entry per copy kernel the backward runs."""
    b, t, _ = x.shape
    X = wgpar.tensor(x, dtype=dtype, requires_grad=True)
    W = wgpar.tensor(w, dtype=dtype, requires_grad=True)
    qkv = X @ W
    q, k, v = (p.reshape(b, t, h, d).transpose(1, 2) for p in qkv.split(h * d, dim=-1))
    with A.force_path("fused"):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if copies is None:
        y.backward(wgpar.tensor(g, dtype=dtype))
    else:
        run_map = E.run_map

        def counted(op, *args, **kwargs):
            if op == "copy":
                copies.append(op)
            return run_map(op, *args, **kwargs)

        E.run_map = counted
        try:
            y.backward(wgpar.tensor(g, dtype=dtype))
        finally:
            E.run_map = run_map
    return y, X.grad, W.grad


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ds", [False, True])
def test_fused_projection_gradients_match_and_need_no_copies(ds, causal, rng, monkeypatch):
    b, t, h, d = 2, 36 if ds else 37, 3, 16  # dS K reads the keys in whole vec4s
    x, w, g = _problem(rng, b, t, 20, h, d)
    want_y, want_x, want_w = _want(x, w, g, h, d, causal)
    # dS K needs the register-tiled dK / dV kernel (a GPU's); lavapipe picks the plain one
    tiles = {"dkv": "16x16r4t4"} if ds else {}
    counts = []
    for fused in (True, False):
        if not fused:  # contiguous gradients, joined by copies (the code before)
            monkeypatch.setattr(A, "_fused_grads", lambda q, k, v: None)
        copies: list = []
        with A.force_tiles(**tiles), A.force_ds_path(ds), A.force_matmul_backward(False):
            assert A._use_ds(wgpar.device(0), A.pick("dkv", wgpar.device(0), d), t, t) == ds
            y, gx, gw = _run(x, w, g, h, d, causal, copies=copies)
        assert rel_err(y.numpy(), want_y) < 2e-5
        assert rel_err(gx.numpy(), want_x) < 2e-5 and rel_err(gw.numpy(), want_w) < 2e-5
        counts.append(len(copies))
    # dK and dV land in place, and dQ from the dQ kernel; from dS K (a matmul's output) dQ is copied once
    assert counts[1] - counts[0] == (5 if ds else 6), counts
    assert ds or counts[0] == 0, counts


def test_key_chunks_and_float16_still_match(rng, monkeypatch):
    """Chunks of keys accumulate in float32 (their gradients copied into place after); float16 operands."""
    b, t, h, d = 1, 40, 2, 16
    x, w, g = _problem(rng, b, t, 12, h, d)
    want_y, want_x, want_w = _want(x, w, g, h, d, True)
    monkeypatch.setattr(A, "MAX_LOOP", 60)
    with A.force_ds_path(False), A.force_matmul_backward(False):
        assert len(A.chunks("dkv", A.pick("dkv", wgpar.device(0), d), d // 4, t)) >= 2
        y, gx, gw = _run(x, w, g, h, d, True)
    assert rel_err(gx.numpy(), want_x) < 2e-5 and rel_err(gw.numpy(), want_w) < 2e-5
    monkeypatch.undo()
    if not wgpar.device(0).has_f16:
        return
    y, gx, gw = _run(x, w, g, h, d, True, dtype=wgpar.float16)
    assert gx.dtype is wgpar.float16 and gw.dtype is wgpar.float16
    assert rel_err(gx.numpy(), want_x) < 1e-2 and rel_err(gw.numpy(), want_w) < 1e-2


def test_one_tensor_as_q_k_and_v_sums_its_three_gradients(rng):
    """q, k and v the same view (they overlap): no shared gradient buffer, the three gradients add up."""
    q = rng.standard_normal((2, 2, 19, 8)).astype(np.float32)
    g = rng.standard_normal(q.shape).astype(np.float32)
    Q = wgpar.tensor(q, requires_grad=True)
    with A.force_path("fused"):
        y = F.scaled_dot_product_attention(Q, Q, Q, is_causal=True)
    y.backward(wgpar.tensor(g))
    want_y, grads = np_sdpa(q, q, q, g, causal=True)
    assert rel_err(y.numpy(), want_y) < 2e-5
    assert rel_err(Q.grad.numpy(), sum(grads)) < 2e-5


def test_retained_piece_gradient_is_not_changed_by_the_optimizer(rng):
    """The joined gradient is a view over the pieces' buffer; a leaf taking it while a piece's retained
    gradient still holds that buffer gets a copy, so an optimizer's in-place update leaves it alone."""
    b, t, h, d = 1, 8, 2, 8
    x = rng.standard_normal((b, t, 3 * h * d)).astype(np.float32)
    g = rng.standard_normal((b, h, t, d)).astype(np.float32)
    qkv = wgpar.nn.Parameter(wgpar.tensor(x))
    q, k, v = (p.reshape(b, t, h, d).transpose(1, 2) for p in qkv.split(h * d, dim=-1))
    q.retain_grad()
    with A.force_path("fused"), A.force_matmul_backward(False):
        F.scaled_dot_product_attention(q, k, v).backward(wgpar.tensor(g))
    kept = q.grad.numpy().copy()
    np.testing.assert_array_equal(qkv.grad.numpy()[..., : h * d].reshape(b, t, h, d).transpose(0, 2, 1, 3), kept)
    wgpar.optim.SGD([qkv], lr=0.5, weight_decay=0.1).step()
    qkv.grad.mul_(3.0)
    np.testing.assert_array_equal(q.grad.numpy(), kept)


def test_delta_of_float16_views_is_float32(rng):
    """The backward's delta, rowsum(dO * O), of float16 operands (O a [B, T, H, D] buffer's [B, H, T, D] view,
    as the forward leaves it) is float32 and each product exact in float32: against float64 of the same
    rounded values. (The dS K path that calls it does not run on lavapipe.)"""
    if not wgpar.device(0).has_f16:
        pytest.skip("the adapter has no shader-f16")
    b, h, t, d = 2, 3, 37, 24
    g = rng.standard_normal((b, h, t, d)).astype(np.float16)
    o = rng.standard_normal((b, t, h, d)).astype(np.float16)
    dout = wgpar.tensor(g)
    out = wgpar.tensor(o).transpose(1, 2)
    got = A._delta(dout, out)
    assert got.dtype is wgpar.float32 and got.shape == (b, h, t)
    want = (g.astype(np.float64) * o.astype(np.float64).transpose(0, 2, 1, 3)).sum(-1)
    assert rel_err(got.numpy(), want) < 1e-6
