"""Short rows share a workgroup in the row reduction: fewer lanes a row, several rows a workgroup.

Row counts that leave a workgroup's last rows past the end, lengths around each lane count (4 to 256
lanes), scalar and vec4 loads, every operation (ties in argmax / argmin go to the first index, a NaN
wins max), against NumPy float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


@pytest.fixture
def lanes(dev, monkeypatch):
    """The lane count (override constant L) of every row reduction dispatched on the default device."""
    seen: list[int] = []
    real = dev.dispatch

    def record(kspec, *args, **kwargs):
        if kspec.family == "reduce":
            seen.append(int(dict(kspec.constants)["L"]))
        return real(kspec, *args, **kwargs)

    monkeypatch.setattr(dev, "dispatch", record)
    return seen


def _values(r) -> np.ndarray:
    """A reduction's values (max / min along an axis may return (values, indices), as torch's)."""
    return (r[0] if isinstance(r, tuple) else r).numpy()


# (rows, columns, lanes a row): about 4 loads a lane (vec4 loads where the columns are a multiple of 4)
@pytest.mark.parametrize("rows,cols,want_lanes", [(1001, 1, 4), (333, 3, 4), (517, 17, 8), (259, 49, 16), (130, 64, 4),
                                                  (67, 130, 64), (9, 515, 256), (3, 1000, 64)])
def test_sum_mean_max_min_of_short_rows(rng, lanes, rows, cols, want_lanes):
    a = rng.uniform(-3, 3, size=(rows, cols)).astype(np.float32)
    x = wgpar.tensor(a)
    for op, want in (("sum", a.astype(np.float64).sum(1)), ("mean", a.astype(np.float64).mean(1)),
                     ("max", a.max(1)), ("min", a.min(1))):
        assert_close(_values(getattr(x, op)(1)), want,
                     rtol=1e-5, atol=1e-5 * max(1, cols) ** 0.5, what=f"{op} {rows}x{cols}")
    assert lanes and set(lanes) == {want_lanes}


@pytest.mark.parametrize("rows,cols", [(301, 7), (129, 40), (66, 97)])
def test_argmax_argmin_ties_and_nan(rng, rows, cols):
    a = rng.integers(-3, 4, size=(rows, cols)).astype(np.float32)  # many ties in each row
    x = wgpar.tensor(a)
    np.testing.assert_array_equal(x.argmax(1).numpy(), a.argmax(1))
    np.testing.assert_array_equal(x.argmin(1).numpy(), a.argmin(1))
    a[::5, cols // 2] = np.nan  # a NaN wins max, as in PyTorch
    want = np.where(np.isnan(a).any(1), np.nan, np.nanmax(a, 1))
    np.testing.assert_array_equal(_values(wgpar.tensor(a).max(1)), want.astype(np.float32))


def test_integer_sums_of_short_rows(rng):
    a = rng.integers(-1000, 1000, size=(777, 13)).astype(np.int32)
    np.testing.assert_array_equal(wgpar.tensor(a).sum(1).numpy(), a.sum(1))


def test_global_average_pool_of_small_planes(rng):
    """AdaptiveAvgPool2d(1) over planes of 7x7: each plane's mean (the row reduction, several planes a
    workgroup)."""
    a = rng.standard_normal((5, 37, 7, 7)).astype(np.float32)
    got = wgpar.nn.AdaptiveAvgPool2d(1)(wgpar.tensor(a)).numpy()
    assert got.shape == (5, 37, 1, 1)
    assert_close(got, a.astype(np.float64).mean((2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
