"""nn.MultiheadAttention against torch.nn.MultiheadAttention with the same weights (loaded from torch's
state_dict): outputs, returned weights and every gradient, for self-, cross- and causal attention."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn

torch = pytest.importorskip("torch")


def _pair(e, h, batch_first, bias=True):
    tm = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first).double()
    wm = nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first)
    assert list(wm.state_dict()) == list(tm.state_dict())  # torch's names and order
    wm.load_state_dict({k: v.float().numpy() for k, v in tm.state_dict().items()})
    return wm, tm


def _compare(wm, tm, inputs, g, **kw):
    """Run both on the same arrays (query, key, value: one array object is reused for self-attention)."""
    w_in, t_in, seen = [], [], {}
    for a in inputs:
        if id(a) not in seen:
            seen[id(a)] = (wgpar.tensor(a, requires_grad=True),
                           torch.tensor(a, dtype=torch.float64, requires_grad=True))
        w_in.append(seen[id(a)][0])
        t_in.append(seen[id(a)][1])
    tkw = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    y, wts = wm(*w_in, **kw)
    ty, twts = tm(*t_in, **tkw)
    y.backward(wgpar.tensor(g))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg="output")
    if twts is None:
        assert wts is None
    else:
        np.testing.assert_allclose(wts.numpy(), twts.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg="weights")
    for (wt, tt) in seen.values():
        np.testing.assert_allclose(wt.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg="input grad")
    tparams = dict(tm.named_parameters())
    for name, p in wm.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[name].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_self_attention_with_masks_and_weights(rng):
    L, N, E, H = 7, 3, 12, 3
    wm, tm = _pair(E, H, batch_first=False)
    x = rng.standard_normal((L, N, E)).astype(np.float32)
    attn_mask = rng.random((L, L)) > 0.7  # True: may NOT attend (torch's MultiheadAttention convention)
    np.fill_diagonal(attn_mask, False)
    kpm = np.zeros((N, L), dtype=bool)
    kpm[1, -2:] = True
    g = rng.standard_normal((L, N, E)).astype(np.float32)
    _compare(wm, tm, [x, x, x], g, attn_mask=attn_mask, key_padding_mask=kpm)


def test_cross_attention_batch_first_without_weights(rng):
    N, L, S, E, H = 2, 5, 9, 16, 4
    wm, tm = _pair(E, H, batch_first=True)
    q = rng.standard_normal((N, L, E)).astype(np.float32)
    kv = rng.standard_normal((N, S, E)).astype(np.float32)
    g = rng.standard_normal((N, L, E)).astype(np.float32)
    _compare(wm, tm, [q, kv, kv], g, need_weights=False, average_attn_weights=False)


def test_causal_runs_the_fused_kernels_like_torch(rng):
    """is_causal with need_weights=False: the fused causal path here, torch's with its causal mask."""
    N, L, E, H = 2, 11, 16, 2
    wm, tm = _pair(E, H, batch_first=True)
    x = rng.standard_normal((N, L, E)).astype(np.float32)
    g = rng.standard_normal((N, L, E)).astype(np.float32)
    causal = ~np.tril(np.ones((L, L), dtype=bool))
    _compare(wm, tm, [x, x, x], g, attn_mask=causal, is_causal=True, need_weights=False)
    y, _ = wm(wgpar.tensor(x), wgpar.tensor(x), wgpar.tensor(x), is_causal=True, need_weights=False)
    ty, _ = tm(*(torch.tensor(x, dtype=torch.float64),) * 3, attn_mask=torch.tensor(causal), is_causal=True,
               need_weights=False)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)  # no mask needed here


def test_unbatched_and_per_head_weights(rng):
    L, E, H = 6, 8, 2
    wm, tm = _pair(E, H, batch_first=False, bias=False)
    x = rng.standard_normal((L, E)).astype(np.float32)
    g = rng.standard_normal((L, E)).astype(np.float32)
    _compare(wm, tm, [x, x, x], g, average_attn_weights=False)


def test_errors():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(NotImplementedError, match="kdim"):
        nn.MultiheadAttention(8, 2, kdim=4)
    m = nn.MultiheadAttention(8, 2)
    with pytest.raises(ValueError, match="expected"):
        m(wgpar.zeros(2, 3, 5), wgpar.zeros(2, 3, 5), wgpar.zeros(2, 3, 5))
