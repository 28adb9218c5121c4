"""TransformerEncoderLayer / TransformerDecoderLayer / TransformerEncoder / TransformerDecoder / Transformer:
forward and gradients against a NumPy float64 reference and finite differences (eval mode), torch's state
dicts loaded and compared with its masks, and train-mode dropout, on awkward sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import wgpar
from wgpar import nn

from .gradcheck import numeric_grad
from .helpers import assert_close, np_sdpa

_erf = np.vectorize(math.erf)


def np_ln(x, w, b, eps):
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * w + (0 if b is None else b)


def np_act(x, name):
    return np.maximum(x, 0) if name == "relu" else 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_mha(x, mem, p, pre, nhead, allowed):
    """torch's MultiheadAttention in float64 on batch-first [N, L, E]; ``allowed`` True: may attend."""
    e = x.shape[-1]
    w, b = p[pre + "in_proj_weight"], p.get(pre + "in_proj_bias")
    proj = [(t @ w[i * e:(i + 1) * e].T + (0 if b is None else b[i * e:(i + 1) * e]))
            for i, t in enumerate((x, mem, mem))]
    q, k, v = (t.reshape(t.shape[0], t.shape[1], nhead, -1).transpose(0, 2, 1, 3) for t in proj)
    y = np_sdpa(q, k, v, mask=allowed).transpose(0, 2, 1, 3).reshape(x.shape)
    return y @ p[pre + "out_proj.weight"].T + p.get(pre + "out_proj.bias", 0)


def np_encoder_layer(x, p, nhead, act, norm_first, allowed, eps=1e-5):
    def ln(t, i):
        return np_ln(t, p[f"norm{i}.weight"], p.get(f"norm{i}.bias"), eps)

    def sa(t):
        return np_mha(t, t, p, "self_attn.", nhead, allowed)

    def ff(t):
        hidden = np_act(t @ p["linear1.weight"].T + p.get("linear1.bias", 0), act)
        return hidden @ p["linear2.weight"].T + p.get("linear2.bias", 0)

    if norm_first:
        x = x + sa(ln(x, 1))
        return x + ff(ln(x, 2))
    x = ln(x + sa(x), 1)
    return ln(x + ff(x), 2)


def _load(model, rng, scale=0.4):
    params = {k: (scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(params)
    return {k: v.astype(np.float64) for k, v in params.items()}


# (d_model, nhead, dim_feedforward, activation, norm_first, bias, batch_first, S, N)
ENC_CASES = [
    (6, 2, 5, "relu", False, True, False, 3, 2),
    (8, 4, 7, "gelu", True, False, True, 4, 1),
    (4, 1, 3, "gelu", False, True, True, 5, 3),
]


@pytest.mark.parametrize("case", ENC_CASES, ids=lambda c: "-".join(map(str, c)))
def test_encoder_layer_matches_numpy_with_gradients(case, rng):
    d, h, ff, act, nf, bias, bf, s, n = case
    layer = nn.TransformerEncoderLayer(d, h, ff, dropout=0.3, activation=act, norm_first=nf, bias=bias,
                                       batch_first=bf).eval()
    params = _load(layer, rng)
    names = list(params)
    x = rng.standard_normal((n, s, d))
    kpm = np.zeros((n, s), bool)
    kpm[-1, s - 1:] = True  # the last sequence's last key is padding
    allowed = np.tril(np.ones((s, s), bool))[None, None] & ~kpm[:, None, None, :]

    def ref(x, *ps):
        return np_encoder_layer(x, dict(zip(names, ps)), h, act, nf, allowed)

    xt = wgpar.tensor((x if bf else x.transpose(1, 0, 2)).astype(np.float32), requires_grad=True)
    out = layer(xt, src_key_padding_mask=kpm, is_causal=True)
    got = out.numpy() if bf else out.numpy().transpose(1, 0, 2)
    assert_close(got, ref(x, *params.values()), 1e-4, 1e-5, "output")
    g = rng.standard_normal(x.shape)
    out.backward(wgpar.tensor((g if bf else g.transpose(1, 0, 2)).astype(np.float32)))
    want = numeric_grad(ref, [x, *params.values()], g)
    gx = xt.grad.numpy() if bf else xt.grad.numpy().transpose(1, 0, 2)
    params_by_name = dict(layer.named_parameters())
    for what, got_g, w in zip(["input", *names], [gx] + [params_by_name[k].grad.numpy() for k in names], want):
        assert_close(got_g, w, 2e-3, 2e-4 * max(1.0, np.abs(w).max()), what)


def _pair(torch, cls, *args, **kwargs):
    tm = getattr(torch.nn, cls)(*args, **kwargs)
    wm = getattr(nn, cls)(*args, **kwargs)
    assert list(wm.state_dict()) == list(tm.state_dict())
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    return tm.eval(), wm.eval()


def _compare_grads(tm, wm, pairs, what=""):
    for (k, p) in tm.named_parameters():
        assert_close(dict(wm.named_parameters())[k].grad.numpy(), p.grad.numpy(), 2e-4, 2e-5, what + k)
    for a, b in pairs:
        assert_close(a.grad.numpy(), b.grad.numpy(), 2e-4, 2e-5, what + "input")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_loads_torch_and_matches_masks(norm_first, rng, torch):
    tm, wm = _pair(torch, "TransformerEncoderLayer", 10, 5, dim_feedforward=9, norm_first=norm_first,
                   activation="gelu")
    x = rng.standard_normal((7, 3, 10)).astype(np.float32)
    float_mask = (rng.standard_normal((7, 7)) * 2).astype(np.float32)
    kpm = np.zeros((3, 7), bool)
    kpm[1, 5:] = True
    for masks in ({"src_mask": float_mask}, {"src_key_padding_mask": kpm},
                  {"src_mask": np.triu(np.ones((7, 7), bool), 1), "is_causal": True}):
        xw, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        wo = wm(xw, **masks)
        to = tm(xt, **{k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in masks.items()})
        assert_close(wo.numpy(), to.detach().numpy(), 2e-4, 2e-5, f"output {list(masks)}")
        wm.zero_grad()
        tm.zero_grad()
        g = rng.standard_normal(x.shape).astype(np.float32)
        wo.backward(wgpar.tensor(g))
        to.backward(torch.tensor(g))
        _compare_grads(tm, wm, [(xw, xt)], f"{list(masks)} ")


def test_decoder_layer_loads_torch_and_matches_masks(rng, torch):
    tm, wm = _pair(torch, "TransformerDecoderLayer", 8, 2, dim_feedforward=11, batch_first=True, bias=False)
    tgt = rng.standard_normal((2, 5, 8)).astype(np.float32)
    mem = rng.standard_normal((2, 6, 8)).astype(np.float32)
    causal = np.triu(np.full((5, 5), -np.inf, np.float32), 1)
    mem_kpm = np.zeros((2, 6), bool)
    mem_kpm[0, 4:] = True
    tgt_kpm = np.zeros((2, 5), bool)
    tgt_kpm[1, 3:] = True
    memory_mask = (rng.standard_normal((5, 6))).astype(np.float32)
    masks = dict(tgt_mask=causal, memory_mask=memory_mask, tgt_key_padding_mask=tgt_kpm,
                 memory_key_padding_mask=mem_kpm)
    tw, mw = wgpar.tensor(tgt, requires_grad=True), wgpar.tensor(mem, requires_grad=True)
    tt, mt = torch.tensor(tgt, requires_grad=True), torch.tensor(mem, requires_grad=True)
    wo = wm(tw, mw, **masks, tgt_is_causal=True)
    to = tm(tt, mt, **{k: torch.tensor(v) for k, v in masks.items()}, tgt_is_causal=True)
    assert_close(wo.numpy(), to.detach().numpy(), 2e-4, 2e-5, "output")
    g = rng.standard_normal(tgt.shape).astype(np.float32)
    wo.backward(wgpar.tensor(g))
    to.backward(torch.tensor(g))
    _compare_grads(tm, wm, [(tw, tt), (mw, mt)])


def test_encoder_decoder_stacks_and_transformer(rng, torch):
    tm, wm = _pair(torch, "Transformer", d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=3,
                   dim_feedforward=6, norm_first=True)
    assert "encoder.layers.1.linear2.weight" in wm.state_dict() and "decoder.norm.bias" in wm.state_dict()
    src = rng.standard_normal((6, 2, 8)).astype(np.float32)
    tgt = rng.standard_normal((4, 2, 8)).astype(np.float32)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(tgt_mask.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    sw, tw = wgpar.tensor(src, requires_grad=True), wgpar.tensor(tgt, requires_grad=True)
    st, tt = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    wo = wm(sw, tw, tgt_mask=tgt_mask)
    to = tm(st, tt, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(4))
    assert_close(wo.numpy(), to.detach().numpy(), 2e-4, 2e-5, "output")
    wo.sum().backward()
    to.sum().backward()
    _compare_grads(tm, wm, [(sw, st), (tw, tt)])


def test_encoder_copies_layers_and_applies_norm(rng, torch):
    layer = nn.TransformerEncoderLayer(6, 3, 5, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(6))
    assert len(enc.layers) == 3 and enc.layers[0] is not layer
    w0, w2 = enc.layers[0].linear1.weight, enc.layers[2].linear1.weight
    assert w0 is not w2 and np.array_equal(w0.numpy(), w2.numpy())  # deep copies, equal at first
    tlayer = torch.nn.TransformerEncoderLayer(6, 3, 5, dropout=0.0)
    tenc = torch.nn.TransformerEncoder(tlayer, 3, norm=torch.nn.LayerNorm(6), enable_nested_tensor=False)
    assert list(enc.state_dict()) == list(tenc.state_dict())
    enc.load_state_dict({k: v.detach().numpy() for k, v in tenc.state_dict().items()})
    x = rng.standard_normal((4, 2, 6)).astype(np.float32)
    kpm = np.array([[False] * 4, [False, False, True, True]])
    wo = enc(wgpar.tensor(x), src_key_padding_mask=kpm)
    to = tenc(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm))
    assert_close(wo.numpy(), to.detach().numpy(), 2e-4, 2e-5, "output")


def test_train_mode_dropout_shapes_and_unbatched(rng):
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True)
    x = wgpar.tensor(rng.standard_normal((3, 5, 8)).astype(np.float32), requires_grad=True)
    a, b = layer(x), layer(x)
    assert a.shape == (3, 5, 8)
    assert not np.array_equal(a.numpy(), b.numpy())
    a.sum().backward()
    assert x.grad.shape == x.shape and layer.linear1.weight.grad is not None
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())
    seq_first = nn.TransformerEncoderLayer(8, 2, 16).eval()
    one = seq_first(x[0])  # unbatched [S, E]
    assert_close(one.numpy(), seq_first(x[0].unsqueeze(1))[:, 0].numpy(), 1e-5, 1e-6, "unbatched")
    dec = nn.TransformerDecoderLayer(8, 4, 16, activation=nn.GELU())
    assert dec(wgpar.tensor(rng.standard_normal((5, 2, 8)).astype(np.float32)),
               wgpar.tensor(rng.standard_normal((3, 2, 8)).astype(np.float32))).shape == (5, 2, 8)


def test_errors():
    with pytest.raises(ValueError, match="activation"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="multiple of num_heads"):
        nn.TransformerDecoderLayer(8, 3)
    with pytest.raises(ValueError, match="num_layers"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 0)
