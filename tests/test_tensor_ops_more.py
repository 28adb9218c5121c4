"""The remaining Tensor ops of the first week: cumsum / cumprod (a scan kernel), gather / scatter /
scatter_add / index_add, nonzero and boolean-mask indexing, sin / cos / tan with exact range reduction.
Values and gradients against NumPy in float64 (finite differences or the analytic formula), and against
PyTorch through the ``torch`` fixture, on fresh random inputs of awkward sizes."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .gradcheck import check
from .helpers import assert_close


def _t(a, requires_grad=False):
    return wgpar.tensor(np.asarray(a), requires_grad=requires_grad)


# -- cumsum / cumprod ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((5, 13), 1), ((5, 13), 0), ((3, 4, 6), 1), ((2, 1500), -1),
                                       ((1, 70001), 1), ((0, 5), 1), ((4, 0), 1)])
def test_cumsum_forward(rng, shape, dim):
    x = rng.standard_normal(shape).astype(np.float32)
    got = _t(x).cumsum(dim).numpy()
    want = np.cumsum(x.astype(np.float64), axis=dim)
    # a tree of float32 additions: within a few ulp of the largest partial sum
    assert_close(got, want, rtol=0, atol=4e-7 * max(1.0, float(np.abs(want).max()) if want.size else 1.0) * 8)


def test_cumsum_of_a_row_past_two_levels_and_the_loop_limit(rng):
    x = rng.integers(-3, 4, (2, 1_100_003)).astype(np.float32)  # integers: every partial sum is exact
    got = wgpar.cumsum(_t(x), 1).numpy()
    np.testing.assert_array_equal(got, np.cumsum(x.astype(np.float64), 1))


@pytest.mark.parametrize("shape,dim", [((6,), 0), ((4, 9), 1), ((3, 5, 4), 0)])
def test_cumsum_backward(rng, shape, dim):
    x = rng.standard_normal(shape)
    check(lambda t: t.cumsum(dim) * 1.5, lambda a: np.cumsum(a, axis=dim) * 1.5, [x], rng)


def test_cumsum_backward_on_a_long_row(rng):
    x = rng.standard_normal((2, 5000)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    t = _t(x, requires_grad=True)
    t.cumsum(1).backward(_t(g))
    want = np.cumsum(g[:, ::-1].astype(np.float64), 1)[:, ::-1]
    assert_close(t.grad.numpy(), want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape,dim", [((6,), 0), ((4, 9), 1), ((3, 5, 4), 0)])
def test_cumprod_forward_and_backward(rng, shape, dim):
    x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    check(lambda t: t.cumprod(dim), lambda a: np.cumprod(a, axis=dim), [x], rng)


@pytest.mark.parametrize("zeros", [[3], [0], [8], [2, 5], [1, 1 + 0, 6]])
def test_cumprod_gradient_with_zeros(rng, zeros):
    x = rng.uniform(0.5, 1.5, (3, 9)) * rng.choice([-1, 1], (3, 9))
    x[1, zeros] = 0.0
    x[2, -1] = 0.0
    check(lambda t: wgpar.cumprod(t, 1), lambda a: np.cumprod(a, axis=1), [x], rng)


def test_cumprod_long_row(rng):
    x = (1 + 1e-4 * rng.standard_normal((2, 70001))).astype(np.float32)
    got = _t(x).cumprod(-1).numpy()
    want = np.cumprod(x.astype(np.float64), -1)
    # float32 products, in a tree: relative error within the bound of any float32 order, n * 2**-24
    assert_close(got / want, np.ones_like(want), rtol=0, atol=x.shape[1] * 2.0**-24)


def test_cumsum_cumprod_int_bool_and_half(dev, rng):
    xi = rng.integers(-9, 10, (4, 2000)).astype(np.int32)
    got = _t(xi).cumsum(1)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.cumsum(xi.astype(np.int64), 1))
    big = np.full((1, 40), 7, np.int32)  # 7**40 wraps modulo 2**32 (PyTorch: int64)
    wrapped = (np.cumprod(np.full(40, 7, dtype=object)) % 2**32).astype(np.int64)
    wrapped = np.where(wrapped >= 2**31, wrapped - 2**32, wrapped).astype(np.int32)
    np.testing.assert_array_equal(_t(big).cumprod(1).numpy()[0], wrapped)
    b = rng.random((3, 50)) < 0.4
    got = wgpar.tensor(b).cumsum(1)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.cumsum(b, 1))
    f = rng.standard_normal((3, 11)).astype(np.float32)
    np.testing.assert_allclose(_t(f).cumsum(0, dtype=wgpar.int32).numpy(), np.cumsum(f.astype(np.int32), 0))
    if dev.has_f16:
        h = rng.standard_normal((3, 300)).astype(np.float16)
        got = wgpar.tensor(h).cumsum(1)
        assert got.dtype is wgpar.float16
        assert_close(got.numpy(), np.cumsum(h.astype(np.float64), 1).astype(np.float16), rtol=2e-3, atol=2e-2)


def test_cumsum_cumprod_match_torch(torch, rng):
    x = rng.standard_normal((4, 1100)).astype(np.float32)
    x[1, 17] = 0.0
    x[2, [5, 900]] = 0.0
    g = rng.standard_normal(x.shape).astype(np.float32)
    for name in ("cumsum", "cumprod"):
        xt = torch.tensor(x if name == "cumsum" else np.clip(x, -1.05, 1.05), requires_grad=True)
        getattr(xt, name)(1).backward(torch.tensor(g))
        w = _t(xt.detach().numpy(), requires_grad=True)
        out = getattr(w, name)(1)
        out.backward(_t(g))
        want = getattr(xt.detach(), name)(1).numpy()
        assert_close(out.numpy(), want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()), what=name)
        assert_close(w.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-4 * max(1.0, np.abs(xt.grad.numpy()).max()),
                     what=f"{name} grad")


# -- gather / scatter / scatter_add / index_add -------------------------------------------------
def _np_gather(x, d, idx):
    return np.take_along_axis(x[tuple(slice(0, n) if k != d else slice(None) for k, n in enumerate(idx.shape))],
                              idx, d)


def _grids(idx, d):
    """Open index grids for every dim of idx but d, and d's position."""
    g = list(np.ogrid[tuple(slice(0, n) for n in idx.shape)])
    return g, g[d]


def _np_scatter(x, d, idx, src, add):
    out = np.array(x, dtype=np.float64, copy=True)
    grids, _ = _grids(idx, d)
    src = src[tuple(slice(0, n) for n in idx.shape)]
    for j in range(idx.shape[d]):  # in order along d: of repeated indices the last one wins
        key = [np.broadcast_to(g if k != d else 0, idx.shape).take(j, axis=d) for k, g in enumerate(grids)]
        key[d] = idx.take(j, axis=d)
        if add:
            np.add.at(out, tuple(key), src.take(j, axis=d))
        else:
            out[tuple(key)] = src.take(j, axis=d)
    return out


CASES = [((5, 7), (5, 4), 1), ((5, 7), (3, 7), 0), ((4, 6, 5), (3, 9, 4), 1), ((4, 6, 5), (4, 6, 2), -1),
         ((9,), (13,), 0)]


@pytest.mark.parametrize("xshape,ishape,dim", CASES)
def test_gather_forward_and_backward(rng, xshape, ishape, dim):
    d = dim % len(xshape)
    idx = rng.integers(0, xshape[d], ishape).astype(np.int32)
    x = rng.standard_normal(xshape)
    check(lambda t: t.gather(dim, _t(idx)), lambda a: _np_gather(a, d, idx), [x], rng)
    np.testing.assert_array_equal(wgpar.gather(_t(x.astype(np.float32)), dim, _t(idx)).numpy(),
                                  _np_gather(x.astype(np.float32), d, idx))


@pytest.mark.parametrize("xshape,ishape,dim", CASES)
def test_scatter_add_forward_and_backward(rng, xshape, ishape, dim):
    d = dim % len(xshape)
    idx = rng.integers(0, xshape[d], ishape).astype(np.int32)  # repeats included
    x = rng.standard_normal(xshape)
    src = rng.standard_normal(tuple(n + 1 for n in ishape))  # larger than the index: only its corner counts
    check(lambda t, s: t.scatter_add(dim, _t(idx), s), lambda a, s: _np_scatter(a, d, idx, s, add=True), [x, src],
          rng)


@pytest.mark.parametrize("xshape,ishape,dim", CASES)
def test_scatter_last_of_repeated_indices_wins_and_gets_the_gradient(rng, xshape, ishape, dim):
    d = dim % len(xshape)
    idx = rng.integers(0, xshape[d], ishape).astype(np.int32)
    x = rng.standard_normal(xshape)
    src = rng.standard_normal(ishape)
    check(lambda t, s: wgpar.scatter(t, dim, _t(idx), s), lambda a, s: _np_scatter(a, d, idx, s, add=False),
          [x, src], rng)
    got = _t(x.astype(np.float32)).scatter(dim, _t(idx), 2.5).numpy()
    np.testing.assert_array_equal(got, _np_scatter(x.astype(np.float32), d, idx, np.full(ishape, 2.5), False))
    check(lambda t: t.scatter(dim, _t(idx), value=-1.0), lambda a: _np_scatter(a, d, idx, np.full(ishape, -1.0),
                                                                                 False), [x], rng)


def test_scatter_reduce_add_and_refusals(rng):
    x = wgpar.zeros(3, 4)
    idx = _t(np.array([[0, 0, 2, 1]], np.int32))
    np.testing.assert_array_equal(x.scatter(0, idx, 1.0, reduce="add").numpy(),
                                  [[1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]])
    with pytest.raises(ValueError, match="multiply"):
        x.scatter(0, idx, 1.0, reduce="multiply")
    with pytest.raises(IndexError, match="out of range"):
        x.gather(1, _t(np.array([[4]], np.int32)))
    with pytest.raises(IndexError, match="out of range"):
        x.scatter_add(0, _t(np.array([[-1]], np.int32)), wgpar.ones(1, 1))
    with pytest.raises(TypeError, match="int32"):
        x.gather(1, _t(np.array([[1.0]], np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        x.scatter_add(0, idx, wgpar.ones(1, 4, dtype=wgpar.int32))
    with pytest.raises(ValueError, match="larger"):
        x.gather(0, _t(np.zeros((1, 5), np.int32)))


def test_scatter_add_of_a_line_past_the_loop_limit_and_int32(rng):
    count = 70001
    idx = rng.integers(0, 3, (2, count)).astype(np.int32)
    src = rng.integers(-4, 5, (2, count)).astype(np.float32)  # integers: every order sums exactly
    # references written for this one layout: _np_scatter's loop over 70001 positions took ~15 s of CI
    want = np.zeros((2, 3))
    np.add.at(want, (np.broadcast_to(np.arange(2)[:, None], idx.shape), idx), src)
    got = wgpar.zeros(2, 3).scatter_add(1, _t(idx), _t(src)).numpy()
    np.testing.assert_array_equal(got, want)
    want_last = np.zeros((2, 3))
    for i in range(2):
        for k in range(3):
            hits = np.flatnonzero(idx[i] == k)
            if hits.size:
                want_last[i, k] = src[i, hits[-1]]  # of repeated indices the last one wins
    last = wgpar.zeros(2, 3).scatter(1, _t(idx), _t(src)).numpy()
    np.testing.assert_array_equal(last, want_last)
    big = np.full((1, 5), 2**30, np.int32)
    got = wgpar.zeros(1, 2, dtype=wgpar.int32).scatter_add(1, _t(np.zeros((1, 5), np.int32)), _t(big)).numpy()
    assert got[0, 0] == np.int32(np.int64(5 * 2**30) - 2**32) and got[0, 1] == 0  # int32 wraps


def test_scatter_add_repeats_bit_for_bit(rng):
    idx = _t(rng.integers(0, 4, (1, 5000)).astype(np.int32))
    src = _t(rng.standard_normal((1, 5000)).astype(np.float32))
    a = wgpar.zeros(1, 4).scatter_add(1, idx, src).numpy()
    b = wgpar.zeros(1, 4).scatter_add(1, idx, src).numpy()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,dim,count", [((6, 5), 0, 9), ((4, 7, 3), 1, 4), ((4, 7, 3), -1, 5), ((8,), 0, 3)])
def test_index_add_forward_and_backward(rng, shape, dim, count):
    d = dim % len(shape)
    index = rng.integers(0, shape[d], count)
    x = rng.standard_normal(shape)
    src = rng.standard_normal(tuple(count if k == d else n for k, n in enumerate(shape)))

    def f_np(a, s):
        out = a.copy()
        np.add.at(np.moveaxis(out, d, 0), index, np.moveaxis(s, d, 0) * 0.5)
        return out

    check(lambda t, s: t.index_add(dim, index.tolist(), s, alpha=0.5), f_np, [x, src], rng)
    check(lambda t, s: wgpar.index_add(t, dim, _t(index.astype(np.int32)), s, alpha=0.5), f_np, [x, src], rng)


def test_in_place_forms(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    idx = rng.integers(0, 4, (3, 5)).astype(np.int32)
    src = rng.standard_normal((3, 5)).astype(np.float32)
    t = _t(x)
    assert t.scatter_add_(0, _t(idx), _t(src)) is t
    assert_close(t.numpy(), _np_scatter(x, 0, idx, src, True), rtol=1e-6)
    t = _t(x)
    t.scatter_(0, _t(idx), _t(src))
    np.testing.assert_array_equal(t.numpy(), _np_scatter(x, 0, idx, src, False).astype(np.float32))
    t = _t(x)
    t.index_add_(1, [4, 0, 4], _t(np.ones((4, 3), np.float32)), alpha=2)
    want = x.copy()
    want[:, 4] += 4
    want[:, 0] += 2
    assert_close(t.numpy(), want, rtol=1e-6)
    leaf = _t(x, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        leaf.scatter_(0, _t(idx), _t(src))


def test_gather_scatter_index_add_match_torch(torch, rng):
    x = rng.standard_normal((5, 8, 3)).astype(np.float32)
    idx = np.stack([rng.permutation(8)[:6] for _ in range(5 * 3)]).reshape(5, 3, 6).transpose(0, 2, 1)
    idx = np.ascontiguousarray(idx).astype(np.int32)  # distinct along dim 1: scatter defined in torch
    src = rng.standard_normal((5, 6, 3)).astype(np.float32)
    g = rng.standard_normal((5, 8, 3)).astype(np.float32)
    for name in ("scatter", "scatter_add"):
        xt, st = torch.tensor(x, requires_grad=True), torch.tensor(src, requires_grad=True)
        getattr(xt, name)(1, torch.tensor(idx, dtype=torch.int64), st).backward(torch.tensor(g))
        xw, sw = _t(x, requires_grad=True), _t(src, requires_grad=True)
        out = getattr(xw, name)(1, _t(idx), sw)
        out.backward(_t(g))
        want = getattr(torch.tensor(x), name)(1, torch.tensor(idx, dtype=torch.int64), torch.tensor(src))
        assert_close(out.numpy(), want.numpy(), rtol=1e-6, what=name)
        assert_close(xw.grad.numpy(), xt.grad.numpy(), what=f"{name} grad a")
        assert_close(sw.grad.numpy(), st.grad.numpy(), what=f"{name} grad src")
    xt = torch.tensor(x, requires_grad=True)
    xt.gather(1, torch.tensor(idx, dtype=torch.int64)).backward(torch.tensor(src))
    xw = _t(x, requires_grad=True)
    xw.gather(1, _t(idx)).backward(_t(src))
    assert_close(xw.grad.numpy(), xt.grad.numpy(), rtol=1e-6, what="gather grad")
    index = rng.integers(0, 8, 11)
    s2 = rng.standard_normal((5, 11, 3)).astype(np.float32)
    want = torch.tensor(x).index_add(1, torch.tensor(index), torch.tensor(s2), alpha=-2.0)
    assert_close(_t(x).index_add(1, index, _t(s2), alpha=-2.0).numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


# -- nonzero and boolean masks ------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (5, 9), (3, 4, 6), (2, 70001), (0, 3)])
def test_nonzero_positions_in_order(rng, shape):
    x = np.where(rng.random(shape) < 0.3, rng.standard_normal(shape), 0.0).astype(np.float32)
    if x.size:
        x.flat[rng.integers(0, x.size)] = np.nan  # NaN is nonzero
    got = _t(x).nonzero()
    assert got.dtype is wgpar.int32 and got.shape == (np.count_nonzero(x), len(shape))
    np.testing.assert_array_equal(got.numpy(), np.argwhere(x))
    np.testing.assert_array_equal(wgpar.argwhere(_t(x)).numpy(), np.argwhere(x))
    for g, w in zip(wgpar.nonzero(_t(x), as_tuple=True), np.nonzero(x)):
        np.testing.assert_array_equal(g.numpy(), w)


def test_nonzero_of_ints_bools_and_edge_shapes(rng):
    xi = rng.integers(-2, 3, (6, 5)).astype(np.int32)
    np.testing.assert_array_equal(_t(xi).nonzero().numpy(), np.argwhere(xi))
    b = rng.random((4, 4)) < 0.5
    np.testing.assert_array_equal(wgpar.tensor(b).nonzero().numpy(), np.argwhere(b))
    assert wgpar.zeros(3, 4).nonzero().shape == (0, 2)
    assert wgpar.tensor(5.0).nonzero().shape == (1, 0) and wgpar.tensor(0.0).nonzero().shape == (0, 0)


@pytest.mark.parametrize("shape,mdims", [((9,), 1), ((6, 5), 2), ((6, 5), 1), ((4, 3, 7), 2), ((3, 70001), 2)])
def test_mask_read_forward_and_backward(rng, shape, mdims):
    mask = rng.random(shape[:mdims]) < 0.45
    x = rng.standard_normal(shape).astype(np.float32)
    for m in (wgpar.tensor(mask), mask):  # a bool tensor or a NumPy bool array
        got = _t(x)[m]
        assert got.shape == x[mask].shape
        np.testing.assert_array_equal(got.numpy(), x[mask])
    g = rng.standard_normal(x[mask].shape).astype(np.float32)
    t = _t(x, requires_grad=True)
    t[wgpar.tensor(mask)].backward(_t(g))
    want = np.zeros_like(x)
    want[mask] = g
    np.testing.assert_array_equal(t.grad.numpy(), want)


def test_mask_read_gradient_by_finite_differences(rng):
    x = rng.standard_normal((5, 4))
    mask = rng.random((5, 4)) < 0.5
    mask[0, 0] = True
    check(lambda t: t[wgpar.tensor(mask)] * 3.0, lambda a: a[mask] * 3.0, [x], rng)
    check(lambda t: wgpar.masked_select(t, wgpar.tensor(mask[2:3])), lambda a: a[np.broadcast_to(mask[2:3], a.shape)],
          [x], rng)


def test_mask_read_of_nothing(rng):
    t = _t(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    out = t[wgpar.zeros(3, dtype=wgpar.bool_)]
    assert out.shape == (0, 2)
    out.sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.zeros((3, 2)))


@pytest.mark.parametrize("kind", ["scalar", "0d", "row", "rows", "array"])
def test_mask_write(rng, kind):
    x = rng.standard_normal((6, 4, 3)).astype(np.float32)
    mask = rng.random((6, 4)) < 0.5
    mask[1, 2] = True
    count = int(mask.sum())
    value = {"scalar": 2.5, "0d": _t(np.float32(-1.5)), "row": _t(rng.standard_normal(3).astype(np.float32)),
             "rows": _t(rng.standard_normal((count, 3)).astype(np.float32)),
             "array": rng.standard_normal((count, 3)).astype(np.float32)}[kind]
    t = _t(x)
    t[wgpar.tensor(mask)] = value
    want = x.copy()
    want[mask] = value.numpy() if isinstance(value, wgpar.Tensor) else value
    np.testing.assert_array_equal(t.numpy(), want)


def test_mask_write_long_and_int(rng):
    x = rng.integers(-5, 5, 70001).astype(np.int32)
    mask = x > 0
    t = _t(x)
    t[mask] = _t(np.arange(int(mask.sum()), dtype=np.int32))
    want = x.copy()
    want[mask] = np.arange(int(mask.sum()))
    np.testing.assert_array_equal(t.numpy(), want)


def test_mask_errors(rng):
    x = wgpar.zeros(3, 4)
    with pytest.raises(IndexError, match="leading dims"):
        x[wgpar.zeros(4, dtype=wgpar.bool_)]
    with pytest.raises(IndexError, match="whole index"):
        x[wgpar.zeros(3, dtype=wgpar.bool_), 0]
    leaf = wgpar.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        leaf[wgpar.ones(3, dtype=wgpar.bool_)] = 1.0


def test_nonzero_and_masks_match_torch(torch, rng):
    x = np.where(rng.random((6, 7)) < 0.4, rng.standard_normal((6, 7)), 0).astype(np.float32)
    np.testing.assert_array_equal(_t(x).nonzero().numpy(), torch.tensor(x).nonzero().numpy())
    mask = rng.random(6) < 0.5
    g = rng.standard_normal((int(mask.sum()), 7)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    xt[torch.tensor(mask)].backward(torch.tensor(g))
    t = _t(x, requires_grad=True)
    out = t[wgpar.tensor(mask)]
    out.backward(_t(g))
    np.testing.assert_array_equal(out.numpy(), torch.tensor(x)[torch.tensor(mask)].numpy())
    np.testing.assert_array_equal(t.grad.numpy(), xt.grad.numpy())
    m2 = torch.tensor(x) > 0
    np.testing.assert_array_equal(wgpar.masked_select(_t(x), wgpar.tensor(m2.numpy())).numpy(),
                                  torch.masked_select(torch.tensor(x), m2).numpy())


# -- sin / cos / tan over the whole float32 range --------------------------------------------------
def _ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of float32 spacing at the float32-rounded truth (want in float64). Below the
    smallest normal float the unit is that number itself: GPUs may flush subnormal inputs and results to
    zero (Vulkan leaves denormals to the driver; an H200 flushes them), an error of at most one such unit."""
    tiny = np.float64(np.finfo(np.float32).tiny)
    spacing = np.maximum(np.spacing(np.abs(want.astype(np.float32))).astype(np.float64), tiny)
    return np.abs(got.astype(np.float64) - want) / spacing


def _trig_inputs(rng, n: int) -> np.ndarray:
    bits = rng.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.uint32)  # every finite magnitude alike
    wide = bits.view(np.float32) * rng.choice(np.float32([-1, 1]), n)
    near = rng.uniform(-200, 200, n).astype(np.float32)
    # float32 near multiples of pi/2, where reduction cancels most bits (the worst case of Payne-Hanek)
    k = rng.integers(1, 2**22, n)
    close = (k * (np.pi / 2)).astype(np.float32)
    hard = np.float32([np.finfo(np.float32).max, np.finfo(np.float32).min, 16367173 * 2.0**72, 1.5707964,
                       3.1415927, 0.78539819, 0.78539813, 1e-30, 2.0**-149, 8.5e37, 105414350.0])
    return np.concatenate([wide, near, close, hard]).astype(np.float32)


@pytest.mark.parametrize("name,ulps", [("sin", 3.0), ("cos", 3.0), ("tan", 6.0)])
def test_trig_within_a_few_ulp_over_the_float32_range(rng, name, ulps):
    x = _trig_inputs(rng, 60000)
    got = getattr(wgpar, name)(_t(x)).numpy()
    want = getattr(np, name)(x.astype(np.float64))
    err = _ulp_error(got, want)
    worst = int(np.argmax(err))
    assert err.max() <= ulps, f"{name}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {err.max():.2f} ulp"


def test_trig_edge_values():
    x = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).max])
    s, c, t = (getattr(_t(x), n)().numpy() for n in ("sin", "cos", "tan"))
    assert np.signbit(s[1]) and not np.signbit(s[0]) and np.signbit(t[1]) and (c[:2] == 1).all()
    assert np.isnan(s[2:5]).all() and np.isnan(c[2:5]).all() and np.isnan(t[2:5]).all()
    np.testing.assert_allclose(s[5], np.sin(np.float64(x[5])), rtol=1e-6)  # -0.5218765, not a driver's +-1
    np.testing.assert_allclose(c[5], np.cos(np.float64(x[5])), rtol=1e-6)


def test_trig_gradients_and_methods(rng):
    x = rng.uniform(-4, 4, (5, 7))
    check(lambda t: t.sin() * t.cos() + wgpar.tan(t * 0.3), lambda a: np.sin(a) * np.cos(a) + np.tan(a * 0.3),
          [x], rng)
    ints = _t(np.array([0, 1, 100000], np.int32))
    assert ints.sin().dtype is wgpar.float32
    assert_close(ints.cos().numpy(), np.cos([0.0, 1.0, 100000.0]), rtol=1e-6, atol=1e-7)


def test_trig_matches_torch(torch, rng):
    x = _trig_inputs(rng, 2000)
    for name in ("sin", "cos", "tan"):
        want = getattr(torch, name)(torch.tensor(x, dtype=torch.float64)).numpy()
        err = _ulp_error(getattr(_t(x), name)().numpy(), want)
        assert err.max() <= (6.0 if name == "tan" else 3.0), name
    g = rng.uniform(-3, 3, 50).astype(np.float32)
    xt = torch.tensor(g, requires_grad=True)
    (xt.sin() + xt.cos() + xt.tan()).sum().backward()
    t = _t(g, requires_grad=True)
    (t.sin() + t.cos() + t.tan()).sum().backward()
    assert_close(t.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
