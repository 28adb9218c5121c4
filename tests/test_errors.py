"""Bad input raises the right Python exception with a message naming shapes, devices and bytes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import wgpu

import wgpar

from .helpers import assert_close


# -- shapes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b, lambda a, b: a ** b,
    lambda a, b: a < b, lambda a, b: wgpar.maximum(a, b), lambda a, b: wgpar.where(a > 0, a, b),
    lambda a, b: a.add_(b), lambda a, b: a.copy_(b),
])
def test_shape_mismatch_names_both_shapes(dev, fn):
    a, b = wgpar.zeros(3, 4), wgpar.ones(5, 2)
    with pytest.raises(ValueError) as info:
        fn(a, b)
    assert "(3, 4)" in str(info.value) and "(5, 2)" in str(info.value), str(info.value)


def test_other_shape_errors_name_shapes(dev):
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        wgpar.zeros(2, 3) @ wgpar.zeros(4, 5)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        wgpar.zeros(2, 3).reshape(7)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)|\(2, 4\).*\(2, 3\)"):
        wgpar.cat([wgpar.zeros(2, 3), wgpar.zeros(2, 4)])
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)|\(4,\).*\(3,\)"):
        wgpar.stack([wgpar.zeros(3), wgpar.zeros(4)])
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        wgpar.zeros(2, 3).expand(4, 4)
    with pytest.raises(ValueError, match=r"\(2,\)"):
        wgpar.zeros(2).item()


# -- devices -------------------------------------------------------------------------------------------
@pytest.mark.multidevice
@pytest.mark.parametrize("name,fn", [
    ("add", lambda a, b, m, i: a + b), ("mul", lambda a, b, m, i: b * a), ("matmul", lambda a, b, m, i: a @ b),
    ("where", lambda a, b, m, i: wgpar.where(m, a, b)), ("cat", lambda a, b, m, i: wgpar.cat([a, b])),
    ("stack", lambda a, b, m, i: wgpar.stack([a, b])), ("add_", lambda a, b, m, i: a.add_(b)),
    ("copy_", lambda a, b, m, i: a.copy_(b)), ("setitem", lambda a, b, m, i: a.__setitem__(slice(None), b)),
    ("maximum", lambda a, b, m, i: wgpar.maximum(a, b)), ("clamp", lambda a, b, m, i: a.clamp(b, None)),
    ("index_select", lambda a, b, m, i: a.index_select(0, i)), ("getitem", lambda a, b, m, i: a[i]),
])
def test_device_mismatch_is_an_error_never_a_copy(devs2, name, fn):
    d0, d1 = devs2
    a = wgpar.ones(4, 4, device=d0)
    b = wgpar.ones(4, 4, device=d1)
    mask = a > 0
    idx = wgpar.tensor([0, 3], device=d1)
    gc.collect()
    before = [wgpar.memory_stats(d)["num_allocs"] for d in devs2]
    with pytest.raises(wgpar.DeviceMismatchError) as info:
        fn(a, b, mask, idx)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "wgpu:0" in msg and "wgpu:1" in msg, msg
    assert [wgpar.memory_stats(d)["num_allocs"] for d in devs2] == before  # nothing was copied or made
    assert_close(a.numpy(), np.ones((4, 4)))


@pytest.mark.multidevice
def test_moving_explicitly_works(devs2, rng):
    d0, d1 = devs2
    a = rng.standard_normal((3, 5)).astype(np.float32)
    x = wgpar.tensor(a, device=d0)
    y = x.to(d1)
    assert y.device is d1 and x.device is d0
    assert_close((y + wgpar.tensor(a, device=d1)).numpy(), 2 * a.astype(np.float64))


# -- device arguments ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["cuda", "cuda:0", "cuda:1", "cpu", "mps", "xpu:0", "bogus", "bogus:0", "wgpu:",
                                      "wgpu:x", "wgpu:-1", "wgpu:1:2", "1", "wgpu:\u00b2", " wgpu:0"])
def test_foreign_device_strings_are_refused(dev, tmp_path, spelling):
    x = wgpar.ones(3)
    lin = wgpar.nn.Linear(2, 2)
    wgpar.save({"x": x}, tmp_path / "x.safetensors")
    calls = [lambda: wgpar.zeros(2, device=spelling), lambda: wgpar.tensor([1.0], device=spelling),
             lambda: x.to(spelling), lambda: x.to(device=spelling), lambda: wgpar.device(spelling),
             lambda: wgpar.empty_cache(device=spelling), lambda: wgpar.memory_stats(spelling),
             lambda: wgpar.synchronize(spelling), lambda: wgpar.load(tmp_path / "x.safetensors", device=spelling),
             lambda: lin.to(spelling)]
    gc.collect()
    before = wgpar.memory_stats(dev)["num_allocs"]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert repr(spelling) in msg and "'wgpu:N'" in msg, msg
        if spelling == "cpu":
            assert ".numpy()" in msg
    assert wgpar.memory_stats(dev)["num_allocs"] == before  # refused before anything was made
    assert lin.weight.device is dev


def test_devices_count_must_be_an_int():
    for bad in (True, 0, -2, 1.0, "2"):
        with pytest.raises(ValueError, match="devices"):
            wgpar.devices(bad)
    assert len(wgpar.devices(np.int64(2))) == 2


def test_wgpar_device_spellings(dev):
    for spelling in ("wgpu", "wgpu:0", 0, np.int64(0), np.uint8(0), dev, None):
        assert wgpar.zeros(2, device=spelling).device is dev
        assert wgpar.ones(2).to(spelling).device is dev
    assert wgpar.ones(2).to("float16" if dev.has_f16 else "int64").device is dev
    assert isinstance(wgpar.empty_cache(device="wgpu:0"), int)
    for bad in (-1, 1.0, True, [0]):
        with pytest.raises(ValueError):
            wgpar.zeros(2, device=bad)


# -- expand --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,target", [((1, 3), (-2, 3)), ((1, 3), (2, -2)), ((3,), (-1, 3)), ((3,), (-5, 3)),
                                          ((2, 1), (2, -3)), ((2, 3), (2, -7)), ((1,), (-2,))])
def test_expand_refuses_negative_sizes_at_once(dev, shape, target):
    x = wgpar.ones(*shape)
    bad = next(n for n in target if n < -1) if any(n < -1 for n in target) else -1
    with pytest.raises(ValueError, match=f"size {bad}"):
        x.expand(target)
    with pytest.raises(ValueError, match=f"size {bad}"):
        x.expand(*target)


@pytest.mark.parametrize("shape,target", [((1, 3), (-2, 3)), ((3,), (-1, 3)), ((2, 3), (2, -7))])
def test_torch_refuses_those_sizes_too(shape, target, torch):
    with pytest.raises(RuntimeError):
        torch.ones(shape).expand(target)


def test_expand_sizes_must_be_ints(dev):
    x = wgpar.ones(1, 3)
    for target in ((2.0, 3), (2, "3"), (True, 3)):
        with pytest.raises(TypeError, match="int"):
            x.expand(target)
    np.testing.assert_array_equal(x.expand(np.int64(2), -1).numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(x.expand(4, 0, 3).numpy(), np.ones((4, 0, 3)))


# -- requires_grad -------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: wgpar.zeros(3, dtype="int32", requires_grad=True),
    lambda: wgpar.ones(2, 2, dtype=wgpar.bool_, requires_grad=True),
    lambda: wgpar.full((2,), 1, requires_grad=True),
    lambda: wgpar.full((2,), True, requires_grad=True),
    lambda: wgpar.full((2,), 1.5, dtype=wgpar.int32, requires_grad=True),
    lambda: wgpar.tensor([1, 2], requires_grad=True),
    lambda: wgpar.tensor(np.array([1.5]), dtype=wgpar.int32, requires_grad=True),
    lambda: wgpar.rand(3, dtype=wgpar.int32, requires_grad=True),
    lambda: wgpar.randn(3, dtype=wgpar.bool_, requires_grad=True),
    lambda: wgpar.arange(3).requires_grad_(),
])
def test_integer_tensors_cannot_require_grad(dev, make):
    gc.collect()
    before = wgpar.memory_stats(dev)["allocated_bytes"]
    with pytest.raises(TypeError, match="only floating point tensors can require gradients"):
        make()
    gc.collect()
    assert wgpar.memory_stats(dev)["allocated_bytes"] == before


def test_torch_refuses_integer_tensors_that_require_grad(torch):
    with pytest.raises(RuntimeError, match="floating point"):
        torch.zeros(3, dtype=torch.int32, requires_grad=True)


def test_float_factories_still_require_grad_and_modules_refuse_int_parameters(dev):
    for t in (wgpar.zeros(3, requires_grad=True), wgpar.full((2,), 1.5, requires_grad=True),
              wgpar.ones(2, dtype=wgpar.float16 if dev.has_f16 else wgpar.float32, requires_grad=True),
              wgpar.full((2,), 1, dtype=wgpar.float32, requires_grad=True)):
        assert t.requires_grad and t.is_leaf
        (t * 2).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), np.full(t.shape, 2.0))
    assert not wgpar.zeros(3, dtype="int32", requires_grad=False).requires_grad
    m = wgpar.nn.Module()
    m.steps = wgpar.nn.Parameter(wgpar.zeros(2, dtype=wgpar.int32), requires_grad=False)
    with pytest.raises(TypeError, match="floating point"):
        m.requires_grad_(True)
    assert not m.steps.requires_grad


# -- dtypes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", [np.array([1 + 2j]), np.array(["a", "b"]), np.array([object()]),
                                  np.array([1, 2], dtype="datetime64[s]")])
def test_unsupported_numpy_dtypes(dev, data):
    with pytest.raises(TypeError):
        wgpar.tensor(data)
    with pytest.raises(TypeError):
        wgpar.from_numpy(data)


def test_unsupported_dtype_arguments_and_ops(dev):
    with pytest.raises(TypeError):
        wgpar.zeros(3, dtype="complex64")
    with pytest.raises(TypeError):
        wgpar.zeros(3, dtype="no-such-type")
    i = wgpar.zeros(3, 3, dtype=wgpar.int32)
    with pytest.raises(TypeError, match="float"):
        i @ i
    with pytest.raises(TypeError):
        i.softmax(-1)
    with pytest.raises(TypeError):
        wgpar.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError):
        wgpar.zeros(3) + "a"
    with pytest.raises(TypeError):
        wgpar.zeros(3) + np.zeros(3)  # host arrays must be converted explicitly
    with pytest.raises(TypeError):
        np.zeros(3) * wgpar.zeros(3)
    with pytest.raises(TypeError):
        wgpar.exp([1.0, 2.0])
    with pytest.raises(ValueError, match="int32"):
        wgpar.tensor(np.array([2**40]))
    with pytest.raises((TypeError, ValueError)):
        wgpar.tensor([[1, 2], [3]])


def test_float16_where_the_device_lacks_it(monkeypatch):
    d = wgpar.runtime.open_device(7)
    monkeypatch.setattr(d, "has_f16", False)
    with pytest.raises(TypeError, match="shader-f16"):
        wgpar.zeros(3, dtype=wgpar.float16, device=d)
    with pytest.raises(TypeError, match="shader-f16"):
        wgpar.ones(3, device=d).half()


# -- indices -------------------------------------------------------------------------------------------
def test_out_of_range_indices(dev):
    x = wgpar.zeros(5, 4)
    for key in (5, -6, (0, 4), (slice(None), -5), (..., 9)):
        with pytest.raises(IndexError):
            x[key]
    with pytest.raises(IndexError, match="7"):
        x.index_select(0, [1, 7])
    with pytest.raises(IndexError):
        x.index_select(1, wgpar.tensor([-5]))
    with pytest.raises(IndexError):
        x.index_select(2, [0])  # no dim 2
    with pytest.raises(IndexError):
        x.sum(3)
    with pytest.raises(IndexError):
        x[0, 0, 0]
    with pytest.raises(IndexError):
        x[5] = 1.0


# -- memory --------------------------------------------------------------------------------------------
def test_out_of_memory(dev, monkeypatch):
    gc.collect()
    dev.empty_cache()  # nothing cached may serve the request
    alloc = dev.allocator

    def create(size):
        raise wgpu.GPUValidationError("Not enough memory left")

    monkeypatch.setattr(alloc, "_create", create)
    with pytest.raises(wgpar.OutOfMemoryError) as info:
        wgpar.empty(123457, device=dev)
    assert isinstance(info.value, MemoryError)
    assert "wgpu:0" in str(info.value) and str(123457 * 4) in str(info.value)
    monkeypatch.undo()
    assert_close((wgpar.ones(5) * 2).numpy(), np.full(5, 2.0))


def test_binding_limit(dev):
    n = dev.max_binding // 4 + 1
    with pytest.raises(wgpar.BindingLimitError) as info:
        wgpar.empty(n, device=dev)
    assert isinstance(info.value, ValueError)
    assert str(4 * n) in str(info.value) and "wgpu:0" in str(info.value)
