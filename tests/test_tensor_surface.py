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
    torch = pytest.importorskip("torch")
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


def test_split_chunk_flip_roll_tril_against_torch(rng):
    torch = pytest.importorskip("torch")
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
