"""Views and layout: reshape/view, transpose/permute, slicing, integer and array indexing, cat/stack."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


def arr(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def same(t, want):
    got = t.numpy()
    assert got.shape == np.shape(want), f"{got.shape} != {np.shape(want)}"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src,dst", [((24,), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((7, 33), (33, 7)),
                                     ((1, 1000), (1000, 1)), ((3, 1, 5), (15, -1)), ((0, 4), (4, 0, 2)), ((1,), ())])
def test_reshape_and_view_contiguous(dev, rng, src, dst):
    a = arr(rng, src)
    x = wgpar.tensor(a)
    want = a.reshape(dst)
    for r in (x.reshape(dst), x.view(*dst) if dst else x.view(()), wgpar.reshape(x, dst)):
        same(r, want)
        if x.numel():
            assert r._storage is x._storage  # a view of a contiguous tensor never copies


def test_reshape_of_non_contiguous_tensors(dev, rng):
    a = arr(rng, (4, 6, 5))
    x = wgpar.tensor(a)
    t = x.permute(2, 0, 1)  # (5, 4, 6)
    same(t.reshape(5, 24), a.transpose(2, 0, 1).reshape(5, 24))  # merges contiguous trailing dims: a view
    assert t.reshape(5, 24)._storage is x._storage
    same(t.reshape(20, 6), a.transpose(2, 0, 1).reshape(20, 6))  # needs a copy
    same(t.reshape(-1), a.transpose(2, 0, 1).reshape(-1))
    s = x[:, ::2]  # (4, 3, 5), strided
    same(s.reshape(12, 5), a[:, ::2].reshape(12, 5))
    same(s.view(12, 5), a[:, ::2].reshape(12, 5))  # merges dims whose strides chain: a view
    assert s.view(12, 5)._storage is x._storage
    with pytest.raises(RuntimeError, match="reshape"):  # as PyTorch: a view never copies
        s.view(4, 15)
    same(x[::-1].reshape(24, 5), a[::-1].reshape(24, 5))
    same(x.T.reshape(5, 2, 12).T, a.T.reshape(5, 2, 12).T)
    same(x.expand(2, 4, 6, 5).reshape(8, 30), np.broadcast_to(a, (2, 4, 6, 5)).reshape(8, 30))
    same(x[:, 1].flatten(), a[:, 1].reshape(-1))
    same(x.flatten(1), a.reshape(4, 30))
    same(x.permute(1, 2, 0).flatten(0, 1), a.transpose(1, 2, 0).reshape(30, 4))


def test_reshape_errors(dev):
    x = wgpar.zeros(2, 3)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        x.reshape(4, 2)
    with pytest.raises(ValueError):
        x.reshape(-1, -1)
    with pytest.raises(ValueError):
        x.reshape(5, -1)


def test_transpose_permute_T_contiguous(dev, rng):
    a = arr(rng, (3, 7, 33))
    x = wgpar.tensor(a)
    same(x.T, a.T)
    same(x.mT, np.swapaxes(a, -1, -2))
    same(x.transpose(0, 2), np.swapaxes(a, 0, 2))
    same(x.transpose(-1, 0), np.swapaxes(a, -1, 0))
    same(wgpar.transpose(x, 0, 1), np.swapaxes(a, 0, 1))
    same(x.permute(1, 2, 0), a.transpose(1, 2, 0))
    same(x.permute((2, 0, 1)), a.transpose(2, 0, 1))
    same(wgpar.permute(x, (0, 2, 1)), a.transpose(0, 2, 1))
    for v in (x.T, x.mT, x.permute(1, 2, 0)):
        assert v._storage is x._storage and not v.is_contiguous()
        c = v.contiguous()
        assert c.is_contiguous() and c._storage is not x._storage
        same(c, v.numpy())
    assert x.contiguous() is x
    v = wgpar.tensor(a[0, 0])
    same(v.T, a[0, 0])  # 1-D .T is itself
    with pytest.raises(ValueError):
        x.permute(0, 0, 1)


def test_basic_slicing(dev, rng):
    a = arr(rng, (7, 33, 5))
    x = wgpar.tensor(a)
    keys = [
        np.s_[2], np.s_[-1], np.s_[1:4], np.s_[::2], np.s_[::-1], np.s_[5:1:-2], np.s_[-3:], np.s_[:, 3],
        np.s_[:, -2, 1], np.s_[1, 2, 3], np.s_[..., 2], np.s_[..., ::-3, :], np.s_[None], np.s_[:, None, 1:3],
        np.s_[2, ..., None], np.s_[None, ..., None], np.s_[::3, ::-5, ::2], np.s_[10:20], np.s_[:, 40:],
        np.s_[-100:100, 1:-1:4], np.s_[3, ::-1], np.s_[:0], np.s_[1:1, ::-1], np.s_[()], np.s_[...],
        np.s_[np.int64(2), :, np.int32(-1)],
    ]
    for key in keys:
        got = x[key]
        assert got._storage is x._storage, key
        same(got, a[key])


def test_slices_of_slices_and_ops_on_them(dev, rng):
    a = arr(rng, (33, 40))
    x = wgpar.tensor(a)
    v = x[3:30:2][::-1, 5::3][1:-1]
    want = a[3:30:2][::-1, 5::3][1:-1]
    same(v, want)
    assert_close((v * 2 + v.T.T).numpy(), want.astype(np.float64) * 3)
    assert_close(x[5][10:20].sum().item(), a[5][10:20].astype(np.float64).sum(), rtol=1e-5)


def test_integer_indexing_along_any_axis(dev, rng):
    a = arr(rng, (4, 5, 6))
    x = wgpar.tensor(a)
    for axis in range(3):
        for i in (0, 2, -1):
            key = (slice(None),) * axis + (i,)
            same(x[key], a[key])
    same(x[1][2][3], a[1][2][3])
    assert x[1, 2, 3].item() == float(a[1, 2, 3])
    with pytest.raises(IndexError, match="out of bounds"):
        x[4]
    with pytest.raises(IndexError):
        x[:, -6]
    with pytest.raises(IndexError):
        x[0, 0, 0, 0]
    with pytest.raises(IndexError):
        x[..., ...]


@pytest.mark.parametrize("shape,dim", [((7, 33), 0), ((7, 33), 1), ((3, 1, 5), 1), ((4, 5, 6), -1), ((129,), 0)])
def test_index_select(dev, rng, shape, dim):
    a = arr(rng, shape)
    n = shape[dim]
    idx = rng.integers(0, n, size=11)  # index_select takes [0, n), as in PyTorch
    x = wgpar.tensor(a)
    want = np.take(a, idx, axis=dim)
    same(x.index_select(dim, idx), want)
    same(wgpar.index_select(x, dim, wgpar.tensor(idx)), want)
    same(x.index_select(dim, list(idx)), want)
    neg = rng.integers(-n, n, size=11)  # advanced indexing also counts from the end
    key = (slice(None),) * (dim % len(shape)) + (neg,)
    same(x[key], a[key])
    same(x[(slice(None),) * (dim % len(shape)) + (wgpar.tensor(neg),)], a[key])


def test_embedding_lookup_with_2d_index(dev, rng):
    table = arr(rng, (1000, 33))
    ids = rng.integers(0, 1000, size=(7, 129))
    emb = wgpar.tensor(table)
    same(emb[wgpar.tensor(ids)], table[ids])
    same(emb.index_select(0, ids), table[ids])
    same(emb[ids], table[ids])
    same(emb[:, [0, 5, 5, 32]], table[:, [0, 5, 5, 32]])
    same(emb[3:9][[0, -1, 2]], table[3:9][[0, -1, 2]])
    same(emb.T[[1, 2]], table.T[[1, 2]])  # gather from a non-contiguous view
    same(emb[..., wgpar.tensor(np.array([[1], [2]]))], table[..., np.array([[1], [2]])])
    same(emb[np.array([], dtype=np.int64)], table[np.array([], dtype=np.int64)])
    i16 = wgpar.tensor(table.astype(np.float16)) if dev.has_f16 else None
    if i16 is not None:
        got = i16[ids[:2]].numpy()
        np.testing.assert_array_equal(got, table.astype(np.float16)[ids[:2]])
    ints = wgpar.tensor(np.arange(50, dtype=np.int32).reshape(10, 5))
    same(ints[[9, 0]], np.arange(50).reshape(10, 5)[[9, 0]])
    # an index computed on the device (no host copy of its values) is checked too
    dev_ids = wgpar.tensor(ids[0]).clamp(max=999)
    same(emb[dev_ids], table[ids[0]])


def test_index_out_of_range(dev, rng):
    x = wgpar.tensor(arr(rng, (5, 4)))
    with pytest.raises(IndexError, match="5"):
        x.index_select(0, [0, 5])
    with pytest.raises(IndexError):
        x[[-6]]
    with pytest.raises(IndexError):
        x[:, wgpar.tensor([4])]
    with pytest.raises(IndexError):
        x[wgpar.tensor(np.array([1, 2], np.int32)) * 10]  # values known only on the device
    with pytest.raises(TypeError):
        x[wgpar.tensor([0.5])]
    with pytest.raises(IndexError):  # a list of bools is a mask (as in PyTorch): it must match dim 0
        x[[True, False, True]]


@pytest.mark.parametrize("shapes,dim", [([(3, 4), (5, 4), (1, 4)], 0), ([(3, 4), (3, 1), (3, 7)], 1),
                                        ([(2, 3, 4), (2, 3, 1)], -1), ([(33,), (0,), (129,)], 0),
                                        ([(2, 0, 3), (2, 5, 3)], 1), ([(7,)], 0)])
def test_cat(dev, rng, shapes, dim):
    arrays = [arr(rng, s) for s in shapes]
    want = np.concatenate(arrays, axis=dim)
    same(wgpar.cat([wgpar.tensor(a) for a in arrays], dim), want)
    same(wgpar.cat([wgpar.tensor(a) for a in arrays], dim=dim), want)
    same(wgpar.concatenate(tuple(wgpar.tensor(a) for a in arrays), axis=dim), want)


def test_cat_of_views_and_mixed_dtypes(dev, rng):
    a = arr(rng, (5, 6))
    x = wgpar.tensor(a)
    same(wgpar.cat([x.T, x.T[::-1]], 1), np.concatenate([a.T, a.T[::-1]], 1))
    i = wgpar.tensor(np.arange(6, dtype=np.int32).reshape(1, 6))
    got = wgpar.cat([x, i])
    assert got.dtype is wgpar.float32
    same(got, np.concatenate([a, np.arange(6).reshape(1, 6)]).astype(np.float32))
    with pytest.raises(ValueError, match=r"\(5, 6\).*\(5, 7\)|\(5, 7\).*\(5, 6\)"):
        wgpar.cat([x, wgpar.zeros(5, 7)], 0)
    with pytest.raises(ValueError):
        wgpar.cat([])
    with pytest.raises(ValueError, match="zero-dimensional"):
        wgpar.cat([wgpar.tensor(1.0), wgpar.tensor(2.0)])


@pytest.mark.parametrize("shape", [(3,), (4, 5), (2, 1, 3), (0, 2)])
def test_stack_any_dim(dev, rng, shape):
    arrays = [arr(rng, shape) for _ in range(3)]
    for dim in range(-len(shape) - 1, len(shape) + 1):
        same(wgpar.stack([wgpar.tensor(a) for a in arrays], dim), np.stack(arrays, axis=dim))
    same(wgpar.stack([wgpar.tensor(a).T for a in arrays], axis=0), np.stack([a.T for a in arrays]))
    with pytest.raises(ValueError):
        wgpar.stack([wgpar.zeros(3), wgpar.zeros(4)])


def test_squeeze_unsqueeze_expand(dev, rng):
    a = arr(rng, (3, 1, 5, 1))
    x = wgpar.tensor(a)
    same(x.squeeze(), a.squeeze())
    same(x.squeeze(1), a.squeeze(1))
    same(x.squeeze(-1), a.squeeze(-1))
    same(x.squeeze(0), a)  # size 3: unchanged, like torch
    for d in range(-5, 5):
        same(x.unsqueeze(d), np.expand_dims(a, d))
    same(x.expand(2, 3, 4, 5, 6), np.broadcast_to(a, (2, 3, 4, 5, 6)))
    same(x.expand(-1, 7, -1, 2), np.broadcast_to(a, (3, 7, 5, 2)))
    with pytest.raises(ValueError):
        x.expand(3, 1, 4, 1)
    assert x.size() == (3, 1, 5, 1) and x.size(2) == 5 and x.size(-1) == 1 and len(x) == 3


def test_setitem(dev, rng):
    a = arr(rng, (7, 33))
    x = wgpar.tensor(a)
    want = a.astype(np.float64).copy()
    x[2] = 1.0
    want[2] = 1.0
    x[:, 5:9] = wgpar.tensor(a[:, :4])
    want[:, 5:9] = a[:, :4]
    x[::3, ::-4] = -2
    want[::3, ::-4] = -2
    x[1:3, None, 10] = wgpar.tensor(np.array([[7.0], [8.0]], np.float32))
    want[1:3, 10] = [7.0, 8.0]
    x[..., 0] = x[..., 1]
    want[..., 0] = want[..., 1]
    assert_close(x.numpy(), want)
    with pytest.raises(ValueError):
        x[0:2] = wgpar.zeros(3, 33)
    with pytest.raises(TypeError):
        x[[0, 1]] = 0.0


def test_index_changed_in_place_is_checked_again(dev):
    x = wgpar.arange(5).float()
    idx = wgpar.tensor([0, 1])
    idx += 10  # the range known from the upload is stale now
    with pytest.raises(IndexError, match="11"):
        x.index_select(0, idx)
    idx = wgpar.tensor([0, 1])
    idx[1] = 7
    with pytest.raises(IndexError, match="7"):
        x[idx]
    idx = wgpar.tensor([4, 9])
    idx.fill_(2)
    same(x[idx], np.array([2.0, 2.0], np.float32))
