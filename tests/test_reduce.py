"""Reductions (sum mean max min argmax argmin) and softmax / log_softmax against NumPy float64."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import SIZES, assert_close

SHAPES = [(1,), (3,), (1000,), (7, 33), (33, 1, 7), (3, 129, 5), (2, 3, 7, 4), (1, 1)]
NP = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "amax": np.max, "amin": np.min,
      "argmax": np.argmax, "argmin": np.argmin}


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def axes_for(ndim):
    out = [None] + list(range(ndim)) + [-1]
    if ndim >= 2:
        out += [(0, ndim - 1), (-1, 0)]
    if ndim >= 3:
        out += [(0, 2), (1, 2), tuple(range(ndim))]
    return out


def check(got, want, a, what):
    """Sums are compared with an error scaled by the sum of magnitudes (float32 accumulation)."""
    scale = np.abs(a.astype(np.float64)).sum() if a.size else 1.0
    assert_close(got, want, rtol=1e-5, atol=1e-6 * max(scale, 1.0), what=what)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("shape", SHAPES)
def test_reduce_over_axes(dev, rng, op, shape):
    a = f32(rng, shape)
    x = wgpar.tensor(a)
    for axis in axes_for(len(shape)):
        for keep in (False, True):
            want = NP[op](a.astype(np.float64), axis=axis, keepdims=keep)
            got = getattr(x, op)(axis=axis, keepdims=keep)
            assert got.shape == np.shape(want), (axis, keep)
            assert got.dtype is wgpar.float32
            check(got.numpy(), want, a, f"{op} axis={axis} keepdims={keep}")


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape", SHAPES)
def test_arg_reductions(dev, rng, op, shape):
    a = rng.integers(-5, 6, size=shape).astype(np.float32)  # many ties: the first index must win
    x = wgpar.tensor(a)
    for axis in [None] + list(range(len(shape))) + [-1]:
        for keep in (False, True):
            want = NP[op](a, axis=axis, keepdims=keep)
            got = getattr(x, op)(axis=axis, keepdims=keep)
            assert got.dtype is wgpar.int32
            assert got.shape == np.shape(want), (axis, keep)
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{op} axis={axis} keepdims={keep}")
    ia = rng.integers(-1000, 1000, size=shape).astype(np.int32)
    np.testing.assert_array_equal(getattr(wgpar.tensor(ia), op)(axis=-1).numpy(), NP[op](ia, axis=-1))


def test_torch_spellings_and_top_level_functions(dev, rng):
    a = f32(rng, (7, 33, 3))
    x = wgpar.tensor(a)
    r = a.astype(np.float64)
    check(x.sum(dim=1).numpy(), r.sum(1), a, "dim=")
    check(x.sum(dim=(0, 2), keepdim=True).numpy(), r.sum((0, 2), keepdims=True), a, "dim tuple keepdim")
    check(x.mean(1, True).numpy(), r.mean(1, keepdims=True), a, "positional")
    check(wgpar.sum(x, dim=-1).numpy(), r.sum(-1), a, "wgpar.sum")
    check(wgpar.mean(x, axis=(0, 1)).numpy(), r.mean((0, 1)), a, "wgpar.mean")
    check(wgpar.max(x, dim=0, keepdim=True).values.numpy(), r.max(0, keepdims=True), a, "wgpar.max")
    check(wgpar.amax(x, dim=(0, 2), keepdim=True).numpy(), r.max((0, 2), keepdims=True), a, "wgpar.amax")
    check(wgpar.min(x).numpy(), r.min(), a, "wgpar.min")
    np.testing.assert_array_equal(wgpar.argmax(x, dim=1).numpy(), a.argmax(1))
    np.testing.assert_array_equal(wgpar.argmin(x, axis=2, keepdims=True).numpy(), a.argmin(2, keepdims=True))
    np.testing.assert_array_equal(x.argmax(dim=-1, keepdim=True).numpy(), a.argmax(-1, keepdims=True))
    assert x.sum().shape == () and abs(x.sum().item() - r.sum()) < 1e-4 * np.abs(r).sum()


def test_integer_and_bool_reductions(dev, rng):
    a = rng.integers(-100, 100, size=(33, 7)).astype(np.int32)
    x = wgpar.tensor(a)
    for op in ("sum", "amax", "amin"):
        got = getattr(x, op)(axis=0)
        assert got.dtype is wgpar.int32
        np.testing.assert_array_equal(got.numpy(), NP[op](a, axis=0))
    m = x.mean(axis=1)
    assert m.dtype is wgpar.float32
    assert_close(m.numpy(), a.mean(1))
    b = a > 0
    s = wgpar.tensor(b).sum(axis=1)
    assert s.dtype is wgpar.int32
    np.testing.assert_array_equal(s.numpy(), b.sum(1))


@pytest.mark.parametrize("shape,axis", [((1000,), None), ((3, 5000), 1), ((128, 7), 0), ((4096, 3), 0),
                                        ((33, 7, 5), (0, 2)), ((2, 70000), None)])
def test_int32_mean_accumulates_in_float32(dev, rng, shape, axis):
    # Large ints whose int32 sum would wrap: every split of the work (row chunks, column slices) must
    # accumulate in float32 (the column path once summed its slices in int32).
    a = rng.integers(2**30, 2**31, size=shape).astype(np.int32)
    got = wgpar.tensor(a).mean(axis=axis)
    assert got.dtype is wgpar.float32
    assert_close(got.numpy(), a.astype(np.float64).mean(axis=axis), rtol=1e-5)


@pytest.mark.parametrize("shape,axis", [((1000,), None), ((3, 5000), 1), ((128, 7), 0), ((33, 7, 5), (0, 2)),
                                        ((2, 70000), None)])
def test_int32_sum_wraps_modulo_2_32(dev, rng, shape, axis):
    # Documented (README "Types", Tensor.sum): wgpar has no int64, so an int32 sum wraps around, exactly
    # modulo 2**32 whatever the kernel's split into partial sums; x.float().sum() is the wide sum.
    a = rng.integers(2**30, 2**31, size=shape).astype(np.int32)
    a.flat[::3] *= -1
    exact = a.astype(np.int64).sum(axis=axis)
    assert np.any(np.abs(exact) >= 2**31), "the case must overflow"
    got = wgpar.tensor(a).sum(axis=axis)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), (exact + 2**31) % 2**32 - 2**31)
    assert_close(wgpar.tensor(a).float().sum(axis=axis).numpy(), exact, rtol=1e-5)


def test_reductions_of_non_contiguous_views(dev, rng):
    a = f32(rng, (33, 40))
    x = wgpar.tensor(a)
    r = a.astype(np.float64)
    check(x.T.sum(0).numpy(), r.T.sum(0), a, "T.sum(0)")
    check(x[3:30:3, ::-2].mean(1).numpy(), r[3:30:3, ::-2].mean(1), a, "slice mean")
    check(x.T[5:].amax(axis=(0, 1)).numpy(), r.T[5:].max(), a, "T max all")
    np.testing.assert_array_equal(x[:, 1::2].argmax(0).numpy(), a[:, 1::2].argmax(0))
    check(x.expand(4, 33, 40).sum((0, 2)).numpy(), 4 * r.sum(1), a, "expanded")
    check(x[5:].sum(1).numpy(), r[5:].sum(1), a, "contiguous view at an offset")
    check(x[5:].sum(0).numpy(), r[5:].sum(0), a, "contiguous view at an offset, axis 0")
    np.testing.assert_array_equal(x[7:].argmax(1).numpy(), a[7:].argmax(1))


@pytest.mark.parametrize("n", [1_000_003, 70_001])
def test_large_reductions(dev, rng, n):
    a = rng.random(n, dtype=np.float32)
    x = wgpar.tensor(a)
    r = a.astype(np.float64)
    assert_close(x.sum().item(), r.sum(), rtol=1e-5)
    assert_close(x.mean().item(), r.mean(), rtol=1e-5)
    a[n // 3] = 7.0
    a[n - 2] = -3.0
    x = wgpar.tensor(a)
    assert x.max().item() == 7.0 and x.min().item() == -3.0
    assert x.argmax().item() == n // 3 and x.argmin().item() == n - 2
    r7 = a[: (n // 7) * 7].reshape(7, -1).astype(np.float64)
    rows = wgpar.tensor(r7)
    assert_close(rows.sum(1).numpy(), r7.sum(1), rtol=1e-5)
    assert_close(rows.mean(1, keepdims=True).numpy(), r7.mean(1, keepdims=True), rtol=1e-5)
    assert_close(rows[2:].max(1).values.numpy(), r7[2:].max(1))
    np.testing.assert_array_equal(rows.argmin(1).numpy(), r7.argmin(1))


def test_long_reduction_along_first_axis(dev, rng):
    a = f32(rng, (20000, 3))
    check(wgpar.tensor(a).sum(0).numpy(), a.astype(np.float64).sum(0), a, "sum(0) of a tall matrix")


def test_zero_size_reductions(dev):
    e = wgpar.zeros(0, 3)
    assert_close(e.sum(0).numpy(), np.zeros(3))
    assert e.sum(1).shape == (0,)
    assert e.amax(1).shape == (0,)
    assert np.isnan(e.mean(0).numpy()).all()
    assert e.sum().item() == 0
    with pytest.raises(ValueError, match="zero-size"):
        e.amax(0)
    with pytest.raises(ValueError):
        e.argmax()


def test_bad_axes(dev):
    x = wgpar.zeros(3, 4)
    with pytest.raises(IndexError):
        x.sum(2)
    with pytest.raises(ValueError):
        x.sum((1, 1))
    with pytest.raises(TypeError):
        x.argmax((0, 1))


# -- softmax ---------------------------------------------------------------------------------------
def np_softmax(a, axis):
    a = a.astype(np.float64)
    z = a - a.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True), z - np.log(e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1000), (33, 7), (2, 129, 3), (5, 1, 4)])
def test_softmax_and_log_softmax_over_any_axis(dev, rng, shape):
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    x = wgpar.tensor(a)
    for axis in range(-len(shape), len(shape)):
        sm, lsm = np_softmax(a, axis)
        assert_close(x.softmax(axis).numpy(), sm, rtol=1e-5, atol=1e-7, what=f"softmax axis={axis}")
        assert_close(x.log_softmax(dim=axis).numpy(), lsm, rtol=1e-5, atol=2e-6, what=f"log_softmax {axis}")
        assert_close(wgpar.softmax(x, dim=axis).numpy(), sm, rtol=1e-5, atol=1e-7)
        assert_close(wgpar.log_softmax(x, axis).numpy(), lsm, rtol=1e-5, atol=2e-6)


def test_softmax_extremes_and_views(dev, rng):
    a = np.array([[1000.0, 0.0, -1000.0], [-50.0, -50.0, -50.0]], dtype=np.float32)
    x = wgpar.tensor(a)
    sm, lsm = np_softmax(a, -1)
    assert_close(x.softmax(-1).numpy(), sm, atol=1e-7)
    assert_close(x.log_softmax(-1).numpy(), lsm, rtol=1e-6)  # finite where softmax underflows
    b = f32(rng, (33, 7))
    y = wgpar.tensor(b)
    assert_close(y.T.softmax(0).numpy(), np_softmax(b.T, 0)[0], atol=1e-7)
    assert_close(y[::2, 1:].log_softmax(-1).numpy(), np_softmax(b[::2, 1:], -1)[1], atol=2e-6)
    assert_close(y[4:].softmax(-1).numpy(), np_softmax(b[4:], -1)[0], atol=1e-7)
    assert_close(y[4:].log_softmax(0).numpy(), np_softmax(b[4:], 0)[1], atol=2e-6)
    assert wgpar.zeros(0, 5).softmax(-1).shape == (0, 5)
    with pytest.raises(TypeError):
        wgpar.zeros(3, dtype=wgpar.int32).softmax(0)


@pytest.mark.parametrize("n", SIZES)
def test_sum_sizes(dev, rng, n):
    a = f32(rng, (n, 3))
    check(wgpar.tensor(a).sum(0).numpy(), a.astype(np.float64).sum(0), a, f"n={n}")
    check(wgpar.tensor(a).sum(1).numpy(), a.astype(np.float64).sum(1), a, f"n={n}")


# lavapipe leaves a shader's loops once an invocation has run 65535 iterations: results then go wrong
# silently. These shapes make naive kernels loop longer than that.
def test_long_column_reductions(dev, rng):
    a = rng.random((70001, 3), dtype=np.float32)
    x = wgpar.tensor(a)
    r = a.astype(np.float64)
    assert_close(x.sum(0).numpy(), r.sum(0), rtol=1e-5)
    assert_close(x.mean(0, keepdims=True).numpy(), r.mean(0, keepdims=True), rtol=1e-5)
    assert_close(x.amax(0).numpy(), r.max(0))
    np.testing.assert_array_equal(x.argmin(0).numpy(), a.argmin(0))
    b = rng.random((2, 66000, 2), dtype=np.float32)
    assert_close(wgpar.tensor(b).sum(1).numpy(), b.astype(np.float64).sum(1), rtol=1e-5)


def test_arg_reductions_of_long_rows_keep_the_first_tie(dev):
    n = 100_003
    a = np.zeros((3, n), np.float32)
    a[0, [5000, 90000]] = 1.0
    a[1, [n - 1, 40000]] = -2.0
    a[2, 7] = 3.0
    a[2, n - 2] = 3.0
    x = wgpar.tensor(a)
    np.testing.assert_array_equal(x.argmax(1).numpy(), a.argmax(1))
    np.testing.assert_array_equal(x.argmin(1).numpy(), a.argmin(1))
    np.testing.assert_array_equal(x.argmax(1, keepdims=True).numpy(), a.argmax(1, keepdims=True))
    ints = wgpar.tensor((a * 10).astype(np.int32))
    np.testing.assert_array_equal(ints.argmax(-1).numpy(), a.argmax(-1))


def test_reductions_longer_than_16m_elements(dev, rng):
    n = 2**24 + 3  # 64 MiB, below the 128 MiB binding limit
    a = np.zeros(n, np.float32)
    a[[123, n - 1]] = 2.0
    a[[7, n - 5]] = -1.0
    x = wgpar.tensor(a)
    assert x.argmax().item() == 123 and x.argmin().item() == 7
    assert x.max().item() == 2.0 and x.min().item() == -1.0
    assert x.sum().item() == 2.0


def test_softmax_of_very_long_rows(dev, rng):
    for n in (2_500_001, 6_000_001):  # the single-kernel path and the composed one
        a = (rng.standard_normal(n) * 3).astype(np.float32)
        x = wgpar.tensor(a)
        sm, lsm = np_softmax(a, 0)
        assert_close(x.log_softmax(0).numpy(), lsm, rtol=1e-5, atol=1e-4)
        got = x.softmax(-1).numpy()
        assert abs(got.astype(np.float64).sum() - 1) < 1e-4
        assert_close(got, sm, rtol=1e-4, atol=1e-10)


def test_scalar_and_empty_axis_reductions(dev):
    s = wgpar.tensor(3.5)
    for op in ("sum", "mean", "amax", "amin"):
        for kw in ({}, {"axis": 0}, {"dim": -1}, {"axis": ()}, {"keepdims": True}):
            got = getattr(s, op)(**kw)
            assert got.shape == () and got.item() == 3.5, (op, kw)
    for op in ("max", "min"):  # PyTorch: a 0-d tensor's dim 0 (or -1) is its one element, at index 0
        values, indices = getattr(s, op)(dim=-1)
        assert values.shape == indices.shape == () and values.item() == 3.5 and indices.item() == 0
    assert s.argmax().item() == 0 and s.argmin(0).item() == 0
    with pytest.raises(IndexError):
        s.sum(1)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = wgpar.tensor(a)
    for op in ("sum", "amax", "amin", "mean"):
        got = getattr(x, op)(axis=())
        want = NP[op](a, axis=())
        assert got.shape == want.shape and got.dtype is (wgpar.float32 if op == "mean" else wgpar.int32)
        np.testing.assert_array_equal(got.numpy(), want)
    assert wgpar.tensor([True, False]).sum(axis=()).dtype is wgpar.int32
