"""Everyday Tensor pieces against torch (CPU), forward and gradient, on awkward sizes: sort, argsort,
topk, var, std, repeat, masked_fill, t, bmm, einsum, linspace, eye."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close

torch = pytest.importorskip("torch")


def _pair(a: np.ndarray, requires_grad: bool = False):
    return wgpar.tensor(a, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


def _grads_match(x, tx, out, tout, rng, rtol=1e-5, atol=1e-6):
    """Backpropagate the same random weighting of ``out`` and ``tout`` and compare the leaves' gradients."""
    w = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    (out * wgpar.tensor(w)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)


# -- sort / argsort / topk ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", [((1,), 0), ((7,), 0), ((33, 5), 0), ((5, 129), 1), ((3, 1000), -1),
                                       ((4, 7, 6), 1), ((2, 1025), 1), ((6, 3), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_torch(rng, shape, dim, descending):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(a, requires_grad=True)
    got = x.sort(dim=dim, descending=descending)
    want = tx.sort(dim=dim, descending=descending, stable=True)
    assert type(got).__name__ == "sort" and got.indices.dtype is wgpar.int32
    np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(x.argsort(dim, descending).numpy(), want.indices.numpy())
    np.testing.assert_array_equal(wgpar.sort(x, dim, descending).indices.numpy(), want.indices.numpy())
    _grads_match(x, tx, got.values, want.values, rng, rtol=0, atol=0)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties_nan_and_infinities_like_torch(rng, descending):
    a = rng.integers(-3, 4, size=(9, 37)).astype(np.float32)  # many ties
    a[rng.random(a.shape) < 0.15] = np.nan
    a[0, :3] = [np.inf, -np.inf, np.nan]
    a[1] = np.nan  # a row of NaN only
    x, tx = _pair(a)
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
    x, tx = _pair(a)
    for descending in (False, True):
        got, want = x.sort(-1, descending), tx.sort(dim=-1, descending=descending, stable=True)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


def test_sort_integer_bool_and_half(dev, rng):
    a = rng.integers(-2**31, 2**31, size=(5, 77), dtype=np.int64).astype(np.int32)
    a[:, :5] = [-2**31, 2**31 - 1, 0, -1, -2**31]
    got, want = wgpar.tensor(a).sort(1, True), torch.tensor(a).sort(dim=1, descending=True, stable=True)
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    b = rng.random((3, 20)) < 0.5
    got, want = wgpar.tensor(b).sort(1), torch.tensor(b).sort(dim=1, stable=True)
    assert got.values.dtype is wgpar.bool_
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    if dev.has_f16:
        h = rng.standard_normal((4, 50)).astype(np.float16)
        h[0, 3] = np.nan
        got, want = wgpar.tensor(h).sort(1), torch.tensor(h).sort(dim=1, stable=True)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    s = wgpar.tensor(2.5).sort()
    assert s.values.item() == 2.5 and s.indices.item() == 0 and s.indices.shape == ()
    e = wgpar.zeros(3, 0).sort(1)
    assert e.values.shape == e.indices.shape == (3, 0)


@pytest.mark.parametrize("shape,dim,k", [((10,), 0, 3), ((6, 129), 1, 5), ((40, 7), 0, 40), ((5, 33), -1, 0),
                                         ((3, 4, 9), 1, 2), ((2, 1000), 1, 17)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(rng, shape, dim, k, largest):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(a, requires_grad=True)
    got, want = x.topk(k, dim, largest), tx.topk(k, dim=dim, largest=largest)
    assert type(got).__name__ == "topk"
    np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    values, indices = wgpar.topk(x, k, dim=dim, largest=largest)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    if k:
        _grads_match(x, tx, got.values, want.values, rng, rtol=0, atol=0)


def test_topk_with_nan_and_ties():
    a = np.array([[3.0, 1.0, 3.0, 1.0, 2.0], [np.nan, 5.0, np.nan, -1.0, 0.0]], np.float32)
    x, tx = _pair(a)
    for largest in (True, False):
        got, want = x.topk(3, 1, largest), tx.topk(3, dim=1, largest=largest)
        np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    for bad in (6, -1, 2.0):
        with pytest.raises(ValueError, match="topk"):
            x.topk(bad, 1)


# -- var / std ----------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*degrees of freedom")  # torch's, for N <= correction
@pytest.mark.parametrize("shape", [(1,), (7,), (33, 5), (3, 129, 4)])
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std_match_torch(rng, shape, op):
    a = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    dims = [None, 0, -1] + ([(0, 2), 1] if len(shape) == 3 else [])
    for dim in dims:
        for kwargs in ({}, {"correction": 0}, {"correction": 2}, {"unbiased": False}, {"keepdim": True}):
            x, tx = _pair(a, requires_grad=True)
            got = getattr(x, op)(dim, **kwargs)
            want = getattr(tx, op)(dim=dim, **kwargs) if dim is not None else getattr(tx, op)(**kwargs)
            assert got.shape == tuple(want.shape), (dim, kwargs)
            assert_close(got.detach().numpy(), want.detach().numpy(), rtol=2e-5, atol=1e-6)  # NaN where torch's
            if np.isfinite(want.detach().numpy()).all():
                _grads_match(x, tx, got, want, rng, rtol=1e-4, atol=1e-6)
    x, tx = _pair(a)
    assert_close(getattr(wgpar, op)(x, 0).numpy(), getattr(torch, op)(tx, 0).numpy(), rtol=2e-5, atol=1e-6)
    assert_close(getattr(x, op)(False).numpy(), getattr(tx, op)(False).numpy(), rtol=2e-5)  # var(unbiased)


def test_std_of_constant_rows_has_a_zero_gradient_like_torch(rng):
    a = np.repeat(rng.standard_normal((4, 1)).astype(np.float32), 6, axis=1)
    x, tx = _pair(a, requires_grad=True)
    x.std(1).sum().backward()
    tx.std(1).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy())  # 0, not NaN (the mean may round by an ulp)


def test_var_refuses_integers_and_two_corrections():
    with pytest.raises(TypeError, match="float"):
        wgpar.arange(5).var()
    with pytest.raises(TypeError, match="correction"):
        wgpar.ones(5).var(0, True, correction=1)


# -- repeat, masked_fill, t, bmm ------------------------------------------------------------------------
@pytest.mark.parametrize("shape,sizes", [((3,), (2,)), ((3,), (4, 2)), ((2, 5), (3, 1)), ((2, 5), (1, 2, 3)),
                                         ((4, 1, 3), (2, 7, 1)), ((), (3,)), ((2, 3), (0, 2))])
def test_repeat_matches_torch(rng, shape, sizes):
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = _pair(a, requires_grad=True)
    got, want = x.repeat(*sizes), tx.repeat(*sizes)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(x.repeat(sizes).numpy(), want.detach().numpy())
    if got.numel():
        _grads_match(x, tx, got, want, rng)
    with pytest.raises(ValueError, match="repeat"):
        wgpar.ones(2, 3).repeat(2)


def test_masked_fill_matches_torch(rng):
    a = rng.standard_normal((7, 33)).astype(np.float32)
    m = rng.random((7, 33)) < 0.3
    x, tx = _pair(a, requires_grad=True)
    got, want = x.masked_fill(wgpar.tensor(m), -1e9), tx.masked_fill(torch.tensor(m), -1e9)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    _grads_match(x, tx, got, want, rng)
    # a broadcast mask (attention's causal mask) and a 0-d tensor value with a gradient
    col = rng.random((1, 33)) < 0.5
    x, tx = _pair(a, requires_grad=True)
    v, tv = _pair(np.float32(2.5), requires_grad=True)
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
    y, ty = _pair(a)
    assert y.masked_fill_(wgpar.tensor(m), 0.0) is y
    np.testing.assert_array_equal(y.numpy(), ty.masked_fill_(torch.tensor(m), 0.0).numpy())
    with pytest.raises(RuntimeError, match="in-place"):
        wgpar.tensor(a, requires_grad=True).masked_fill_(wgpar.tensor(m), 0.0)
    with pytest.raises(TypeError, match="bool"):
        y.masked_fill(wgpar.tensor(m.astype(np.int32)), 0.0)
    with pytest.raises(ValueError, match="broadcast"):
        y.masked_fill(wgpar.tensor(np.ones((2, 7, 33), bool)), 0.0)


def test_t_matches_torch(rng):
    for shape in ((), (5,), (3, 7)):
        a = rng.standard_normal(shape).astype(np.float32)
        x, tx = _pair(a)
        np.testing.assert_array_equal(x.t().numpy(), tx.t().numpy())
        np.testing.assert_array_equal(wgpar.t(x).numpy(), torch.t(tx).numpy())
    with pytest.raises(ValueError, match="t\\(\\)"):
        wgpar.ones(2, 3, 4).t()


def test_bmm_matches_torch(rng):
    a = rng.standard_normal((3, 5, 17)).astype(np.float32)
    b = rng.standard_normal((3, 17, 6)).astype(np.float32)
    (x, tx), (y, ty) = _pair(a, True), _pair(b, True)
    got, want = x.bmm(y), tx.bmm(ty)
    assert_close(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(wgpar.bmm(x, y).numpy(), torch.bmm(tx, ty).detach().numpy(), rtol=1e-5, atol=1e-5)
    _grads_match(x, tx, got, want, rng, rtol=1e-4, atol=1e-5)
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
def test_einsum_matches_torch(rng, eq, shapes):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pairs = [_pair(a, True) for a in arrays]
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
@pytest.mark.parametrize("start,end,steps", [(0, 1, 5), (-3.5, 7.25, 33), (2, 2, 4), (1, 0, 1), (0, 10, 0),
                                             (-1e3, 1e3, 1001)])
def test_linspace_matches_torch(start, end, steps):
    got, want = wgpar.linspace(start, end, steps), torch.linspace(start, end, steps)
    assert got.dtype is wgpar.float32 and got.shape == tuple(want.shape)
    assert_close(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6 * max(abs(start), abs(end), 1))
    ints = wgpar.linspace(start, end, steps, dtype=wgpar.int32)
    np.testing.assert_array_equal(ints.numpy(), torch.linspace(start, end, steps, dtype=torch.int32).numpy())
    with pytest.raises(ValueError, match="steps"):
        wgpar.linspace(0, 1, -1)


@pytest.mark.parametrize("n,m", [(1, None), (5, None), (3, 7), (7, 3), (0, 2), (33, 33)])
def test_eye_matches_torch(n, m):
    got = wgpar.eye(n, m)
    want = torch.eye(n) if m is None else torch.eye(n, m)
    assert got.dtype is wgpar.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert wgpar.eye(n, m, dtype=wgpar.int32).dtype is wgpar.int32
