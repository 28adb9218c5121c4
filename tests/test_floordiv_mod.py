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


INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _wrap(q: int) -> int:
    return (q - INT_MIN) % 2**32 + INT_MIN


def test_int_floordiv_and_mod_at_the_int32_extremes():
    # Every sign combination, the extremes, and INT_MIN // -1 (wraps to INT_MIN, as in PyTorch).
    nums = [INT_MIN, INT_MIN + 1, -7, -1, 0, 1, 7, INT_MAX]
    dens = [INT_MIN, -7, -2, -1, 1, 2, 7, INT_MAX]
    a = np.array([[n] * len(dens) for n in nums], dtype=np.int32)
    b = np.array([dens] * len(nums), dtype=np.int32)
    q = np.array([[_wrap(n // d) for d in dens] for n in nums])
    r = np.array([[n % d for d in dens] for n in nums])
    ta, tb = wgpar.tensor(a), wgpar.tensor(b)
    np.testing.assert_array_equal((ta // tb).numpy(), q)
    np.testing.assert_array_equal((ta % tb).numpy(), r)
    # broadcast (block kernel, "div" / "mod" modes) and transposed (strided kernel) operands
    np.testing.assert_array_equal((wgpar.tensor(a[:, :1]) // wgpar.tensor(b[:1])).numpy(), q)
    np.testing.assert_array_equal((wgpar.tensor(np.ascontiguousarray(a.T)).T % tb).numpy(), r)
    for d in (-1, 3, -3, INT_MIN):
        np.testing.assert_array_equal((ta // d).numpy(), [[_wrap(n // d)] * len(dens) for n in nums])
        np.testing.assert_array_equal((d % tb).numpy(), [[d % x for x in dens]] * len(nums))


def test_integer_division_by_zero_raises_like_pytorch(dev):
    a = wgpar.tensor(np.array([5, -3, 7], dtype=np.int32))
    for bad in (lambda: a // 0, lambda: a % 0, lambda: 7 % wgpar.tensor(np.array([1, 0], dtype=np.int32)),
                lambda: a.remainder(wgpar.tensor(np.array([2, 0, 1], dtype=np.int32))),
                lambda: a // wgpar.tensor(np.array([True, False, True])),
                lambda: a // (a * 0)):  # a divisor computed on the device: no host range to go by
        with pytest.raises(RuntimeError, match="by zero") as info:
            bad()
        assert isinstance(info.value, ZeroDivisionError)
    # nonzero divisors pass, whether their range is known on the host or not
    np.testing.assert_array_equal((a // (a * 0 + 2)).numpy(), [2, -2, 3])
    np.testing.assert_array_equal((a % wgpar.tensor(np.array([-2, 2, -5], dtype=np.int32))).numpy(), [-1, 1, -3])
    # floats divide by zero as IEEE says (no error), as in PyTorch
    f = wgpar.tensor(np.array([1.0, -1.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal((f // 0.0).numpy(), [np.inf, -np.inf, np.nan])
    assert np.isnan((f % 0.0).numpy()).all()
    np.testing.assert_array_equal((a / 0).numpy(), [np.inf, -np.inf, np.inf])
    wgpar.synchronize(dev)  # the device is fine afterwards
