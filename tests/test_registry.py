"""Every public op of the registry (wgpar/ops/registry.py), tested from its entry: forward against
NumPy float64 through the method, the function and the operators; gradients against finite
differences and against PyTorch; the generated API present. An op added to the registry is tested
here without a line of its own."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import wgpar
from wgpar.ops.registry import GRADS, OPS, SAVES

from .gradcheck import check
from .helpers import assert_close

PUBLIC = [op for op in OPS.values() if op.api and op.check]
DIFFERENTIABLE = [op for op in PUBLIC if op.differentiable]
# operand shapes per arity: same shapes, then broadcasting (a bias, a column against a row)
SHAPES = {1: [(33, 7), (5, 1, 3)], 2: [((5, 7), (5, 7)), ((4, 1, 7), (3, 7)), ((6, 1), (1, 5))]}


def _ids(ops):
    return [op.name for op in ops]


def values(rng, domain: str, shape) -> np.ndarray:
    if domain == "int":
        return rng.integers(-9, 10, shape).astype(np.int32)
    if domain == "intnz":
        return (rng.integers(1, 10, shape) * rng.choice([-1, 1], shape)).astype(np.int32)
    if domain == "shift":
        return rng.integers(0, 32, shape).astype(np.int32)
    x = rng.standard_normal(shape)
    if domain == "pos":
        x = np.abs(x) + 0.5
    elif domain == "nonzero":
        x = np.sign(x) * (np.abs(x) + 0.5)
    elif domain == "unit":
        x = 0.9 * np.tanh(x)
    elif domain == "away0":
        x = np.where(np.abs(x) < 0.05, 0.3, x)
    return x.astype(np.float32)


def py_operator(name: str):
    """The function of the operator module behind a dunder name ("and": operator.and_)."""
    return getattr(operator, name, None) or getattr(operator, name + "_")


def f64(a: np.ndarray) -> np.ndarray:
    """Float test values in float64 for the references; integers as they are (bitwise ops take no floats)."""
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def inputs(op, rng):
    """Per shape case: the operands as NumPy arrays."""
    cases = SHAPES[op.arity]
    return [[values(rng, d, s) for d, s in zip(op.check.domain, case if op.arity > 1 else (case,))]
            for case in cases]


def compare(op, got: wgpar.Tensor, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    if want.dtype == np.bool_ or got.dtype is not wgpar.float32 and not got.dtype.is_float:
        np.testing.assert_array_equal(got.numpy(), want, err_msg=what)
    else:
        assert_close(got.numpy(), want, rtol=op.check.rtol, atol=op.check.atol, what=what)


@pytest.mark.parametrize("op", PUBLIC, ids=_ids(PUBLIC))
def test_forward_against_numpy(op, rng):
    for arrays in inputs(op, rng):
        want = op.check.ref(*[f64(a) for a in arrays])
        tensors = [wgpar.tensor(a) for a in arrays]
        forms = {"method": getattr(tensors[0], op.api)(*tensors[1:])}
        if op.function:
            forms["function"] = getattr(wgpar, op.api)(*tensors)
        if op.dunder:
            forms["operator"] = py_operator(op.dunder)(*tensors)
        for form, got in forms.items():
            compare(op, got, want, f"{op.name} {form} {[a.shape for a in arrays]}")
        if op.arity == 2:  # a Python number on either side
            s = float(arrays[1].flat[0]) if arrays[1].dtype.kind == "f" else int(arrays[1].flat[0])
            compare(op, getattr(tensors[0], op.api)(s), op.check.ref(f64(arrays[0]), s),
                    f"{op.name}(tensor, {s})")
            if op.dunder:
                r = float(arrays[0].flat[0]) if arrays[0].dtype.kind == "f" else int(arrays[0].flat[0])
                compare(op, py_operator(op.dunder)(r, tensors[1]),
                        op.check.ref(r, f64(arrays[1])), f"{op.name}({r}, tensor)")


@pytest.mark.parametrize("op", [op for op in PUBLIC if op.inplace], ids=_ids([op for op in PUBLIC if op.inplace]))
def test_in_place_forms(op, rng):
    a, b = values(rng, op.check.domain[0], (5, 7)), values(rng, op.check.domain[1], (7,))  # b broadcasts into a
    want = op.check.ref(f64(a), f64(b))
    for form in ("method", "operator"):
        t = wgpar.tensor(a)
        alias = t
        if form == "method":
            t = getattr(t, op.api + "_")(wgpar.tensor(b))
        else:
            t = py_operator(f"i{op.dunder}")(t, wgpar.tensor(b))
        assert t is alias, f"{op.name}_ {form} returned another tensor"
        compare(op, t, want, f"{op.name} in place ({form})")


@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=_ids(DIFFERENTIABLE))
def test_gradient_against_finite_differences(op, rng):
    for arrays in inputs(op, rng):
        check(lambda *ts: getattr(ts[0], op.api)(*ts[1:]), op.check.ref, [a.astype(np.float64) for a in arrays], rng)


@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=_ids(DIFFERENTIABLE))
def test_gradient_against_torch(op, rng, torch):
    fn = torch
    for part in (op.check.torch or op.api).split("."):
        fn = getattr(fn, part)
    for arrays in inputs(op, rng):
        upstream = rng.standard_normal(np.broadcast_shapes(*[a.shape for a in arrays]))
        ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
        (fn(*ts) * torch.tensor(upstream)).sum().backward()
        ws = [wgpar.tensor(a, requires_grad=True) for a in arrays]
        getattr(ws[0], op.api)(*ws[1:]).backward(wgpar.tensor(upstream.astype(np.float32)))
        for k, (t, w) in enumerate(zip(ts, ws)):
            want = t.grad.numpy()
            assert_close(w.grad.numpy(), want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()),
                         what=f"d {op.name} / d x{k}")


def test_gradients_save_what_they_read():
    assert SAVES["mul"] == ("x0", "x1") and SAVES["exp"] == ("y",) and SAVES["add"] == ()
    assert SAVES["div"] == ("x1", "y") and SAVES["where"] == ("x0",)
    for name, kernels in GRADS.items():
        assert len(kernels) == OPS[name].arity
        for k in kernels:
            if k not in (None, "g"):
                assert OPS[k.op].arity == len(k.operands), k


@pytest.mark.parametrize("op", PUBLIC, ids=_ids(PUBLIC))
def test_api_comes_from_the_registry(op):
    assert callable(getattr(wgpar.Tensor, op.api))
    assert (op.api in wgpar.__all__ and callable(getattr(wgpar, op.api))) == op.function
    if op.dunder:
        assert f"__{op.dunder}__" in vars(wgpar.Tensor)
    if op.inplace:
        assert f"{op.api}_" in vars(wgpar.Tensor) and f"__i{op.dunder}__" in vars(wgpar.Tensor)
