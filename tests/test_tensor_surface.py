"""The Tensor surface a PyTorch user types in the first week: splitting, triangles, flips and rolls,
rounding, classification, products, logical reductions, norms, logsumexp, factories, comparisons,
outer / diag, clamp_min / clamp_max. Values and gradients against NumPy in float64 (finite
differences), and against PyTorch where it is installed, on fresh random inputs of awkward sizes.
The elementwise ops among them (expm1 .. isfinite) are registry rows, tested by test_registry.py
and test_edge_values.py; here only what those do not cover."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .gradcheck import check
from .helpers import assert_close


# -- split, chunk, unbind ---------------------------------------------------------------------
@pytest.mark.parametrize("size,dim", [(3, 0), (4, 1), ([2, 0, 5], 1), ([7], 1), (2, -1)])
def test_split_forward_and_backward(rng, size, dim):
    x = rng.standard_normal((5, 7, 3))
    d = dim % 3
    n = x.shape[d]
    sizes = size if isinstance(size, list) else [min(size, n - s) for s in range(0, n, size)]
    bounds = np.cumsum([0] + sizes)
    pieces = wgpar.tensor(x.astype(np.float32)).split(size, dim)
    assert [p.shape[d] for p in pieces] == sizes
    for p, lo, hi in zip(pieces, bounds[:-1], bounds[1:]):
        assert_close(p.numpy(), np.take(x, np.arange(lo, hi), axis=d), rtol=1e-6, what="piece")

    def f_w(t):
        return wgpar.cat([p * float(k + 1) for k, p in enumerate(wgpar.split(t, size, dim))], dim)

    def f_np(a):
        return np.concatenate([np.take(a, np.arange(lo, hi), axis=d) * (k + 1)
                               for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))], axis=d)

    check(f_w, f_np, [x], rng)


def test_split_rejects_sizes_that_do_not_add_up():
    x = wgpar.zeros(5, 3)
    with pytest.raises(ValueError, match="add up"):
        x.split([2, 2])
    with pytest.raises(ValueError, match="> 0"):
        x.split(0)


@pytest.mark.parametrize("n,chunks", [(5, 4), (7, 3), (6, 6), (2, 5), (1, 1)])
def test_chunk_sizes_as_torch(rng, n, chunks):
    x = rng.standard_normal((3, n)).astype(np.float32)
    pieces = wgpar.tensor(x).chunk(chunks, 1)
    step = -(-n // chunks)
    want = [x[:, s:s + step] for s in range(0, n, step)]
    assert len(pieces) == len(want)
    for p, w in zip(pieces, want):
        np.testing.assert_array_equal(p.numpy(), w)


@pytest.mark.parametrize("n,chunks", [(5, 4), (7, 3), (6, 6), (2, 5), (1, 1)])
def test_chunk_shapes_match_torch(torch, rng, n, chunks):
    x = rng.standard_normal((3, n)).astype(np.float32)
    pieces = wgpar.tensor(x).chunk(chunks, 1)
    assert [p.shape for p in pieces] == [tuple(p.shape) for p in torch.tensor(x).chunk(chunks, 1)]


def test_chunk_of_an_empty_dim_gives_empty_pieces():
    assert [p.shape for p in wgpar.zeros(0, 3).chunk(3)] == [(0, 3)] * 3


def test_unbind_forward_and_backward(rng):
    x = rng.standard_normal((4, 3, 5))

    def f_w(t):
        return wgpar.stack([p * float(k + 1) for k, p in enumerate(t.unbind(1))], 1)

    check(f_w, lambda a: a * np.arange(1, 4).reshape(1, 3, 1), [x], rng)
    parts = wgpar.unbind(wgpar.tensor(x.astype(np.float32)), -1)
    assert len(parts) == 5 and parts[2].shape == (4, 3)
    assert_close(parts[2].numpy(), x[:, :, 2], rtol=1e-6)


# -- tril, triu, flip, roll -------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, -2, 9, -9])
def test_tril_triu_forward_and_backward(rng, k):
    x = rng.standard_normal((2, 5, 7))
    check(lambda t: t.tril(k), lambda a: np.tril(a, k), [x], rng)
    check(lambda t: wgpar.triu(t, diagonal=k), lambda a: np.triu(a, k), [x], rng)


def test_tril_keeps_the_dtype_and_needs_a_matrix():
    x = wgpar.tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    got = x.tril(-1)
    assert got.dtype is wgpar.int32
    np.testing.assert_array_equal(got.numpy(), np.tril(np.arange(12).reshape(3, 4), -1))
    with pytest.raises(ValueError, match="at least 2 dims"):
        wgpar.zeros(3).triu()


@pytest.mark.parametrize("dims", [0, (1,), (0, 2), (-1, 0, 1)])
def test_flip_forward_and_backward(rng, dims):
    x = rng.standard_normal((3, 5, 4))
    check(lambda t: wgpar.flip(t, dims), lambda a: np.flip(a, dims), [x], rng)


def test_flip_method_takes_varargs_and_copies():
    x = wgpar.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = x.flip(0, 1)
    np.testing.assert_array_equal(y.numpy(), np.arange(6).reshape(2, 3)[::-1, ::-1])
    x.fill_(0)
    assert y.numpy().sum() == 15  # a copy, as torch.flip


@pytest.mark.parametrize("shifts,dims", [(2, 1), (-3, 0), ((1, -9), (0, 2)), (5, None), (0, 1)])
def test_roll_forward_and_backward(rng, shifts, dims):
    x = rng.standard_normal((4, 5, 3))
    check(lambda t: t.roll(shifts, dims), lambda a: np.roll(a, shifts, dims), [x], rng)


def test_split_chunk_flip_roll_tril_against_torch(torch, rng):
    x = rng.standard_normal((6, 7)).astype(np.float32)
    w, t = wgpar.tensor(x), torch.tensor(x)
    for a, b in zip(w.split([1, 4, 2], 1), t.split([1, 4, 2], 1)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(w.flip(1).numpy(), t.flip(1).numpy())
    np.testing.assert_array_equal(w.roll((2, -1), (0, 1)).numpy(), t.roll((2, -1), (0, 1)).numpy())
    np.testing.assert_array_equal(w.roll(4).numpy(), t.roll(4).numpy())
    np.testing.assert_array_equal(w.tril(1).numpy(), t.tril(1).numpy())
    np.testing.assert_array_equal(w.triu(-2).numpy(), t.triu(-2).numpy())


# -- rounding and classification ----------------------------------------------------------------
def test_round_halves_to_even_and_rounding_passes_edges():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1e8, -0.0, np.nan, np.inf, -np.inf], np.float32)
    t = wgpar.tensor(v)
    for name, ref in (("round", np.round), ("floor", np.floor), ("ceil", np.ceil), ("trunc", np.trunc)):
        got = getattr(t, name)().numpy()
        np.testing.assert_array_equal(got, ref(v), err_msg=name)
        assert np.signbit(got[8]), f"{name}(-0.0) lost the sign"
    ints = wgpar.tensor(np.array([-3, 0, 7], np.int32))
    assert ints.round().dtype is wgpar.int32 and ints.floor().tolist() == [-3, 0, 7]


def test_rounding_gradient_is_zero(rng):
    x = wgpar.tensor(rng.standard_normal(9).astype(np.float32), requires_grad=True)
    (x.round() + x.floor() * 2 + x.ceil() + x.trunc()).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(9, np.float32))


def test_isnan_isinf_isfinite():
    v = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3e38, -np.nan], np.float32)
    t = wgpar.tensor(v)
    for name, ref in (("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite)):
        got = getattr(wgpar, name)(t)
        assert got.dtype is wgpar.bool_
        np.testing.assert_array_equal(got.numpy(), ref(v), err_msg=name)
    ints = wgpar.tensor(np.array([1, -2], np.int32))
    assert ints.isfinite().tolist() == [True, True] and ints.isnan().tolist() == [False, False]


# -- prod, any / all ------------------------------------------------------------------------------
@pytest.mark.parametrize("zeros", [0, 1, 2])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (None, False), (-1, True)])
def test_prod_forward_and_backward_with_zeros(rng, zeros, dim, keepdim):
    x = rng.uniform(0.5, 1.5, (5, 7)) * rng.choice([-1, 1], (5, 7))
    for k in range(zeros):  # zeros in one row (and column): the gradient rules for 1 and 2 zeros
        x[2, 2 * k + 1] = 0.0
    check(lambda t: t.prod(dim, keepdim), lambda a: np.prod(a, axis=dim, keepdims=keepdim), [x], rng)


def test_prod_against_torch_with_zeros(torch, rng):
    x = rng.standard_normal((3, 13)).astype(np.float32)
    x[0, 4] = 0.0
    x[1, [2, 9]] = 0.0
    w = wgpar.tensor(x, requires_grad=True)
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    up = rng.standard_normal(3)
    w.prod(1).backward(wgpar.tensor(up.astype(np.float32)))
    (t.prod(1) * torch.tensor(up)).sum().backward()
    assert_close(w.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)
    ints = wgpar.tensor(np.array([[2, 3], [4, -5]], np.int32))
    assert ints.prod(1).tolist() == [6, -20] and wgpar.prod(ints).item() == -120
    assert wgpar.zeros(0).prod().item() == 1.0


def test_any_all(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[1] = 0.0
    x[2, 3] = np.nan
    x[3, :5] = 0.0
    t = wgpar.tensor(x)
    for dim in (None, 0, 1, (0, 1)):
        for keepdim in (False, True):
            np.testing.assert_array_equal(t.any(dim, keepdim).numpy(), np.any(x, axis=dim, keepdims=keepdim))
            np.testing.assert_array_equal(wgpar.all(t, dim, keepdim).numpy(), np.all(x, axis=dim, keepdims=keepdim))
    assert t.any().dtype is wgpar.bool_
    assert not wgpar.zeros(0).any().item() and wgpar.zeros(0).all().item()


# -- norms, logsumexp -------------------------------------------------------------------------------
def _np_norm(a, p, dim, keepdim):
    axis = dim if dim is None or isinstance(dim, tuple) else (dim,)
    m = np.abs(a)
    if p == np.inf:
        return np.max(m, axis=axis, keepdims=keepdim)
    if p == -np.inf:
        return np.min(m, axis=axis, keepdims=keepdim)
    if p == 0:
        return np.sum(m != 0, axis=axis, keepdims=keepdim).astype(np.float64)
    return np.sum(m ** p, axis=axis, keepdims=keepdim) ** (1 / p)


@pytest.mark.parametrize("p", [2, 1, np.inf, -np.inf, 3, 0.5, 0])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_vector_norm_forward_and_backward(rng, p, dim, keepdim):
    x = rng.standard_normal((3, 5, 4))
    x = np.sign(x) * (np.abs(x) + 0.1)  # off the kink of |x| at 0, without ties
    if p == 0:
        x[0, 1, 2] = 0.0
        got = wgpar.linalg.vector_norm(wgpar.tensor(x.astype(np.float32)), p, dim, keepdim)
        assert_close(got.numpy(), _np_norm(x, p, dim, keepdim))
        return
    check(lambda t: wgpar.linalg.vector_norm(t, p, dim, keepdim), lambda a: _np_norm(a, p, dim, keepdim), [x], rng)


def test_norm_gradient_is_zero_where_the_norm_is_zero(torch):
    for p in (2, 3, 1, float("inf")):
        w = wgpar.zeros(2, 3, requires_grad=True)
        w.norm(p, dim=1).sum().backward()
        t = torch.zeros(2, 3, requires_grad=True)
        t.norm(p, dim=1).sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), t.grad.numpy(), err_msg=f"p={p}")


def test_norm_against_torch(torch, rng):
    x = rng.standard_normal((6, 9)).astype(np.float32)
    for args in (("fro",), (2, 1), (1, 0, True), (float("inf"), 1), (3, (0, 1))):
        w = wgpar.tensor(x, requires_grad=True)
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        w.norm(*args).sum().backward()
        t.norm(*args).sum().backward()
        assert_close(w.norm(*args).numpy(), t.norm(*args).detach().numpy(), rtol=1e-5, what=str(args))
        assert_close(w.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-6, what=f"grad {args}")
    with pytest.raises(ValueError, match="nuclear"):
        wgpar.tensor(x).norm("nuc")


def _np_logsumexp(a, dim, keepdim):
    m = np.max(a, axis=dim, keepdims=True)
    out = np.log(np.sum(np.exp(a - m), axis=dim, keepdims=True)) + m
    return out if keepdim else np.squeeze(out, axis=dim)


@pytest.mark.parametrize("dim,keepdim", [(1, False), (-1, True), ((0, 2), False)])
def test_logsumexp_forward_and_backward(rng, dim, keepdim):
    x = rng.standard_normal((3, 37, 5)) * 4
    check(lambda t: t.logsumexp(dim, keepdim), lambda a: _np_logsumexp(a, dim, keepdim), [x], rng)


def test_logsumexp_is_stable_and_takes_infinities():
    x = wgpar.tensor(np.array([[1000.0, 1000.0], [-1000.0, -1001.0], [-np.inf, -np.inf], [np.inf, 1.0]], np.float32))
    got = wgpar.logsumexp(x, 1).numpy()
    want = [1000.0 + np.log(2), -1000.0 + np.log1p(np.exp(-1.0)), -np.inf, np.inf]
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- factories, .data -------------------------------------------------------------------------------
def test_new_factories_take_the_tensors_dtype_and_device():
    x = wgpar.tensor(np.array([1, 2], np.int32))
    assert x.new_zeros(2, 3).dtype is wgpar.int32 and x.new_zeros((2, 3)).shape == (2, 3)
    assert x.new_ones(4).tolist() == [1, 1, 1, 1]
    assert x.new_full((2,), 7).tolist() == [7, 7]
    assert x.new_tensor([1.7, -2.2]).tolist() == [1, -2]  # x's dtype, as torch
    f = x.new_zeros(3, dtype=wgpar.float32, requires_grad=True)
    assert f.dtype is wgpar.float32 and f.requires_grad and f.device is x.device


def test_like_factories():
    x = wgpar.tensor(np.ones((3, 5), np.float32))
    assert wgpar.zeros_like(x).numpy().sum() == 0 and wgpar.ones_like(x, dtype=wgpar.int32).dtype is wgpar.int32
    assert wgpar.full_like(x, 2).tolist() == [[2.0] * 5] * 3  # x's dtype, not the int fill's
    assert wgpar.empty_like(x).shape == (3, 5)
    assert wgpar.zeros_like(x, requires_grad=True).requires_grad
    u = wgpar.rand_like(x).numpy()
    assert u.shape == (3, 5) and (u >= 0).all() and (u < 1).all()
    assert wgpar.randn_like(x).shape == (3, 5)
    with pytest.raises(TypeError, match="float dtype"):
        wgpar.randn_like(wgpar.tensor(np.array([1], np.int32)))


def test_data_is_a_detached_alias():
    w = wgpar.tensor(np.ones(3, np.float32), requires_grad=True)
    d = w.data
    assert not d.requires_grad and d.data_ptr() == w.data_ptr()
    d.fill_(5.0)
    assert w.tolist() == [5.0, 5.0, 5.0]
    w.data = wgpar.zeros(2, 2)
    assert w.shape == (2, 2) and w.requires_grad and w.numpy().sum() == 0


# -- isclose, allclose, outer, diag, clamp_min / clamp_max, numel -----------------------------------
def test_isclose_and_allclose_as_numpy():
    a = np.array([1.0, 1.0, np.inf, -np.inf, np.nan, 0.0, 1e-9, 100.0], np.float32)
    b = np.array([1.0 + 1e-6, 1.1, np.inf, np.inf, np.nan, 1e-9, 0.0, 100.001], np.float32)
    ta, tb = wgpar.tensor(a), wgpar.tensor(b)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 0.2}):
        got = wgpar.isclose(ta, tb, **kw)
        assert got.dtype is wgpar.bool_
        np.testing.assert_array_equal(got.numpy(), np.isclose(a, b, **kw), err_msg=str(kw))
    assert ta.allclose(ta, equal_nan=True) and not ta.allclose(ta) and not wgpar.allclose(ta, tb)
    ints = wgpar.tensor(np.array([3, 4], np.int32))
    np.testing.assert_array_equal(ints.isclose(wgpar.tensor(np.array([3, 5], np.int32))).numpy(), [True, False])


def test_outer_and_diag(rng):
    a, b = rng.standard_normal(5), rng.standard_normal(7)
    check(lambda x, y: wgpar.outer(x, y), np.outer, [a, b], rng)
    for k in (0, 2, -3):
        check(lambda x, k=k: wgpar.diag(x, k), lambda v, k=k: np.diag(v, k), [a], rng)
    m = rng.standard_normal((4, 6))
    for k in (0, 1, -2, 5, -4):
        check(lambda x, k=k: x.diag(k), lambda v, k=k: np.diag(v, k), [m], rng)


def test_clamp_min_max_and_numel(rng):
    x = rng.standard_normal((4, 9))
    check(lambda t: t.clamp_min(0.2), lambda a: np.maximum(a, 0.2), [np.where(np.abs(x - 0.2) < 0.05, 0.5, x)], rng)
    check(lambda t: wgpar.clamp_max(t, -0.1), lambda a: np.minimum(a, -0.1),
          [np.where(np.abs(x + 0.1) < 0.05, 0.5, x)], rng)
    assert wgpar.numel(wgpar.zeros(3, 4)) == 12
