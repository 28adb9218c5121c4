"""Elementwise ops against NumPy float64: binary with broadcasting, scalars, unary, where, clamp, in place."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import wgpar

from .helpers import SIZES, assert_close

SHAPE_PAIRS = [
    ((1,), (1,)),
    ((3,), (1,)),
    ((7, 1), (1, 33)),
    ((129,), (129,)),
    ((1000,), ()),
    ((2, 3, 1), (7, 1, 3, 129)),
    ((33, 7), (7,)),
    ((0, 3), (1, 3)),
    ((4, 0, 2), (4, 1, 2)),
]


def f32(rng, shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def ref(a):
    return np.asarray(a, dtype=np.float64)


BINARY = {
    "+": (operator.add, np.add),
    "-": (operator.sub, np.subtract),
    "*": (operator.mul, np.multiply),
    "/": (operator.truediv, np.divide),
    "maximum": (wgpar.maximum, np.maximum),
    "minimum": (wgpar.minimum, np.minimum),
    "**": (operator.pow, np.power),
}


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS)
def test_binary_broadcasting(dev, rng, op, sa, sb):
    ours, theirs = BINARY[op]
    a, b = f32(rng, sa), f32(rng, sb)
    if op == "/":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    if op == "**":
        a = np.abs(a) + np.float32(0.1)
    got = ours(wgpar.tensor(a), wgpar.tensor(b))
    want = theirs(ref(a), ref(b))
    assert got.shape == want.shape and got.dtype is wgpar.float32
    rtol = 1e-5 if op == "**" else 2e-6
    assert_close(got.numpy(), want, rtol=rtol, atol=1e-6, what=f"{sa} {op} {sb}")


@pytest.mark.parametrize("n", SIZES)
def test_pow(dev, rng, n):
    a = f32(rng, (n,), 0.1, 3.0)
    b = f32(rng, (n,), -2.0, 2.0)
    assert_close((wgpar.tensor(a) ** wgpar.tensor(b)).numpy(), ref(a) ** ref(b), rtol=1e-5)
    neg = f32(rng, (n,), -3.0, 3.0)
    for e in (2, 3, -1, 0, 2.0, 0.5):
        base = np.abs(neg) if e == 0.5 else neg
        if e == -1:
            base = np.where(np.abs(base) < 0.1, 0.5, base).astype(np.float32)
        assert_close((wgpar.tensor(base) ** e).numpy(), ref(base) ** e, rtol=1e-5, atol=1e-6, what=f"x ** {e}")


def test_scalar_operands_on_either_side(dev, rng):
    a = f32(rng, (7, 33), 0.5, 2.0)
    x = wgpar.tensor(a)
    r = ref(a)
    cases = {
        "2 - x": (2 - x, 2 - r), "x - 2": (x - 2, r - 2), "2.5 + x": (2.5 + x, 2.5 + r),
        "x * 3": (x * 3, r * 3), "3 * x": (3 * x, 3 * r), "2 / x": (2 / x, 2 / r), "x / 4": (x / 4, r / 4),
        "x ** 2": (x ** 2, r ** 2), "2 ** x": (2 ** x, 2 ** r), "1.5 ** x": (1.5 ** x, 1.5 ** r),
        "x ** -0.5": (x ** -0.5, r ** -0.5), "np.float32(2) * x": (np.float32(2) * x, 2 * r),
        "np.float64(0.5) - x": (np.float64(0.5) - x, 0.5 - r),
        "max(x, 1)": (wgpar.maximum(x, 1.0), np.maximum(r, 1.0)),
        "min(1, x)": (wgpar.minimum(1.0, x), np.minimum(1, r)),
    }
    for what, (got, want) in cases.items():
        assert isinstance(got, wgpar.Tensor), what
        assert got.dtype is wgpar.float32, what
        assert_close(got.numpy(), want, rtol=2e-6, what=what)


def test_int32_arithmetic_and_promotion(dev, rng):
    a = rng.integers(-1000, 1000, size=(33, 7)).astype(np.int64)
    b = rng.integers(1, 50, size=(7,)).astype(np.int16)
    x, y = wgpar.tensor(a), wgpar.tensor(b)
    assert x.dtype is wgpar.int32 and y.dtype is wgpar.int32
    for got, want in [(x + y, a + b), (x - y, a - b), (x * y, a * b), (-x, -a), (abs(x), np.abs(a)),
                      (x + 3, a + 3), (7 - x, 7 - a), (wgpar.maximum(x, y), np.maximum(a, b)),
                      (x.relu(), np.maximum(a, 0))]:
        assert got.dtype is wgpar.int32
        np.testing.assert_array_equal(got.numpy(), want)
    q = x / y  # true division gives float
    assert q.dtype is wgpar.float32
    assert_close(q.numpy(), a / b.astype(np.float64), rtol=1e-6)
    mixed = x + wgpar.tensor(b.astype(np.float32))
    assert mixed.dtype is wgpar.float32
    assert_close(mixed.numpy(), a + b.astype(np.float64))
    assert (x + 0.5).dtype is wgpar.float32
    assert_close((x * 0.5).numpy(), a * 0.5)


CMP = [("==", operator.eq), ("!=", operator.ne), ("<", operator.lt), ("<=", operator.le),
       (">", operator.gt), (">=", operator.ge)]


@pytest.mark.parametrize("name,op", CMP)
def test_comparisons_return_bool(dev, rng, name, op):
    a = rng.integers(-3, 4, size=(7, 33)).astype(np.float32)
    b = rng.integers(-3, 4, size=(33,)).astype(np.float32)
    got = op(wgpar.tensor(a), wgpar.tensor(b))
    assert got.dtype is wgpar.bool_
    out = got.numpy()
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, op(a, b))
    np.testing.assert_array_equal(op(wgpar.tensor(a), 1).numpy(), op(a, 1))
    np.testing.assert_array_equal(op(1.0, wgpar.tensor(a)).numpy(), op(1.0, a))
    ia = a.astype(np.int32)
    np.testing.assert_array_equal(op(wgpar.tensor(ia), wgpar.tensor(b.astype(np.int32))).numpy(),
                                  op(ia, b.astype(np.int32)))


def test_bool_tensors(dev, rng):
    m = rng.random((7, 33)) > 0.5
    t = wgpar.tensor(m)
    assert t.dtype is wgpar.bool_
    np.testing.assert_array_equal(t.numpy(), m)
    np.testing.assert_array_equal((t + t).numpy(), m | m)  # logical or, as PyTorch and NumPy
    assert (t + t).dtype is wgpar.bool_
    np.testing.assert_array_equal((t + 1).numpy(), m.astype(np.int32) + 1)
    assert (t + 1).dtype is wgpar.int32
    f = t.float()
    assert f.dtype is wgpar.float32
    assert_close(f.numpy(), m.astype(np.float64))


def test_bool_arithmetic_matches_torch(dev, torch):
    """bool (op) bool stays bool where PyTorch keeps it (add: or, mul: and, maximum, minimum, sign) and is
    refused where PyTorch refuses it (sub, neg, //, %, abs, relu); a bool with an int scalar is an int."""
    a, b = np.array([True, False, True, False]), np.array([True, True, False, False])
    wa, wb, ta, tb = wgpar.tensor(a), wgpar.tensor(b), torch.tensor(a), torch.tensor(b)
    for name, f in [("add", lambda x, y: x + y), ("mul", lambda x, y: x * y), ("add True", lambda x, y: x + True),
                    ("add 1", lambda x, y: x + 1), ("maximum", lambda x, y: x.maximum(y)),
                    ("minimum", lambda x, y: x.minimum(y)), ("sign", lambda x, y: x.sign())]:
        got, want = f(wa, wb), f(ta, tb)
        assert got.dtype.name == str(want.dtype).replace("torch.", "").replace("int64", "int32"), name
        assert got.numpy().tolist() == want.numpy().tolist(), name
    for name, f in [("sub", lambda x, y: x - y), ("neg", lambda x, y: -x), ("floordiv", lambda x, y: x // y),
                    ("mod", lambda x, y: x % y), ("abs", lambda x, y: x.abs()), ("relu", lambda x, y: x.relu())]:
        with pytest.raises((RuntimeError, NotImplementedError)):
            f(ta, tb)
        with pytest.raises(TypeError, match=f"{name}.*bool"):
            f(wa, wb)


@pytest.mark.parametrize("sc,sa,sb", [((7, 33), (7, 33), (7, 33)), ((33,), (7, 1), ()), ((1, 3), (129, 1), (3,)),
                                      ((0,), (0,), (1,))])
def test_where(dev, rng, sc, sa, sb):
    c = rng.random(sc) > 0.4
    a, b = f32(rng, sa), f32(rng, sb)
    got = wgpar.where(wgpar.tensor(c), wgpar.tensor(a), wgpar.tensor(b))
    assert_close(got.numpy(), np.where(c, ref(a), ref(b)))
    got = wgpar.where(wgpar.tensor(a) > 0, wgpar.tensor(a), 0.0)
    assert_close(got.numpy(), np.where(a > 0, ref(a), 0.0))
    got = wgpar.where(wgpar.tensor(c), 1.0, -1.0)
    assert_close(got.numpy(), np.where(c, 1.0, -1.0))


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


UNARY = {
    "neg": (lambda x: -x, None),
    "abs": (lambda x: np.abs(x), None),
    "exp": (np.exp, None),
    "log": (np.log, (0.01, 5.0)),
    "sqrt": (np.sqrt, (0.0, 5.0)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 5.0)),
    "tanh": (np.tanh, (-25.0, 25.0)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-30.0, 30.0)),
    "relu": (lambda x: np.maximum(x, 0), None),
    "gelu": (lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), (-6.0, 6.0)),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("shape", [(1,), (3,), (7, 33), (1000,), (0,), (2, 0, 3)])
def test_unary(dev, rng, name, shape):
    fn, rng_range = UNARY[name]
    lo, hi = rng_range or (-4.0, 4.0)
    a = f32(rng, shape, lo, hi)
    x = wgpar.tensor(a)
    want = fn(ref(a))
    for got in (getattr(x, name)(), getattr(wgpar, name)(x)):
        assert got.shape == want.shape
        assert_close(got.numpy(), want, rtol=2e-6, atol=2e-6, what=name)


def test_unary_operators(dev, rng):
    a = f32(rng, (33,))
    x = wgpar.tensor(a)
    assert_close((-x).numpy(), -ref(a))
    assert_close(abs(x).numpy(), np.abs(ref(a)))
    assert_close((+x).numpy(), ref(a))


def test_unary_on_non_contiguous_view(dev, rng):
    a = f32(rng, (33, 7))
    x = wgpar.tensor(a)
    assert_close(x.T.exp().numpy(), np.exp(ref(a).T), rtol=2e-6)
    assert_close(x[::-2, 1::3].tanh().numpy(), np.tanh(ref(a)[::-2, 1::3]), rtol=2e-6)
    assert_close((x.T[1:] + x[1:2].T[1:]).numpy(), ref(a).T[1:] + ref(a)[1:2].T[1:])


@pytest.mark.parametrize("n", SIZES)
def test_clamp(dev, rng, n):
    a = f32(rng, (n, 3))
    x = wgpar.tensor(a)
    assert_close(x.clamp(min=-0.5).numpy(), np.maximum(ref(a), -0.5))
    assert_close(x.clamp(max=0.25).numpy(), np.minimum(ref(a), 0.25))
    assert_close(x.clamp(-0.5, 0.25).numpy(), np.clip(ref(a), -0.5, 0.25))
    assert_close(wgpar.clamp(x, min=0.0, max=1.0).numpy(), np.clip(ref(a), 0, 1))
    assert_close(x.clip(-1, 1).numpy(), np.clip(ref(a), -1, 1))
    lo, hi = f32(rng, (3,), -1, 0), f32(rng, (n, 1), 0, 1)
    assert_close(x.clamp(wgpar.tensor(lo), wgpar.tensor(hi)).numpy(), np.minimum(np.maximum(ref(a), lo), hi))
    i = rng.integers(-10, 10, size=n).astype(np.int32)
    ci = wgpar.tensor(i).clamp(-3, 4)
    assert ci.dtype is wgpar.int32
    np.testing.assert_array_equal(ci.numpy(), np.clip(i, -3, 4))
    with pytest.raises(ValueError):
        x.clamp()


# -- in place ------------------------------------------------------------------------------------------
INPLACE = {
    "add_": np.add, "sub_": np.subtract, "mul_": np.multiply, "div_": np.divide,
}


@pytest.mark.parametrize("name", list(INPLACE))
@pytest.mark.parametrize("bshape", [(7, 33), (33,), (7, 1), ()])
def test_inplace_methods(dev, rng, name, bshape):
    a, b = f32(rng, (7, 33)), f32(rng, bshape, 0.5, 2.0)
    x = wgpar.tensor(a)
    storage = x._storage
    out = getattr(x, name)(wgpar.tensor(b))
    assert out is x and x._storage is storage and x.shape == (7, 33)
    assert_close(x.numpy(), INPLACE[name](ref(a), ref(b)), rtol=2e-6)
    y = wgpar.tensor(a)
    getattr(y, name)(1.5)
    assert_close(y.numpy(), INPLACE[name](ref(a), 1.5), rtol=2e-6)


def test_augmented_assignment_keeps_identity(dev, rng):
    a, b = f32(rng, (33, 7)), f32(rng, (7,), 0.5, 2)
    x = wgpar.tensor(a)
    orig = x
    x += wgpar.tensor(b)
    x -= 1.0
    x *= wgpar.tensor(b)
    x /= 2
    assert x is orig
    assert_close(x.numpy(), ((ref(a) + b) - 1.0) * b / 2, rtol=2e-6)


def test_inplace_on_non_contiguous_views_writes_through(dev, rng):
    a = f32(rng, (7, 33))
    base = wgpar.tensor(a)
    want = ref(a).copy()
    v = base.T[3:20:2]  # non-contiguous view, shape (9, 7)
    assert not v.is_contiguous()
    v += wgpar.tensor(np.arange(7, dtype=np.float32))  # broadcast along the view's rows
    want.T[3:20:2] += np.arange(7)
    v2 = base[::-1, ::-5]
    v2.mul_(2.0)
    want[::-1, ::-5] *= 2
    base[1:3].sub_(wgpar.tensor(a[4:6]))
    want[1:3] -= a[4:6]
    base[:, 5].div_(4)
    want[:, 5] /= 4
    assert_close(base.numpy(), want, rtol=2e-6)
    assert_close(v.numpy(), want.T[3:20:2], rtol=2e-6)


def test_copy_fill_zero_clamp_inplace(dev, rng):
    a = f32(rng, (7, 33))
    x = wgpar.tensor(a)
    want = ref(a).copy()
    src = f32(rng, (33, 3))
    x[:3].T.copy_(wgpar.tensor(src))  # copy into a transposed view
    want[:3].T[...] = src
    x[4].fill_(7.5)
    want[4] = 7.5
    x[5:, ::4].zero_()
    want[5:, ::4] = 0
    x[:, 10:].clamp_(-0.5, 0.5)
    want[:, 10:] = np.clip(want[:, 10:], -0.5, 0.5)
    x[:, :2].clamp_(min=1.0)
    want[:, :2] = np.maximum(want[:, :2], 1.0)
    x[:, 2:4].clamp_(max=-1.0)
    want[:, 2:4] = np.minimum(want[:, 2:4], -1.0)
    assert_close(x.numpy(), want)
    x.copy_(wgpar.tensor(src[:1, :1]))  # broadcasting copy
    assert_close(x.numpy(), np.full((7, 33), src[0, 0]))
    i = wgpar.zeros(5, dtype=wgpar.int32)
    i.copy_(wgpar.tensor(np.array([1.7, -2.2, 3.9, 0.0, 5.5], dtype=np.float32)))  # converts like torch (truncates)
    np.testing.assert_array_equal(i.numpy(), [1, -2, 3, 0, 5])


def test_inplace_shape_and_dtype_rules(dev, rng):
    x = wgpar.zeros(3, 4)
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        x.add_(wgpar.ones(2, 3, 4))  # would grow x
    i = wgpar.zeros(4, dtype=wgpar.int32)
    with pytest.raises(TypeError):
        i.add_(wgpar.ones(4))  # a float result cannot be stored in an int tensor in place
    with pytest.raises(TypeError):
        i /= 2


def test_chain_of_many_ops_is_right(dev, rng):
    a = f32(rng, (129,))
    x = wgpar.tensor(a)
    r = ref(a)
    for k in range(60):
        x = (x * 0.9 + 0.1).tanh() if k % 2 else x - 0.01 * x
        r = np.tanh(r * 0.9 + 0.1) if k % 2 else r - 0.01 * r
    assert_close(x.numpy(), r, rtol=1e-5, atol=1e-6)


def test_setitem_with_slices(dev, rng):
    a = f32(rng, (7, 33))
    x = wgpar.tensor(a)
    want = ref(a).copy()
    x[1:4, ::3] = 0.5
    want[1:4, ::3] = 0.5
    x[-1] = wgpar.tensor(np.arange(33, dtype=np.float32))
    want[-1] = np.arange(33)
    x[:, -2:] = wgpar.tensor(a[:, :1])  # broadcast
    want[:, -2:] = a[:, :1]
    x[5, 3] = -9
    want[5, 3] = -9
    x[::-2, 4:6] = wgpar.tensor(a[:4, :2][::-1])
    want[::-2, 4:6] = a[:4, :2][::-1]
    x[...] = x * 2
    want[...] = want * 2
    assert_close(x.numpy(), want)


def test_inplace_reading_its_own_memory_elsewhere(dev, rng):
    # Inputs that overlap the written tensor at other positions must read the old values, as in NumPy.
    a = f32(rng, (1000,))
    x = wgpar.tensor(a)
    x[1:] += x[:-1]
    want = ref(a).copy()
    want[1:] += ref(a)[:-1]
    assert_close(x.numpy(), want)
    b = f32(rng, (129, 129))
    y = wgpar.tensor(b)
    y += y.T
    assert_close(y.numpy(), ref(b) + ref(b).T)
    y = wgpar.tensor(b)
    y.copy_(y.T)
    assert_close(y.numpy(), ref(b).T)
    y = wgpar.tensor(b)
    y -= y[3]  # a broadcast row of itself
    assert_close(y.numpy(), ref(b) - ref(b)[3])
    y = wgpar.tensor(b)
    y[:, 1:] = y[:, :-1]
    want = ref(b).copy()
    want[:, 1:] = ref(b)[:, :-1]
    assert_close(y.numpy(), want)
    y = wgpar.tensor(b)
    y[::-1] = y  # reversed onto itself
    assert_close(y.numpy(), ref(b)[::-1])
    y = wgpar.tensor(b)
    y[:64] += y[64:128]  # disjoint halves of one buffer
    want = ref(b).copy()
    want[:64] += ref(b)[64:128]
    assert_close(y.numpy(), want)


def test_writing_into_a_broadcast_view_is_refused(dev):
    x = wgpar.zeros(1, 33)
    with pytest.raises(ValueError, match=r"\(7, 33\)"):
        x.expand(7, 33).add_(1.0)
    assert_close(x.numpy(), np.zeros((1, 33)))
