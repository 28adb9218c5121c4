"""Bitwise, logical and shift ops on int32 and bool tensors, and reciprocal, atan2, erf, erfc, erfinv:
what the generated registry tests (test_registry.py, test_edge_values.py) do not cover. Operators with
Python numbers on either side, awkward and broadcast shapes, strided views, in-place forms, result
dtypes, the dtype errors; accuracy in ulp of float32 against NumPy / math in float64 (and PyTorch
where it is installed)."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import wgpar

from .helpers import assert_close

TINY = float(np.finfo(np.float32).tiny)


def _ints(rng, shape, lo=-(2**31), hi=2**31):
    return rng.integers(lo, hi, shape, dtype=np.int64).astype(np.int32)


def _bools(rng, shape):
    return rng.random(shape) < 0.5


def assert_ulp(got, want, ulps: float, what: str = "") -> None:
    """``got`` (float32) within ``ulps`` float32 ulps of ``want`` (float64); NaN where NaN, the same
    infinities; a result below the smallest normal may be flushed to zero (GPUs flush subnormals)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        ok = (got == want) | (np.isnan(got) & np.isnan(want))
        ok |= np.isfinite(want) & (np.abs(got - want) <= ulps * spacing)
        ok |= (np.abs(want) < TINY) & (np.abs(got) < TINY)
    if not ok.all():
        i = np.argwhere(~ok)[:5]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.size} off by more than {ulps} ulp, e.g. "
                             + ", ".join(f"{tuple(j)}: got {got[tuple(j)]!r} want {want[tuple(j)]!r}" for j in i))


# -- bitwise and logical ----------------------------------------------------------------------
BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@pytest.mark.parametrize("name", sorted(BITWISE))
@pytest.mark.parametrize("kind", ["int32", "bool"])
def test_bitwise_operators_broadcast_and_strided(rng, name, kind):
    make = _ints if kind == "int32" else _bools
    a, b = make(rng, (7, 1, 5)), make(rng, (3, 5))
    want = BITWISE[name](a, b)
    ta, tb = wgpar.tensor(a), wgpar.tensor(b)
    f = getattr(operator, name, None) or getattr(operator, f"{name}_")
    for got in (f(ta, tb), getattr(wgpar, f"bitwise_{name}")(ta, tb), getattr(ta, f"bitwise_{name}")(tb)):
        assert got.dtype == (wgpar.int32 if kind == "int32" else wgpar.bool_)
        np.testing.assert_array_equal(got.numpy(), want)
    c, d = make(rng, (5, 9)), make(rng, (1, 5))  # a transposed (strided) operand
    np.testing.assert_array_equal(f(wgpar.tensor(c).T, wgpar.tensor(d)).numpy(), BITWISE[name](c.T, d))


def test_invert_is_logical_not_on_bool_and_complement_on_int(rng):
    m = _bools(rng, (4, 7))
    i = _ints(rng, (13,))
    got = ~wgpar.tensor(m)
    assert got.dtype == wgpar.bool_
    np.testing.assert_array_equal(got.numpy(), ~m)
    np.testing.assert_array_equal(wgpar.bitwise_not(wgpar.tensor(m)).numpy(), ~m)
    np.testing.assert_array_equal((~wgpar.tensor(i)).numpy(), ~i)
    np.testing.assert_array_equal((~wgpar.tensor(m).T).numpy(), ~m.T)  # strided bool
    x = wgpar.tensor(np.array([1.0, 2.0], np.float32))
    assert (~(x > 1)).numpy().tolist() == [True, False]  # the everyday mask form


def test_bitwise_with_python_numbers_on_either_side(rng):
    m = _bools(rng, (6, 5))
    i = _ints(rng, (6, 5), -100, 100)
    tm, ti = wgpar.tensor(m), wgpar.tensor(i)
    assert (tm & True).dtype == wgpar.bool_
    np.testing.assert_array_equal((tm & True).numpy(), m)
    np.testing.assert_array_equal((False | tm).numpy(), m)
    np.testing.assert_array_equal((True ^ tm).numpy(), ~m)
    r = tm & 3  # an int joins a bool tensor: int32, as PyTorch's int64
    assert r.dtype == wgpar.int32
    np.testing.assert_array_equal(r.numpy(), m.astype(np.int32) & 3)
    np.testing.assert_array_equal((ti & 0xF0).numpy(), i & 0xF0)
    np.testing.assert_array_equal((-8 | ti).numpy(), -8 | i)
    np.testing.assert_array_equal((ti ^ -1).numpy(), ~i)
    np.testing.assert_array_equal((ti & tm).numpy(), i & m)  # int32 with bool: int32
    assert (ti & tm).dtype == wgpar.int32


def test_bitwise_in_place(rng):
    i, j = _ints(rng, (4, 6)), _ints(rng, (6,))
    m, n = _bools(rng, (4, 6)), _bools(rng, (4, 1))
    for name, f in (("and", operator.iand), ("or", operator.ior), ("xor", operator.ixor)):
        t = wgpar.tensor(i)
        alias = t
        t = f(t, wgpar.tensor(j))
        assert t is alias
        np.testing.assert_array_equal(t.numpy(), BITWISE[name](i, j))
        t = wgpar.tensor(m)
        getattr(t, f"bitwise_{name}_")(wgpar.tensor(n))
        np.testing.assert_array_equal(t.numpy(), BITWISE[name](m, n))
        assert t.dtype == wgpar.bool_
    t = wgpar.tensor(m)
    t &= True
    np.testing.assert_array_equal(t.numpy(), m)
    t = wgpar.tensor(i)
    t <<= 3
    np.testing.assert_array_equal(t.numpy(), (i.astype(np.int64) << 3).astype(np.int32))
    with pytest.raises(TypeError):  # int32 result cannot be stored in a bool tensor (PyTorch refuses too)
        b = wgpar.tensor(m)
        b &= wgpar.tensor(i)


def test_bitwise_refuses_floats_and_shifts_refuse_bool():
    x = wgpar.tensor(np.array([1.0, 2.0], np.float32))
    i = wgpar.tensor(np.array([1, 2], np.int32))
    m = i > 1
    for bad in (lambda: x & x, lambda: x | 1, lambda: 1 ^ x, lambda: ~x, lambda: i & 1.5, lambda: wgpar.bitwise_not(x),
                lambda: x << 1, lambda: m >> m, lambda: m << wgpar.tensor(np.array([True, False]))):
        with pytest.raises(TypeError):
            bad()
    assert (m << 1).numpy().tolist() == [0, 2]  # an int joins the bool tensor first: int32, as PyTorch


@pytest.mark.parametrize("name,ref", [("logical_and", np.logical_and), ("logical_or", np.logical_or),
                                      ("logical_xor", np.logical_xor)])
def test_logical_ops_on_every_dtype(rng, name, ref):
    f = rng.standard_normal((5, 1, 3)).astype(np.float32)
    f[f > 0.8] = 0.0
    f[0, 0, 0] = np.nan  # NaN is true, as in PyTorch
    i = rng.integers(-1, 2, (4, 3)).astype(np.int32)
    m = _bools(rng, (3,))
    for a, b in ((f, i), (i, m), (m, f), (f, f.transpose(1, 0, 2))):
        got = getattr(wgpar, name)(wgpar.tensor(a), wgpar.tensor(b))
        assert got.dtype == wgpar.bool_
        np.testing.assert_array_equal(got.numpy(), ref(a, b))
    np.testing.assert_array_equal(getattr(wgpar.tensor(f), name)(0.5).numpy(), ref(f, 0.5))
    np.testing.assert_array_equal(getattr(wgpar.tensor(i), name)(0).numpy(), ref(i, 0))
    h = wgpar.tensor(f).half()
    if h.device.has_f16:
        np.testing.assert_array_equal(getattr(wgpar, name)(h, wgpar.tensor(i)).numpy(), ref(f, i))


def test_logical_not_and_no_gradient(rng):
    f = np.array([0.0, -0.0, 1.5, np.nan, -np.inf], np.float32)
    np.testing.assert_array_equal(wgpar.logical_not(wgpar.tensor(f)).numpy(), np.logical_not(f))
    np.testing.assert_array_equal(wgpar.tensor(np.array([0, 3], np.int32)).logical_not().numpy(), [True, False])
    x = wgpar.tensor(f, requires_grad=True)
    r = wgpar.logical_and(x, x)
    assert r.dtype == wgpar.bool_ and not r.requires_grad


def test_bitwise_and_logical_against_torch(rng, torch):
    a, b = _ints(rng, (3, 1, 6)), _ints(rng, (5, 6))
    m, n = _bools(rng, (3, 1, 6)), _bools(rng, (5, 6))
    ta, tb, tm, tn = (torch.tensor(v) for v in (a, b, m, n))
    wa, wb, wm, wn = (wgpar.tensor(v) for v in (a, b, m, n))
    for fn in ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor"):
        for (w1, w2), (t1, t2) in (((wa, wb), (ta, tb)), ((wm, wn), (tm, tn)), ((wa, wn), (ta, tn))):
            want = getattr(torch, fn)(t1, t2)
            got = getattr(wgpar, fn)(w1, w2)
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=fn)
            assert (got.dtype == wgpar.bool_) == (want.dtype == torch.bool), fn
    np.testing.assert_array_equal((~wm).numpy(), (~tm).numpy())
    np.testing.assert_array_equal((~wa).numpy(), (~ta).numpy())
    np.testing.assert_array_equal((wm & 3).numpy(), (tm & 3).numpy())


def test_shifts_against_torch_rules(rng, torch):
    a = np.array([0, 1, -1, 7, -7, 2**31 - 1, -(2**31), 12345, -54321], np.int32)
    s = np.array([0, 1, 5, 31, 32, 33, 40, -1, -(2**31), 2**31 - 1], np.int32)
    ta, ts = torch.tensor(a)[:, None], torch.tensor(s)[None, :]
    wa, ws = wgpar.tensor(a[:, None]), wgpar.tensor(s[None, :])
    np.testing.assert_array_equal((wa << ws).numpy(), (ta << ts).numpy())
    np.testing.assert_array_equal((wa >> ws).numpy(), (ta >> ts).numpy())
    np.testing.assert_array_equal(wgpar.bitwise_left_shift(wa, 3).numpy(), (ta << 3).numpy())
    np.testing.assert_array_equal((1 << ws).numpy(), (1 << ts).numpy())
    np.testing.assert_array_equal((-1024 >> ws).numpy(), (-1024 >> ts).numpy())
    assert (wa << 2).dtype == wgpar.int32


def test_shifts_against_numpy(rng):
    a = _ints(rng, (9, 7))
    s = rng.integers(0, 32, (7,)).astype(np.int32)
    np.testing.assert_array_equal((wgpar.tensor(a) << wgpar.tensor(s)).numpy(),
                                  (a.astype(np.int64) << s).astype(np.int64).astype(np.uint64).astype(np.uint32)
                                  .view(np.int32))
    np.testing.assert_array_equal((wgpar.tensor(a).T >> 4).numpy(), a.T >> 4)


# -- reciprocal, atan2, erf, erfc, erfinv ---------------------------------------------------------------
def _spread(rng, n):
    """Floats over many binades, both signs."""
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)).astype(np.float32)


def test_reciprocal(rng):
    x = np.concatenate([_spread(rng, 999), np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, 1e-37], np.float32)])
    with np.errstate(divide="ignore"):
        want = 1.0 / x.astype(np.float64)
    # WGSL's division is within 2.5 ulp (an H100's is not correctly rounded; lavapipe's is)
    assert_ulp(wgpar.tensor(x).reciprocal().numpy(), want, 2.5, "reciprocal")
    i = wgpar.tensor(np.array([2, -4, 5], np.int32))
    assert i.reciprocal().dtype == wgpar.float32
    assert_close(wgpar.reciprocal(i).numpy(), np.array([0.5, -0.25, 0.2]), rtol=1e-7)


def test_atan2_every_quadrant_and_edge(rng):
    y, x = _spread(rng, 2000), _spread(rng, 2000)
    want = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    assert_ulp(wgpar.atan2(wgpar.tensor(y), wgpar.tensor(x)).numpy(), want, 3, "atan2")
    assert_ulp(wgpar.arctan2(wgpar.tensor(y), wgpar.tensor(x)).numpy(), want, 3, "arctan2")
    edge = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3e38, -1e-38], np.float32)
    ey, ex = edge[:, None], edge[None, :]  # every pair: signed zeros, infinities (C's atan2 rules)
    got = wgpar.tensor(ey).atan2(wgpar.tensor(ex)).numpy()
    want = np.arctan2(ey.astype(np.float64), ex.astype(np.float64))
    # -1e-38 is subnormal: a GPU may flush it to -0 first (an H100 does); both answers are right then
    ftz = np.where(np.abs(edge) < np.finfo(np.float32).tiny, np.copysign(0.0, edge), edge).astype(np.float64)
    flushed = np.arctan2(ftz[:, None], ftz[None, :])
    want = np.where(np.abs(got - flushed) < np.abs(got - want), flushed, want)
    assert_ulp(got, want, 1, "atan2 edges")
    assert (np.signbit(got) == np.signbit(want.astype(np.float32)))[~np.isnan(want)].all()
    assert_ulp(wgpar.tensor(y).atan2(2).numpy(), np.arctan2(y.astype(np.float64), 2.0), 3, "atan2(t, 2)")
    i = wgpar.tensor(np.array([1, -1], np.int32))
    assert wgpar.atan2(i, i).dtype == wgpar.float32


def test_erf_erfc_accuracy():
    x = np.concatenate([np.linspace(-11, 11, 8801), np.array([0.0, -0.0, 1e-30, -1e-10, 3e-5, 0.5, -0.5, 0.49999997,
                                                            0.50000006, 3.9, 10.05, np.inf, -np.inf, np.nan])])
    x = x.astype(np.float32)
    x64 = x.astype(np.float64)
    erf = np.array([math.erf(v) if np.isfinite(v) else (np.sign(v) if not np.isnan(v) else np.nan) for v in x64])
    erfc = np.array([math.erfc(v) if np.isfinite(v) else (1.0 - np.sign(v) if not np.isnan(v) else np.nan)
                     for v in x64])
    t = wgpar.tensor(x)
    assert_ulp(t.erf().numpy(), erf, 3, "erf")  # erf of a tiny x is x * 2 / sqrt(pi), no cancellation
    assert_ulp(t.erfc().numpy(), erfc, 8, "erfc")  # down to 1e-38, through its own exp
    assert wgpar.erf(wgpar.tensor(np.array([1], np.int32))).dtype == wgpar.float32


def test_erfinv_inverts_erf():
    y = np.concatenate([np.linspace(-1, 1, 4001), np.array([1 - 2**-24, -(1 - 2**-24), 1e-30, -1e-7, 0.5, 2.0, -1.5,
                                                            np.nan])]).astype(np.float32)
    got = wgpar.tensor(y).erfinv().numpy()
    from wgpar.ops.registry import _erfinv

    assert_ulp(got, _erfinv(y.astype(np.float64)), 4, "erfinv")
    assert got[0] == -np.inf and got[4000] == np.inf and np.isnan(got[-3:]).all()


def test_special_functions_against_torch(rng, torch):
    x = np.concatenate([_spread(rng, 500), rng.uniform(-5, 5, 500)]).astype(np.float32)
    tx = torch.tensor(x.astype(np.float64))
    for name in ("erf", "erfc", "reciprocal"):
        want = getattr(torch, name)(tx).numpy()
        assert_ulp(getattr(wgpar.tensor(x), name)().numpy(), want, 8, name)
    u = np.clip(x, -0.999999, 0.999999)
    assert_ulp(wgpar.tensor(u).erfinv().numpy(), torch.erfinv(torch.tensor(u.astype(np.float64))).numpy(), 4, "erfinv")
    y = _spread(rng, 1000)
    assert_ulp(wgpar.tensor(y).atan2(wgpar.tensor(x)).numpy(),
               torch.atan2(torch.tensor(y.astype(np.float64)), tx).numpy(), 3, "atan2")


def test_special_gradients_against_torch(rng, torch):
    a = rng.standard_normal((4, 1, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5)).astype(np.float32) + 0.1
    u = (0.9 * np.tanh(a)).astype(np.float32)
    cases = [("erf", (a,)), ("erfc", (a,)), ("erfinv", (u,)), ("reciprocal", (b,)), ("atan2", (a, b))]
    for name, arrays in cases:
        ts = [torch.tensor(v.astype(np.float64), requires_grad=True) for v in arrays]
        ws = [wgpar.tensor(v, requires_grad=True) for v in arrays]
        up = rng.standard_normal(np.broadcast_shapes(*[v.shape for v in arrays]))
        (getattr(torch, name)(*ts) * torch.tensor(up)).sum().backward()
        getattr(wgpar, name)(*ws).backward(wgpar.tensor(up.astype(np.float32)))
        for t, w in zip(ts, ws):
            assert_close(w.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6, what=f"d {name}")


# -- median ---------------------------------------------------------------------------------------
def _lower_median(x: np.ndarray, axis: int) -> np.ndarray:
    """torch.median's value: the lower middle of the sorted line; NaN where the line holds one."""
    s = np.sort(x, axis=axis)  # NaN last
    v = np.take(s, (x.shape[axis] - 1) // 2, axis=axis)
    return np.where(np.isnan(x).any(axis=axis), np.nan, v) if x.dtype.kind == "f" else v


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((4, 6), 1), ((5, 3, 8), 1), ((3, 9, 2), -1), ((1, 1), 0)])
def test_median_along_a_dim(rng, shape, dim):
    x = rng.integers(-5, 6, shape).astype(np.float32)  # ties on purpose
    if x.size > 4:
        x.flat[3] = np.nan
    got = wgpar.tensor(x).median(dim)
    want = _lower_median(x, dim)
    np.testing.assert_array_equal(got.values.numpy(), want)
    assert got.indices.dtype == wgpar.int32
    picked = np.take_along_axis(x, np.expand_dims(got.indices.numpy(), dim), dim).squeeze(dim)
    np.testing.assert_array_equal(picked, want)  # the index points at the median
    kept = wgpar.median(wgpar.tensor(x), dim, keepdim=True)
    assert kept.values.shape == np.expand_dims(want, dim).shape
    i = rng.integers(-9, 10, shape).astype(np.int32)
    np.testing.assert_array_equal(wgpar.tensor(i).median(dim).values.numpy(), _lower_median(i, dim))


def test_median_of_everything_and_gradient(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    t = wgpar.tensor(x, requires_grad=True)
    m = t.median()
    assert m.shape == () and m.item() == np.sort(x.ravel())[(x.size - 1) // 2]
    m.backward()
    g = np.zeros(x.size, np.float32)
    g[np.argsort(x.ravel(), kind="stable")[(x.size - 1) // 2]] = 1
    np.testing.assert_array_equal(t.grad.numpy().ravel(), g)
    assert np.isnan(wgpar.median(wgpar.zeros(0)).item())
    with pytest.raises(ValueError):
        wgpar.zeros(2, 0).median(1)


def test_median_against_torch(rng, torch):
    x = rng.integers(-4, 5, (5, 8)).astype(np.float32)
    x[2, 5] = np.nan
    for dim in (0, 1):
        w, t = wgpar.tensor(x).median(dim), torch.tensor(x).median(dim)
        np.testing.assert_array_equal(w.values.numpy(), t.values.numpy())
        nan_rows = np.isnan(t.values.numpy())
        np.testing.assert_array_equal(w.indices.numpy()[nan_rows], t.indices.numpy()[nan_rows])  # the first NaN
    y = rng.standard_normal(10).astype(np.float32)
    assert wgpar.tensor(y).median().item() == torch.tensor(y).median().item()
