"""Host interop: np.asarray(t) through __array__ (a device readback), len(), wgpar.from_numpy (a copy),
and DLPack refused with a clear error, against NumPy and (through the fixture) torch."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar


@pytest.mark.parametrize("shape", [(), (1,), (7,), (33, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_asarray_reads_back_values_and_dtype(shape, dtype, rng, dev):
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    t = wgpar.tensor(a, device=dev)
    got = np.asarray(t)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(np.array(t, dtype=np.float64), a.astype(np.float64))
    with pytest.raises(ValueError, match="always copies"):
        np.array(t, copy=False)


def test_asarray_of_views_and_empty(rng, dev):
    a = rng.standard_normal((6, 9)).astype(np.float32)
    t = wgpar.tensor(a)
    np.testing.assert_array_equal(np.asarray(t.T[1:, ::2]), a.T[1:, ::2])
    np.testing.assert_array_equal(np.asarray(t[2]), a[2])
    assert np.asarray(wgpar.zeros(0, 3)).shape == (0, 3)
    np.testing.assert_allclose(np.mean(np.asarray(t), axis=0), a.mean(axis=0), rtol=1e-6)


def test_len_follows_torch(dev):
    assert len(wgpar.zeros(4, 2)) == 4 and len(wgpar.zeros(0)) == 0
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(wgpar.tensor(3.0))


def test_from_numpy_copies(rng, dev):
    a = rng.standard_normal((3, 4))
    t = wgpar.from_numpy(a, device=dev)
    assert t.dtype is wgpar.float32 and t.device is dev
    a[0, 0] = 1e6  # no shared memory: the tensor keeps the value it was made with
    assert t.numpy()[0, 0] != 1e6
    assert "copy" in wgpar.from_numpy.__doc__


def test_dlpack_is_refused_with_the_way_out(dev):
    t = wgpar.ones(2, 3)
    for call in (t.__dlpack__, t.__dlpack_device__):
        with pytest.raises(BufferError, match=r"cannot be shared.*t\.numpy\(\)"):
            call()
    with pytest.raises(BufferError, match="WebGPU"):
        np.from_dlpack(t)


def test_torch_sees_the_clear_error_and_the_copy_works(rng, dev, torch):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    t = wgpar.tensor(a)
    for make in (torch.tensor, torch.as_tensor, torch.from_dlpack):  # all three go through __dlpack__
        with pytest.raises(BufferError, match=r"torch\.tensor\(t\.numpy\(\)\)"):
            make(t)
    np.testing.assert_array_equal(torch.tensor(t.numpy()).numpy(), a)
    np.testing.assert_array_equal(torch.from_numpy(np.asarray(t)).numpy(), a)
    assert torch.tensor(wgpar.tensor(2.5).item()).item() == 2.5
