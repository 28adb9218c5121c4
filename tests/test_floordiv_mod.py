"""// and % follow Python/NumPy: quotients round toward -inf, remainders take the divisor's sign."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .gradcheck import check


@pytest.mark.parametrize("n", [1, 7, 33, 1000])
def test_int_floordiv_and_mod_match_numpy(rng, n):
    a = rng.integers(-50, 50, n)
    b = rng.integers(1, 9, n) * rng.choice([-1, 1], n)
    ta, tb = wgpar.tensor(a), wgpar.tensor(b)
    q, r = ta // tb, ta % tb
    assert q.dtype is wgpar.int32 and r.dtype is wgpar.int32
    np.testing.assert_array_equal(q.numpy(), a // b)
    np.testing.assert_array_equal(r.numpy(), a % b)
    np.testing.assert_array_equal((ta // 3).numpy(), a // 3)
    np.testing.assert_array_equal((-7 % tb).numpy(), -7 % b)
    np.testing.assert_array_equal(ta.remainder(-4).numpy(), np.remainder(a, -4))


@pytest.mark.parametrize("shape_a,shape_b", [((7, 5), (7, 5)), ((4, 1000), (1000,)), ((3, 1), (1, 9))])
def test_float_floordiv_and_mod_match_numpy(rng, shape_a, shape_b):
    a = rng.standard_normal(shape_a) * 10
    b = (rng.uniform(0.5, 3.0, shape_b) * rng.choice([-1, 1], shape_b))
    ta, tb = wgpar.tensor(a), wgpar.tensor(b)
    a32, b32 = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(ta.floor_divide(tb).numpy(), np.floor_divide(a32, b32))
    np.testing.assert_allclose((ta % tb).numpy(), np.mod(a32, b32), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose((2.5 // tb).numpy(), np.floor_divide(2.5, b32))


def test_mod_gradient(rng):
    a = rng.uniform(0.1, 0.9, (4, 5)) + rng.integers(-3, 3, (4, 5))
    b = np.full((5,), 1.0) + rng.uniform(0.05, 0.2, 5)
    # keep a/b away from integers, where the remainder jumps
    frac = (a / b) - np.floor(a / b)
    a = np.where((frac < 0.05) | (frac > 0.95), a + 0.3 * b, a)
    check(lambda x, y: x % y, lambda x, y: np.mod(x, y), [a, b], rng)
