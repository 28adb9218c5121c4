"""Comparison helpers shared by the test files."""

from __future__ import annotations

import numpy as np


def assert_close(got, want, rtol=1e-5, atol=1e-6, what=""):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


SIZES = (1, 3, 7, 33, 129, 1000)
