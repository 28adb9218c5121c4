"""Scalars in elementwise ops: NumPy scalars promote exactly like the Python numbers they hold.

PyTorch's rule for a Python number: it keeps the tensor's type within its kind (float16 + 0.5 stays
float16), a float joining an integer or bool tensor gives float32, an int joining a bool tensor an
integer type. wgpar has no int64, so PyTorch's int64 results are int32 here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import wgpar

from .helpers import assert_close

NP_SCALARS = [np.float32(0.5), np.float64(-1.5), np.float16(2.5), np.int64(3), np.int32(-2), np.uint8(2),
              np.bool_(True)]

# name -> (op on a wgpar or torch tensor t and a scalar s)
OPS = {
    "add": lambda t, s: t + s, "radd": lambda t, s: s + t, "sub": lambda t, s: t - s, "rsub": lambda t, s: s - t,
    "mul": lambda t, s: t * s, "div": lambda t, s: t / s, "rdiv": lambda t, s: s / t,
    "floordiv": lambda t, s: t // s, "mod": lambda t, s: t % s, "pow": lambda t, s: t ** s,
    "lt": lambda t, s: t < s, "eq": lambda t, s: t == s, "ge": lambda t, s: t >= s,
    "clamp_min": lambda t, s: t.clamp(min=s), "clamp_max": lambda t, s: t.clamp(max=s),
    "clamp": lambda t, s: t.clamp(min=s, max=s * 2),
}
WHERE = {
    "where_a": lambda w, t, s: w.where(t > 0, t, s), "where_b": lambda w, t, s: w.where(t > 0, s, t),
    "where_scalars": lambda w, t, s: w.where(t > 0, s, 0),
}
# The same ops on float64 NumPy arrays (clamp spelled with maximum / minimum).
NP_OPS = {**OPS, "clamp_min": np.maximum, "clamp_max": np.minimum,
          "clamp": lambda t, s: np.minimum(np.maximum(t, s), s * 2),
          "where_a": lambda t, s: np.where(t > 0, t, s), "where_b": lambda t, s: np.where(t > 0, s, t),
          "where_scalars": lambda t, s: np.where(t > 0, s, 0)}


def _torch_result_type(dtype, name: str, s):
    """PyTorch's rule for a tensor of ``dtype`` and a Python number ``s`` (int64 read as int32)."""
    if name in ("lt", "eq", "ge"):
        return wgpar.bool_
    kind = "b" if isinstance(s, bool) else "i" if isinstance(s, int) else "f"
    if name == "where_scalars":  # two Python numbers, s and 0: float32 (the default) or int64
        return wgpar.float32 if kind == "f" else wgpar.int32
    if dtype.is_float:
        return dtype  # float16 + 0.5 stays float16
    if kind == "f" or name in ("div", "rdiv"):
        return wgpar.float32  # true division of integers is float
    if dtype is wgpar.bool_ and kind == "b":
        return wgpar.bool_
    return wgpar.int32


# Ops that refuse a bool tensor with a bool scalar (TypeError), as torch refuses them.
BOOL_REFUSED = ("sub", "rsub", "floordiv", "mod")


def _skip_vs_torch(dtype, name: str, s) -> bool:
    """Combinations where wgpar knowingly differs from PyTorch (the Python scalar behaves the same)."""
    if name in ("sub", "rsub") and (isinstance(s, np.bool_) or dtype is wgpar.bool_):
        return True  # torch refuses subtraction with bools; wgpar subtracts an int tensor and a bool as 0 / 1
    if name == "pow" and not dtype.is_float and not isinstance(s, np.floating):
        return True  # torch keeps integer powers integer; wgpar's pow is a float op
    if name in ("clamp", "clamp_min", "clamp_max", "floordiv", "mod", "rdiv") and dtype is wgpar.bool_:
        return True  # torch refuses or keeps bool here; wgpar computes in int32/float32
    return False


def _reference(torch, a, dtype, name: str, s):
    """(result dtype, float64 values) of op ``name`` on ``a`` and the Python number ``s``: torch's rule with
    NumPy's float64 arithmetic (torch None), or torch's own result."""
    if torch is None:
        rtype = _torch_result_type(dtype, name, s)
        with np.errstate(all="ignore"):  # NaN from pow of negatives, as in torch
            values = NP_OPS[name](a.astype(np.float64), float(s))
        return rtype, (values != 0).astype(np.float64) if rtype is wgpar.bool_ else values  # bool + True: or
    ta = torch.tensor(a)
    r = WHERE[name](torch, ta, s) if name in WHERE else OPS[name](ta, s)
    to_wgpar = {torch.float32: wgpar.float32, torch.float16: wgpar.float16, torch.int32: wgpar.int32,
                torch.int64: wgpar.int32, torch.bool: wgpar.bool_}
    return to_wgpar[r.dtype], r.double().numpy()


def _data(rng, dtype):
    if dtype is wgpar.bool_:
        return rng.random(33) < 0.5
    if dtype is wgpar.int32:
        a = rng.integers(-9, 10, 33).astype(np.int32)
        a[a == 0] = 4  # no integer division by zero (rdiv)
        return a
    return rng.uniform(0.25, 3.0, 33).astype(dtype.np) * np.where(rng.random(33) < 0.5, -1, 1).astype(dtype.np)


def _result(r):
    return r.dtype, r.numpy()


@pytest.mark.parametrize("dtype", [wgpar.int32, wgpar.float32, wgpar.float16, wgpar.bool_])
def test_numpy_scalars_promote_like_python_numbers_and_torch(dev, rng, dtype, reference):
    """NumPy scalars give what the Python number gives; both follow torch's rule (_torch_result_type, values
    in float64) or, in the torch run, torch itself."""
    if dtype is wgpar.float16 and not dev.has_f16:
        pytest.skip(f"{dev} has no shader-f16 feature")
    a = _data(rng, dtype)
    t = wgpar.tensor(a, dtype=dtype)
    cases = [(name, f) for name, f in OPS.items()]
    cases += [(name, functools.partial(f, wgpar)) for name, f in WHERE.items()]
    for s in NP_SCALARS:
        py = s.item()
        for name, fw in cases:
            what = f"{dtype.name} {name} {type(s).__name__}({s})"
            if dtype is wgpar.bool_ and isinstance(py, bool) and name in BOOL_REFUSED:
                for v in (s, py):
                    with pytest.raises(TypeError, match="bool"):
                        fw(t, v)
                continue
            got_np = _result(fw(t, s))
            again = _result(fw(t, s))  # the second call takes the cached fast path
            got_py = _result(fw(t, py))
            assert got_np[0] is got_py[0] is again[0], f"{what}: {got_np[0]} / {again[0]} / python {got_py[0]}"
            np.testing.assert_array_equal(got_np[1], got_py[1], err_msg=what)
            np.testing.assert_array_equal(again[1], got_py[1], err_msg=what)
            if _skip_vs_torch(dtype, name, s):
                continue
            want_dtype, want = _reference(reference, a, dtype, name, py)
            assert got_np[0] is want_dtype, f"{what}: {got_np[0]}, reference {want_dtype}"
            tol = dict(rtol=2e-3, atol=2e-3) if got_np[0] is wgpar.float16 else dict(rtol=1e-6, atol=1e-6)
            got = got_np[1].astype(np.float64)
            if name == "pow" and py < 0:  # 0 ** negative is a kernel matter (WGSL pow), not promotion's
                got, want = got[a != 0], want[a != 0]
            assert_close(got, want, what=what, **tol)


def test_integer_tensor_with_float_scalars(dev):
    i = wgpar.tensor(np.array([1, 2, 3], np.int32))
    for s in (np.float32(0.5), np.float16(0.5), np.float64(0.5), 0.5):
        r = i + s
        assert r.dtype is wgpar.float32 and r.tolist() == [1.5, 2.5, 3.5], (type(s), r)
        assert (i < s).tolist() == [False, False, False]  # compared as floats, not as int(0.5) == 0
        assert (i * s).tolist() == [0.5, 1.0, 1.5]
        with pytest.raises(TypeError, match="int32"):
            i.add_(s)  # a float result cannot be stored in place in the int32 tensor (torch refuses too)
    assert (i / 2).dtype is wgpar.float32 and (i / 2).tolist() == [0.5, 1.0, 1.5]
    assert (i / np.int64(2)).tolist() == [0.5, 1.0, 1.5]
    assert (i // np.int64(2)).dtype is wgpar.int32
    b = wgpar.tensor([True, False])
    assert (b + np.int64(2)).dtype is wgpar.int32 and (b + np.int64(2)).tolist() == [3, 2]
    assert (b * np.float32(1.5)).dtype is wgpar.float32 and (b * np.float32(1.5)).tolist() == [1.5, 0.0]
    w = wgpar.where(b, np.float32(0.5), np.int64(0))  # scalars only: a float makes it float32
    assert w.dtype is wgpar.float32 and w.tolist() == [0.5, 0.0]
