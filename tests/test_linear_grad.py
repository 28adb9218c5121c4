"""F.linear as one graph node: gradients as torch's linear computes them (the weight's contiguous
[out, in], the bias's one column sum), against NumPy float64 or torch, in every path that reaches it."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.autograd import backward_input
from wgpar.nn import functional as F

from .helpers import assert_close


def _case(rng, lead, n_in, n_out, bias):
    x = rng.standard_normal(lead + (n_in,))
    w = rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)
    b = rng.standard_normal(n_out) if bias else None
    g = rng.standard_normal(lead + (n_out,))
    return x, w, b, g


def _want(reference, x, w, b, g):
    """(y, gx, gw, gb) in float64, from torch where given."""
    if reference is not None:
        torch = reference
        tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
        tb = torch.tensor(b, dtype=torch.float64, requires_grad=True) if b is not None else None
        y = torch.nn.functional.linear(tx, tw, tb)
        y.backward(torch.tensor(g))
        return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), None if tb is None else tb.grad.numpy()
    y = x @ w.T + (b if b is not None else 0.0)
    g2 = g.reshape(-1, g.shape[-1])
    return y, g @ w, g2.T @ x.reshape(-1, x.shape[-1]), None if b is None else g2.sum(0)


@pytest.mark.parametrize("lead,n_in,n_out", [((11,), 7, 13), ((3, 5), 33, 6), ((2, 3, 4), 16, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradients_and_the_weight_gradient_is_contiguous(rng, reference, lead, n_in, n_out, bias):
    x, w, b, g = _case(rng, lead, n_in, n_out, bias)
    tx, tw = (wgpar.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w))
    tb = wgpar.tensor(b.astype(np.float32), requires_grad=True) if bias else None
    seen = []
    tw.register_hook(lambda grad: seen.append(grad.is_contiguous()))
    y = F.linear(tx, tw, tb)
    y.backward(wgpar.tensor(g.astype(np.float32)))
    want = _want(reference, x, w, b, g)
    assert_close(y.numpy(), want[0], rtol=1e-5, atol=1e-5, what="y")
    assert_close(tx.grad.numpy(), want[1], rtol=1e-5, atol=1e-5, what="x.grad")
    assert_close(tw.grad.numpy(), want[2], rtol=1e-5, atol=1e-5, what="weight.grad")
    if bias:
        assert_close(tb.grad.numpy(), want[3], rtol=1e-5, atol=1e-5, what="bias.grad")
    # g.T @ x lands as [out, in]: no strided view for .grad to copy
    assert seen == [True]


def test_linear_split_backward_equals_one_backward(rng):
    x, w, b, g = _case(rng, (9,), 10, 6, True)
    grads = []
    for split in (False, True):
        tx, tw, tb = (wgpar.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b))
        y = F.linear(tx, tw, tb)
        if split:
            deferred = backward_input(y, wgpar.tensor(g.astype(np.float32)), [tx])
            assert tx.grad is not None and tw.grad is None and tb.grad is None
            deferred.run()
        else:
            y.backward(wgpar.tensor(g.astype(np.float32)))
        grads.append([t.grad.numpy() for t in (tx, tw, tb)])
    for a, c in zip(*grads):
        assert_close(a, c, rtol=0, atol=0)


def test_linear_under_autocast_gives_float32_gradients(rng, dev):
    if not dev.has_f16:
        pytest.skip("no shader-f16 on this adapter")
    x, w, b, g = _case(rng, (8, 3), 24, 12, True)
    tx, tw, tb = (wgpar.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b))
    with wgpar.autocast():
        y = F.linear(tx, tw, tb)
    assert y.dtype is wgpar.float16
    y.float().backward(wgpar.tensor(g.astype(np.float32)))
    want = _want(None, x, w, b, g)
    for t, ref, name in ((tx, want[1], "x"), (tw, want[2], "weight"), (tb, want[3], "bias")):
        assert t.grad.dtype is wgpar.float32
        assert_close(t.grad.numpy(), ref, rtol=2e-2, atol=2e-2, what=name)


def test_linear_with_mixed_dtypes_promotes_as_before(rng, dev):
    if not dev.has_f16:
        pytest.skip("no shader-f16 on this adapter")
    x, w, b, g = _case(rng, (5,), 8, 4, True)
    tx = wgpar.tensor(x.astype(np.float16), requires_grad=True)
    tw, tb = (wgpar.tensor(a.astype(np.float32), requires_grad=True) for a in (w, b))
    y = F.linear(tx, tw, tb)
    assert y.dtype is wgpar.float32
    y.backward(wgpar.tensor(g.astype(np.float32)))
    want = _want(None, x.astype(np.float16).astype(np.float64), w, b, g)
    assert tx.grad.dtype is wgpar.float16
    assert_close(tw.grad.numpy(), want[2], rtol=1e-2, atol=1e-2, what="weight")
    assert_close(tb.grad.numpy(), want[3], rtol=1e-5, atol=1e-5, what="bias")


@pytest.mark.parametrize("amp", [False, True])
def test_an_empty_batch_gives_zero_parameter_gradients(amp, dev):
    """No rows: an empty output, and zero weight and bias gradients of the parameters' dtype (float32 under
    autocast too)."""
    if amp and not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    layer = nn.Linear(4, 3)
    x = wgpar.zeros(0, 4, requires_grad=True)
    with wgpar.autocast(enabled=amp):
        y = layer(x)
    assert y.shape == (0, 3) and y.dtype is (wgpar.float16 if amp else wgpar.float32)
    y.float().sum().backward()
    assert x.grad.shape == (0, 4)
    for p in (layer.weight, layer.bias):
        assert p.grad.dtype is wgpar.float32 and not p.grad.numpy().any()
