"""Attention masks as PyTorch takes them: integer masks refused (never added to the scores), a fully
masked query row gives zeros forward and backward (torch >= 2.5), a mask of the wrong shape named in
the error; the same through nn.MultiheadAttention. Checked against NumPy float64."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.ops import attention as A


def _np_attention(q, k, v, allowed, add, g):
    """(out, dq, dk, dv) of softmax(q k^T / sqrt(E) + mask) v in float64; a row with no allowed key gives
    zeros and no gradient (torch's safe softmax)."""
    q, k, v, g = (a.astype(np.float64) for a in (q, k, v, g))
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale + add
    s = np.where(allowed, s, -np.inf)
    live = np.isfinite(s).any(-1, keepdims=True)
    e = np.exp(np.where(live, s - np.where(live, s, 0).max(-1, keepdims=True, initial=-np.inf), -np.inf))
    p = np.where(live, e / np.where(live, e.sum(-1, keepdims=True), 1.0), 0.0)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


def _operands(rng, lq=5, lk=7, d=8):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, lq, d), (2, 3, lk, d), (2, 3, lk, d))]
    return arrays, [wgpar.tensor(a, requires_grad=True) for a in arrays]


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(a.numpy().astype(np.float64), b, rtol=tol, atol=tol)


@pytest.mark.parametrize("mask", [np.ones((5, 7), np.int32), np.ones((5, 7), np.int64), np.ones((5, 7), np.uint8)],
                         ids=lambda m: m.dtype.name)
def test_integer_mask_is_refused_not_added(mask, rng):
    _, (q, k, v) = _operands(rng)
    for m in (mask, wgpar.tensor(mask.astype(np.int32))):
        with pytest.raises(RuntimeError, match="attn_mask") as info:
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        assert isinstance(info.value, TypeError)
        assert "bool" in str(info.value) and "int" in str(info.value)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_row_gives_zeros_and_zero_gradient(kind, rng):
    (qa, ka, va), (q, k, v) = _operands(rng)
    allowed = rng.random((2, 1, 5, 7)) < 0.6
    allowed[:, :, 2] = False  # every head's row 2 sees nothing
    allowed[1, :, 4] = False
    add = np.zeros(allowed.shape, np.float32)
    mask = allowed if kind == "bool" else np.where(allowed, rng.standard_normal(allowed.shape), -np.inf).astype(
        np.float32)
    if kind == "float":
        add = np.where(allowed, mask, 0.0)
    g = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    y.backward(wgpar.tensor(g))
    out, dq, dk, dv = _np_attention(qa, ka, va, allowed, add, g)
    assert not np.isnan(out).any()
    _close(y, out)
    assert (y.numpy()[:, :, 2] == 0).all()
    for t, ref in zip((q, k, v), (dq, dk, dv)):
        assert np.isfinite(t.grad.numpy()).all()
        _close(t.grad, ref)
    assert (q.grad.numpy()[:, :, 2] == 0).all()


def test_fully_masked_row_matches_torch(torch, rng):
    (qa, ka, va), (q, k, v) = _operands(rng)
    allowed = np.ones((5, 7), bool)
    allowed[3] = False
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    y.sum().backward()
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (qa, ka, va))
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(allowed))
    ty.sum().backward()
    _close(y, ty.detach().numpy())
    for t, tt in zip((q, k, v), (tq, tk, tv)):
        _close(t.grad, tt.grad.numpy())


def test_rows_without_keys_in_fused_chunks_are_zero(rng, monkeypatch):
    """The fused kernels' only mask is the causal one, which leaves every row a key; a chunk of keys past a
    row's diagonal is where a fused row sees none: it must add nothing (no NaN), forward and backward."""
    monkeypatch.setattr(A, "MAX_LOOP", 200)
    (qa, ka, va), (q, k, v) = _operands(rng, lq=70, lk=70, d=8)
    g = rng.standard_normal((2, 3, 70, 8)).astype(np.float32)
    # Looped inner blocks (lavapipe's choice) on every adapter, so the small loop budget makes chunks.
    with A.force_tiles(cv=1, unroll=False, fwd="32x16", dq="32x16", dkv="32x16"), A.force_path("fused"):
        assert len(A.chunks("fwd", A.pick("fwd", q.device, 8, 70, 70), 2, 70)) >= 3
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(wgpar.tensor(g))
    out, dq, dk, dv = _np_attention(qa, ka, va, np.tril(np.ones((70, 70), bool)), 0.0, g)
    _close(y, out, 2e-5)
    for t, ref in zip((q, k, v), (dq, dk, dv)):
        _close(t.grad, ref, 2e-5)


@pytest.mark.parametrize("shape", [(4, 7), (5, 6), (3, 3, 5, 7)])
def test_wrong_shaped_mask_names_attn_mask_and_shapes(shape, rng):
    _, (q, k, v) = _operands(rng)
    with pytest.raises(ValueError, match="attn_mask") as info:
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones(shape, bool))
    assert str(shape) in str(info.value) and "(2, 3, 5, 7)" in str(info.value)
    assert isinstance(info.value, RuntimeError)  # torch raises RuntimeError there


def _mha(rng, batch_first=True):
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    x = wgpar.tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    return mha, x


@pytest.mark.parametrize("arg", ["attn_mask", "key_padding_mask"])
def test_multihead_attention_refuses_integer_masks(arg, rng):
    mha, x = _mha(rng)
    mask = np.zeros((5, 5) if arg == "attn_mask" else (2, 5), np.int32)
    for need_weights in (True, False):
        with pytest.raises(TypeError, match=arg):
            mha(x, x, x, need_weights=need_weights, **{arg: mask})


def test_multihead_attention_wrong_shaped_mask_names_it(rng):
    mha, x = _mha(rng)
    with pytest.raises(ValueError, match=r"attn_mask.*\(4, 5\).*\(5, 5\)"):
        mha(x, x, x, attn_mask=np.zeros((4, 5), bool))


def test_multihead_attention_fully_masked_row_as_torch(rng):
    """torch's MultiheadAttention gives zeros for a row that sees nothing without weights (SDPA) and NaN
    with them (a plain softmax): wgpar does the same."""
    mha, x = _mha(rng)
    kpm = np.zeros((2, 5), bool)
    kpm[0] = True  # batch entry 0 may attend to nothing
    out, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert np.isfinite(out.numpy()).all()
    bias = mha.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy()[0], np.broadcast_to(bias, (5, 8)), atol=1e-6)
    out, w = mha(x, x, x, key_padding_mask=kpm, need_weights=True)
    assert np.isnan(out.numpy()[0]).all() and np.isnan(w.numpy()[0]).all()
    assert np.isfinite(out.numpy()[1]).all()
