"""nn.MultiheadAttention against a float64 NumPy MultiheadAttention (torch's semantics written out, its
gradients by central differences) on wgpar's own weights, and, where installed, against
torch.nn.MultiheadAttention with torch's weights (loaded from its state_dict): outputs, returned weights
and every gradient, for self-, cross- and causal attention."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn

from . import gradcheck

NAMES = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]  # torch's names and order


def np_mha(query, key, value, params, heads, batch_first, attn_mask=None, key_padding_mask=None,
           need_weights=True, average_attn_weights=True, is_causal=False):
    """torch.nn.MultiheadAttention's forward in float64: (output, weights or None). Bool masks: True may
    NOT be attended; is_causal without attn_mask: query i sees keys 0..i."""
    unbatched = query.ndim == 2
    x = [np.asarray(a, np.float64) for a in (query, key, value)]
    x = [a[None] if unbatched else a if batch_first else a.swapaxes(0, 1) for a in x]  # [N, L, E]
    n, lq, e = x[0].shape
    lk, hd = x[1].shape[1], e // heads
    w, b = params["in_proj_weight"], params.get("in_proj_bias")
    q, k, v = (a @ w[i * e:(i + 1) * e].T + (0 if b is None else b[i * e:(i + 1) * e]) for i, a in enumerate(x))
    q, k, v = (t.reshape(n, -1, heads, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
    allowed = np.ones((n, 1, lq, lk), dtype=bool)
    if attn_mask is not None:
        allowed = allowed & ~attn_mask
    elif is_causal:
        allowed = allowed & np.tril(np.ones((lq, lk), dtype=bool))
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    s = np.where(allowed, q @ k.swapaxes(-1, -2) / np.sqrt(hd), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = (p @ v).transpose(0, 2, 1, 3).reshape(n, lq, e) @ params["out_proj.weight"].T
    y = y + params.get("out_proj.bias", 0)
    y = y[0] if unbatched else y if batch_first else y.swapaxes(0, 1)
    if not need_weights:
        return y, None
    p = p.mean(1) if average_attn_weights else p
    return y, p[0] if unbatched else p


def _pair(torch, e, h, batch_first, bias=True):
    tm = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first).double()
    wm = nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first)
    assert list(wm.state_dict()) == list(tm.state_dict())
    wm.load_state_dict({k: v.float().numpy() for k, v in tm.state_dict().items()})
    return wm, tm


def _model(reference, rng, e, h, batch_first, bias=True):
    """wgpar's module and what to compare it with: the torch module, or None for the NumPy reference (then
    random weights: the initial biases are zero and would hide a misplaced one)."""
    if reference is not None:
        return _pair(reference, e, h, batch_first, bias)
    wm = nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first)
    assert list(wm.state_dict()) == (NAMES if bias else [NAMES[0], NAMES[2]])
    wm.load_state_dict({k: (0.5 * rng.standard_normal(v.shape)).astype(np.float32)
                        for k, v in wm.state_dict().items()})
    return wm, None


def _want_numpy(wm, inputs, g, **kw):
    """Output, weights, input gradients (one per distinct array) and parameter gradients, float64."""
    params = {k: v.numpy().astype(np.float64) for k, v in wm.state_dict().items()}
    distinct = list({id(a): a for a in inputs}.values())
    slots = [[id(d) for d in distinct].index(id(a)) for a in inputs]  # which distinct array feeds each input
    names, nd = list(params), len(distinct)

    def f(*arrays):
        ins = [arrays[i] for i in slots]
        return np_mha(*ins, dict(zip(names, arrays[nd:])), wm.num_heads, wm.batch_first, **kw)[0]

    y, wts = np_mha(*inputs, params, wm.num_heads, wm.batch_first, **kw)
    grads = gradcheck.numeric_grad(f, [d.astype(np.float64) for d in distinct] + list(params.values()), g)
    return y, wts, grads[:nd], dict(zip(names, grads[nd:]))


def _want_torch(torch, tm, inputs, g, **kw):
    seen = {}
    for a in inputs:
        seen.setdefault(id(a), torch.tensor(a, dtype=torch.float64, requires_grad=True))
    tkw = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    ty, twts = tm(*(seen[id(a)] for a in inputs), **tkw)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    return (ty.detach().numpy(), None if twts is None else twts.detach().numpy(),
            [t.grad.numpy() for t in seen.values()], {k: p.grad.numpy() for k, p in tm.named_parameters()})


def _compare(reference, wm, tm, inputs, g, **kw):
    """Run wgpar on the arrays (query, key, value: one array object reused is self-attention) and compare
    output, weights and every gradient with the reference's."""
    seen = {}
    for a in inputs:
        seen.setdefault(id(a), wgpar.tensor(a, requires_grad=True))
    y, wts = wm(*(seen[id(a)] for a in inputs), **kw)
    y.backward(wgpar.tensor(g))
    ny, nwts, ngx, ngp = _want_numpy(wm, inputs, g, **kw) if reference is None else \
        _want_torch(reference, tm, inputs, g, **kw)
    np.testing.assert_allclose(y.numpy(), ny, rtol=1e-4, atol=1e-5, err_msg="output")
    if nwts is None:
        assert wts is None
    else:
        np.testing.assert_allclose(wts.numpy(), nwts, rtol=1e-4, atol=1e-6, err_msg="weights")
    for wt, want in zip(seen.values(), ngx):
        # float32 sums that cancel: the absolute error follows the largest entry (as for the parameters)
        atol = 1e-5 + 2e-6 * float(np.abs(want).max())
        np.testing.assert_allclose(wt.grad.numpy(), want, rtol=1e-4, atol=atol, err_msg="input grad")
    params = dict(wm.named_parameters())
    assert sorted(params) == sorted(ngp)
    for name, p in params.items():
        # Entries whose exact gradient is 0 (the key bias: softmax ignores a per-row shift) come out as
        # float32 cancellation noise, which scales with the tensor's gradients.
        atol = 1e-5 + 2e-6 * float(np.abs(ngp[name]).max())
        np.testing.assert_allclose(p.grad.numpy(), ngp[name], rtol=1e-4, atol=atol, err_msg=name)


def test_self_attention_with_masks_and_weights(rng, reference):
    L, N, E, H = 7, 3, 12, 3
    wm, tm = _model(reference, rng, E, H, batch_first=False)
    x = rng.standard_normal((L, N, E)).astype(np.float32)
    attn_mask = rng.random((L, L)) > 0.7  # True: may NOT attend (torch's MultiheadAttention convention)
    np.fill_diagonal(attn_mask, False)
    kpm = np.zeros((N, L), dtype=bool)
    kpm[1, -2:] = True
    # Key 0 open to every query: otherwise a padded query's diagonal is padded too and about one seed in 400
    # masks its whole row (NaN in both references; test_attention_masks.py covers such rows).
    attn_mask[:, 0] = False
    g = rng.standard_normal((L, N, E)).astype(np.float32)
    _compare(reference, wm, tm, [x, x, x], g, attn_mask=attn_mask, key_padding_mask=kpm)


def test_cross_attention_batch_first_without_weights(rng, reference):
    N, L, S, E, H = 2, 5, 9, 16, 4
    wm, tm = _model(reference, rng, E, H, batch_first=True)
    q = rng.standard_normal((N, L, E)).astype(np.float32)
    kv = rng.standard_normal((N, S, E)).astype(np.float32)
    g = rng.standard_normal((N, L, E)).astype(np.float32)
    _compare(reference, wm, tm, [q, kv, kv], g, need_weights=False, average_attn_weights=False)


def test_causal_runs_the_fused_kernels(rng, reference):
    """is_causal with need_weights=False: the fused causal path here (with and without the mask torch
    requires beside is_causal), the causal mask in the reference."""
    N, L, E, H = 2, 11, 16, 2
    wm, tm = _model(reference, rng, E, H, batch_first=True)
    x = rng.standard_normal((N, L, E)).astype(np.float32)
    g = rng.standard_normal((N, L, E)).astype(np.float32)
    causal = ~np.tril(np.ones((L, L), dtype=bool))
    _compare(reference, wm, tm, [x, x, x], g, attn_mask=causal, is_causal=True, need_weights=False)
    y, _ = wm(wgpar.tensor(x), wgpar.tensor(x), wgpar.tensor(x), is_causal=True, need_weights=False)
    params = {k: v.numpy() for k, v in wm.state_dict().items()}
    want = np_mha(x, x, x, params, H, True, is_causal=True, need_weights=False)[0] if reference is None else \
        tm(*(reference.tensor(x, dtype=reference.float64),) * 3, attn_mask=reference.tensor(causal),
           is_causal=True, need_weights=False)[0].detach().numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)  # no mask needed here


def test_unbatched_and_per_head_weights(rng, reference):
    L, E, H = 6, 8, 2
    wm, tm = _model(reference, rng, E, H, batch_first=False, bias=False)
    x = rng.standard_normal((L, E)).astype(np.float32)
    g = rng.standard_normal((L, E)).astype(np.float32)
    _compare(reference, wm, tm, [x, x, x], g, average_attn_weights=False)


def test_errors():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(NotImplementedError, match="kdim"):
        nn.MultiheadAttention(8, 2, kdim=4)
    m = nn.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="expected"):
        m(wgpar.zeros(2, 3, 5), wgpar.zeros(2, 3, 5), wgpar.zeros(2, 3, 5))


@pytest.mark.parametrize("batch_first", [False, True])
def test_unbatched_input_ignores_batch_first(rng, batch_first):
    """Unbatched [L, E] input: every token attends to every token whatever batch_first says (torch's rule);
    it equals the batched module on a batch of one."""
    L, E, H = 7, 12, 3
    wgpar.manual_seed(0)
    m = nn.MultiheadAttention(E, H, batch_first=batch_first)
    x = rng.standard_normal((L, E)).astype(np.float32)
    y, w = m(wgpar.tensor(x), wgpar.tensor(x), wgpar.tensor(x))
    xb = x[None] if batch_first else x[:, None]
    yb, wb = m(wgpar.tensor(xb), wgpar.tensor(xb), wgpar.tensor(xb))
    want = yb.numpy()[0] if batch_first else yb.numpy()[:, 0]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)
    assert w.shape == (L, L)
    np.testing.assert_allclose(w.numpy(), wb.numpy()[0], rtol=1e-5, atol=1e-6)
