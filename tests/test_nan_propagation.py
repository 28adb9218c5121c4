"""NaN propagates as in PyTorch: through activations, max / min, clamp, their gradients, a whole MLP.

Each expected gradient is PyTorch's (checked against torch 2.x on the CPU); the rules are written
out so the tests run without torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

NAN = float("nan")


def _leaf(values):
    return wgpar.tensor(np.asarray(values, dtype=np.float32), requires_grad=True)


def test_activations_keep_nan():
    x = wgpar.tensor(np.array([NAN, -1.0, 2.0, 0.0], np.float32))
    for name in ("relu", "tanh", "sigmoid", "gelu", "exp", "abs", "neg", "sqrt", "log"):
        assert np.isnan(getattr(F if name == "gelu" else wgpar, name)(x).numpy()[0]), name
    np.testing.assert_array_equal(x.relu().numpy(), [NAN, 0, 2, 0])
    np.testing.assert_array_equal(x.clamp(-0.5, 0.5).numpy(), [NAN, -0.5, 0.5, 0])
    np.testing.assert_array_equal(x.maximum(wgpar.zeros(4)).numpy(), [NAN, 0, 2, 0])
    np.testing.assert_array_equal(wgpar.zeros(4).minimum(x).numpy(), [NAN, -1, 0, 0])
    np.testing.assert_array_equal(wgpar.autograd.differentiable.unary("sign", x).numpy(), [0, -1, 1, 0])  # torch: 0


def test_dropout_keeps_nan_even_where_it_drops():
    x = wgpar.tensor(np.full(1000, NAN, np.float32))
    assert np.isnan(F.dropout(x, p=0.5).numpy()).all()  # x * mask * scale: NaN * 0 is NaN (PyTorch)
    y = F.dropout(wgpar.ones(1000), p=0.5).numpy()
    assert 300 < (y == 0).sum() < 700 and set(np.unique(y)) == {0.0, 2.0}


def test_max_min_argmax_argmin_take_the_nan():
    x = wgpar.tensor(np.array([[1.0, NAN, 3.0, NAN], [4.0, 2.0, -1.0, 0.0]], np.float32))
    np.testing.assert_array_equal(x.amax(1).numpy(), [NAN, 4])
    np.testing.assert_array_equal(x.amin(1).numpy(), [NAN, -1])
    np.testing.assert_array_equal(x.max(1).values.numpy(), [NAN, 4])
    np.testing.assert_array_equal(x.min(1).indices.numpy(), [1, 2])  # the first NaN, as torch
    np.testing.assert_array_equal(x.argmax(1).numpy(), [1, 0])  # the first NaN, as torch and NumPy
    np.testing.assert_array_equal(x.argmin(1).numpy(), [1, 2])
    assert np.isnan(x.max().item()) and int(x.argmax().item()) == 1
    np.testing.assert_array_equal(x.amax(0).numpy(), [4, NAN, 3, NAN])


def test_gradients_at_nan_follow_pytorch():
    x = _leaf([NAN, -1.0, 2.0, 0.0])
    x.relu().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1, 0, 1, 0])  # relu passes the gradient at NaN

    x = _leaf([NAN, -1.0, 0.25, 2.0])
    x.clamp(-0.5, 0.5).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0, 1, 0])  # outside [min, max], NaN included

    a, b = _leaf([NAN, 1.0, 2.0, 3.0]), _leaf([1.0, NAN, 2.0, 1.0])
    a.maximum(b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1, 1, 0.5, 1])  # a NaN pair: both get the gradient
    np.testing.assert_array_equal(b.grad.numpy(), [1, 1, 0.5, 0])
    a.grad = b.grad = None
    a.minimum(b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1, 1, 0.5, 0])
    np.testing.assert_array_equal(b.grad.numpy(), [1, 1, 0.5, 1])

    x = _leaf([1.0, NAN, 3.0, -1.0])
    x.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 0, 0])  # the gradient goes to the NaN
    x = _leaf([[2.0, NAN], [5.0, 5.0]])
    x.amin(1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1], [0.5, 0.5]])  # amin splits it over ties
    x = _leaf([[2.0, NAN], [5.0, 5.0]])
    x.min(1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1], [1, 0]])  # min(dim) gives it to the index


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_clip_grad_norm_with_a_nan_gradient(norm_type):
    p, q = _leaf(np.ones(5)), _leaf(np.ones(300))
    p.grad = wgpar.tensor(np.array([1.0, NAN, 2.0, 0.0, -1.0], np.float32))
    q.grad = wgpar.tensor(np.full(300, 0.5, np.float32))
    with pytest.raises(RuntimeError, match="nan"):
        nn.utils.clip_grad_norm_([p, q], 1.0, norm_type=norm_type, error_if_nonfinite=True)
    total = nn.utils.clip_grad_norm_([p, q], 1.0, norm_type=norm_type)
    assert np.isnan(total.item())
    assert np.isnan(q.grad.numpy()).all()  # scaled by a NaN coefficient, as in PyTorch


def test_mlp_fed_a_nan_row_gives_nan_loss_and_gradients(rng):
    wgpar.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 5))
    x = rng.standard_normal((9, 7)).astype(np.float32)
    y = rng.integers(0, 5, 9)
    loss = F.cross_entropy(model(wgpar.tensor(x)), y)
    loss.backward()
    assert np.isfinite(loss.item())
    assert all(np.isfinite(p.grad.numpy()).all() for p in model.parameters())
    model.zero_grad()

    x[4, 2] = NAN
    out = model(wgpar.tensor(x))
    o = out.numpy()
    assert np.isnan(o[4]).all() and np.isfinite(np.delete(o, 4, axis=0)).all()
    per_row = F.cross_entropy(out, y, reduction="none").numpy()
    assert np.isnan(per_row[4]) and np.isfinite(np.delete(per_row, 4)).all()
    loss = F.cross_entropy(out, y)
    assert np.isnan(loss.item())
    loss.backward()
    # NaN reaches every parameter: dW = dH^T X sums over the batch, the NaN row included (as in PyTorch).
    for name, p in model.named_parameters():
        assert np.isnan(p.grad.numpy()).all(), name
