"""Tensor API: factories, attributes, host interop (numpy, __array__, item, tolist), repr, to(device), seeding."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import wgpar

from .helpers import SIZES, assert_close


def test_tensor_from_data(dev, rng):
    a = rng.standard_normal((3, 7)).astype(np.float32)
    t = wgpar.tensor(a)
    assert t.shape == (3, 7) and t.ndim == 2 and t.numel() == 21 and t.dtype is wgpar.float32
    assert t.device is dev and t.nbytes == 84 and len(t) == 3
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.requires_grad is False
    s = wgpar.tensor(2.5)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1 and s.item() == 2.5
    lst = wgpar.tensor([[1, 2, 3], [4, 5, 6]])
    assert lst.dtype is wgpar.int32 and lst.tolist() == [[1, 2, 3], [4, 5, 6]]
    fl = wgpar.tensor([0.5, -1.25])
    assert fl.dtype is wgpar.float32 and fl.tolist() == [0.5, -1.25]
    b = wgpar.tensor([True, False])
    assert b.dtype is wgpar.bool_ and b.tolist() == [True, False]
    d64 = wgpar.tensor(a.astype(np.float64))
    assert d64.dtype is wgpar.float32
    np.testing.assert_array_equal(d64.numpy(), a)
    e = wgpar.tensor([])
    assert e.shape == (0,) and e.numpy().shape == (0,)


def test_tensor_keywords(dev, rng):
    a = rng.standard_normal(5)
    t = wgpar.tensor(a, device=dev, dtype=wgpar.float16, requires_grad=True)
    assert t.dtype is wgpar.float16 and t.requires_grad and t.device is dev
    assert_close(t.numpy(), a.astype(np.float16), rtol=0, atol=0)
    i = wgpar.tensor([1.9, -2.9], dtype="int32")
    assert i.dtype is wgpar.int32 and i.tolist() == [1, -2]
    f = wgpar.tensor([1, 2], dtype=float)
    assert f.dtype is wgpar.float32 and f.tolist() == [1.0, 2.0]
    copy = wgpar.tensor(t)
    assert copy._storage is not t._storage and copy.dtype is wgpar.float16
    np.testing.assert_array_equal(copy.numpy(), t.numpy())


def test_from_numpy(dev, rng):
    a = rng.standard_normal((8, 6)).astype(np.float32)
    for src in (a, a[::2].T, a[::-1, 1:4], np.asfortranarray(a)):
        t = wgpar.from_numpy(src)
        np.testing.assert_array_equal(t.numpy(), src)
        assert t.is_contiguous()
    h = wgpar.from_numpy(a.astype(np.float16))
    assert h.dtype is wgpar.float16


@pytest.mark.parametrize("n", SIZES + (0,))
def test_factories(dev, n):
    for shape_args in ((n,), ((n, 3),), (n, 3)):
        shape = shape_args[0] if isinstance(shape_args[0], tuple) else shape_args
        z, o = wgpar.zeros(*shape_args), wgpar.ones(*shape_args)
        assert z.shape == shape and o.shape == shape and z.dtype is wgpar.float32
        np.testing.assert_array_equal(z.numpy(), np.zeros(shape))
        np.testing.assert_array_equal(o.numpy(), np.ones(shape))
    f = wgpar.full((n, 2), 1.5)
    assert f.dtype is wgpar.float32
    np.testing.assert_array_equal(f.numpy(), np.full((n, 2), 1.5))
    fi = wgpar.full((2, n), -7)
    assert fi.dtype is wgpar.int32
    np.testing.assert_array_equal(fi.numpy(), np.full((2, n), -7))
    fe = wgpar.full(n, 3.0, dtype=wgpar.float16)
    assert fe.dtype is wgpar.float16 and fe.shape == (n,)
    np.testing.assert_array_equal(fe.numpy(), np.full(n, 3.0, np.float16))
    assert wgpar.empty(n, 2).shape == (n, 2)
    oi = wgpar.ones(n, dtype=wgpar.int32)
    assert oi.dtype is wgpar.int32 and oi.numpy().sum() == n
    zl = wgpar.zeros_like(oi)
    assert zl.dtype is wgpar.int32 and zl.shape == (n,) and not zl.numpy().any()
    ol = wgpar.ones_like(f, dtype=wgpar.float16)
    assert ol.dtype is wgpar.float16 and ol.shape == (n, 2)
    assert wgpar.zeros(n, requires_grad=True).requires_grad


@pytest.mark.parametrize("args,kw", [((5,), {}), ((1, 10, 3), {}), ((10, 1, -2), {}), ((0, 1, 0.1), {}),
                                     ((5,), {"dtype": wgpar.float32}), ((-3.5, 2.0), {}), ((0,), {}),
                                     ((1000,), {})])
def test_arange(dev, args, kw):
    t = wgpar.arange(*args, **kw)
    want = np.arange(*args)
    assert t.shape == want.shape
    if kw.get("dtype") is wgpar.float32 or want.dtype.kind == "f":
        assert t.dtype is wgpar.float32
        assert_close(t.numpy(), want, rtol=1e-6)
    else:
        assert t.dtype is wgpar.int32
        np.testing.assert_array_equal(t.numpy(), want)


def test_random_and_manual_seed(dev):
    wgpar.manual_seed(1234)
    a, b = wgpar.rand(33, 7).numpy(), wgpar.randn(1000).numpy()
    wgpar.manual_seed(1234)
    a2, b2 = wgpar.rand(33, 7).numpy(), wgpar.randn(1000).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    wgpar.manual_seed(99)
    assert not np.array_equal(wgpar.rand(33, 7).numpy(), a)
    assert not np.array_equal(wgpar.rand(33, 7).numpy(), wgpar.rand(33, 7).numpy())
    u = wgpar.rand(20000).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    n = wgpar.randn(20000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    h = wgpar.randn(3, 4, dtype=wgpar.float16)
    assert h.dtype is wgpar.float16 and h.shape == (3, 4)
    assert wgpar.rand((2, 3)).shape == (2, 3) and wgpar.randn(2, 3, requires_grad=True).requires_grad
    r = wgpar.randint(3, 9, size=(50,))
    assert r.dtype is wgpar.int32 and r.numpy().min() >= 3 and r.numpy().max() < 9


def test_rng_stream_is_per_thread_and_leaves_the_global_generator_alone(dev):
    import threading

    wgpar.manual_seed(5)
    plain = wgpar.rand(4).numpy()
    wgpar.manual_seed(5)
    with wgpar.rng_stream([7, 1]):
        a = wgpar.randn(6).numpy()
        mask = wgpar.nn.functional.dropout(wgpar.ones(64), 0.5).numpy()
    np.testing.assert_array_equal(wgpar.rand(4).numpy(), plain)  # the global stream did not move
    got = {}

    def other():
        with wgpar.rng_stream([7, 1]):
            got["a"] = wgpar.randn(6).numpy()
            got["mask"] = wgpar.nn.functional.dropout(wgpar.ones(64), 0.5).numpy()

    t = threading.Thread(target=other)
    t.start()
    wgpar.rand(1000)  # draws on this thread meanwhile do not disturb the other thread's stream
    t.join()
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["mask"], mask)
    with wgpar.rng_stream(8):
        assert not np.array_equal(wgpar.randn(6).numpy(), a)


def test_numpy_and_array_protocol(dev, rng):
    a = rng.standard_normal((7, 33)).astype(np.float32)
    t = wgpar.tensor(a)
    got = t.numpy()
    got[0, 0] = 1e6  # a copy: the tensor is unchanged
    assert t[0, 0].item() == a[0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy 2 warns when __array__ lacks dtype/copy
        np.testing.assert_array_equal(np.asarray(t), a)
        d = np.asarray(t, dtype=np.float64)
        assert d.dtype == np.float64 and np.array_equal(d, a)
        c = np.array(t, copy=True)
        assert c.dtype == np.float32 and np.array_equal(c, a)
        np.testing.assert_array_equal(np.asarray(t.T[::2]), a.T[::2])
        assert_close(np.exp(np.asarray(t)), np.exp(a))
    with pytest.raises(ValueError):
        np.array(t, copy=False)  # the values live on the GPU: a copy is always needed


def test_item_tolist_scalars(dev):
    assert wgpar.tensor([[3.5]]).item() == 3.5
    assert isinstance(wgpar.tensor([7]).item(), int) and wgpar.tensor([7]).item() == 7
    assert wgpar.tensor([True]).item() is True
    assert float(wgpar.tensor(2.0)) == 2.0 and int(wgpar.tensor(3)) == 3 and bool(wgpar.tensor(1))
    assert wgpar.arange(6).reshape(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert wgpar.tensor(1.5).tolist() == 1.5
    with pytest.raises(ValueError):
        wgpar.zeros(2).item()


def test_repr_shows_values(dev):
    r = repr(wgpar.tensor([1.5, -2.25, 3.0]))
    assert "1.5" in r and "-2.25" in r and r.startswith("tensor(")
    ri = repr(wgpar.tensor([[1, 2], [3, 4]]))
    assert "int32" in ri and "[3, 4]" in ri
    assert "requires_grad=True" in repr(wgpar.ones(2, requires_grad=True))
    big = repr(wgpar.arange(10000))
    assert "..." in big and len(big) < 2000
    assert "[]" in repr(wgpar.zeros(0))


@pytest.mark.multidevice
def test_to_device_and_dtype(devs2, rng):
    d0, d1 = devs2
    a = rng.standard_normal((5, 129)).astype(np.float32)
    t = wgpar.tensor(a, device=d0)
    for spelling in (d1, 1, "wgpu:1"):
        u = t.to(spelling)
        assert u.device is d1 and u._storage is not t._storage
        np.testing.assert_array_equal(u.numpy(), a)
    assert t.to(d0) is t and t.to(0) is t
    v = t.T[::2].to(d1)  # non-contiguous source
    np.testing.assert_array_equal(v.numpy(), a.T[::2])
    h = t.to(d1, dtype=wgpar.float16)
    assert h.device is d1 and h.dtype is wgpar.float16
    assert_close(h.numpy(), a.astype(np.float16), rtol=0, atol=0)
    assert t.to("float16").dtype is wgpar.float16 and t.to(wgpar.int32).dtype is wgpar.int32
    assert t.half().float().dtype is wgpar.float32
    b = wgpar.tensor([True, False], device=d0).to(d1)
    assert b.dtype is wgpar.bool_ and b.tolist() == [True, False]


def test_top_level_names_exist():
    for name in ("softmax", "log_softmax", "cat", "stack", "where", "matmul", "tensor", "from_numpy", "zeros",
                 "ones", "full", "arange", "rand", "randn", "manual_seed", "devices", "device", "memory_stats",
                 "empty_cache", "reset_peak_memory_stats", "OutOfMemoryError", "BindingLimitError",
                 "DeviceMismatchError", "float32", "float16", "int32", "bool_"):
        assert callable(getattr(wgpar, name)) or isinstance(getattr(wgpar, name), wgpar.DType), name
    assert issubclass(wgpar.OutOfMemoryError, MemoryError)
    assert issubclass(wgpar.DeviceMismatchError, ValueError)


def test_full_infers_bool_and_float_dtypes():
    assert wgpar.full((2, 3), True).dtype is wgpar.bool_
    np.testing.assert_array_equal(wgpar.full((2, 3), True).numpy(), np.ones((2, 3), bool))
    assert wgpar.full((2,), 1.5).dtype is wgpar.float32
    assert wgpar.full((2,), 7).dtype is wgpar.int32


def test_setitem_with_host_values(rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    t = wgpar.tensor(a)
    block = rng.standard_normal((2, 3))
    t[1:3, ::3] = block
    a[1:3, ::3] = block
    t[4] = [float(i) for i in range(7)]
    a[4] = np.arange(7)
    np.testing.assert_array_equal(t.numpy(), a)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        t[0:2, 0:2] = block


def test_arange_step_zero_is_a_clear_error(dev):
    for args in ((0, 10, 0), (1.0, 2.0, 0.0), (5, 0, 0)):
        with pytest.raises(ValueError, match="step must be nonzero"):
            wgpar.arange(*args)
