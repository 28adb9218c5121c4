"""Everyday Tensor pieces against NumPy in float64 (and torch on CPU where installed), forward and
gradient, on awkward sizes: sort, argsort, topk, var, std, repeat, masked_fill, t, bmm, einsum, linspace, eye.

Each comparison has a float64 twin (gradients analytic, or central differences for einsum); the torch ones
take the ``torch`` fixture."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from . import gradcheck
from .helpers import assert_close


def np_sort(a: np.ndarray, dim: int, descending: bool):
    """A stable sort, NaN above everything (torch's order): (values, indices)."""
    m = np.moveaxis(np.asarray(a), dim, -1)
    v = m.astype(np.float64) if m.dtype.kind == "f" else m.astype(np.int64)  # -(-2**31) fits in int64
    nan = np.isnan(v) if v.dtype.kind == "f" else np.zeros(v.shape, bool)
    v = np.where(nan, 0, v)
    idx = np.lexsort((-v, ~nan)) if descending else np.lexsort((v, nan))  # last key is the primary one
    vals = np.take_along_axis(m, idx, -1)
    return np.moveaxis(vals, -1, dim), np.moveaxis(idx, -1, dim)


def np_scatter_grad(shape, indices, w, dim):
    """The gradient of sum(w * take_along_axis(x, indices, dim)): w put back where each value came from."""
    g = np.zeros(shape, np.float64)
    np.put_along_axis(g, indices.astype(np.int64), w, dim)
    return g


def np_var(a, dim=None, correction=1, keepdim=False):
    """torch's var: sum of squared deviations / max(0, N - correction) (0 / 0: NaN)."""
    a = np.asarray(a, np.float64)
    axis = tuple(range(a.ndim)) if dim is None else dim
    n = a.size if dim is None else int(np.prod([a.shape[d] for d in np.atleast_1d(dim)]))
    ss = ((a - a.mean(axis, keepdims=True)) ** 2).sum(axis, keepdims=keepdim)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ss / max(0, n - correction)


def np_var_grad(a, w, dim, correction, keepdim, std):
    """d sum(w * var) / da = w * 2 (a - mean) / (N - correction); for std also divided by 2 std (0 where
    std is 0, as torch's std_backward masks it)."""
    a = np.asarray(a, np.float64)
    axis = tuple(range(a.ndim)) if dim is None else dim
    n = a.size if dim is None else int(np.prod([a.shape[d] for d in np.atleast_1d(dim)]))
    w = np.asarray(w, np.float64)
    if not keepdim:
        w = np.expand_dims(w, axis) if dim is not None or a.ndim else w
    g = w * 2 * (a - a.mean(axis, keepdims=True)) / (n - correction)
    if not std:
        return g
    sd = np.sqrt(np_var(a, dim, correction, keepdim=True))
    return np.where(sd == 0, 0.0, g / np.where(sd == 0, 1.0, 2 * sd))


def _pair(torch, a: np.ndarray, requires_grad: bool = False):
    return wgpar.tensor(a, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


def _grads_match(torch, x, tx, out, tout, rng, rtol=1e-5, atol=1e-6):
    """Backpropagate the same random weighting of ``out`` and ``tout`` and compare the leaves' gradients."""
    w = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    (out * wgpar.tensor(w)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)


def _weighted_backward(out, rng):
    """Backpropagate a random weighting w of ``out``; returns w (float64)."""
    w = rng.standard_normal(out.shape).astype(np.float32)
    (out * wgpar.tensor(w)).sum().backward()
    return w.astype(np.float64)


# -- sort / argsort / topk ----------------------------------------------------------------------------
SORT_CASES = [((1,), 0), ((7,), 0), ((33, 5), 0), ((5, 129), 1), ((3, 1000), -1), ((4, 7, 6), 1), ((2, 1025), 1),
              ((6, 3), 1)]


@pytest.mark.parametrize("shape,dim", SORT_CASES)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_torch(rng, shape, dim, descending, torch):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(torch, a, requires_grad=True)
    got = x.sort(dim=dim, descending=descending)
    want = tx.sort(dim=dim, descending=descending, stable=True)
    assert type(got).__name__ == "sort" and got.indices.dtype is wgpar.int32
    np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(x.argsort(dim, descending).numpy(), want.indices.numpy())
    np.testing.assert_array_equal(wgpar.sort(x, dim, descending).indices.numpy(), want.indices.numpy())
    _grads_match(torch, x, tx, got.values, want.values, rng, rtol=0, atol=0)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties_nan_and_infinities_like_torch(rng, descending, torch):
    a = rng.integers(-3, 4, size=(9, 37)).astype(np.float32)  # many ties
    a[rng.random(a.shape) < 0.15] = np.nan
    a[0, :3] = [np.inf, -np.inf, np.nan]
    a[1] = np.nan  # a row of NaN only
    x, tx = _pair(torch, a)
    for dim in (0, 1):
        got = x.sort(dim, descending)
        want = tx.sort(dim=dim, descending=descending, stable=True)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


@pytest.mark.parametrize("shape", [(1, 5000), (1001, 3), (3, 512), (2, 513), (130, 9)])
def test_sort_paths_long_rows_and_many_short_ones(rng, shape):
    """Rows longer than a workgroup's block (global steps, then in-block merges) and many short rows
    sharing blocks, a last block left partly empty; with ties and NaN."""
    a = rng.integers(-20, 20, size=shape).astype(np.float32)
    a[rng.random(shape) < 0.05] = np.nan
    x = wgpar.tensor(a)
    for descending in (False, True):
        got, (values, indices) = x.sort(-1, descending), np_sort(a, -1, descending)
        np.testing.assert_array_equal(got.values.numpy(), values)
        np.testing.assert_array_equal(got.indices.numpy(), indices)


def _sort_cases(dev, rng):
    """(array, descending): int32 with its extremes (descending), bool, float16 with a NaN."""
    a = rng.integers(-2**31, 2**31, size=(5, 77), dtype=np.int64).astype(np.int32)
    a[:, :5] = [-2**31, 2**31 - 1, 0, -1, -2**31]
    cases = [(a, True), (rng.random((3, 20)) < 0.5, False)]
    if dev.has_f16:
        h = rng.standard_normal((4, 50)).astype(np.float16)
        h[0, 3] = np.nan
        cases.append((h, False))
    return cases


def test_sort_integer_bool_and_half(dev, rng):
    for a, descending in _sort_cases(dev, rng):
        got, (values, indices) = wgpar.tensor(a).sort(1, descending), np_sort(a, 1, descending)
        assert got.values.numpy().dtype == a.dtype
        np.testing.assert_array_equal(got.values.numpy(), values)
        np.testing.assert_array_equal(got.indices.numpy(), indices)
    assert wgpar.tensor(rng.random(3) < 0.5).sort().values.dtype is wgpar.bool_
    s = wgpar.tensor(2.5).sort()
    assert s.values.item() == 2.5 and s.indices.item() == 0 and s.indices.shape == ()
    e = wgpar.zeros(3, 0).sort(1)
    assert e.values.shape == e.indices.shape == (3, 0)


def test_sort_integer_bool_and_half_like_torch(dev, rng, torch):
    for a, descending in _sort_cases(dev, rng):
        got, want = wgpar.tensor(a).sort(1, descending), torch.tensor(a).sort(dim=1, descending=descending,
                                                                              stable=True)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


TOPK_CASES = [((10,), 0, 3), ((6, 129), 1, 5), ((40, 7), 0, 40), ((5, 33), -1, 0), ((3, 4, 9), 1, 2),
              ((2, 1000), 1, 17)]


@pytest.mark.parametrize("shape,dim,k", TOPK_CASES)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(rng, shape, dim, k, largest, torch):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(torch, a, requires_grad=True)
    got, want = x.topk(k, dim, largest), tx.topk(k, dim=dim, largest=largest)
    assert type(got).__name__ == "topk"
    np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    values, indices = wgpar.topk(x, k, dim=dim, largest=largest)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    if k:
        _grads_match(torch, x, tx, got.values, want.values, rng, rtol=0, atol=0)


def test_topk_with_nan_and_ties():
    """NaN counts as the largest; ties come in index order (what torch's CPU topk gives here)."""
    a = np.array([[3.0, 1.0, 3.0, 1.0, 2.0], [np.nan, 5.0, np.nan, -1.0, 0.0]], np.float32)
    x = wgpar.tensor(a)
    want = {True: ([[3, 3, 2], [np.nan, np.nan, 5]], [[0, 2, 4], [0, 2, 1]]),
            False: ([[1, 1, 2], [-1, 0, 5]], [[1, 3, 4], [3, 4, 1]])}
    for largest in (True, False):
        got = x.topk(3, 1, largest)
        np.testing.assert_array_equal(got.values.numpy(), np.array(want[largest][0], np.float32))
        np.testing.assert_array_equal(got.indices.numpy(), want[largest][1])
    for bad in (6, -1, 2.0):
        with pytest.raises(ValueError, match="topk"):
            x.topk(bad, 1)


# -- var / std ----------------------------------------------------------------------------------------
VAR_SHAPES = [(1,), (7,), (33, 5), (3, 129, 4)]
VAR_KWARGS = ({}, {"correction": 0}, {"correction": 2}, {"unbiased": False}, {"keepdim": True})


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")  # torch's, for N <= correction
@pytest.mark.parametrize("shape", VAR_SHAPES)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std_match_torch(rng, shape, op, torch):
    a = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dims = [None, 0, -1] + ([(0, 2), 1] if len(shape) == 3 else [])
    for dim in dims:
        for kwargs in VAR_KWARGS:
            x, tx = _pair(torch, a, requires_grad=True)
            got = getattr(x, op)(dim, **kwargs)
            want = getattr(tx, op)(dim=dim, **kwargs) if dim is not None else getattr(tx, op)(**kwargs)
            assert got.shape == tuple(want.shape), (dim, kwargs)
            assert_close(got.detach().numpy(), want.detach().numpy(), rtol=2e-5, atol=1e-6)  # NaN where torch's
            if np.isfinite(want.detach().numpy()).all():
                _grads_match(torch, x, tx, got, want, rng, rtol=1e-4, atol=1e-6)
    x, tx = _pair(torch, a)
    assert_close(getattr(wgpar, op)(x, 0).numpy(), getattr(torch, op)(tx, 0).numpy(), rtol=2e-5, atol=1e-6)
    assert_close(getattr(x, op)(False).numpy(), getattr(tx, op)(False).numpy(), rtol=2e-5)  # var(unbiased)


def test_std_of_constant_rows_has_a_zero_gradient_like_torch(rng, torch):
    a = np.repeat(rng.standard_normal((4, 1)).astype(np.float32), 6, axis=1)
    x, tx = _pair(torch, a, requires_grad=True)
    x.std(1).sum().backward()
    tx.std(1).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy())  # 0, not NaN (the mean may round by an ulp)


def test_var_refuses_integers_and_two_corrections():
    with pytest.raises(TypeError, match="float"):
        wgpar.arange(5).var()
    with pytest.raises(TypeError, match="correction"):
        wgpar.ones(5).var(0, True, correction=1)


# -- repeat, masked_fill, t, bmm ------------------------------------------------------------------------
REPEAT_CASES = [((3,), (2,)), ((3,), (4, 2)), ((2, 5), (3, 1)), ((2, 5), (1, 2, 3)), ((4, 1, 3), (2, 7, 1)),
                ((), (3,)), ((2, 3), (0, 2))]


@pytest.mark.parametrize("shape,sizes", REPEAT_CASES)
def test_repeat_matches_torch(rng, shape, sizes, torch):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(torch, a, requires_grad=True)
    got, want = x.repeat(*sizes), tx.repeat(*sizes)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(x.repeat(sizes).numpy(), want.detach().numpy())
    if got.numel():
        _grads_match(torch, x, tx, got, want, rng)
    with pytest.raises(ValueError, match="repeat"):
        wgpar.ones(2, 3).repeat(2)


def test_masked_fill_matches_torch(rng, torch):
    a = rng.standard_normal((7, 33)).astype(np.float32)
    m = rng.random((7, 33)) < 0.3
    x, tx = _pair(torch, a, requires_grad=True)
    got, want = x.masked_fill(wgpar.tensor(m), -1e9), tx.masked_fill(torch.tensor(m), -1e9)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    _grads_match(torch, x, tx, got, want, rng)
    # a broadcast mask (attention's causal mask) and a 0-d tensor value with a gradient
    col = rng.random((1, 33)) < 0.5
    x, tx = _pair(torch, a, requires_grad=True)
    v, tv = _pair(torch, np.float32(2.5), requires_grad=True)
    got, want = wgpar.masked_fill(x, wgpar.tensor(col), v), torch.masked_fill(tx, torch.tensor(col), tv)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    w = rng.standard_normal((7, 33)).astype(np.float32)
    (got * wgpar.tensor(w)).sum().backward()
    (want * torch.tensor(w)).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy())
    assert_close(v.grad.numpy(), tv.grad.numpy(), rtol=1e-5, atol=1e-5)
    # dtype stays the tensor's: an int tensor filled with 2.7 holds 2, as torch
    ia = rng.integers(-5, 5, (4, 6)).astype(np.int32)
    im = rng.random((4, 6)) < 0.5
    got = wgpar.tensor(ia).masked_fill(wgpar.tensor(im), 2.7)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), torch.tensor(ia).masked_fill(torch.tensor(im), 2.7).numpy())
    # in place, outside the graph
    y, ty = _pair(torch, a)
    assert y.masked_fill_(wgpar.tensor(m), 0.0) is y
    np.testing.assert_array_equal(y.numpy(), ty.masked_fill_(torch.tensor(m), 0.0).numpy())
    with pytest.raises(RuntimeError, match="in-place"):
        wgpar.tensor(a, requires_grad=True).masked_fill_(wgpar.tensor(m), 0.0)
    with pytest.raises(TypeError, match="bool"):
        y.masked_fill(wgpar.tensor(m.astype(np.int32)), 0.0)
    with pytest.raises(ValueError, match="broadcast"):
        y.masked_fill(wgpar.tensor(np.ones((2, 7, 33), bool)), 0.0)


def test_t_matches_torch(rng, torch):
    for shape in ((), (5,), (3, 7)):
        a = rng.standard_normal(shape).astype(np.float32)
        x, tx = _pair(torch, a)
        np.testing.assert_array_equal(x.t().numpy(), tx.t().numpy())
        np.testing.assert_array_equal(wgpar.t(x).numpy(), torch.t(tx).numpy())
    with pytest.raises(ValueError, match="t\\(\\)"):
        wgpar.ones(2, 3, 4).t()


def test_bmm_matches_torch(rng, torch):
    a = rng.standard_normal((3, 5, 17)).astype(np.float32)
    b = rng.standard_normal((3, 17, 6)).astype(np.float32)
    (x, tx), (y, ty) = _pair(torch, a, True), _pair(torch, b, True)
    got, want = x.bmm(y), tx.bmm(ty)
    assert_close(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(wgpar.bmm(x, y).numpy(), torch.bmm(tx, ty).detach().numpy(), rtol=1e-5, atol=1e-5)
    _grads_match(torch, x, tx, got, want, rng, rtol=1e-4, atol=1e-5)
    assert_close(y.grad.numpy(), ty.grad.numpy(), rtol=1e-4, atol=1e-5)
    for bad in ((x, y[:2]), (x[0], y[0]), (x, x)):
        with pytest.raises(ValueError, match="bmm"):
            wgpar.bmm(*bad)


# -- einsum ------------------------------------------------------------------------------------------
EINSUM = [
    ("ij,jk->ik", [(5, 7), (7, 3)]),
    ("bij,bjk->bik", [(4, 5, 7), (4, 7, 3)]),
    ("ij,kj->ik", [(5, 7), (6, 7)]),
    ("ji,jk->ik", [(7, 5), (7, 3)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 6, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 6), (2, 3, 6, 8)]),
    ("ij,jk", [(5, 7), (7, 3)]),                    # implicit output
    ("i,i->", [(33,), (33,)]),                       # dot
    ("i,j->ij", [(4,), (5,)]),                       # outer
    ("ij->ji", [(5, 7)]),
    ("ij->", [(5, 7)]),
    ("ij->j", [(5, 7)]),
    ("ii->", [(6, 6)]),                              # trace
    ("ii->i", [(6, 6)]),                             # diagonal
    ("bii->b", [(3, 4, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 5, 7), (7, 4)]),  # broadcast batch
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 6)]),
    ("ij,ij->ij", [(5, 7), (5, 7)]),                 # elementwise product
    ("ij,ik->ijk", [(3, 4), (1, 5)]),                # a size-1 dim broadcasts
    ("bn,nd->bd", [(9, 1), (1, 4)]),
    ("ijk,jil->kl", [(3, 4, 5), (4, 3, 2)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM)
def test_einsum_matches_torch(rng, eq, shapes, torch):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pairs = [_pair(torch, a, True) for a in arrays]
    got = wgpar.einsum(eq, *[p[0] for p in pairs])
    want = torch.einsum(eq, *[p[1] for p in pairs])
    assert got.shape == tuple(want.shape)
    assert_close(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    w = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    (got * wgpar.tensor(w)).sum().backward()
    (want * torch.tensor(w)).sum().backward()
    for x, tx in pairs:
        assert_close(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(wgpar.einsum(eq, [p[0] for p in pairs]).detach().numpy(), want.detach().numpy(), rtol=1e-5,
                 atol=1e-5)  # the operands as one list


@pytest.mark.parametrize("eq,shapes,match", [
    ("ij,jk->ik", [(5, 7), (6, 3)], "size 7"),
    ("ij,jk->il", [(5, 7), (7, 3)], "'l'"),
    ("ij->ii", [(5, 5)], "repeats"),
    ("ijk->i", [(5, 7)], "names 3 dims"),
    ("ij,jk", [(5, 7)], "2 operand subscripts for 1"),
    ("i1->i", [(5, 2)], "letters"),
    ("i.j->i", [(5, 2)], "'...'"),
])
def test_einsum_errors_say_what(eq, shapes, match):
    with pytest.raises(ValueError, match=match):
        wgpar.einsum(eq, *[wgpar.ones(*s) for s in shapes])


# -- linspace, eye ----------------------------------------------------------------------------------------
LINSPACE_CASES = [(0, 1, 5), (-3.5, 7.25, 33), (2, 2, 4), (1, 0, 1), (0, 10, 0), (-1e3, 1e3, 1001)]


@pytest.mark.parametrize("start,end,steps", LINSPACE_CASES)
def test_linspace_matches_torch(start, end, steps, torch):
    got, want = wgpar.linspace(start, end, steps), torch.linspace(start, end, steps)
    assert got.dtype is wgpar.float32 and got.shape == tuple(want.shape)
    assert_close(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6 * max(abs(start), abs(end), 1))
    ints = wgpar.linspace(start, end, steps, dtype=wgpar.int32)
    np.testing.assert_array_equal(ints.numpy(), torch.linspace(start, end, steps, dtype=torch.int32).numpy())
    with pytest.raises(ValueError, match="steps"):
        wgpar.linspace(0, 1, -1)


EYE_CASES = [(1, None), (5, None), (3, 7), (7, 3), (0, 2), (33, 33)]


@pytest.mark.parametrize("n,m", EYE_CASES)
def test_eye_matches_torch(n, m, torch):
    got = wgpar.eye(n, m)
    want = torch.eye(n) if m is None else torch.eye(n, m)
    assert got.dtype is wgpar.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert wgpar.eye(n, m, dtype=wgpar.int32).dtype is wgpar.int32


# -- the same against NumPy in float64 ----------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", SORT_CASES)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_float64(rng, shape, dim, descending):
    a = rng.standard_normal(shape).astype(np.float32)
    x = wgpar.tensor(a, requires_grad=True)
    got, (values, indices) = x.sort(dim=dim, descending=descending), np_sort(a, dim, descending)
    assert type(got).__name__ == "sort" and got.indices.dtype is wgpar.int32
    np.testing.assert_array_equal(got.values.numpy(), values)
    np.testing.assert_array_equal(got.indices.numpy(), indices)
    np.testing.assert_array_equal(x.argsort(dim, descending).numpy(), indices)
    np.testing.assert_array_equal(wgpar.sort(x, dim, descending).indices.numpy(), indices)
    w = _weighted_backward(got.values, rng)
    np.testing.assert_array_equal(x.grad.numpy(), np_scatter_grad(shape, indices, w, dim))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties_nan_and_infinities_float64(rng, descending):
    a = rng.integers(-3, 4, size=(9, 37)).astype(np.float32)  # many ties
    a[rng.random(a.shape) < 0.15] = np.nan
    a[0, :3] = [np.inf, -np.inf, np.nan]
    a[1] = np.nan  # a row of NaN only
    x = wgpar.tensor(a)
    for dim in (0, 1):
        got, (values, indices) = x.sort(dim, descending), np_sort(a, dim, descending)
        np.testing.assert_array_equal(got.values.numpy(), values)
        np.testing.assert_array_equal(got.indices.numpy(), indices)


@pytest.mark.parametrize("shape,dim,k", TOPK_CASES)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_float64(rng, shape, dim, k, largest):
    """The first k of the stable sort (no ties in random floats)."""
    a = rng.standard_normal(shape).astype(np.float32)
    x = wgpar.tensor(a, requires_grad=True)
    values, indices = (np.take(r, range(k), axis=dim) for r in np_sort(a, dim, largest))
    got = x.topk(k, dim, largest)
    assert type(got).__name__ == "topk" and got.values.shape == values.shape
    np.testing.assert_array_equal(got.values.numpy(), values)
    np.testing.assert_array_equal(got.indices.numpy(), indices)
    np.testing.assert_array_equal(wgpar.topk(x, k, dim=dim, largest=largest)[1].numpy(), indices)
    if k:
        w = _weighted_backward(got.values, rng)
        np.testing.assert_array_equal(x.grad.numpy(), np_scatter_grad(shape, indices, w, dim))


@pytest.mark.parametrize("shape", VAR_SHAPES)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std_float64(rng, shape, op):
    a = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dims = [None, 0, -1] + ([(0, 2), 1] if len(shape) == 3 else [])
    for dim in dims:
        for kwargs in VAR_KWARGS:
            correction = kwargs.get("correction", 0 if kwargs.get("unbiased") is False else 1)
            keepdim = kwargs.get("keepdim", False)
            want = np_var(a, dim, correction, keepdim)
            want = np.sqrt(want) if op == "std" else want
            x = wgpar.tensor(a, requires_grad=True)
            got = getattr(x, op)(dim, **kwargs)
            assert got.shape == want.shape, (dim, kwargs)
            assert_close(got.detach().numpy(), want, rtol=2e-5, atol=1e-6, what=f"{dim} {kwargs}")  # NaN: N <= c
            if np.isfinite(want).all():
                w = _weighted_backward(got, rng)
                assert_close(x.grad.numpy(), np_var_grad(a, w, dim, correction, keepdim, op == "std"), rtol=1e-4,
                             atol=1e-6, what=f"grad {dim} {kwargs}")
    x = wgpar.tensor(a)
    want0 = np_var(a, 0)
    assert_close(getattr(wgpar, op)(x, 0).numpy(), np.sqrt(want0) if op == "std" else want0, rtol=2e-5, atol=1e-6)
    want_all = np_var(a, None, 0)  # var(False): the positional argument is unbiased
    assert_close(getattr(x, op)(False).numpy(), np.sqrt(want_all) if op == "std" else want_all, rtol=2e-5)


def test_std_of_constant_rows_has_a_zero_gradient(rng):
    a = np.repeat(rng.standard_normal((4, 1)).astype(np.float32), 6, axis=1)
    x = wgpar.tensor(a, requires_grad=True)
    x.std(1).sum().backward()
    # 0, not NaN: std of the float32 deviations (an ulp off where the mean rounds) masks its 0 / 0
    assert_close(x.grad.numpy(), np.zeros((4, 6)), atol=1e-6)


@pytest.mark.parametrize("shape,sizes", REPEAT_CASES)
def test_repeat_float64(rng, shape, sizes):
    """np.tile; the gradient sums the upstream over the copies."""
    a = rng.standard_normal(shape).astype(np.float32)
    x = wgpar.tensor(a, requires_grad=True)
    got, want = x.repeat(*sizes), np.tile(a, sizes)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(x.repeat(sizes).numpy(), want)
    if got.numel():
        w = _weighted_backward(got, rng)
        padded = (1,) * (len(sizes) - len(shape)) + shape
        split = w.reshape([n for pair in zip(sizes, padded) for n in pair])  # copy index, then element index
        assert_close(x.grad.numpy(), split.sum(axis=tuple(range(0, 2 * len(sizes), 2))).reshape(shape))


def test_masked_fill_float64(rng):
    a = rng.standard_normal((7, 33)).astype(np.float32)
    m = rng.random((7, 33)) < 0.3
    x = wgpar.tensor(a, requires_grad=True)
    got = x.masked_fill(wgpar.tensor(m), -1e9)
    np.testing.assert_array_equal(got.numpy(), np.where(m, np.float32(-1e9), a))
    w = _weighted_backward(got, rng)
    assert_close(x.grad.numpy(), np.where(m, 0.0, w))
    # a broadcast mask (attention's causal mask) and a 0-d tensor value with a gradient
    col = rng.random((1, 33)) < 0.5
    x, v = wgpar.tensor(a, requires_grad=True), wgpar.tensor(np.float32(2.5), requires_grad=True)
    got = wgpar.masked_fill(x, wgpar.tensor(col), v)
    np.testing.assert_array_equal(got.numpy(), np.where(col, np.float32(2.5), a))
    w = _weighted_backward(got, rng)
    assert_close(x.grad.numpy(), np.where(col, 0.0, w))
    assert_close(v.grad.numpy(), np.where(col, w, 0.0).sum(), rtol=1e-5, atol=1e-5)
    # dtype stays the tensor's: an int tensor filled with 2.7 holds 2 (truncated, as torch)
    ia = rng.integers(-5, 5, (4, 6)).astype(np.int32)
    im = rng.random((4, 6)) < 0.5
    got = wgpar.tensor(ia).masked_fill(wgpar.tensor(im), 2.7)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.where(im, 2, ia))
    y = wgpar.tensor(a)
    assert y.masked_fill_(wgpar.tensor(m), 0.0) is y
    np.testing.assert_array_equal(y.numpy(), np.where(m, 0.0, a))


def test_t_float64(rng):
    for shape in ((), (5,), (3, 7)):
        a = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(wgpar.tensor(a).t().numpy(), a.T)
        np.testing.assert_array_equal(wgpar.t(wgpar.tensor(a)).numpy(), a.T)


def test_bmm_float64(rng):
    a = rng.standard_normal((3, 5, 17)).astype(np.float32)
    b = rng.standard_normal((3, 17, 6)).astype(np.float32)
    x, y = wgpar.tensor(a, requires_grad=True), wgpar.tensor(b, requires_grad=True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    got = x.bmm(y)
    assert_close(got.detach().numpy(), a64 @ b64, rtol=1e-5, atol=1e-5)
    assert_close(wgpar.bmm(x, y).detach().numpy(), a64 @ b64, rtol=1e-5, atol=1e-5)
    w = _weighted_backward(got, rng)
    assert_close(x.grad.numpy(), w @ b64.transpose(0, 2, 1), rtol=1e-4, atol=1e-5)
    assert_close(y.grad.numpy(), a64.transpose(0, 2, 1) @ w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", EINSUM)
def test_einsum_float64(rng, eq, shapes):
    """np.einsum; gradients by central differences (exact up to rounding: einsum is linear in each operand)."""
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    xs = [wgpar.tensor(a, requires_grad=True) for a in arrays]
    got = wgpar.einsum(eq, *xs)
    want = np.einsum(eq, *[a.astype(np.float64) for a in arrays])
    assert got.shape == want.shape
    assert_close(got.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    assert_close(wgpar.einsum(eq, xs).detach().numpy(), want, rtol=1e-5, atol=1e-5)  # the operands as one list
    w = _weighted_backward(got, rng)
    grads = gradcheck.numeric_grad(lambda *ops: np.einsum(eq, *ops), [a.astype(np.float64) for a in arrays], w)
    for k, (x, g) in enumerate(zip(xs, grads)):
        assert_close(x.grad.numpy(), g, rtol=1e-4, atol=1e-5, what=f"grad of operand {k}")


@pytest.mark.parametrize("start,end,steps", LINSPACE_CASES)
def test_linspace_float64(start, end, steps):
    got = wgpar.linspace(start, end, steps)
    assert got.dtype is wgpar.float32
    assert_close(got.numpy(), np.linspace(start, end, steps), rtol=1e-6, atol=1e-6 * max(abs(start), abs(end), 1))
    # Integer linspace as torch's: the ends truncated to integers first, each step truncated.
    want = np.trunc(np.linspace(int(start), int(end), steps)).astype(np.int32)
    np.testing.assert_array_equal(wgpar.linspace(start, end, steps, dtype=wgpar.int32).numpy(), want)


@pytest.mark.parametrize("n,m", EYE_CASES)
def test_eye_float64(n, m):
    got = wgpar.eye(n, m)
    assert got.dtype is wgpar.float32
    np.testing.assert_array_equal(got.numpy(), np.eye(n, m))
    assert wgpar.eye(n, m, dtype=wgpar.int32).dtype is wgpar.int32
