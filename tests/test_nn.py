"""nn: Module bookkeeping, state dicts, and each layer against NumPy (and PyTorch when importable)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from .helpers import assert_close


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 7)
        self.norm = nn.LayerNorm(7)
        self.head = nn.Sequential(nn.GELU(), nn.Dropout(0.5), nn.Linear(7, 3, bias=False))

    def forward(self, x):
        return self.head(self.norm(self.fc(x)))


def test_module_registration_and_names():
    m = Block()
    names = [k for k, _ in m.named_parameters()]
    assert names == ["fc.weight", "fc.bias", "norm.weight", "norm.bias", "head.2.weight"]
    assert [type(c).__name__ for c in m.children()] == ["Linear", "LayerNorm", "Sequential"]
    assert list(m.state_dict()) == names
    assert m.fc.weight.shape == (7, 5) and m.fc.bias.shape == (7,)
    assert isinstance(m.head[2], nn.Linear) and len(m.head) == 3
    assert "Linear(in_features=5, out_features=7, bias=True)" in repr(m)


def test_linear_default_init_and_forward(rng):
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    lin = nn.Linear(129, 33)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / math.sqrt(129)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert w.std() > 0.4 * bound  # uniform on [-bound, bound] has std bound/sqrt(3)
    x = rng.standard_normal((7, 129))
    assert_close(lin(wgpar.tensor(x)).numpy(), x @ w.T.astype(np.float64) + b, rtol=1e-5, atol=1e-5)


def test_manual_seed_makes_init_reproducible():
    wgpar.manual_seed(123)
    a = nn.Linear(4, 3).weight.numpy()
    wgpar.manual_seed(123)
    b = nn.Linear(4, 3).weight.numpy()
    np.testing.assert_array_equal(a, b)


def test_state_dict_round_trip_and_errors(rng):
    src, dst = Block(), Block()
    dst.load_state_dict({k: v.numpy() for k, v in src.state_dict().items()})
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    dst.load_state_dict(src.state_dict())
    sd = {k: v.numpy() for k, v in src.state_dict().items()}
    missing = dict(sd)
    del missing["fc.bias"]
    with pytest.raises(KeyError, match="fc.bias"):
        dst.load_state_dict(missing)
    with pytest.raises(KeyError, match="extra.weight"):
        dst.load_state_dict(sd | {"extra.weight": np.zeros(3)})
    bad = dict(sd)
    bad["fc.weight"] = np.zeros((5, 7), np.float32)
    with pytest.raises(ValueError, match=r"fc.weight.*\(5, 7\).*\(7, 5\)"):
        dst.load_state_dict(bad)
    assert dst.load_state_dict(missing, strict=False) == (["fc.bias"], [])


def test_train_eval_switches_dropout(rng):
    m = Block()
    x = wgpar.tensor(rng.standard_normal((16, 5)))
    m.eval()
    a, b = m(x).numpy(), m(x).numpy()
    np.testing.assert_array_equal(a, b)
    m.train()
    assert all(mod.training for mod in m.modules())
    assert not np.array_equal(m(x).numpy(), a)


def test_zero_grad_and_to_device(devs2, rng):
    m = nn.Linear(3, 2, device=devs2[0])
    (m(wgpar.tensor(rng.standard_normal((4, 3)), device=devs2[0])).sum()).backward()
    assert m.weight.grad is not None
    m.zero_grad(set_to_none=False)
    assert_close(m.weight.grad.numpy(), np.zeros((2, 3)))
    m.zero_grad()
    assert m.weight.grad is None
    w = m.weight.numpy()
    m.to(devs2[1])
    assert m.weight.device is devs2[1] and isinstance(m.weight, nn.Parameter)
    np.testing.assert_array_equal(m.weight.numpy(), w)
    assert m(wgpar.ones(2, 3, device=devs2[1])).device is devs2[1]


def test_layer_norm_embedding_against_numpy(rng):
    x = rng.standard_normal((3, 4, 33))
    ln = nn.LayerNorm(33)
    with wgpar.no_grad():
        ln.weight.copy_(wgpar.tensor(rng.standard_normal(33)))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy()
    assert_close(ln(wgpar.tensor(x)).numpy(), want, rtol=1e-4, atol=1e-5)
    emb = nn.Embedding(11, 6)
    idx = rng.integers(0, 11, (4, 7))
    assert_close(emb(idx).numpy(), emb.weight.numpy()[idx])
    with pytest.raises(IndexError):
        emb(np.array([11]))


def test_activation_modules(rng):
    x = rng.standard_normal((5, 6))
    t = wgpar.tensor(x)
    assert_close(nn.ReLU()(t).numpy(), np.maximum(x, 0))
    assert_close(nn.Tanh()(t).numpy(), np.tanh(x), rtol=1e-5)
    assert_close(nn.Sigmoid()(t).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-5)
    e = np.exp(x - x.max(-1, keepdims=True))
    assert_close(nn.Softmax(-1)(t).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_losses_against_numpy(rng):
    z = rng.standard_normal((9, 5))
    t = rng.integers(0, 5, 9)
    e = np.exp(z - z.max(1, keepdims=True))
    logp = np.log(e / e.sum(1, keepdims=True))
    zt = wgpar.tensor(z)
    assert_close(F.cross_entropy(zt, t).item(), -logp[np.arange(9), t].mean(), rtol=1e-5)
    assert_close(F.cross_entropy(zt, t, reduction="sum").item(), -logp[np.arange(9), t].sum(), rtol=1e-5)
    assert_close(F.cross_entropy(zt, t, reduction="none").numpy(), -logp[np.arange(9), t], rtol=1e-5)
    assert_close(nn.CrossEntropyLoss()(zt, wgpar.tensor(t)).item(), -logp[np.arange(9), t].mean(), rtol=1e-5)
    assert_close(F.nll_loss(wgpar.tensor(logp), t).item(), -logp[np.arange(9), t].mean(), rtol=1e-5)
    y = rng.standard_normal((9, 5))
    assert_close(nn.MSELoss()(zt, wgpar.tensor(y)).item(), ((z - y) ** 2).mean(), rtol=1e-5)


def test_loss_bad_input():
    z = wgpar.zeros(4, 3)
    with pytest.raises(IndexError, match="3"):
        F.cross_entropy(z, np.array([0, 1, 2, 3]))
    with pytest.raises(IndexError):
        F.cross_entropy(z, np.array([0, -1, 2, 1]))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        F.cross_entropy(z, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer"):
        F.cross_entropy(z, wgpar.zeros(4))
    with pytest.raises(ValueError, match=r"\(4, 3\).*\(4, 2\)"):
        F.mse_loss(z, wgpar.zeros(4, 2))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(z, np.array([0, 1, 2, 0]), reduction="avg")
    with pytest.raises(ValueError, match=r"\(4, 3\).*\(5, 2\)"):
        nn.Linear(2, 5)(z)


def test_layers_match_torch(rng, torch):
    wl = nn.Linear(6, 4)
    tl = torch.nn.Linear(6, 4)
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(wl.weight.numpy()))
        tl.bias.copy_(torch.tensor(wl.bias.numpy()))
    x = rng.standard_normal((5, 6)).astype(np.float32)
    assert_close(wl(wgpar.tensor(x)).numpy(), tl(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(F.gelu(wgpar.tensor(x)).numpy(), torch.nn.functional.gelu(torch.tensor(x)).numpy(),
                 rtol=1e-5, atol=1e-6)
    assert_close(F.layer_norm(wgpar.tensor(x), 6).numpy(),
                 torch.nn.functional.layer_norm(torch.tensor(x), (6,)).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forward_and_backward_match_torch(rng, approximate, torch):
    """Both GELUs against torch in float64, over the range where the approximations differ, NaN passing."""
    x = np.concatenate([rng.uniform(-8, 8, 997), [0.0, -3.0, 3.0, np.nan]]).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    t = wgpar.tensor(x, requires_grad=True)
    y = nn.GELU(approximate)(t)
    y.backward(wgpar.tensor(g))
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.gelu(tx, approximate=approximate)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    assert_close(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(t.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert np.isnan(y.numpy()[-1]) and np.isnan(t.grad.numpy()[-1])
    if approximate == "tanh":  # it really is the other function: the two differ by up to ~5e-4
        exact = F.gelu(wgpar.tensor(x[:-1])).numpy()
        assert np.abs(exact - y.numpy()[:-1]).max() > 1e-4
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")


@pytest.mark.parametrize("shape,norm,affine,dtype", [
    ((5, 7, 64), (64,), True, "float32"), ((3, 700), (700,), True, "float32"), ((4, 3, 5), (3, 5), True, "float32"),
    ((6, 9), (9,), False, "float32"), ((33, 16), (16,), True, "float16")], ids=str)
def test_fused_layer_norm_matches_torch(shape, norm, affine, dtype, rng, torch):
    """The fused kernels (every threads-per-row width: 1 to 128 here) against torch in float64, gradients of
    the input, weight and bias included; a NaN spreads over its own row only."""
    x = rng.standard_normal(shape).astype(np.float32) * 3 + 1
    g = rng.standard_normal(shape).astype(np.float32)
    m = nn.LayerNorm(norm, elementwise_affine=affine, dtype=dtype)
    if affine:
        with wgpar.no_grad():
            m.weight.copy_(wgpar.tensor(rng.standard_normal(norm).astype(np.float32)))
            m.bias.copy_(wgpar.tensor(rng.standard_normal(norm).astype(np.float32)))
    t = wgpar.tensor(x, dtype=dtype, requires_grad=True)
    y = m(t)
    assert y.grad_fn.name == "layer_norm" and y.dtype is t.dtype
    y.backward(wgpar.tensor(g, dtype=dtype))
    tx = torch.tensor(t.numpy().astype(np.float64), requires_grad=True)
    tw = torch.tensor(m.weight.numpy().astype(np.float64), requires_grad=True) if affine else None
    tb = torch.tensor(m.bias.numpy().astype(np.float64), requires_grad=True) if affine else None
    ty = torch.nn.functional.layer_norm(tx, norm, tw, tb)
    ty.backward(torch.tensor(g, dtype=torch.float64))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
    assert_close(y.numpy(), ty.detach().numpy(), **tol)
    assert_close(t.grad.numpy(), tx.grad.numpy(), **tol)
    if affine:
        assert_close(m.weight.grad.numpy(), tw.grad.numpy(), **tol)
        assert_close(m.bias.grad.numpy(), tb.grad.numpy(), **tol)
    x2 = x.reshape(-1, *norm).copy()
    x2[1].flat[2] = np.nan
    out = m(wgpar.tensor(x2, dtype=dtype)).numpy()
    assert np.isnan(out[1]).all() and not np.isnan(out[0]).any()
