"""The remaining Tensor ops of the first week: cumsum / cumprod (a scan kernel), gather / scatter /
scatter_add / index_add, nonzero and boolean-mask indexing, sin / cos / tan with exact range reduction.
Values and gradients against NumPy in float64 (finite differences or the analytic formula), and against
PyTorch through the ``torch`` fixture, on fresh random inputs of awkward sizes."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .gradcheck import check
from .helpers import assert_close


def _t(a, requires_grad=False):
    return wgpar.tensor(np.asarray(a), requires_grad=requires_grad)


# -- cumsum / cumprod ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((5, 13), 1), ((5, 13), 0), ((3, 4, 6), 1), ((2, 1500), -1),
                                       ((1, 70001), 1), ((0, 5), 1), ((4, 0), 1)])
def test_cumsum_forward(rng, shape, dim):
    x = rng.standard_normal(shape).astype(np.float32)
    got = _t(x).cumsum(dim).numpy()
    want = np.cumsum(x.astype(np.float64), axis=dim)
    # a tree of float32 additions: within a few ulp of the largest partial sum
    assert_close(got, want, rtol=0, atol=4e-7 * max(1.0, float(np.abs(want).max()) if want.size else 1.0) * 8)


def test_cumsum_of_a_row_past_two_levels_and_the_loop_limit(rng):
    x = rng.integers(-3, 4, (2, 1_100_003)).astype(np.float32)  # integers: every partial sum is exact
    got = wgpar.cumsum(_t(x), 1).numpy()
    np.testing.assert_array_equal(got, np.cumsum(x.astype(np.float64), 1))


@pytest.mark.parametrize("shape,dim", [((6,), 0), ((4, 9), 1), ((3, 5, 4), 0)])
def test_cumsum_backward(rng, shape, dim):
    x = rng.standard_normal(shape)
    check(lambda t: t.cumsum(dim) * 1.5, lambda a: np.cumsum(a, axis=dim) * 1.5, [x], rng)


def test_cumsum_backward_on_a_long_row(rng):
    x = rng.standard_normal((2, 5000)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    t = _t(x, requires_grad=True)
    t.cumsum(1).backward(_t(g))
    want = np.cumsum(g[:, ::-1].astype(np.float64), 1)[:, ::-1]
    assert_close(t.grad.numpy(), want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape,dim", [((6,), 0), ((4, 9), 1), ((3, 5, 4), 0)])
def test_cumprod_forward_and_backward(rng, shape, dim):
    x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    check(lambda t: t.cumprod(dim), lambda a: np.cumprod(a, axis=dim), [x], rng)


@pytest.mark.parametrize("zeros", [[3], [0], [8], [2, 5], [1, 1 + 0, 6]])
def test_cumprod_gradient_with_zeros(rng, zeros):
    x = rng.uniform(0.5, 1.5, (3, 9)) * rng.choice([-1, 1], (3, 9))
    x[1, zeros] = 0.0
    x[2, -1] = 0.0
    check(lambda t: wgpar.cumprod(t, 1), lambda a: np.cumprod(a, axis=1), [x], rng)


def test_cumprod_long_row(rng):
    x = (1 + 1e-4 * rng.standard_normal((2, 70001))).astype(np.float32)
    got = _t(x).cumprod(-1).numpy()
    want = np.cumprod(x.astype(np.float64), -1)
    # float32 products, in a tree: relative error within the bound of any float32 order, n * 2**-24
    assert_close(got / want, np.ones_like(want), rtol=0, atol=x.shape[1] * 2.0**-24)


def test_cumsum_cumprod_int_bool_and_half(dev, rng):
    xi = rng.integers(-9, 10, (4, 2000)).astype(np.int32)
    got = _t(xi).cumsum(1)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.cumsum(xi.astype(np.int64), 1))
    big = np.full((1, 40), 7, np.int32)  # 7**40 wraps modulo 2**32 (PyTorch: int64)
    wrapped = (np.cumprod(np.full(40, 7, dtype=object)) % 2**32).astype(np.int64)
    wrapped = np.where(wrapped >= 2**31, wrapped - 2**32, wrapped).astype(np.int32)
    np.testing.assert_array_equal(_t(big).cumprod(1).numpy()[0], wrapped)
    b = rng.random((3, 50)) < 0.4
    got = wgpar.tensor(b).cumsum(1)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.cumsum(b, 1))
    f = rng.standard_normal((3, 11)).astype(np.float32)
    np.testing.assert_allclose(_t(f).cumsum(0, dtype=wgpar.int32).numpy(), np.cumsum(f.astype(np.int32), 0))
    if dev.has_f16:
        h = rng.standard_normal((3, 300)).astype(np.float16)
        got = wgpar.tensor(h).cumsum(1)
        assert got.dtype is wgpar.float16
        assert_close(got.numpy(), np.cumsum(h.astype(np.float64), 1).astype(np.float16), rtol=2e-3, atol=2e-2)


def test_cumsum_cumprod_match_torch(torch, rng):
    x = rng.standard_normal((4, 1100)).astype(np.float32)
    x[1, 17] = 0.0
    x[2, [5, 900]] = 0.0
    g = rng.standard_normal(x.shape).astype(np.float32)
    for name in ("cumsum", "cumprod"):
        xt = torch.tensor(x if name == "cumsum" else np.clip(x, -1.05, 1.05), requires_grad=True)
        getattr(xt, name)(1).backward(torch.tensor(g))
        w = _t(xt.detach().numpy(), requires_grad=True)
        out = getattr(w, name)(1)
        out.backward(_t(g))
        want = getattr(xt.detach(), name)(1).numpy()
        assert_close(out.numpy(), want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()), what=name)
        assert_close(w.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-4 * max(1.0, np.abs(xt.grad.numpy()).max()),
                     what=f"{name} grad")
