"""Element types: int32 from any NumPy integer array, bool, float16 ops (shader-f16), casts."""

from __future__ import annotations

import math

import numpy as np
import pytest

import wgpar

from .helpers import assert_close
from .test_matmul import rel_err

INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.intp]


@pytest.mark.parametrize("np_type", INT_TYPES)
def test_int32_from_any_numpy_integer_array(dev, rng, np_type):
    info = np.iinfo(np_type)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    a = rng.integers(lo, hi, size=(7, 33), endpoint=True).astype(np_type)
    a.flat[0], a.flat[1] = lo, hi  # the extremes that still fit
    t = wgpar.tensor(a)
    assert t.dtype is wgpar.int32
    np.testing.assert_array_equal(t.numpy(), a.astype(np.int64))
    assert wgpar.from_numpy(a).dtype is wgpar.int32
    np.testing.assert_array_equal(t.T[::2].numpy(), a.T[::2].astype(np.int64))
    small = a[:3, :3].astype(np.int64) % 100
    np.testing.assert_array_equal((wgpar.tensor(small.astype(np_type)) * 2).numpy(), small * 2)


def test_integers_outside_int32_are_refused(dev):
    for a in (np.array([2**31], np.int64), np.array([-(2**31) - 1], np.int64), np.array([2**32 - 1], np.uint32),
              np.array([2**63], np.uint64)):
        with pytest.raises(ValueError, match="int32"):
            wgpar.tensor(a)


def test_int_scalars_and_python_ints(dev):
    t = wgpar.tensor([1, 2, 3])
    assert t.dtype is wgpar.int32
    assert (t * np.int64(3)).tolist() == [3, 6, 9]
    assert (t + np.uint8(1)).tolist() == [2, 3, 4]
    with pytest.raises(OverflowError):
        t + 2**40


# -- float16 ---------------------------------------------------------------------------------------------
H_TOL = dict(rtol=1e-2, atol=1e-2)


@pytest.fixture
def f16(dev):
    assert dev.has_f16 == ("shader-f16" in dev.features)
    if not dev.has_f16:
        pytest.skip(f"{dev} has no shader-f16 feature")  # real GPUs without it exist; lavapipe has it
    return dev


def h(rng, shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float16)


def test_f16_storage_round_trip_odd_sizes(f16, rng):
    for n in (1, 3, 7, 33, 129, 1000):
        a = h(rng, (n,))
        t = wgpar.tensor(a)
        assert t.dtype is wgpar.float16 and t.nbytes == 2 * n
        np.testing.assert_array_equal(t.numpy(), a)
        np.testing.assert_array_equal(t[1:].numpy(), a[1:])  # odd element offset
        np.testing.assert_array_equal(t[::-3].numpy(), a[::-3])


@pytest.mark.parametrize("shape_a,shape_b", [((7, 33), (7, 33)), ((33,), (7, 1, 33)), ((129, 1), (1, 3))])
def test_f16_elementwise(f16, rng, shape_a, shape_b):
    a, b = h(rng, shape_a), h(rng, shape_b, 0.5, 2.0)
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    ra, rb = a.astype(np.float64), b.astype(np.float64)
    for got, want in [(x + y, ra + rb), (x - y, ra - rb), (x * y, ra * rb), (x / y, ra / rb),
                      (x ** 2, ra ** 2), (2 - x, 2 - ra), (wgpar.maximum(x, y), np.maximum(ra, rb)),
                      (x.exp(), np.exp(ra)), (x.tanh(), np.tanh(ra)), (y.log(), np.log(rb)), (y.sqrt(), np.sqrt(rb)),
                      (x.sigmoid(), 1 / (1 + np.exp(-ra))), (x.relu(), np.maximum(ra, 0)),
                      (x.gelu(), 0.5 * ra * (1 + np.vectorize(math.erf)(ra / math.sqrt(2)))),
                      (x.clamp(-0.5, 0.5), np.clip(ra, -0.5, 0.5)),
                      (wgpar.where(x > 0, x, y), np.where(ra > 0, ra, rb))]:
        assert got.dtype is wgpar.float16
        assert_close(got.numpy(), want, **H_TOL)
    assert (x < y).dtype is wgpar.bool_
    mixed = x + wgpar.tensor(b.astype(np.float32))
    assert mixed.dtype is wgpar.float32
    x += 0.5
    x *= wgpar.tensor(a)
    assert x.dtype is wgpar.float16
    assert_close(x.numpy(), (ra + 0.5) * ra, **H_TOL)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 3), (33, 129, 65), (64, 64, 64)])
def test_f16_matmul(f16, rng, m, k, n):
    a, b = h(rng, (m, k), -1, 1), h(rng, (k, n), -1, 1)
    got = wgpar.tensor(a) @ wgpar.tensor(b)
    assert got.dtype is wgpar.float16
    assert rel_err(got.numpy(), a.astype(np.float64) @ b) < 1e-2
    got = wgpar.tensor(a).T.mT @ wgpar.tensor(b.T.copy()).T
    assert rel_err(got.numpy(), a.astype(np.float64) @ b) < 1e-2
    mixed = wgpar.tensor(a) @ wgpar.tensor(b.astype(np.float32))
    assert mixed.dtype is wgpar.float32
    batched = wgpar.tensor(np.stack([a, a])) @ wgpar.tensor(b)
    assert rel_err(batched.numpy(), np.stack([a, a]).astype(np.float64) @ b) < 1e-2


def test_f16_reductions_and_softmax(f16, rng):
    a = h(rng, (33, 129))
    x = wgpar.tensor(a)
    r = a.astype(np.float64)
    for axis in (None, 0, 1, (0, 1)):
        for op in ("sum", "mean", "max", "min"):
            got = getattr(x, {"max": "amax", "min": "amin"}.get(op, op))(axis=axis)
            assert got.dtype is wgpar.float16
            want = getattr(np, op if op not in ("max", "min") else "a" + op)(r, axis=axis)
            scale = np.abs(r).sum() if op == "sum" else 1.0
            assert_close(got.numpy(), want, rtol=1e-2, atol=1e-2 * max(1.0, scale / 100), what=f"{op} {axis}")
    np.testing.assert_array_equal(x.argmax(1).numpy(), r.argmax(1))
    np.testing.assert_array_equal(x.argmin(0).numpy(), r.argmin(0))
    big = h(rng, (20001,), 0, 1)
    assert_close(wgpar.tensor(big).sum().item(), big.astype(np.float64).sum(), rtol=1e-2)
    for axis in (0, 1, -1):
        z = r - r.max(axis, keepdims=True)
        e = np.exp(z)
        sm = x.softmax(axis)
        assert sm.dtype is wgpar.float16
        assert_close(sm.numpy(), e / e.sum(axis, keepdims=True), **H_TOL)
        assert_close(x.log_softmax(axis).numpy(), z - np.log(e.sum(axis, keepdims=True)), **H_TOL)


def test_f16_indexing_cat_and_casts(f16, rng):
    a = h(rng, (7, 33))
    x = wgpar.tensor(a)
    np.testing.assert_array_equal(wgpar.cat([x, x[:2]]).numpy(), np.concatenate([a, a[:2]]))
    np.testing.assert_array_equal(x.index_select(1, [0, 32, 5]).numpy(), a[:, [0, 32, 5]])
    f = x.float()
    assert f.dtype is wgpar.float32
    np.testing.assert_array_equal(f.numpy(), a.astype(np.float32))
    back = wgpar.tensor(a.astype(np.float32)).half()
    assert back.dtype is wgpar.float16
    np.testing.assert_array_equal(back.numpy(), a)
    x[1:3, ::2] = 0.25
    a[1:3, ::2] = 0.25
    np.testing.assert_array_equal(x.numpy(), a)


def test_casts_between_all_types(dev, rng):
    a = rng.uniform(-5, 5, size=(33,)).astype(np.float32)
    t = wgpar.tensor(a)
    np.testing.assert_array_equal(t.int().numpy(), a.astype(np.int32))  # truncates toward zero, like NumPy
    np.testing.assert_array_equal(t.bool().numpy(), a != 0)
    i = wgpar.tensor(np.array([0, 3, -2], np.int32))
    assert i.bool().tolist() == [False, True, True]
    assert i.float().tolist() == [0.0, 3.0, -2.0]
    assert wgpar.tensor([True, False]).int().tolist() == [1, 0]
    assert wgpar.tensor([True, False]).to(wgpar.float32).tolist() == [1.0, 0.0]
    assert t.astype("int32").dtype is wgpar.int32
    assert t.to(dtype=wgpar.float32) is t


def test_conversions_on_the_way_in(dev):
    assert wgpar.tensor([0.5, 0.0, -2.0, np.nan], dtype=wgpar.bool_).tolist() == [True, False, True, True]
    assert wgpar.tensor([3, 0], dtype=wgpar.bool_).tolist() == [True, False]
    assert wgpar.tensor([1.7, -1.7], dtype=wgpar.int32).tolist() == [1, -1]
    for bad in ([1e10], [-3e9], [np.nan], [np.inf]):
        with pytest.raises(ValueError, match="int32"):
            wgpar.tensor(bad, dtype=wgpar.int32)
    with pytest.raises(TypeError):
        wgpar.tensor(np.array([1 + 1j]), dtype=wgpar.int32)
    idx = wgpar.tensor([0.0, 2.9], dtype=wgpar.int32)  # its checked range is that of the int32 values
    np.testing.assert_array_equal(wgpar.arange(3).index_select(0, idx).numpy(), [0, 2])


def test_dtypes_stay_the_one_instance_through_pickle_and_copy():
    import copy
    import pickle

    for d in (wgpar.float32, wgpar.float16, wgpar.int32, wgpar.bool_):
        assert pickle.loads(pickle.dumps(d)) is d and copy.deepcopy(d) is d and copy.copy(d) is d
        assert d == d and hash(d) == hash(d) and d != "float32"
    assert wgpar.float16.is_float and not wgpar.bool_.is_float
