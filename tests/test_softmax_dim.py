"""Softmax without a dim: torch's implicit rule (``_get_softmax_dim``: dim 0 for 0-, 1- and 3-d input, else
dim 1) with its deprecation warning, for nn.Softmax / nn.LogSoftmax and nn.functional.softmax /
log_softmax; an explicit dim warns about nothing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

SHAPES = [(), (5,), (3, 5), (2, 3, 5), (2, 3, 4, 5)]


def _np_softmax(x, dim, log):
    x = x.astype(np.float64)
    z = x - x.max(dim, keepdims=True)
    lse = np.log(np.exp(z).sum(dim, keepdims=True))
    return z - lse if log else np.exp(z - lse)


def _implicit_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("form", ["Softmax", "LogSoftmax", "softmax", "log_softmax"])
def test_no_dim_follows_torch_rule_with_warning(form, shape, rng):
    a = rng.standard_normal(shape).astype(np.float32)
    fn = getattr(nn, form)() if form[0].isupper() else getattr(F, form)
    with pytest.warns(UserWarning, match="Implicit dimension choice for (log_)?softmax"):
        y = fn(wgpar.tensor(a))
    want = _np_softmax(a, _implicit_dim(len(shape)) if shape else None, "og" in form)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["Softmax", "LogSoftmax", "softmax", "log_softmax"])
def test_explicit_dim_does_not_warn(form, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    fn = getattr(nn, form)(dim=-1) if form[0].isupper() else (lambda x: getattr(F, form)(x, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = fn(wgpar.tensor(a))
    np.testing.assert_allclose(y.numpy(), _np_softmax(a, -1, "og" in form), rtol=1e-5, atol=1e-6)


def test_module_repr_and_torch_agree(torch, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for name in ("Softmax", "LogSoftmax"):
        assert repr(getattr(nn, name)()) == repr(getattr(torch.nn, name)())
        assert repr(getattr(nn, name)(1)) == repr(getattr(torch.nn, name)(1))
        with pytest.warns(UserWarning):
            want = getattr(torch.nn, name)()(torch.tensor(a)).numpy()
        with pytest.warns(UserWarning):
            got = getattr(nn, name)()(wgpar.tensor(a)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
