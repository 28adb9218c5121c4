"""Column reductions of the training step: sums and means over leading axes (a Linear's bias gradient)
and LayerNorm's weight and bias gradients, against NumPy float64 (and PyTorch), and their dispatch
counts: at most two per reduction (partials, then one pass over them), LayerNorm's backward two.

Sizes straddle the kernels' choices: rows just past a power of two, columns that are not whole vec4s.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.runtime.device import Device

from .helpers import assert_close

SHAPES = [(8193, 769), (8192, 768), (1000, 2305), (8193, 3), (1000, 3), (3, 769), (3, 2305), (5000, 4), (1, 8)]


@pytest.fixture
def families(monkeypatch):
    """The kernel family of every dispatch, in order (Device.dispatch wrapped)."""
    seen: list[str] = []
    real = Device.dispatch

    def record(self, kspec, *args, **kwargs):
        seen.append(kspec.family)
        return real(self, kspec, *args, **kwargs)

    monkeypatch.setattr(Device, "dispatch", record)
    return seen


def dtypes(dev):
    return ["float32", "float16"] if dev.has_f16 else ["float32"]


def sum_tol(a: np.ndarray, axis, half: bool, want: np.ndarray) -> dict:
    """float32 accumulation errs by a small multiple of eps times the summed magnitudes; a float16 result
    is also rounded to 11 bits."""
    atol = 2e-7 * np.abs(a).sum(axis).max() + 1e-6
    return dict(rtol=2 ** -10 if half else 1e-5, atol=atol + (2 ** -11 * np.abs(want).max() if half else 0))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sum_and_mean_over_leading_axes(dev, rng, families, shape):
    for dt in dtypes(dev):
        half = dt == "float16"
        a = rng.uniform(-1, 1, size=shape).astype(np.float16 if half else np.float32)
        x = wgpar.tensor(a, dtype=dt)
        a64 = a.astype(np.float64)
        for op in ("sum", "mean"):
            want = getattr(a64, op)(0)
            families.clear()
            got = getattr(x, op)(0)
            assert got.dtype is x.dtype
            tol = sum_tol(a64 if op == "sum" else a64 / shape[0], 0, half, want)
            assert_close(got.numpy(), want, **tol, what=f"{op} {dt} {shape}")
            assert len(families) <= 2, (op, shape, families)
        # three leading axes of a 4-D view reduce as one
        b = a[: shape[0] - shape[0] % 3].reshape(3, 1, -1, shape[1])
        want = b.astype(np.float64).sum((0, 1, 2))
        xb = wgpar.tensor(b, dtype=dt)
        families.clear()
        got = xb.sum((0, 1, 2))
        assert_close(got.numpy(), want, **sum_tol(b.astype(np.float64), (0, 1, 2), half, want), what=f"3-axis {dt}")
        assert len(families) <= 2, families


def test_float16_sums_accumulate_in_float32(dev):
    if not dev.has_f16:
        pytest.skip("no shader-f16")
    ones = wgpar.tensor(np.ones((8193, 5), np.float16), dtype="float16")
    # float16 accumulators would stop at 2048; float32 ones reach 8193, which rounds to 8192 in float16
    np.testing.assert_array_equal(ones.sum(0).numpy(), np.full(5, 8192, np.float16))
    np.testing.assert_array_equal(ones.mean(0).numpy(), np.ones(5, np.float16))


@pytest.mark.parametrize("shape", [(8193, 769), (1000, 3), (3, 2305), (4099, 12)], ids=str)
def test_other_column_reductions(dev, rng, shape):
    """max, min, argmax, argmin, integer and bool sums and integer means share the kernels."""
    a = rng.integers(-4, 5, size=shape).astype(np.float32)  # ties: the first index must win
    a[shape[0] // 2, 0] = np.nan  # a NaN wins its column (its first NaN for argmax)
    x = wgpar.tensor(a)
    for name, want in [("amax", np.max(a, 0)), ("amin", np.min(a, 0)), ("argmax", np.argmax(a, 0)),
                       ("argmin", np.argmin(a, 0))]:
        np.testing.assert_array_equal(getattr(x, name)(0).numpy(), want, err_msg=name)
    ints = rng.integers(-1000, 1000, size=shape).astype(np.int32)
    xi = wgpar.tensor(ints)
    np.testing.assert_array_equal(xi.sum(0).numpy(), ints.sum(0))
    np.testing.assert_array_equal(xi.amax(0).numpy(), ints.max(0))
    np.testing.assert_array_equal(xi.argmin(0).numpy(), ints.argmin(0))
    assert_close(xi.mean(0).numpy(), ints.astype(np.float64).mean(0), rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(wgpar.tensor(ints > 0).sum(0).numpy(), (ints > 0).sum(0))


def test_middle_axis_with_several_outer_blocks(dev, rng, families):
    a = rng.uniform(-1, 1, size=(3, 4097, 36)).astype(np.float32)
    x = wgpar.tensor(a)
    for op in ("sum", "mean"):
        want = getattr(a.astype(np.float64), op)(1)
        families.clear()
        assert_close(getattr(x, op)(1).numpy(), want, **sum_tol(a, 1, False, want), what=op)
        assert len(families) <= 2, families


@pytest.mark.parametrize("rows,n_out", [(8193, 769), (1000, 2305), (3, 3)], ids=str)
def test_linear_bias_gradient(dev, rng, reference, rows, n_out):
    x = rng.standard_normal((rows, 5)).astype(np.float32)
    w = rng.standard_normal((n_out, 5)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    gy = rng.standard_normal((rows, n_out)).astype(np.float32)
    wb = wgpar.tensor(b, requires_grad=True)
    ww = wgpar.tensor(w, requires_grad=True)
    F.linear(wgpar.tensor(x), ww, wb).backward(wgpar.tensor(gy))
    if reference is None:
        want_b, want_w = gy.astype(np.float64).sum(0), gy.astype(np.float64).T @ x
    else:
        tb = reference.tensor(b.astype(np.float64), requires_grad=True)
        tw = reference.tensor(w.astype(np.float64), requires_grad=True)
        reference.nn.functional.linear(reference.tensor(x, dtype=reference.float64), tw, tb).backward(
            reference.tensor(gy, dtype=reference.float64))
        want_b, want_w = tb.grad.numpy(), tw.grad.numpy()
    assert_close(wb.grad.numpy(), want_b, **sum_tol(gy, 0, False, want_b), what="bias")
    assert_close(ww.grad.numpy(), want_w, rtol=1e-4, atol=1e-6 * np.abs(gy).sum(0).max() * np.abs(x).max())


def test_linear_bias_gradient_takes_two_dispatches(dev, rng, families):
    """GPT-2's bias gradients are [8192, N] summed over rows: one pass for partials, one over them."""
    x = wgpar.tensor(rng.standard_normal((8192, 8)).astype(np.float32))
    lin = nn.Linear(8, 768)
    gy = rng.standard_normal((8192, 768)).astype(np.float32)
    y = lin(x)
    families.clear()
    y.backward(wgpar.tensor(gy))
    assert [f for f in families if f.startswith("reduce")] == ["reduce_cols", "reduce_cols"], families
    first = lin.bias.grad.numpy()
    assert_close(first, gy.astype(np.float64).sum(0), **sum_tol(gy, 0, False, gy.sum(0)))
    lin.bias.grad = None
    lin(x).backward(wgpar.tensor(gy))
    np.testing.assert_array_equal(lin.bias.grad.numpy(), first)  # no atomics: the same bits every time


def ln_ref(x, w, b, gy, eps=1e-5):
    """LayerNorm over the last axis in float64: xhat, the output, and the input, weight and bias gradients."""
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xh = (x - mean) * rstd
    g = gy * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    return xh, xh * w + b, dx, (gy * xh).sum(0), gy.sum(0)


@pytest.mark.parametrize("rows,cols", [(8193, 769), (1000, 3), (3, 2305), (1000, 768), (37, 4096), (1100, 4100)],
                         ids=str)
def test_layer_norm_gradients(dev, rng, reference, rows, cols):
    """The backward kernel's partial sums at threads-per-row widths 1 to 256 (past 4096 columns a
    workgroup keeps them in memory, not registers, over more rows than it has threads for), float32
    and float16."""
    for dt in dtypes(dev):
        half = dt == "float16"
        if half and (reference is not None or rows * cols > 5_000_000):
            continue
        np_t = np.float16 if half else np.float32
        x = (rng.standard_normal((rows, cols)) * 2 + 0.5).astype(np_t)
        w = rng.standard_normal(cols).astype(np_t)
        b = rng.standard_normal(cols).astype(np_t)
        gy = rng.standard_normal((rows, cols)).astype(np_t)
        m = nn.LayerNorm(cols, dtype=dt)
        with wgpar.no_grad():
            m.weight.copy_(wgpar.tensor(w, dtype=dt))
            m.bias.copy_(wgpar.tensor(b, dtype=dt))
        xt = wgpar.tensor(x, dtype=dt, requires_grad=True)
        y = m(xt)
        y.backward(wgpar.tensor(gy, dtype=dt))
        f64 = [a.astype(np.float64) for a in (x, w, b, gy)]
        xh = ln_ref(*f64)[0]
        if reference is None:
            want_y, want_dx, want_w, want_b = ln_ref(*f64)[1:]
        else:
            tx, tw, tb = (reference.tensor(a, requires_grad=True) for a in f64[:3])
            ty = reference.nn.functional.layer_norm(tx, (cols,), tw, tb)
            ty.backward(reference.tensor(f64[3]))
            want_y, want_dx, want_w, want_b = (t.detach().numpy() for t in (ty, tx.grad, tw.grad, tb.grad))
        assert m.weight.grad.dtype is m.weight.dtype and m.bias.grad.dtype is m.bias.dtype
        tol = (lambda want: dict(rtol=2e-2, atol=2e-2 * max(1.0, np.abs(want).max()) ** 0.5)) if half else \
            (lambda want: dict(rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max())))
        assert_close(y.numpy(), want_y, **tol(want_y), what=f"y {dt}")
        # x - mean loses digits where a row's values nearly agree (with 3 columns, now and then), and
        # rstd scales that rounding twice into dx: allow eps times both per row
        rstd = 1.0 / np.sqrt(f64[0].var(-1, keepdims=True) + 1e-5)
        row_tol = 8 * 2 ** -24 * np.abs(f64[0]).max(-1, keepdims=True) * rstd ** 2 * \
            np.abs(f64[3] * f64[1]).max(-1, keepdims=True)
        dx_tol = tol(want_dx)
        assert_close(xt.grad.numpy(), want_dx, dx_tol["rtol"], dx_tol["atol"] + (0 if half else row_tol), f"dx {dt}")
        # the column sums: float32 accumulation over `rows` terms
        for got, want, terms in ((m.weight.grad, want_w, f64[3] * xh), (m.bias.grad, want_b, f64[3])):
            assert_close(got.numpy(), want, **sum_tol(terms, 0, half, want), what=f"weight/bias grad {dt}")


def test_layer_norm_backward_takes_three_dispatches(dev, rng, families):
    """The backward kernel leaves per-workgroup partial sums of dy * xhat and dy, and one reduction
    each finishes them into buffers of their own: no dy * xhat tensor, no multi-pass reductions, no
    copy into .grad."""
    x = wgpar.tensor(rng.standard_normal((8192, 768)).astype(np.float32), requires_grad=True)
    gy = wgpar.tensor(rng.standard_normal((8192, 768)).astype(np.float32))
    m = nn.LayerNorm(768)
    y = m(x)
    families.clear()
    y.backward(gy)
    assert families == ["layer_norm_bwd", "reduce_cols", "reduce_cols"], families
    assert m.weight.grad.shape == (768,) and m.bias.grad.shape == (768,)
    x = wgpar.tensor(rng.standard_normal((8192, 768)).astype(np.float32), requires_grad=True)
    y = nn.LayerNorm(768, elementwise_affine=False)(x)
    families.clear()
    y.backward(gy)
    assert families == ["layer_norm_bwd"], families


def test_axis_longer_than_a_thread_may_loop(dev, rng, families):
    """70001 rows: more than MAX_LOOP, so slices are forced (argmax, which cannot split, is transposed)."""
    a = rng.uniform(-1, 1, size=(70001, 5)).astype(np.float32)
    x = wgpar.tensor(a)
    for op in ("sum", "mean"):
        want = getattr(a.astype(np.float64), op)(0)
        families.clear()
        assert_close(getattr(x, op)(0).numpy(), want, **sum_tol(a / (1 if op == "sum" else 70001), 0, False, want))
        assert families == ["reduce_cols", "reduce_cols"], families
    np.testing.assert_array_equal(x.amax(0).numpy(), a.max(0))
    np.testing.assert_array_equal(x.argmax(0).numpy(), a.argmax(0))
