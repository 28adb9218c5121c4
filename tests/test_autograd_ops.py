"""Gradients of the ops outside the registry's generated tests (tests/test_registry.py covers every
registry op): scalar operands, where / clamp, reductions, softmax, matmul, shapes, indexing, nn,
against finite differences (float64 NumPy) and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F

from .gradcheck import check


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("scalar", [2.5, -1.5])
def test_scalar_operands_grad(scalar, rng):
    x = np.abs(rng.standard_normal((5, 3))) + 0.5
    check(lambda t: scalar - t, lambda a: scalar - a, [x], rng)
    check(lambda t: scalar / t, lambda a: scalar / a, [x], rng)
    check(lambda t: t ** scalar, lambda a: a ** scalar, [x], rng)
    check(lambda t: abs(scalar) ** (t * 0.3), lambda a: abs(scalar) ** (a * 0.3), [x], rng)


def test_where_and_clamp_grad(rng):
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5,))
    cond_np = rng.standard_normal((4, 5)) > 0
    cond = wgpar.tensor(cond_np)
    check(lambda x, y: wgpar.where(cond, x, y), lambda x, y: np.where(cond_np, x, y), [a, b], rng)
    x = rng.standard_normal((6, 7))
    x = np.where(np.abs(np.abs(x) - 0.5) < 0.05, 0.0, x)
    check(lambda t: t.clamp(-0.5, 0.5), lambda v: np.clip(v, -0.5, 0.5), [x], rng)
    check(lambda t: t.clamp(min=-0.5), lambda v: np.maximum(v, -0.5), [x], rng)
    check(lambda t: t.clamp(max=0.5), lambda v: np.minimum(v, 0.5), [x], rng)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("axis,keep", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
def test_reduction_grad(op, axis, keep, rng):
    x = rng.standard_normal((3, 4, 5))
    f_np = lambda a: getattr(np, op)(a, axis=axis, keepdims=keep)  # noqa: E731
    check(lambda t: getattr(t, op)(axis=axis, keepdims=keep), f_np, [x], rng)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_grad(axis, log, rng):
    x = rng.standard_normal((3, 4, 5))
    f_w = (lambda t: wgpar.log_softmax(t, dim=axis)) if log else (lambda t: wgpar.softmax(t, dim=axis))
    f_np = (lambda a: np.log(_softmax(a, axis))) if log else (lambda a: _softmax(a, axis))
    check(f_w, f_np, [x], rng)


@pytest.mark.parametrize("sa,sb", [((5, 3), (3, 4)), ((2, 5, 3), (3, 4)), ((2, 1, 5, 3), (3, 3, 4)),
                                   ((3,), (3, 4)), ((5, 3), (3,)), ((3,), (3,))])
def test_matmul_grad(sa, sb, rng):
    check(lambda a, b: a @ b, lambda a, b: a @ b, [rng.standard_normal(sa), rng.standard_normal(sb)], rng)


def test_matmul_transposed_operands_grad(rng):
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((4, 3))
    check(lambda x, y: x.T @ y.T, lambda x, y: x.T @ y.T, [a, b], rng)


def test_shape_ops_grad(rng):
    x = rng.standard_normal((2, 3, 4))
    check(lambda t: t.reshape(4, 6) * 2, lambda a: a.reshape(4, 6) * 2, [x], rng)
    check(lambda t: t.permute(2, 0, 1).contiguous(), lambda a: a.transpose(2, 0, 1), [x], rng)
    check(lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2), [x], rng)
    check(lambda t: t.T.reshape(-1), lambda a: a.T.reshape(-1), [x], rng)
    check(lambda t: t[:, None, 1:, ::-2].unsqueeze(0).squeeze(), lambda a: a[:, None, 1:, ::-2].squeeze(), [x], rng)
    check(lambda t: t[1, ..., 2], lambda a: a[1, ..., 2], [x], rng)
    y = rng.standard_normal((1, 4))
    check(lambda t: t.expand(3, 4) * 1.5, lambda a: np.broadcast_to(a, (3, 4)) * 1.5, [y], rng)


def test_index_select_and_cat_stack_grad(rng):
    x = rng.standard_normal((5, 3))
    idx = np.array([[4, 0], [4, 4], [2, 1]])
    check(lambda t: wgpar.index_select(t, 0, idx), lambda a: a[idx], [x], rng)
    check(lambda t: t[:, [2, 2, 0]], lambda a: a[:, [2, 2, 0]], [x], rng)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    check(lambda u, v: wgpar.cat([u, v], dim=0), lambda u, v: np.concatenate([u, v], 0), [a, b], rng)
    c = rng.standard_normal((2, 3))
    check(lambda u, v: wgpar.stack([u, v], dim=1), lambda u, v: np.stack([u, v], 1), [a, c], rng)


def test_nn_functional_grads(rng):
    x, w, b = rng.standard_normal((4, 5)), rng.standard_normal((3, 5)), rng.standard_normal((3,))
    check(lambda x_, w_, b_: F.linear(x_, w_, b_), lambda x_, w_, b_: x_ @ w_.T + b_, [x, w, b], rng)

    def ln_np(x_, g_, b_):
        mu = x_.mean(-1, keepdims=True)
        var = ((x_ - mu) ** 2).mean(-1, keepdims=True)
        return (x_ - mu) / np.sqrt(var + 1e-5) * g_ + b_

    g, bb = rng.standard_normal((5,)), rng.standard_normal((5,))
    check(lambda x_, g_, b_: F.layer_norm(x_, 5, g_, b_), ln_np, [x, g, bb], rng, rtol=5e-3)
    t = np.array([2, 0, 1, 2])

    def ce_np(z):
        return -np.log(_softmax(z, 1)[np.arange(4), t]).mean()

    check(lambda z: F.cross_entropy(z, t), ce_np, [rng.standard_normal((4, 3))], rng)
    check(lambda z: F.cross_entropy(z, t, reduction="sum"), lambda z: ce_np(z) * 4,
          [rng.standard_normal((4, 3))], rng)
    y = rng.standard_normal((4, 5))
    check(lambda a: F.mse_loss(a, wgpar.tensor(y)), lambda a: ((a - y) ** 2).mean(), [x], rng)


def test_dropout_grad_matches_its_mask(rng):
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    x = wgpar.tensor(rng.standard_normal((50, 40)).astype(np.float32) + 3.0, requires_grad=True)
    y = F.dropout(x, p=0.3)
    y.sum().backward()
    yv, g = y.numpy(), x.grad.numpy()
    kept = yv != 0
    assert 0.6 < kept.mean() < 0.8, f"kept fraction {kept.mean()}"
    np.testing.assert_allclose(g, kept / 0.7, rtol=1e-6)
    np.testing.assert_allclose(yv[kept], x.numpy()[kept] / 0.7, rtol=1e-6)
    assert F.dropout(x, 0.3, training=False) is x


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_kernels_and_their_function(rng, reduction):
    """ops.loss's kernels against NumPy; nn.functional.cross_entropy is their autograd.Function."""
    from wgpar.autograd.nn_ops import CrossEntropy
    from wgpar.ops.loss import cross_entropy_grad, cross_entropy_rows

    x = rng.standard_normal((9, 6))
    t = rng.integers(0, 6, 9)
    lsm = x - x.max(1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
    logits, target = wgpar.tensor(x.astype(np.float32)), wgpar.tensor(t.astype(np.int32))
    np.testing.assert_allclose(cross_entropy_rows(logits, target).numpy(), -lsm[np.arange(9), t], rtol=1e-5)
    onehot = np.eye(6)[t]
    np.testing.assert_allclose(cross_entropy_grad(logits, target, wgpar.full((1,), 2.0)).numpy(),
                               (np.exp(lsm) - onehot) * 2.0 / 9, rtol=1e-5, atol=1e-7)
    xs = wgpar.tensor(x.astype(np.float32), requires_grad=True)
    loss = F.cross_entropy(xs, t, reduction=reduction)
    assert loss.grad_fn.name == CrossEntropy.name == "cross_entropy"
    per_row = -lsm[np.arange(9), t]
    np.testing.assert_allclose(loss.numpy(), {"mean": per_row.mean(), "sum": per_row.sum(), "none": per_row}[reduction],
                               rtol=1e-5)
    up = rng.standard_normal(9) if reduction == "none" else np.float64(1.5)
    loss.backward(wgpar.tensor(np.asarray(up, np.float32)))
    scale = up[:, None] if reduction == "none" else up / 9 if reduction == "mean" else up
    np.testing.assert_allclose(xs.grad.numpy(), (np.exp(lsm) - onehot) * scale, rtol=1e-5, atol=1e-6)


def test_against_torch_mlp_block(rng, torch):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w1 = rng.standard_normal((7, 5)).astype(np.float32)
    g = rng.standard_normal((7,)).astype(np.float32)
    t = rng.integers(0, 7, 6)

    def run(lib, tensor):
        X, W, G = tensor(x), tensor(w1, True), tensor(g, True)
        h = (X @ W.T).tanh() * G
        if lib == "torch":
            h = torch.nn.functional.layer_norm(torch.nn.functional.gelu(h), (7,))
            loss = torch.nn.functional.cross_entropy(torch.softmax(h, -1) * 3, torch.tensor(t))
        else:
            h = F.layer_norm(F.gelu(h), 7)
            loss = F.cross_entropy(wgpar.softmax(h, -1) * 3, t)
        loss.backward()
        return float(loss.item()), W.grad.numpy() if lib != "torch" else W.grad.detach().numpy(), \
            G.grad.numpy() if lib != "torch" else G.grad.detach().numpy()

    ref = run("torch", lambda a, rg=False: torch.tensor(a, dtype=torch.float64, requires_grad=rg))
    got = run("wgpar", lambda a, rg=False: wgpar.tensor(a, requires_grad=rg))
    assert abs(got[0] - ref[0]) < 1e-5 * max(1, abs(ref[0]))
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-3, atol=1e-5)


def test_copy_like_ops_grad(rng, devs2):
    x = rng.standard_normal((3, 5))
    check(lambda t: t.clone() * 2.0, lambda a: a * 2.0, [x], rng)
    check(lambda t: t.T.contiguous().exp(), lambda a: np.exp(a.T), [x], rng)
    check(lambda t: t.half().float() * 1.0, lambda a: a, [np.round(x * 8) / 8], rng)  # exact in float16
    # across devices: the gradient comes back to the source device
    t = wgpar.tensor(x.astype(np.float32), device=devs2[0], requires_grad=True)
    y = (t.to(devs2[1]) * 3.0).sum()
    y.backward()
    assert t.grad.device is devs2[0]
    np.testing.assert_allclose(t.grad.numpy(), np.full((3, 5), 3.0))


def test_loss_variants_grad(rng):
    t = rng.integers(0, 4, 6)
    w = rng.standard_normal(6)

    def logp(z):
        return np.log(_softmax(z, 1))

    check(lambda z: F.nll_loss(F.log_softmax(z, 1), t), lambda z: -logp(z)[np.arange(6), t].mean(),
          [rng.standard_normal((6, 4))], rng)
    check(lambda z: (F.cross_entropy(z, t, reduction="none") * wgpar.tensor(w)).sum(),
          lambda z: (-logp(z)[np.arange(6), t] * w).sum(), [rng.standard_normal((6, 4))], rng)
