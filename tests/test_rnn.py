"""RNN / LSTM / GRU and their cells: forward and gradients (inputs, initial states, every parameter) against a
NumPy float64 reference and finite differences, torch's state dicts loaded and compared, on awkward sizes."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn

from .gradcheck import numeric_grad
from .helpers import assert_close

MODES = {"LSTM": "LSTM", "GRU": "GRU", "RNN": "RNN_TANH"}


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def np_step(mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """One step in float64 from the definitions in torch's documentation."""
    gi = x @ w_ih.T + (0 if b_ih is None else b_ih)
    gh = h @ w_hh.T + (0 if b_hh is None else b_hh)
    hs = h.shape[-1]
    if mode == "LSTM":
        i, f, g, o = np.split(gi + gh, 4, axis=-1)
        c = _sig(f) * c + _sig(i) * np.tanh(g)
        return _sig(o) * np.tanh(c), c
    if mode == "GRU":
        r, z = _sig(gi[..., :hs] + gh[..., :hs]), _sig(gi[..., hs:2 * hs] + gh[..., hs:2 * hs])
        n = np.tanh(gi[..., 2 * hs:] + r * gh[..., 2 * hs:])
        return (1 - z) * n + z * h, None
    pre = gi + gh
    return (np.tanh(pre) if mode == "RNN_TANH" else np.maximum(pre, 0)), None


def np_rnn(mode, x, params, h0, c0, layers, dirs):
    """The stack over time-major x [T, N, in]: (output, h_n, c_n)."""
    steps = x.shape[0]
    hn, cn = [], []
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w = [params.get(k + sfx) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            k = layer * dirs + d
            h, c = h0[k], None if c0 is None else c0[k]
            ys = [None] * steps
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                h, c = np_step(mode, x[t], h, c, *w)
                ys[t] = h
            outs.append(np.stack(ys))
            hn.append(h)
            cn.append(c)
        x = np.concatenate(outs, -1)
    return x, np.stack(hn), None if c0 is None else np.stack(cn)


def _load(model, rng, scale=0.5):
    params = {k: (scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(params)
    return {k: v.astype(np.float64) for k, v in params.items()}


# (mode, input_size, hidden_size, num_layers, bidirectional, bias, batch_first, T, N)
CASES = [
    ("LSTM", 3, 5, 2, True, True, False, 4, 3),
    ("LSTM", 6, 3, 1, False, False, True, 7, 1),
    ("GRU", 4, 3, 2, True, True, True, 5, 2),
    ("GRU", 2, 6, 1, False, True, False, 3, 4),
    ("RNN", 5, 4, 3, False, True, False, 6, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_and_gradients_match_numpy(case, rng):
    cls, in_size, hs, layers, bidir, bias, bf, steps, n = case
    mode, dirs = MODES[cls], 2 if bidir else 1
    model = getattr(nn, cls)(in_size, hs, num_layers=layers, bias=bias, batch_first=bf, bidirectional=bidir)
    params = _load(model, rng)
    names = list(params)
    x = rng.standard_normal((steps, n, in_size))
    h0 = rng.standard_normal((layers * dirs, n, hs))
    c0 = rng.standard_normal((layers * dirs, n, hs)) if mode == "LSTM" else None

    def ref(x, h0, c0, *ps):
        out, hn, cn = np_rnn(mode, x, dict(zip(names, ps)), h0, c0, layers, dirs)
        return np.concatenate([out.ravel(), hn.ravel()] + ([] if cn is None else [cn.ravel()]))

    xt = wgpar.tensor((x.transpose(1, 0, 2) if bf else x).astype(np.float32), requires_grad=True)
    h0t = wgpar.tensor(h0.astype(np.float32), requires_grad=True)
    c0t = None if c0 is None else wgpar.tensor(c0.astype(np.float32), requires_grad=True)
    out, state = model(xt, h0t if c0t is None else (h0t, c0t))
    want_out, want_hn, want_cn = np_rnn(mode, x, params, h0, c0, layers, dirs)
    assert out.shape == ((n, steps, dirs * hs) if bf else (steps, n, dirs * hs))
    assert_close((out.numpy().transpose(1, 0, 2) if bf else out.numpy()), want_out, 1e-5, 1e-5, "output")
    hn, cn = state if mode == "LSTM" else (state, None)
    assert_close(hn.numpy(), want_hn, 1e-5, 1e-5, "h_n")
    if cn is not None:
        assert_close(cn.numpy(), want_cn, 1e-5, 1e-5, "c_n")

    # One backward through output, h_n and c_n together; every gradient against finite differences.
    outs = [out.transpose(0, 1) if bf else out, hn] + ([] if cn is None else [cn])
    upstream = rng.standard_normal(sum(t.numel() for t in outs))
    wgpar.cat([t.reshape(-1) for t in outs]).backward(wgpar.tensor(upstream.astype(np.float32)))
    arrays = [x, h0] + ([] if c0 is None else [c0]) + [params[k] for k in names]
    f = ref if c0 is not None else (lambda x, h0, *ps: ref(x, h0, None, *ps))
    want = numeric_grad(f, arrays, upstream)
    got = [xt.grad.numpy().transpose(1, 0, 2) if bf else xt.grad.numpy(), h0t.grad.numpy()]
    got += [] if c0t is None else [c0t.grad.numpy()]
    got += [getattr(model, k).grad.numpy() for k in names]
    for what, g, w in zip(["input", "h0"] + ([] if c0 is None else ["c0"]) + names, got, want):
        assert_close(g, w, 2e-3, 2e-4 * max(1.0, np.abs(w).max()), what)


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_torch_state_dict_loads_and_matches(cls, rng, torch):
    kwargs = dict(num_layers=2, bidirectional=True, batch_first=True)
    tm = getattr(torch.nn, cls)(7, 6, **kwargs)
    wm = getattr(nn, cls)(7, 6, **kwargs)
    assert list(wm.state_dict()) == list(tm.state_dict())
    assert [tuple(v.shape) for v in wm.state_dict().values()] == [tuple(v.shape) for v in tm.state_dict().values()]
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((3, 9, 7)).astype(np.float32)
    xw, xt = wgpar.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    wo, ws = wm(xw)
    to, ts = tm(xt)
    assert_close(wo.numpy(), to.detach().numpy(), 1e-4, 1e-5, "output")
    ws, ts = (ws, ts) if cls == "LSTM" else ((ws,), (ts,))
    for a, b in zip(ws, ts):
        assert_close(a.numpy(), b.detach().numpy(), 1e-4, 1e-5, "state")
    g = rng.standard_normal(to.shape).astype(np.float32)
    wo.backward(wgpar.tensor(g))
    to.backward(torch.tensor(g))
    assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-4, 1e-5, "input grad")
    for k, p in tm.named_parameters():
        assert_close(getattr(wm, k).grad.numpy(), p.grad.numpy(), 1e-4, 1e-5, k)


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_unbatched_input_and_states(cls, rng, torch):
    tm, wm = getattr(torch.nn, cls)(4, 5, num_layers=2), getattr(nn, cls)(4, 5, num_layers=2)
    wm.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = rng.standard_normal((6, 4)).astype(np.float32)
    h0 = rng.standard_normal((2, 5)).astype(np.float32)
    hx_t = (torch.tensor(h0), torch.tensor(-h0)) if cls == "LSTM" else torch.tensor(h0)
    hx_w = (wgpar.tensor(h0), wgpar.tensor(-h0)) if cls == "LSTM" else wgpar.tensor(h0)
    to, ts = tm(torch.tensor(x), hx_t)
    wo, ws = wm(wgpar.tensor(x), hx_w)
    assert wo.shape == (6, 5)
    assert_close(wo.numpy(), to.detach().numpy(), 1e-4, 1e-5, "output")
    for a, b in zip(ws if cls == "LSTM" else (ws,), ts if cls == "LSTM" else (ts,)):
        assert a.shape == (2, 5)
        assert_close(a.numpy(), b.detach().numpy(), 1e-4, 1e-5, "state")


@pytest.mark.parametrize("cls", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_match_numpy_and_torch(cls, rng, reference):
    mode = {"LSTMCell": "LSTM", "GRUCell": "GRU", "RNNCell": "RNN_TANH"}[cls]
    cell = getattr(nn, cls)(5, 3)
    assert list(cell.state_dict()) == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    if reference is None:
        params = _load(cell, rng)
    else:
        tc = getattr(reference.nn, cls)(5, 3)
        params = {k: v.detach().numpy().astype(np.float64) for k, v in tc.state_dict().items()}
        cell.load_state_dict({k: v.astype(np.float32) for k, v in params.items()})
    x = rng.standard_normal((4, 5)).astype(np.float32)
    h = rng.standard_normal((4, 3)).astype(np.float32)
    c = rng.standard_normal((4, 3)).astype(np.float32)
    xw = wgpar.tensor(x, requires_grad=True)
    got = cell(xw, (wgpar.tensor(h), wgpar.tensor(c)) if mode == "LSTM" else wgpar.tensor(h))
    want_h, want_c = np_step(mode, x.astype(np.float64), h.astype(np.float64), c.astype(np.float64),
                             *(params[k] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))
    got_h = got[0] if mode == "LSTM" else got
    assert_close(got_h.numpy(), want_h, 1e-5, 1e-6, "h'")
    if mode == "LSTM":
        assert_close(got[1].numpy(), want_c, 1e-5, 1e-6, "c'")
    got_h.sum().backward()
    if reference is not None:
        xt = reference.tensor(x, requires_grad=True)
        out = tc(xt, (reference.tensor(h), reference.tensor(c)) if mode == "LSTM" else reference.tensor(h))
        (out[0] if mode == "LSTM" else out).sum().backward()
        assert_close(xw.grad.numpy(), xt.grad.numpy(), 1e-4, 1e-5, "input grad")
        for k, p in tc.named_parameters():
            assert_close(getattr(cell, k).grad.numpy(), p.grad.numpy(), 1e-4, 1e-5, k)
    # Unbatched, no state: zeros, as torch.
    one = cell(wgpar.tensor(x[0]))
    z = np.zeros(3)
    want1 = np_step(mode, x[0].astype(np.float64), z, z, *(params[k] for k in ("weight_ih", "weight_hh",
                                                                                "bias_ih", "bias_hh")))[0]
    assert_close((one[0] if mode == "LSTM" else one).numpy(), want1, 1e-5, 1e-6, "unbatched h'")


def test_dropout_between_layers_only_in_training(rng):
    m = nn.LSTM(3, 4, num_layers=3, dropout=0.5)
    x = wgpar.tensor(rng.standard_normal((5, 2, 3)).astype(np.float32))
    m.eval()
    a, b = m(x)[0].numpy(), m(x)[0].numpy()
    np.testing.assert_array_equal(a, b)
    m.train()
    outs = [m(x)[0] for _ in range(2)]
    assert outs[0].shape == (5, 2, 4)
    assert not np.array_equal(outs[0].numpy(), outs[1].numpy())  # masks differ between calls
    m1 = nn.GRU(3, 4, num_layers=1, dropout=0.5)  # one layer: no dropout anywhere (torch warns; same result)
    np.testing.assert_array_equal(m1(x)[0].numpy(), m1(x)[0].numpy())


def test_errors(rng):
    m = nn.LSTM(3, 4, num_layers=2)
    x = wgpar.tensor(rng.standard_normal((5, 2, 3)).astype(np.float32))
    with pytest.raises(ValueError, match=r"input_size"):
        nn.GRU(0, 4)
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match=r"in = 3.*\(5, 2, 7\)"):
        m(wgpar.tensor(np.zeros((5, 2, 7), np.float32)))
    with pytest.raises(ValueError, match=r"h_0 of shape \(1, 2, 4\), expected \(2, 2, 4\)"):
        m(x, (wgpar.zeros(1, 2, 4), wgpar.zeros(2, 2, 4)))
    with pytest.raises(TypeError, match="pair"):
        m(x, wgpar.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="no time steps"):
        m(wgpar.zeros(0, 2, 3))
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
