"""What a PyTorch user types first behaves as in PyTorch, or refuses with an error that says why:
max / min with a dim, .cpu() and .to("cpu"), view of non-contiguous tensors, 64-bit dtypes, device
indices. Each case is compared with torch (CPU) where the behaviour is torch's."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar

from .helpers import assert_close

torch = pytest.importorskip("torch")


def _pair(rng, shape, requires_grad=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return wgpar.tensor(a, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


# -- max / min with a dim: the named tuple (values, indices) ----------------------------------------
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((5, 13), 1), ((5, 13), 0), ((3, 1, 29), -1), ((4, 33, 6), 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_return_values_and_indices(rng, op, shape, dim, keepdim):
    x, tx = _pair(rng, shape, requires_grad=True)
    got = getattr(x, op)(dim=dim, keepdim=keepdim)
    want = getattr(tx, op)(dim=dim, keepdim=keepdim)
    assert type(got).__name__ == op and got._fields == ("values", "indices")
    values, indices = got  # unpacks into exactly two
    assert values is got.values and indices is got.indices and got[0] is values
    assert values.shape == tuple(want.values.shape) and indices.shape == tuple(want.indices.shape)
    assert indices.dtype is wgpar.int32
    assert_close(values.numpy(), want.values.detach().numpy(), rtol=0, atol=0)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    # the values keep autograd; the gradient goes to the picked entries only, as in torch
    w = rng.standard_normal(tuple(want.values.shape)).astype(np.float32)
    (values * wgpar.tensor(w)).sum().backward()
    (want.values * torch.tensor(w)).sum().backward()
    assert_close(x.grad.numpy(), tx.grad.numpy(), rtol=0, atol=0)
    # the same through the positional form and the top-level function
    for alt in (getattr(x, op)(dim, keepdim), getattr(wgpar, op)(x, dim, keepdim), getattr(wgpar, op)(x, dim=dim)):
        np.testing.assert_array_equal(alt.indices.numpy().reshape(-1), want.indices.numpy().reshape(-1))


def test_max_min_with_dim_on_ties_and_nan():
    data = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
    x, tx = wgpar.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    for op in ("max", "min"):
        got, want = getattr(x, op)(1), getattr(tx, op)(1)
        np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    x.max(dim=1).values.sum().backward()
    tx.max(dim=1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())  # one index per row, even on ties


def test_max_without_dim_stays_a_0d_tensor(rng):
    x, tx = _pair(rng, (6, 11), requires_grad=True)
    for op in ("max", "min"):
        got = getattr(x, op)()
        assert isinstance(got, wgpar.Tensor) and got.shape == ()
        assert got.item() == getattr(tx, op)().item()
        assert getattr(wgpar, op)(x).item() == got.item()
    data = np.array([1.0, 4.0, 4.0, 2.0], np.float32)
    x, tx = wgpar.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    x.max().backward()
    tx.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())  # split over the ties, as torch


def test_max_of_two_tensors_and_amax(rng):
    (a, ta), (b, tb) = _pair(rng, (4, 5)), _pair(rng, (4, 5))
    np.testing.assert_array_equal(wgpar.max(a, b).numpy(), torch.max(ta, tb).numpy())
    np.testing.assert_array_equal(wgpar.min(a, b).numpy(), torch.min(ta, tb).numpy())
    x, tx = _pair(rng, (3, 4, 5), requires_grad=True)
    got, want = x.amax(dim=(0, 2), keepdim=True), tx.amax(dim=(0, 2), keepdim=True)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(wgpar.amin(x, 1).numpy(), torch.amin(tx, 1).detach().numpy())
    with pytest.raises(TypeError, match="amax"):
        x.max(dim=(0, 1))


# -- the CPU story: wgpar has no host tensor, and says so -------------------------------------------
def test_cpu_raises_and_names_numpy(rng):
    x, _ = _pair(rng, (3, 4), requires_grad=True)
    for call in (lambda: x.cpu(), lambda: x.detach().cpu().numpy()):
        with pytest.raises(TypeError) as info:
            call()
        assert isinstance(info.value, wgpar.HostDeviceError)
        msg = str(info.value)
        assert ".numpy()" in msg and ".tolist()" in msg and ".item()" in msg, msg
    assert_close(x.detach().numpy(), x.numpy())  # what torch's .detach().cpu().numpy() gives


@pytest.mark.parametrize("spelling", ["cpu", "cpu:0", torch.device("cpu")])
def test_to_cpu_says_why_not_dtype(rng, spelling):
    x, _ = _pair(rng, (2, 3))
    for call in (lambda: x.to(spelling), lambda: x.to(device=spelling), lambda: wgpar.zeros(2, device=spelling),
                 lambda: wgpar.nn.Linear(2, 2).to(spelling)):
        with pytest.raises(wgpar.HostDeviceError) as info:  # a TypeError and a ValueError
            call()
        msg = str(info.value)
        assert "dtype" not in msg and ".numpy()" in msg and "'wgpu:N'" in msg, msg
    with pytest.raises(ValueError, match="not a wgpar device"):
        x.to(torch.device("cuda", 1))


# -- view: never a copy; raises where torch raises --------------------------------------------------
@pytest.mark.parametrize("make,shape", [
    (lambda t: t.transpose(0, 1), (-1,)),            # flattening a transpose
    (lambda t: t.transpose(0, 1), (3, 2, 4, 5)),        # splits a dim: a view
    (lambda t: t[:, ::2], (-1,)),                      # strided columns
    (lambda t: t.permute(2, 0, 1), (5, 24)),            # merges contiguous trailing dims: a view
    (lambda t: t.permute(2, 0, 1), (20, 6)),
    (lambda t: t[1:3], (2, 30)),                        # a contiguous slice
    (lambda t: t[:, 1:4], (-1, 5)),                     # merges nothing across the gap
    (lambda t: t.expand(2, 4, 6, 5), (8, 30)),          # a broadcast view
    (lambda t: t[:, :1], (4, 5)),                       # drops a size-1 dim
])
def test_view_matches_torch(rng, make, shape):
    a = rng.standard_normal((4, 6, 5)).astype(np.float32)
    x, tx = make(wgpar.tensor(a, requires_grad=True)), make(torch.tensor(a))
    try:
        want = tx.view(shape)
    except RuntimeError:
        with pytest.raises(RuntimeError, match=r"reshape\(") as info:
            x.view(shape)
        assert str(tuple(x.shape)) in str(info.value)
        np.testing.assert_array_equal(x.reshape(shape).numpy(), tx.reshape(shape).numpy())  # reshape copies
        return
    got = x.view(shape)
    assert got.untyped_storage() is x.untyped_storage()  # a view, never a copy
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    got.sum().backward()


def test_view_dtype_is_refused(rng):
    x, _ = _pair(rng, (2, 3))
    with pytest.raises(TypeError, match=r"to\(dtype\)"):
        x.view(wgpar.int32)


# -- dtypes wgpar lacks: the nearest one, with a warning once per dtype ------------------------------
@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which dtype warnings were shown, so this test sees the first one."""
    monkeypatch.setattr(wgpar.dtypes, "_warned", set())


@pytest.mark.parametrize("spelling,name,want", [
    ("float64", "float64", "float32"), (np.float64, "float64", "float32"), ("double", "float64", "float32"),
    (torch.float64, "float64", "float32"), ("bfloat16", "bfloat16", "float32"), (torch.bfloat16, "bfloat16", "float32"),
    ("int64", "int64", "int32"), (np.int64, "int64", "int32"), ("long", "int64", "int32"),
    (torch.long, "int64", "int32"), (np.uint8, "uint8", "int32"), (np.int16, "int16", "int32"),
])
def test_missing_dtypes_warn_once_and_narrow(fresh_warnings, spelling, name, want):
    calls = [lambda: wgpar.zeros(3, dtype=spelling), lambda: wgpar.tensor([1, 2], dtype=spelling),
             lambda: wgpar.ones(2).to(spelling), lambda: wgpar.ones(2).to(dtype=spelling),
             lambda: wgpar.arange(3, dtype=spelling)]
    with pytest.warns(wgpar.DTypeWarning, match=f"no {name}: it gives {want}") as record:
        out = calls[0]()
    assert out.dtype.name == want
    assert record[0].filename == __file__  # names the caller's line, not wgpar's
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time and after: silent
        for call in calls:
            assert call().dtype.name == want


def test_exact_dtypes_and_data_conversion_are_silent(fresh_warnings):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", wgpar.DTypeWarning)
        for spelling in ("float32", "float", "int32", "int", "bool", float, int, bool, np.float32, np.int32, np.bool_,
                         torch.float32, torch.int32, torch.bool, wgpar.float32, wgpar.int32):
            wgpar.zeros(2, dtype=spelling)
        # data converts on the way in without a word: NumPy float64 to float32, int64 (range-checked) to int32
        assert wgpar.tensor(np.ones(3)).dtype is wgpar.float32
        assert wgpar.tensor(np.arange(3)).dtype is wgpar.int32


def test_conversion_methods_match_torch(fresh_warnings, rng):
    a = (rng.standard_normal((5, 7)) * 100).astype(np.float32)
    x, tx = wgpar.tensor(a), torch.tensor(a)
    np.testing.assert_array_equal(x.int().numpy(), tx.int().numpy())
    np.testing.assert_array_equal(x.float().numpy(), tx.float().numpy())
    assert x.float() is x
    with pytest.warns(wgpar.DTypeWarning, match="int64"):
        long = x.long()
    assert long.dtype is wgpar.int32
    np.testing.assert_array_equal(long.numpy(), tx.long().numpy())
    if x.device.has_f16:
        np.testing.assert_array_equal(x.half().numpy(), tx.half().numpy())


def test_missing_dtype_attributes_say_why():
    for name in ("float64", "double", "int64", "long"):
        with pytest.raises(AttributeError, match="float32, float16, int32 and bool"):
            getattr(wgpar, name)
    with pytest.raises(TypeError, match="float32, float16, int32 and bool"):
        wgpar.zeros(2, dtype=np.complex64)


# -- devices: "wgpu:N" everywhere; an index past the adapters and the devices made is an error -------
def test_device_spellings_agree(dev):
    for spelling in ("wgpu", "wgpu:0", 0, np.int64(0), dev):
        assert wgpar.device(spelling) is dev
        assert wgpar.zeros(1, device=spelling).device is dev


def test_device_index_past_the_adapters_is_an_error(dev):
    n_adapters = len(wgpar.adapter_names())
    made = len(wgpar.runtime.initialized_devices())
    for call in (lambda: wgpar.device(99), lambda: wgpar.device("wgpu:99"), lambda: wgpar.zeros(1, device=99),
                 lambda: wgpar.ones(2).to("wgpu:99")):
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert "wgpar.device(99)" in msg and f"{n_adapters} adapter" in msg and "wgpar.devices(100)" in msg, msg
        assert wgpar.adapter_names()[0] in msg
    assert len(wgpar.runtime.initialized_devices()) == made  # nothing was made
    # devices(n) makes logical devices; afterwards device(i) (and "wgpu:i") names them
    devs = wgpar.devices(n_adapters + 1)
    assert wgpar.device(n_adapters) is devs[-1] and wgpar.device(f"wgpu:{n_adapters}") is devs[-1]
    assert devs[-1].adapter_name == devs[0].adapter_name and devs[-1] is not devs[0]
