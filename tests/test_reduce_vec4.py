"""Row reductions and softmax with vec4 loads, and split column reductions, against NumPy float64.

Rows whose length and offset are multiples of 4 take the vec4 kernels; others the scalar ones; long
rows are split into chunks (rounded to whole vec4s); column reductions with few outputs split the
reduced axis. Sizes straddle each choice.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


@pytest.fixture
def chosen(dev, monkeypatch):
    """Records (family, uses vec4) of every dispatch on the default device."""
    seen: list[tuple[str, bool]] = []
    real = dev.dispatch

    def record(kspec, *args, **kwargs):
        seen.append((kspec.family, kspec.buffers[1][2].startswith("vec4")))  # x, the input
        return real(kspec, *args, **kwargs)

    monkeypatch.setattr(dev, "dispatch", record)
    return seen


def r64(a):
    return np.asarray(a, dtype=np.float64)


@pytest.mark.parametrize("rows,cols", [(1, 4), (3, 5), (8, 12), (65, 1024), (2, 4097), (1, 20000), (3, 16384),
                                       (1, 1 << 20), (5, 1030)])
def test_row_reductions(dev, rng, chosen, rows, cols):
    a = rng.uniform(-2, 2, size=(rows, cols)).astype(np.float32)
    x = wgpar.tensor(a)
    for name, want in [("sum", r64(a).sum(1)), ("mean", r64(a).mean(1)), ("max", a.max(1)), ("min", a.min(1)),
                       ("argmax", a.argmax(1)), ("argmin", a.argmin(1))]:
        chosen.clear()
        got = getattr(x, name)(1).numpy()
        tol = 1e-5 * max(1.0, np.sqrt(cols) / 8)
        assert_close(got, want, rtol=tol, atol=tol, what=f"{name} {rows}x{cols}")
        first = [v for f, v in chosen if f == "reduce"][0]
        assert first == (cols % 4 == 0), (name, chosen)
    chosen.clear()
    assert_close(x.sum().numpy(), r64(a).sum(), rtol=1e-5, atol=1e-4 * np.sqrt(a.size), what="full sum")
    assert_close(x.mean().numpy(), r64(a).mean(), rtol=1e-5, atol=1e-5, what="full mean")


def test_row_reductions_of_offset_rows_and_ties(dev, rng, chosen):
    a = rng.integers(-3, 3, size=(9, 64)).astype(np.float32)  # many ties: the first index must win
    x = wgpar.tensor(a)
    for lo in (1, 2, 4):
        part = x[lo:]
        chosen.clear()
        assert_close(part.sum(1).numpy(), r64(a[lo:]).sum(1))
        np.testing.assert_array_equal(part.argmax(1).numpy(), a[lo:].argmax(1))
        np.testing.assert_array_equal(part.argmin(1).numpy(), a[lo:].argmin(1))
        assert all(v for f, v in chosen if f == "reduce")  # rows of 64: offsets 64 * lo stay aligned
    flat = wgpar.tensor(a.reshape(-1))
    for lo in (1, 3, 4):
        chosen.clear()
        assert_close(flat[lo:lo + 400].sum().numpy(), r64(a.reshape(-1)[lo:lo + 400]).sum())
        assert [v for f, v in chosen if f == "reduce"][0] == (lo % 4 == 0)
    if dev.has_f16:
        h = wgpar.tensor(a, dtype="float16")
        assert_close(h.sum(1).numpy(), r64(a).sum(1), rtol=1e-3, atol=1e-2)
        np.testing.assert_array_equal(h.argmax(1).numpy(), a.argmax(1))


@pytest.mark.parametrize("shape", [(4, 8), (3, 7), (33, 1024), (2, 4096), (130, 36), (1, 4), (6, 5, 12)])
def test_softmax_vec4_and_scalar(dev, rng, chosen, shape):
    a = rng.uniform(-6, 6, size=shape).astype(np.float32)
    z = r64(a) - r64(a).max(-1, keepdims=True)
    e = np.exp(z)
    x = wgpar.tensor(a)
    chosen.clear()
    assert_close(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert [v for f, v in chosen if f == "softmax"] == [shape[-1] % 4 == 0]
    assert_close(x.log_softmax(-1).numpy(), z - np.log(e.sum(-1, keepdims=True)), rtol=1e-5, atol=1e-5)


def test_softmax_with_infinities_and_offsets(dev, rng, chosen):
    a = rng.uniform(-3, 3, size=(6, 1028)).astype(np.float32)
    a[0, :700] = -np.inf  # the threads that see only -inf must not poison the row
    a[1, ::3] = -np.inf
    a[2, 1027] = 80.0  # one huge logit: every other probability underflows
    x = wgpar.tensor(a)
    z = r64(a) - r64(a).max(-1, keepdims=True)
    e = np.exp(z)
    assert_close(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    lsm = x.log_softmax(-1).numpy()
    finite = np.isfinite(a)
    assert_close(lsm[finite], (z - np.log(e.sum(-1, keepdims=True)))[finite], rtol=1e-5, atol=1e-5)
    assert np.all(lsm[~finite] == -np.inf)
    flat = wgpar.tensor(rng.uniform(-3, 3, size=(4 * 256 + 2,)).astype(np.float32))
    for lo in (1, 2):  # offset rows: the scalar kernel
        v = flat[lo:lo + 4 * 256].reshape(4, 256)
        want = v.numpy().astype(np.float64)
        want = np.exp(want - want.max(-1, keepdims=True))
        chosen.clear()
        assert_close(v.softmax(-1).numpy(), want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
        assert [c for f, c in chosen if f == "softmax"] == [False]


@pytest.mark.parametrize("shape,axis", [((4096, 8), 0), ((1000, 3), 0), ((2, 512, 6), 1), ((96, 5), 0),
                                        ((64, 33), 0), ((7, 3), 0)])
def test_split_column_reductions(dev, rng, shape, axis):
    a = rng.uniform(-2, 2, size=shape).astype(np.float32)
    x = wgpar.tensor(a)
    # float32 sums of thousands of terms that cancel: the error scales with the terms, not the sum
    scale = float(np.abs(r64(a)).sum(axis).max())
    for name, want in [("sum", r64(a).sum(axis)), ("mean", r64(a).mean(axis)), ("max", a.max(axis)),
                       ("min", a.min(axis)), ("argmax", a.argmax(axis))]:
        atol = 1e-5 + (2e-7 * scale if name == "sum" else 2e-7 * scale / a.shape[axis] if name == "mean" else 0)
        assert_close(getattr(x, name)(axis).numpy(), want, rtol=1e-5, atol=atol, what=f"{name} {shape} {axis}")
    ints = rng.integers(-50, 50, size=shape)
    np.testing.assert_array_equal(wgpar.tensor(ints).sum(axis).numpy(), ints.sum(axis))
    b = wgpar.tensor(a > 0)
    np.testing.assert_array_equal(b.sum(axis).numpy(), (a > 0).sum(axis))
