"""Index, target and integer ranges are checked before anything is narrowed to int32.

Out-of-range values raise IndexError naming the value and the size; negatives follow PyTorch:
index_select, embedding and class targets reject them, advanced indexing counts from the end.
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F

# values that wrap to small valid indices when narrowed to int32 (2**32 + 1 -> 1, 2**32 -> 0, ...)
WRAPPING = [2**32 + 1, 2**32, -(2**32) + 2, 2**31, 2**63 - 1, -(2**63)]


def _x(rng, shape=(5, 3)):
    return wgpar.tensor(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("value", WRAPPING)
@pytest.mark.parametrize("how", ["index_select", "index_select_list", "getitem_array", "getitem_list",
                                 "getitem_dim1", "embedding", "embedding_module"])
def test_indices_past_int32_raise_naming_value_and_size(dev, rng, value, how):
    x = _x(rng)
    n = 3 if how == "getitem_dim1" else 5
    idx = np.array([0, value, 1], dtype=np.uint64 if value >= 2**63 else np.int64)
    calls = {
        "index_select": lambda: x.index_select(0, idx),
        "index_select_list": lambda: wgpar.index_select(x, 0, [int(v) for v in idx]),
        "getitem_array": lambda: x[idx],
        "getitem_list": lambda: x[[int(v) for v in idx]],
        "getitem_dim1": lambda: x[:, idx],
        "embedding": lambda: F.embedding(idx.reshape(1, 3), x),
        "embedding_module": lambda: _embedding(x)(idx),
    }
    with pytest.raises(IndexError) as info:
        calls[how]()
    msg = str(info.value)
    assert str(value) in msg and f"size {n}" in msg, msg


def _embedding(x):
    emb = wgpar.nn.Embedding(*x.shape)
    with wgpar.no_grad():
        emb.weight.copy_(x)
    return emb


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("idx", [[-1], [0, -1], [-1, -1, 0], [-8], [7], [6, 0, -1], [-7, 3]])
def test_negative_indices_follow_torch(dev, rng, n, idx, reference):
    """torch's rules, as NumPy (a[idx] counts negatives from the end, IndexError outside [-n, n); the
    selection functions take [0, n) only) or as torch itself."""
    a = rng.standard_normal((n, 6)).astype(np.float32)
    x = wgpar.tensor(a)
    i32 = wgpar.tensor(np.array(idx, np.int32))
    if reference is None:
        advanced, select = (lambda: a[idx]), (lambda: _np_select(a, idx))
        embedding = select
    else:
        torch = reference
        t, i64 = torch.tensor(a), torch.tensor(idx, dtype=torch.int64)
        advanced, select = (lambda: t[idx].numpy()), (lambda: torch.index_select(t, 0, i64).numpy())
        embedding = lambda: torch.nn.functional.embedding(i64, t).numpy()  # noqa: E731
    # advanced indexing (a list, an array, an int32 tensor) counts negatives from the end
    for key in (idx, np.array(idx), i32):
        _same_as(advanced, lambda: x[key], n)  # noqa: B023  (called at once)
    cols = [i % 6 - 6 for i in idx]
    np.testing.assert_array_equal(x[:, cols].numpy(), a[:, cols])
    # index_select and embedding take [0, n) only
    _same_as(select, lambda: x.index_select(0, idx), n)
    _same_as(select, lambda: x.index_select(0, i32), n)
    _same_as(embedding, lambda: F.embedding(np.array(idx), x), n)


def _np_select(a, idx):
    if any(not 0 <= i < len(a) for i in idx):
        raise IndexError(f"index out of range for size {len(a)}")
    return a[idx]


def _same_as(fn_ref, fn_wgpar, n):
    """wgpar gives the reference's result, or raises IndexError naming the size where the reference fails."""
    try:
        want = fn_ref()
    except (IndexError, RuntimeError):
        with pytest.raises(IndexError, match=f"size {n}"):
            fn_wgpar()
    else:
        np.testing.assert_array_equal(fn_wgpar().numpy(), want)


def test_index_computed_on_the_device_is_checked_once(dev, rng):
    x = _x(rng)
    idx = wgpar.tensor(np.array([1, 2], np.int32)) - 3  # [-2, -1], values known only on the device
    with pytest.raises(IndexError, match="-2"):
        x.index_select(0, idx)
    np.testing.assert_array_equal(x[idx].numpy(), x.numpy()[[-2, -1]])
    assert idx._host_range == (-2, -1)  # the readback's range is remembered ...
    idx += 10
    assert idx._host_range is None  # ... until the next in-place write
    with pytest.raises(IndexError, match="9"):
        x[idx]


def test_a_reshape_keeps_the_known_range(dev):
    idx = wgpar.tensor(np.array([[0, 4], [2, 1]], np.int32))
    assert idx.reshape(-1)._host_range == (0, 4)  # the same values, so the same range
    flat = idx.reshape(-1)
    idx += 1
    assert flat._host_range is None  # the view's storage was written


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("bad,as_tensor", [(-1, False), (-100, False), (3, False), (2**32, False),
                                           (2**32 + 1, False), (-(2**32) + 1, False), (2**40, False),
                                           (-1, True), (-100, True), (3, True), (2**31 - 1, True)])
def test_class_targets_out_of_range_raise(dev, rng, loss, bad, as_tensor):
    z = rng.standard_normal((4, 3)).astype(np.float32)
    target = np.array([0, 1, bad, 2], dtype=np.int64)
    if as_tensor:  # computed on the device: no range known on the host
        target = wgpar.tensor(target.astype(np.int32)) * 1
    fn = getattr(F, loss)
    logits = wgpar.tensor(z)
    with pytest.raises(IndexError) as info:
        # -100 is torch's default ignore_index (ignored, tests/test_losses.py); with another it is a bad target
        fn(logits if loss == "cross_entropy" else logits.log_softmax(-1), target, ignore_index=-7)
    msg = str(info.value)
    assert str(bad) in msg and "3 classes" in msg and loss in msg, msg


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("bad", [-1, 3, 2**40])  # not -100: torch's default ignore_index
def test_torch_refuses_those_targets_too(rng, loss, bad, torch):
    z = rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises((IndexError, RuntimeError)):
        getattr(torch.nn.functional, loss)(torch.tensor(z), torch.tensor(np.array([0, 1, bad, 2])))


def test_valid_targets_still_match(dev, rng, reference):
    """Every spelling of valid targets gives the loss: -mean(log_softmax(z)[i, t_i]) and -mean(z[i, t_i])."""
    z = rng.standard_normal((33, 7)).astype(np.float32)
    tgt = rng.integers(0, 7, 33)
    if reference is None:
        z64, rows = z.astype(np.float64), np.arange(33)
        logp = z64 - z64.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        want = {"cross_entropy": -logp[rows, tgt].mean(), "nll_loss": -z64[rows, tgt].mean()}
    else:
        want = {k: getattr(reference.nn.functional, k)(reference.tensor(z), reference.tensor(tgt)).item()
                for k in ("cross_entropy", "nll_loss")}
    for t in (tgt, tgt.astype(np.uint8), list(tgt), wgpar.tensor(tgt.astype(np.int32))):
        for loss, w in want.items():
            got = getattr(F, loss)(wgpar.tensor(z), t).item()
            assert abs(got - w) < 1e-5 * max(1.0, abs(w)), loss


def test_setitem_and_integer_keys_past_int32(dev):
    x = wgpar.zeros(5, 3)
    for key in (np.int64(2**32), np.int64(2**32 + 1), (0, np.uint64(2**63)), np.int64(-(2**32) + 1)):
        with pytest.raises(IndexError):
            x[key] = 1.0
        with pytest.raises(IndexError):
            x[key]
    x[np.int64(-1)] = 2.0
    np.testing.assert_array_equal(x.numpy()[-1], [2.0, 2.0, 2.0])


def test_randint_range_is_checked_before_narrowing(dev):
    for low, high in ((2**31, 2**31 + 5), (0, 2**31 + 1), (-(2**31) - 1, 0), (5, 5), (2**32, 2**32 + 3)):
        with pytest.raises(ValueError, match="randint"):
            wgpar.randint(low, high, size=(4,))
    r = wgpar.randint(-(2**31), 2**31, size=(1000,)).numpy()
    assert r.dtype == np.int32 and r.shape == (1000,)
    assert r.min() < -(2**29) and r.max() > 2**29  # the whole int32 range, not a wrapped part of it
    r = wgpar.randint(7, size=(3, 4)).numpy()
    assert r.shape == (3, 4) and r.min() >= 0 and r.max() < 7


def test_int64_data_past_int32_is_refused(dev):
    for data in (np.array([0, 2**31]), np.array([-(2**31) - 1]), np.array([2**32 + 1]), [2**40],
                 np.array([2**63], dtype=np.uint64)):
        with pytest.raises(ValueError, match="int32"):
            wgpar.tensor(data)
        with pytest.raises(ValueError, match="int32"):
            wgpar.from_numpy(np.asarray(data))
    with pytest.raises(ValueError, match="int32"):
        wgpar.arange(2**31 - 2, 2**31 + 2)
    with pytest.raises(ValueError, match="int32"):
        wgpar.arange(2**32, 2**32 + 3)
    np.testing.assert_array_equal(wgpar.arange(2**31 - 3, 2**31).numpy(), np.arange(2**31 - 3, 2**31))
