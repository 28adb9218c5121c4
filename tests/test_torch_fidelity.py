"""What a PyTorch user types first behaves as in PyTorch, or refuses with an error that says why:
max / min with a dim, .cpu() and .to("cpu"), view of non-contiguous tensors, 64-bit dtypes, device
indices. Each case states torch's behaviour (NumPy float64 values, literal results for ties, NaN and
which views exist) and, where torch is installed, is compared with torch (CPU) itself."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import wgpar

from .helpers import assert_close


def _arr(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _max_min_want(reference, a, op, dim, keepdim, w):
    """(values, indices, gradient of sum(w * values)): NumPy's (first index of the extreme; random floats
    have no ties) or torch's."""
    if reference is not None:
        torch = reference
        tx = torch.tensor(a, requires_grad=True)
        want = getattr(tx, op)(dim=dim, keepdim=keepdim)
        (want.values * torch.tensor(w)).sum().backward()
        return want.values.detach().numpy(), want.indices.numpy(), tx.grad.numpy()
    indices = (np.argmax if op == "max" else np.argmin)(a, axis=dim, keepdims=True)
    values = np.take_along_axis(a, indices, dim)
    grad = np.zeros(a.shape)
    np.put_along_axis(grad, indices, w if keepdim else np.expand_dims(w, dim), dim)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices, grad


# -- max / min with a dim: the named tuple (values, indices) ----------------------------------------
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((5, 13), 1), ((5, 13), 0), ((3, 1, 29), -1), ((4, 33, 6), 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_return_values_and_indices(rng, op, shape, dim, keepdim, reference):
    a = _arr(rng, shape)
    x = wgpar.tensor(a, requires_grad=True)
    got = getattr(x, op)(dim=dim, keepdim=keepdim)
    assert type(got).__name__ == op and got._fields == ("values", "indices")
    values, indices = got  # unpacks into exactly two
    assert values is got.values and indices is got.indices and got[0] is values
    w = rng.standard_normal(values.shape).astype(np.float32)
    want_values, want_indices, want_grad = _max_min_want(reference, a, op, dim, keepdim, w)
    assert values.shape == want_values.shape and indices.shape == want_indices.shape
    assert indices.dtype is wgpar.int32
    assert_close(values.numpy(), want_values, rtol=0, atol=0)
    np.testing.assert_array_equal(indices.numpy(), want_indices)
    # the values keep autograd; the gradient goes to the picked entries only, as in torch
    (values * wgpar.tensor(w)).sum().backward()
    assert_close(x.grad.numpy(), want_grad, rtol=0, atol=0)
    # the same through the positional form and the top-level function
    for alt in (getattr(x, op)(dim, keepdim), getattr(wgpar, op)(x, dim, keepdim), getattr(wgpar, op)(x, dim=dim)):
        np.testing.assert_array_equal(alt.indices.numpy().reshape(-1), want_indices.reshape(-1))


TIES_AND_NAN = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [2.0, 2.0, 2.0, 2.0]], np.float32)


def test_max_min_with_dim_on_ties_and_nan():
    """torch's answers: the first index on ties, NaN wins (its first index), one index per row in backward."""
    x = wgpar.tensor(TIES_AND_NAN, requires_grad=True)
    want = {"max": ([3, np.nan, 2], [1, 0, 0]), "min": ([0, np.nan, 2], [3, 0, 0])}
    for op, (values, indices) in want.items():
        got = getattr(x, op)(1)
        np.testing.assert_array_equal(got.values.numpy(), np.array(values, np.float32))
        np.testing.assert_array_equal(got.indices.numpy(), indices)
    x.max(dim=1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.eye(4)[[1, 0, 0]])


def test_max_min_with_dim_on_ties_and_nan_like_torch(torch):
    x, tx = wgpar.tensor(TIES_AND_NAN, requires_grad=True), torch.tensor(TIES_AND_NAN, requires_grad=True)
    for op in ("max", "min"):
        got, want = getattr(x, op)(1), getattr(tx, op)(1)
        np.testing.assert_array_equal(got.values.numpy(), want.values.detach().numpy())
        np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    x.max(dim=1).values.sum().backward()
    tx.max(dim=1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


def test_max_without_dim_stays_a_0d_tensor(rng):
    a = _arr(rng, (6, 11))
    x = wgpar.tensor(a, requires_grad=True)
    for op in ("max", "min"):
        got = getattr(x, op)()
        assert isinstance(got, wgpar.Tensor) and got.shape == ()
        assert got.item() == getattr(a, op)()
        assert getattr(wgpar, op)(x).item() == got.item()
    x = wgpar.tensor(np.array([1.0, 4.0, 4.0, 2.0], np.float32), requires_grad=True)
    x.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 0.5, 0.0])  # split over the ties, as torch


def test_max_without_dim_like_torch(torch):
    data = np.array([1.0, 4.0, 4.0, 2.0], np.float32)
    x, tx = wgpar.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    x.max().backward()
    tx.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


def test_max_of_two_tensors_and_amax(rng):
    a, b = _arr(rng, (4, 5)), _arr(rng, (4, 5))
    np.testing.assert_array_equal(wgpar.max(wgpar.tensor(a), wgpar.tensor(b)).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal(wgpar.min(wgpar.tensor(a), wgpar.tensor(b)).numpy(), np.minimum(a, b))
    c = _arr(rng, (3, 4, 5))
    x = wgpar.tensor(c, requires_grad=True)
    np.testing.assert_array_equal(x.amax(dim=(0, 2), keepdim=True).numpy(), c.max(axis=(0, 2), keepdims=True))
    np.testing.assert_array_equal(wgpar.amin(x, 1).numpy(), c.min(axis=1))
    with pytest.raises(TypeError, match="amax"):
        x.max(dim=(0, 1))


def test_max_of_two_tensors_and_amax_like_torch(rng, torch):
    a, b, c = _arr(rng, (4, 5)), _arr(rng, (4, 5)), _arr(rng, (3, 4, 5))
    ta, tb, tc = torch.tensor(a), torch.tensor(b), torch.tensor(c)
    np.testing.assert_array_equal(wgpar.max(wgpar.tensor(a), wgpar.tensor(b)).numpy(), torch.max(ta, tb).numpy())
    np.testing.assert_array_equal(wgpar.min(wgpar.tensor(a), wgpar.tensor(b)).numpy(), torch.min(ta, tb).numpy())
    x = wgpar.tensor(c)
    np.testing.assert_array_equal(x.amax(dim=(0, 2), keepdim=True).numpy(), tc.amax(dim=(0, 2), keepdim=True).numpy())
    np.testing.assert_array_equal(wgpar.amin(x, 1).numpy(), torch.amin(tc, 1).numpy())


# -- the CPU story: wgpar has no host tensor, and says so -------------------------------------------
def test_cpu_raises_and_names_numpy(rng):
    x = wgpar.tensor(_arr(rng, (3, 4)), requires_grad=True)
    for call in (lambda: x.cpu(), lambda: x.detach().cpu().numpy()):
        with pytest.raises(TypeError) as info:
            call()
        assert isinstance(info.value, wgpar.HostDeviceError)
        msg = str(info.value)
        assert ".numpy()" in msg and ".tolist()" in msg and ".item()" in msg, msg
    assert_close(x.detach().numpy(), x.numpy())  # what torch's .detach().cpu().numpy() gives


def _refuses_cpu(x, spelling):
    for call in (lambda: x.to(spelling), lambda: x.to(device=spelling), lambda: wgpar.zeros(2, device=spelling),
                 lambda: wgpar.nn.Linear(2, 2).to(spelling)):
        with pytest.raises(wgpar.HostDeviceError) as info:  # a TypeError and a ValueError
            call()
        msg = str(info.value)
        assert "dtype" not in msg and ".numpy()" in msg and "'wgpu:N'" in msg, msg


@pytest.mark.parametrize("spelling", ["cpu", "cpu:0"])
def test_to_cpu_says_why_not_dtype(rng, spelling):
    _refuses_cpu(wgpar.tensor(_arr(rng, (2, 3))), spelling)


def test_to_torch_devices_says_why(rng, torch):
    x = wgpar.tensor(_arr(rng, (2, 3)))
    _refuses_cpu(x, torch.device("cpu"))
    with pytest.raises(ValueError, match="not a wgpar device"):
        x.to(torch.device("cuda", 1))


# -- view: never a copy; raises where torch raises --------------------------------------------------
# (make, shape, whether torch's view exists): the strides decide; torch was asked, and the twin asks again.
VIEWS = [
    (lambda t: t.transpose(0, 1), (-1,), False),            # flattening a transpose
    (lambda t: t.transpose(0, 1), (3, 2, 4, 5), True),      # splits a dim: a view
    (lambda t: t[:, ::2], (-1,), False),                    # strided columns
    (lambda t: t.permute(2, 0, 1), (5, 24), True),          # merges contiguous trailing dims: a view
    (lambda t: t.permute(2, 0, 1), (20, 6), False),
    (lambda t: t[1:3], (2, 30), True),                      # a contiguous slice
    (lambda t: t[:, 1:4], (-1, 5), False),                  # merges nothing across the gap
    (lambda t: t.expand(2, 4, 6, 5), (8, 30), False),       # a broadcast view
    (lambda t: t[:, :1], (4, 5), True),                     # drops a size-1 dim
]


def _np_make(make, a):
    """The same view of a NumPy array (expand is broadcast_to there)."""
    class View:
        def __init__(self, arr):
            self.a = arr

        def transpose(self, i, j):
            return np.swapaxes(self.a, i, j)

        def permute(self, *dims):
            return self.a.transpose(dims)

        def expand(self, *shape):
            return np.broadcast_to(self.a, shape)

        def __getitem__(self, key):
            return self.a[key]

    return make(View(a))


@pytest.mark.parametrize("make,shape,viewable", VIEWS)
def test_view_is_a_view_or_raises(rng, make, shape, viewable):
    a = _arr(rng, (4, 6, 5))
    x, want = make(wgpar.tensor(a, requires_grad=True)), _np_make(make, a).reshape(shape)
    if not viewable:
        with pytest.raises(RuntimeError, match=r"reshape\(") as info:
            x.view(shape)
        assert str(tuple(x.shape)) in str(info.value)
        np.testing.assert_array_equal(x.reshape(shape).numpy(), want)  # reshape copies
        return
    got = x.view(shape)
    assert got.untyped_storage() is x.untyped_storage()  # a view, never a copy
    np.testing.assert_array_equal(got.numpy(), want)
    got.sum().backward()


@pytest.mark.parametrize("make,shape,viewable", VIEWS)
def test_torch_views_where_the_table_says(rng, make, shape, viewable, torch):
    tx = make(torch.tensor(_arr(rng, (4, 6, 5))))
    try:
        tx.view(shape)
    except RuntimeError:
        assert not viewable
    else:
        assert viewable


def test_view_dtype_is_refused(rng):
    x = wgpar.tensor(_arr(rng, (2, 3)))
    with pytest.raises(TypeError, match=r"to\(dtype\)"):
        x.view(wgpar.int32)


# -- dtypes wgpar lacks: the nearest one, with a warning once per dtype ------------------------------
@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which dtype warnings were shown, so this test sees the first one."""
    monkeypatch.setattr(wgpar.dtypes, "_warned", set())


# torch's dtype objects are spelled by name here ("torch.float64") and looked up only in the torch run.
MISSING = [
    ("float64", "float64", "float32"), (np.float64, "float64", "float32"), ("double", "float64", "float32"),
    ("torch.float64", "float64", "float32"), ("bfloat16", "bfloat16", "float32"),
    ("torch.bfloat16", "bfloat16", "float32"), ("int64", "int64", "int32"), (np.int64, "int64", "int32"),
    ("long", "int64", "int32"), ("torch.long", "int64", "int32"), (np.uint8, "uint8", "int32"),
    (np.int16, "int16", "int32"),
]


@pytest.mark.parametrize("spelling,name,want", [
    c if not str(c[0]).startswith("torch.") else pytest.param(*c, marks=pytest.mark.torch) for c in MISSING])
def test_missing_dtypes_warn_once_and_narrow(fresh_warnings, spelling, name, want, request):
    if str(spelling).startswith("torch."):
        spelling = getattr(request.getfixturevalue("torch"), spelling.split(".")[1])
    calls = [lambda: wgpar.zeros(3, dtype=spelling), lambda: wgpar.tensor([1, 2], dtype=spelling),
             lambda: wgpar.ones(2).to(spelling), lambda: wgpar.ones(2).to(dtype=spelling),
             lambda: wgpar.arange(3, dtype=spelling)]
    with pytest.warns(wgpar.DTypeWarning, match=f"no {name}: it gives {want}") as record:
        out = calls[0]()
    assert out.dtype.name == want
    assert record[0].filename == __file__  # names the caller's line, not wgpar's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time and after: silent
        for call in calls:
            assert call().dtype.name == want


def test_exact_dtypes_and_data_conversion_are_silent(fresh_warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("error", wgpar.DTypeWarning)
        for spelling, want in (("float32", "float32"), ("float", "float32"), ("int32", "int32"), ("int", "int32"),
                               ("bool", "bool"), (float, "float32"), (int, "int32"), (bool, "bool"),
                               (np.float32, "float32"), (np.int32, "int32"), (np.bool_, "bool"),
                               (wgpar.float32, "float32"), (wgpar.int32, "int32")):
            assert wgpar.zeros(2, dtype=spelling).dtype.name == want
        # data converts on the way in without a word: NumPy float64 to float32, int64 (range-checked) to int32
        assert wgpar.tensor(np.ones(3)).dtype is wgpar.float32
        assert wgpar.tensor(np.arange(3)).dtype is wgpar.int32


def test_exact_torch_dtypes_are_silent(fresh_warnings, torch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", wgpar.DTypeWarning)
        for spelling, want in ((torch.float32, "float32"), (torch.int32, "int32"), (torch.bool, "bool")):
            assert wgpar.zeros(2, dtype=spelling).dtype.name == want


def test_conversion_methods(fresh_warnings, rng):
    """int() truncates toward zero (C's cast, as torch); long() gives int32 with a warning."""
    a = (rng.standard_normal((5, 7)) * 100).astype(np.float32)
    x = wgpar.tensor(a)
    np.testing.assert_array_equal(x.int().numpy(), np.trunc(a).astype(np.int32))
    np.testing.assert_array_equal(x.float().numpy(), a)
    assert x.float() is x
    with pytest.warns(wgpar.DTypeWarning, match="int64"):
        long = x.long()
    assert long.dtype is wgpar.int32
    np.testing.assert_array_equal(long.numpy(), np.trunc(a).astype(np.int32))
    if x.device.has_f16:
        np.testing.assert_array_equal(x.half().numpy(), a.astype(np.float16))


def test_conversion_methods_match_torch(fresh_warnings, rng, torch):
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
