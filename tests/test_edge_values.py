"""Edge values (0, -0.0, -1, min, max, NaN, inf, -inf) through every elementwise op, cast and reduction.

References are NumPy in float64 (float32 for float16 results, as the kernels compute), with
PyTorch's rules where the two differ: sign(nan) is 0. Rules of wgpar's own, where neither library
defines a result: float -> int32 casts saturate and send NaN to 0 (as CUDA), int32 sums wrap.
These tests matter most on real GPUs, whose compilers treat NaN, signed division and
out-of-range conversions differently from lavapipe.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import wgpar
from wgpar.ops.registry import BOOL, FLOAT, INT, OPS

F16_MAX = 65504.0
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _float_values(nd) -> np.ndarray:
    fi = np.finfo(nd)
    return np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, fi.max, fi.min, fi.tiny, np.nan, np.inf, -np.inf], dtype=nd)


VALUES = {
    "float32": _float_values(np.float32),
    "float16": _float_values(np.float16),
    "int32": np.array([0, 1, -1, 7, -7, INT_MAX, INT_MIN], dtype=np.int32),
    "bool": np.array([False, True]),
}
DTYPES = ["float32", "float16", "int32", "bool"]


@pytest.fixture
def need(dev):
    def check(dtype: str):
        if dtype == "float16" and not dev.has_f16:
            pytest.skip(f"{dev} has no shader-f16")
    return check


def _tensor(a: np.ndarray, dtype: str) -> wgpar.Tensor:
    return wgpar.tensor(a, dtype=getattr(wgpar, "bool_" if dtype == "bool" else dtype))


def _compute(a: np.ndarray) -> np.ndarray:
    """Values as the kernels see them: floats (float16 included) in float32, ints and bools as int64."""
    return a.astype(np.float32).astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64)


def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((np.asarray(x, dtype=np.int64) - INT_MIN) % 2**32 + INT_MIN).astype(np.int32)


def _f2i(x: np.ndarray) -> np.ndarray:
    """wgpar's float -> int32 cast: truncate, saturate, NaN -> 0."""
    with np.errstate(invalid="ignore"):
        t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=INT_MAX, neginf=INT_MIN))
    return np.clip(t, INT_MIN, INT_MAX).astype(np.int32)


def assert_values(got: np.ndarray, want: np.ndarray, rtol: float = 0.0, what: str = "", atol: float = 0.0) -> None:
    """Equal values (NaN where NaN, same infinities); finite values within ``rtol`` and ``atol``.

    Finite values below the dtype's smallest normal may be flushed to zero (GPUs may flush
    subnormals). A float16 result between 65504 and 65536 in magnitude may be 65504 or inf:
    WGSL leaves that rounding to the implementation.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind != "f":
        bad = got != want
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        tiny = float(np.finfo(want.dtype).tiny)
        with np.errstate(invalid="ignore"):
            close = (g == w) | (np.isnan(g) & np.isnan(w))
            close |= np.isfinite(w) & (np.abs(g - w) <= atol + rtol * np.abs(w))
            close |= np.isfinite(w) & (np.abs(w) < tiny) & (np.abs(g) < tiny)
            if want.dtype == np.float16:
                close |= (np.abs(w) >= F16_MAX) & (np.abs(w) < 65536) & ((np.abs(g) == F16_MAX) | np.isinf(g)) & \
                    (np.sign(g) == np.sign(w))
        bad = ~close
    if bad.any():
        idx = np.argwhere(bad)[:8]
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ, e.g. "
                             + ", ".join(f"{tuple(i)}: got {got[tuple(i)]} want {want[tuple(i)]}" for i in idx))


# -- unary ops --------------------------------------------------------------------------------
def _gelu(x):
    erf = np.vectorize(math.erf, otypes=[np.float64])
    with np.errstate(invalid="ignore"):
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


# name: (reference on compute values, relative tolerance for float results, absolute tolerance:
# drivers' tanh, sigmoid and gelu near 0 are accurate to ~3e-8 absolute, not relative)
_UNARY = {
    "neg": (lambda x: -x, 0.0, 0.0),
    "abs": (np.abs, 0.0, 0.0),
    "relu": (lambda x: np.where(np.isnan(x), x, np.maximum(x, 0)) if x.dtype.kind == "f" else np.maximum(x, 0),
             0.0, 0.0),
    "sign": (lambda x: np.nan_to_num(np.sign(x), nan=0.0), 0.0, 0.0),  # torch.sign(nan) == 0
    "exp": (np.exp, 1e-5, 0.0),
    "log": (np.log, 1e-5, 0.0),
    "sqrt": (np.sqrt, 1e-6, 0.0),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), 1e-5, 0.0),
    "tanh": (np.tanh, 1e-5, 1e-7),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), 1e-5, 1e-7),
    "gelu": (_gelu, 1e-5, 1e-7),
}
_FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu"}
_INT_ONLY = {op.name for op in OPS.values() if op.types == INT}  # bitwise: float operands raise TypeError
# Every other unary op of the registry, by its NumPy reference there (which must then hold on edge values).
for _op in OPS.values():
    if _op.api and _op.arity == 1 and _op.name not in _UNARY:
        _UNARY[_op.name] = (_op.check.ref, max(_op.check.rtol, 1e-5), 1e-7)
        if _op.types == FLOAT:
            _FLOAT_ONLY.add(_op.name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_unary_ops_on_edge_values(need, dtype):
    need(dtype)
    a = VALUES[dtype]
    t = _tensor(a, dtype)
    x = _compute(a).astype(np.float64) if dtype != "int32" else _compute(a)
    for name, (ref, rtol, atol) in _UNARY.items():
        if name in _INT_ONLY and dtype != "int32":
            with pytest.raises(TypeError):
                _unary(t, name)
            continue
        got = _unary(t, name).numpy()
        with np.errstate(all="ignore"):
            if dtype == "int32" and name not in _FLOAT_ONLY:
                want = _wrap32(ref(x))
            else:  # a float op converts int32 to float32 first (as PyTorch): INT_MAX becomes 2**31
                want = ref(x.astype(np.float32).astype(np.float64)).astype(np.float32 if dtype == "int32" else a.dtype)
        tol = rtol if dtype != "float16" else max(rtol, 1e-3)
        assert_values(got, want, tol, f"{name}({dtype})", atol)


def _unary(t, name):
    from wgpar.autograd import differentiable as D

    return D.unary(name, t)


# -- binary ops over every pair of edge values ------------------------------------------------
def _pow(a, b):
    with np.errstate(all="ignore"):
        return np.power(a, b)


_BINARY = {  # name: (reference on compute values, relative tolerance for float results)
    "add": (np.add, 0.0),
    "sub": (np.subtract, 0.0),
    "mul": (np.multiply, 0.0),
    "div": (np.divide, 3e-7),
    "pow": (_pow, 2e-5),
    "floordiv": (np.floor_divide, 1e-6),
    "mod": (np.remainder, 0.0),
    "maximum": (np.maximum, 0.0),
    "minimum": (np.minimum, 0.0),
    "eq": (np.equal, 0.0), "ne": (np.not_equal, 0.0), "lt": (np.less, 0.0),
    "le": (np.less_equal, 0.0), "gt": (np.greater, 0.0), "ge": (np.greater_equal, 0.0),
}
_CMP = {"eq", "ne", "lt", "le", "gt", "ge"}
_TRUE_DIV = {"div", "pow"}
for _op in OPS.values():  # every other binary op of the registry, by its NumPy reference there
    if _op.api and _op.arity == 2 and _op.name not in _BINARY:
        _BINARY[_op.name] = (_op.check.ref, max(_op.check.rtol, 1e-5))
        if _op.types == FLOAT:
            _TRUE_DIV.add(_op.name)
        if _op.types == BOOL:  # logical_and ..: bool results, like the comparisons
            _CMP.add(_op.name)
# on bool tensors: the comparisons, the logical ops, and & | ^ (logical there, bool results)
_ON_BOOL = _CMP | {"bitwise_and", "bitwise_or", "bitwise_xor"}


def _binary_want(name: str, a: np.ndarray, b: np.ndarray, dtype: str):
    ref = _BINARY[name][0]
    x, y = _compute(a), _compute(b)
    if name in _TRUE_DIV:  # computed in float32, from the float32 values of the operands
        x, y = x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        if name in _CMP:
            return ref(x, y)
        if dtype == "int32" and name not in _TRUE_DIV:
            if name in ("floordiv", "mod"):  # Python's rules on exact integers, wrapped (INT_MIN // -1)
                return _wrap32(np.frompyfunc(lambda p, q: p // q if name == "floordiv" else p % q, 2, 1)(x, y))
            return _wrap32(ref(x, y))
        if name in ("floordiv", "mod"):  # NumPy's float32 divmod is the reference (PyTorch's too)
            return ref(x.astype(np.float32), y.astype(np.float32)).astype(a.dtype if dtype != "int32" else np.float32)
        out = np.float32 if dtype == "int32" else a.dtype
        return ref(x, y).astype(out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_ops_on_every_pair_of_edge_values(need, dtype):
    need(dtype)
    v = VALUES[dtype]
    a, b = v[:, None], v[None, :]  # broadcast: every pair, through the vec4 block kernel when it can
    ta, tb = _tensor(a, dtype), _tensor(b, dtype)
    ta_strided = _tensor(np.ascontiguousarray(np.broadcast_to(a, (len(v), len(v))).T), dtype).T
    for name, (_, rtol) in _BINARY.items():
        if dtype == "bool" and name not in _ON_BOOL:  # bool arithmetic yields int32 in wgpar: not an edge case
            continue
        if name in _INT_ONLY and dtype in ("float32", "float16"):
            with pytest.raises(TypeError):
                _binary(name, ta, tb)
            continue
        if dtype == "int32" and name in ("floordiv", "mod"):
            nz = np.nonzero(v)[0]
            got = _binary(name, ta, _tensor(v[nz][None, :], dtype)).numpy()
            want = _binary_want(name, a, v[nz][None, :], dtype)
        else:
            got = _binary(name, ta, tb).numpy()
            want = _binary_want(name, a, b, dtype)
        tol = rtol if dtype != "float16" or name in _CMP else max(rtol, 1e-3)
        assert_values(got, want, tol, f"{name}({dtype})")
        if name in ("mod", "maximum", "lt"):  # the strided kernel (elementwise.wgsl) shares the helpers
            if dtype == "int32" and name == "mod":
                continue
            assert_values(_binary(name, ta_strided, tb).numpy(), want, tol, f"{name}({dtype}, strided)")


def _binary(name, a, b):
    from wgpar.autograd import differentiable as D

    return D.binary(name, a, b)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_clamp_and_where_on_edge_values(need, dtype):
    need(dtype)
    v = VALUES[dtype]
    t = _tensor(v, dtype)
    x = _compute(v)
    lo, hi = (-1, 7) if dtype == "int32" else (-1.0, 0.5)
    want = np.where(np.isnan(x), x, np.minimum(np.maximum(x, lo), hi)) if dtype != "int32" else np.clip(x, lo, hi)
    assert_values(t.clamp(lo, hi).numpy(), want.astype(v.dtype), 0.0, f"clamp({dtype})")
    assert_values(t.clamp(min=lo).numpy(), np.maximum(x, lo).astype(v.dtype), 0.0, f"clamp_min({dtype})")
    assert_values(t.clamp(max=hi).numpy(), np.minimum(x, hi).astype(v.dtype), 0.0, f"clamp_max({dtype})")
    if dtype != "int32":  # a NaN bound gives NaN everywhere (PyTorch)
        assert np.isnan(t.clamp(min=float("nan")).numpy()).all()
        assert np.isnan(t.clamp(-1.0, float("nan")).numpy()).all()
    # where: the condition's truthiness (a NaN is true), values of every dtype
    cond = _tensor(v, dtype)
    assert_values(wgpar.where(cond, 1, 0).numpy(), (x != 0).astype(np.int32), 0.0, f"where({dtype})")
    with np.errstate(invalid="ignore"):
        want = np.where(x > 0, x, 0 * x).astype(v.dtype)
    assert_values(wgpar.where(cond > 0, t, t * 0).numpy(), want, 0.0, f"where values ({dtype})")


# -- casts ------------------------------------------------------------------------------------
def _cast_want(a: np.ndarray, src: str, dst: str) -> np.ndarray:
    x = _compute(a)
    if dst == "bool":
        return x != 0  # NaN is true
    if dst == "int32":
        return _f2i(x) if src in ("float32", "float16") else x.astype(np.int32)
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(np.float16 if dst == "float16" else np.float32)


@pytest.mark.parametrize("src", DTYPES)
def test_casts_between_every_dtype_on_edge_values(need, src):
    need(src)
    extra = {"float32": [3.7, -3.7, 1e10, -1e10, 2.0**31, 65519.0, 7e4], "float16": [3.7, -3.7, 1000.5]}
    a = np.concatenate([VALUES[src], np.array(extra.get(src, []), dtype=VALUES[src].dtype)])
    t = _tensor(a, src)
    for dst in DTYPES:
        need(dst)
        got = t.to(dtype=getattr(wgpar, "bool_" if dst == "bool" else dst)).numpy()
        assert_values(got, _cast_want(a, src, dst), 0.0, f"{src} -> {dst}")


# -- reductions -------------------------------------------------------------------------------
def _float_rows(nd) -> np.ndarray:
    fi = np.finfo(nd)
    nan, inf = np.nan, np.inf
    return np.array([
        [1, nan, 3, -1, 2], [nan, nan, 0, 1, 5], [inf, 1, -inf, 0, 2], [-inf, -inf, -inf, -inf, -inf],
        [fi.min, fi.min, fi.min, fi.min, fi.min], [fi.max, fi.max, 1, 0, -1], [-0.0, 0.0, -0.0, 0.0, -0.0],
        [-1, -1, -1, -1, -1], [inf, inf, 1, nan, -inf], [fi.max, 2, 0.5, fi.max, -2.5],
    ], dtype=nd)


ROWS = {
    "float32": _float_rows(np.float32),
    "float16": _float_rows(np.float16),
    "int32": np.array([[INT_MAX, 1, 0, -1, INT_MIN], [INT_MIN, INT_MIN, 0, 5, 5], [INT_MAX, INT_MAX, 3, 4, -7],
                       [-1, -1, -1, -1, -1]], dtype=np.int32),
    "bool": np.array([[True, False, True, False, True], [False] * 5, [True] * 5], dtype=bool),
}


def _reduce_want(op: str, x: np.ndarray, axis, dtype: str):
    c = _compute(x)
    with np.errstate(all="ignore"):
        if op == "sum":
            if dtype in ("float32", "float16"):
                return np.sum(c.astype(np.float32), axis=axis, dtype=np.float32).astype(x.dtype)
            return _wrap32(np.sum(c, axis=axis))  # int32 sums wrap (PyTorch sums into int64)
        if op == "mean":
            out = np.float16 if dtype == "float16" else np.float32
            return (np.sum(c.astype(np.float32), axis=axis, dtype=np.float32) / np.float32(
                x.size if axis is None else x.shape[axis])).astype(out)
        if op in ("max", "min"):
            r = (np.max if op == "max" else np.min)(c, axis=axis)  # NumPy propagates NaN, as PyTorch
            return r.astype(x.dtype)
        return (np.argmax if op == "argmax" else np.argmin)(c, axis=axis).astype(np.int32)  # first NaN wins


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_on_edge_values(need, dtype):
    need(dtype)
    x = ROWS[dtype]
    ops = ["sum", "max", "min", "argmax", "argmin"] + (["mean"] if dtype != "bool" else [])
    rtol = {"float16": 1e-3, "float32": 1e-6}.get(dtype, 0.0)
    for width in (5, 4):  # 4 columns: the vec4 row kernel
        xs = np.ascontiguousarray(x[:, :width])
        t = _tensor(xs, dtype)
        for op in ops:
            for axis, tt, xx in ((1, t, xs), (0, _tensor(np.ascontiguousarray(xs.T), dtype), xs.T), (None, t, xs)):
                # axis 0 of the transposed copy: the column kernel (reduce_cols.wgsl)
                got = getattr(tt, {"max": "amax", "min": "amin"}.get(op, op))(axis).numpy()
                want = _reduce_want(op, xx, 0 if axis == 0 else axis, dtype)
                if op in ("argmax", "argmin"):
                    np.testing.assert_array_equal(got, want, err_msg=f"{op}({dtype}, axis={axis})")
                else:
                    # int32 means add in float32, where int32's extremes are rounded to 2^31
                    atol = 1e3 if op == "mean" and dtype == "int32" else 0.0
                    assert_values(got, want.astype(got.dtype), rtol, f"{op}({dtype}, axis={axis}, width {width})", atol)


def test_argmax_of_a_long_row_takes_the_first_nan(rng):
    x = rng.standard_normal((2, 9001)).astype(np.float32)  # long rows: the two-pass path
    x[0, 4500] = x[0, 4700] = np.nan
    x[0, 100] = np.inf
    x[1, 8000] = np.nan
    t = wgpar.tensor(x)
    np.testing.assert_array_equal(t.argmax(1).numpy(), [4500, 8000])
    np.testing.assert_array_equal(t.argmin(1).numpy(), [4500, 8000])
    np.testing.assert_array_equal(t.amax(1).numpy(), [np.nan, np.nan])
    values, indices = t.max(1)
    np.testing.assert_array_equal(values.numpy(), [np.nan, np.nan])
    np.testing.assert_array_equal(indices.numpy(), [4500, 8000])
    assert int(t.argmax().item()) == 4500


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_softmax_and_log_softmax_on_edge_values(need, dtype):
    need(dtype)
    x = ROWS[dtype]
    c = _compute(x)
    rtol = 1e-5 if dtype == "float32" else 2e-3
    for width in (5, 4):
        t = _tensor(np.ascontiguousarray(x[:, :width]), dtype)
        with np.errstate(all="ignore"):
            zz = c[:, :width] - np.max(c[:, :width], axis=1, keepdims=True)
            ss = np.sum(np.exp(zz), axis=1, keepdims=True)
            want_sm, want_lsm = np.exp(zz) / ss, zz - np.log(ss)
        assert_values(t.softmax(-1).numpy(), want_sm.astype(x.dtype), rtol, f"softmax({dtype}, width {width})")
        assert_values(t.log_softmax(-1).numpy(), want_lsm.astype(x.dtype), rtol, f"log_softmax({dtype}, width {width})")


def test_cross_entropy_with_nan_and_infinite_logits():
    from wgpar.nn import functional as F

    x = np.array([[np.nan, 1, 2], [np.inf, 1, 0], [-np.inf, 1, 0], [1, 2, 3], [3.4e38, -3.4e38, 0]], np.float32)
    tgt = np.array([1, 0, 0, 2, 0])
    c = x.astype(np.float64)
    with np.errstate(all="ignore"):
        z = c - np.max(c, axis=1, keepdims=True)
        lsm = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))
    want = -lsm[np.arange(5), tgt]  # PyTorch: nan, nan, inf, 0.4076, 0
    got = F.cross_entropy(wgpar.tensor(x), tgt, reduction="none").numpy()
    assert_values(got, want.astype(np.float32), 1e-5, "cross_entropy")
    assert np.isnan(F.cross_entropy(wgpar.tensor(x), tgt).item())


def test_every_registry_op_meets_the_edge_values():
    public = {op.name for op in OPS.values() if op.api}
    assert public <= set(_UNARY) | set(_BINARY), public - set(_UNARY) - set(_BINARY)
