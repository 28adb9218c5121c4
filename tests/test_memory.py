"""Memory lifecycle: exact byte counts, buffer reuse, empty_cache, peaks, views, OOM and binding limits."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import wgpu

import wgpar

from .helpers import assert_close


@pytest.fixture(scope="module")
def mdev():
    """A logical device of its own, so other tests' tensors never blur the exact counts."""
    return wgpar.runtime.open_device(6)


def stats(d):
    gc.collect()
    return wgpar.memory_stats(d)


@pytest.mark.parametrize("shape,dtype", [((1000,), wgpar.float32), ((7, 33), wgpar.float16),
                                         ((3, 129), wgpar.int32), ((1,), wgpar.bool_), ((0, 5), wgpar.float32)])
def test_alloc_and_free_move_allocated_by_exactly_nbytes(mdev, shape, dtype):
    base = stats(mdev)["allocated_bytes"]
    t = wgpar.empty(*shape, dtype=dtype, device=mdev)
    assert t.nbytes == int(np.prod(shape)) * dtype.itemsize
    assert wgpar.memory_allocated(mdev) == base + t.nbytes
    del t
    assert wgpar.memory_allocated(mdev) == base


def test_op_results_are_counted_and_freed(mdev, rng):
    base = stats(mdev)["allocated_bytes"]
    x = wgpar.tensor(rng.standard_normal((33, 7)), device=mdev)
    y = (x * 2).sum(0)
    assert wgpar.memory_allocated(mdev) == base + x.nbytes + y.nbytes
    del x, y
    assert wgpar.memory_allocated(mdev) == base


def test_buffers_are_reused_in_a_loop(mdev, rng):
    a = rng.standard_normal((129, 33)).astype(np.float32)
    x = wgpar.tensor(a, device=mdev)
    for _ in range(3):  # warm up: one buffer per distinct size
        ((x * 2.0 + 1.0).exp().sum(0)).numpy()
    s0 = stats(mdev)
    for _ in range(40):
        got = ((x * 2.0 + 1.0).exp().sum(0)).numpy()
    s1 = stats(mdev)
    assert s1["num_buffer_creates"] == s0["num_buffer_creates"]
    assert s1["num_cache_hits"] >= s0["num_cache_hits"] + 40 * 4
    assert s1["reserved_bytes"] == s0["reserved_bytes"]
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    assert_close(got, np.exp(a.astype(np.float64) * 2 + 1).sum(0), rtol=1e-5)


def test_empty_cache_drops_reserved_to_live_tensors(mdev):
    stats(mdev)
    mdev.empty_cache()
    keep = wgpar.zeros(1000, device=mdev)
    block = keep._storage.block.size
    trash = [wgpar.zeros(n, device=mdev) for n in (10, 3000, 70000, 123457)]
    del trash
    s = stats(mdev)
    assert s["reserved_bytes"] > block and s["cached_bytes"] > 0
    released = wgpar.empty_cache()  # every initialised device
    s2 = wgpar.memory_stats(mdev)
    assert released >= s["cached_bytes"]
    assert s2["cached_bytes"] == 0
    assert s2["reserved_bytes"] == block  # only the live tensor's buffer is left
    assert s2["allocated_bytes"] == keep.nbytes
    assert_close(keep.numpy(), np.zeros(1000))


def test_reset_peak_memory_stats(mdev):
    base = stats(mdev)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(mdev)
    assert wgpar.max_memory_allocated(mdev) == base
    big = wgpar.empty(50000, device=mdev)
    small = wgpar.empty(10, device=mdev)
    del big
    assert wgpar.max_memory_allocated(mdev) == base + 200000 + 40
    wgpar.reset_peak_memory_stats(mdev)
    assert wgpar.max_memory_allocated(mdev) == base + 40
    del small


def test_views_share_storage(mdev, rng):
    a = rng.standard_normal((6, 33)).astype(np.float32)
    base = stats(mdev)["allocated_bytes"]
    x = wgpar.tensor(a, device=mdev)
    after = wgpar.memory_allocated(mdev)
    assert after == base + x.nbytes
    views = [x.T, x[1:5:2], x[..., ::-3], x.reshape(3, 66), x.view(-1), x.mT, x.permute(1, 0), x[None],
             x.transpose(0, 1), x[2], x.unsqueeze(0).squeeze(0), x.expand(4, 6, 33)]
    assert wgpar.memory_allocated(mdev) == after
    assert all(v._storage is x._storage for v in views)
    assert x.view(-1).data_ptr() == x.data_ptr()
    v = x[3]
    del x, views
    assert wgpar.memory_allocated(mdev) == after  # the view keeps the storage alive
    assert_close(v.numpy(), a[3])
    del v
    assert wgpar.memory_allocated(mdev) == base


def test_training_like_loop_does_not_grow(mdev, rng):
    w = wgpar.tensor(rng.standard_normal((33, 7)) * 0.1, device=mdev)
    x = wgpar.tensor(rng.standard_normal((16, 33)), device=mdev)
    for _ in range(2):
        w -= 0.01 * (x.T @ (x @ w).tanh())
    s0 = stats(mdev)
    for _ in range(20):
        w -= 0.01 * (x.T @ (x @ w).tanh())
    w.numpy()
    s1 = stats(mdev)
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    assert s1["num_buffer_creates"] == s0["num_buffer_creates"]


class _Cycle:
    def __init__(self, t):
        self.t = t
        self.me = self


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["malloc", "free"])
def test_cycle_collector_running_inside_the_allocator(mdev, monkeypatch, where):
    # The cyclic GC may run at any allocation of a Python object, also while the allocator holds its
    # lock; a tensor in a garbage cycle (autograd graphs make them) then re-enters the allocator from
    # the same thread. Force a collection where the allocator makes objects (its Block, a new size
    # bucket): it must neither deadlock nor lose count.
    from wgpar.runtime import allocator as allocator_mod

    alloc = mdev.allocator
    gc.collect()
    base = wgpar.memory_stats(mdev)
    armed = []

    def make_garbage():
        _Cycle(wgpar.empty(64, device=mdev))  # unreachable at once; only the collector frees it
        armed.append(1)

    def collect_if_armed():
        if armed:
            armed.pop()
            gc.collect()

    class CollectingBlock(allocator_mod.Block):
        __slots__ = ()

        def __init__(self, *args):
            collect_if_armed()
            super().__init__(*args)

    class CollectingDict(dict):
        def __missing__(self, key):
            collect_if_armed()
            self[key] = []
            return self[key]

    monkeypatch.setattr(allocator_mod, "Block", CollectingBlock)
    monkeypatch.setattr(alloc, "_free", CollectingDict(alloc._free))
    if where == "malloc":
        make_garbage()
        t = wgpar.empty(100, device=mdev)
        held = t.nbytes
    else:
        t = wgpar.empty(7777, device=mdev)  # a size with no bucket yet
        make_garbage()
        del t
        held = 0
    gc.collect()
    s = alloc.stats()
    assert s["allocated_bytes"] == base["allocated_bytes"] + held
    assert s["num_allocs"] - s["num_frees"] == base["num_allocs"] - base["num_frees"] + (held > 0)
    assert s["cached_bytes"] == sum(len(v) * k for k, v in alloc._free.items())


def test_tensors_in_garbage_cycles_leave_live_buffers_in_the_cache(mdev, rng):
    # The collector finalizes everything in a garbage cycle; a buffer reachable only through the
    # cycle would be released by wgpu while its tensor returns it to the cache, and reusing it
    # aborts the process. Cycles with tensors are everyday: autograd graphs, caught exceptions.
    def fail_holding(t):
        raise ValueError("boom")

    caught = []
    for n in (64, 1000, 4096):  # uploaded, never used by a kernel: no cached bind group holds the buffer
        _Cycle(wgpar.tensor(np.zeros(n, np.float32), device=mdev))
        try:
            fail_holding(wgpar.tensor(np.ones(n, np.float32), device=mdev))
        except ValueError as exc:
            caught.append(exc)  # exception -> traceback -> frame -> tensor -> ... -> exception
    del caught
    gc.collect()
    cached = list(mdev.allocator._cached.values())
    assert cached and all(b._internal is not None for b in cached), "released wgpu buffers in the cache"
    for n in (64, 1000, 4096):  # the cached buffers are reused and work
        a = rng.standard_normal(n).astype(np.float32)
        assert_close((wgpar.tensor(a, device=mdev) * 2).numpy(), a * 2.0)


# -- out of memory -------------------------------------------------------------------------------
def _failing_create(real, fails: int, seen: list):
    def create(size):
        seen.append(size)
        if len(seen) <= fails:
            raise wgpu.GPUValidationError("Not enough memory left")
        return real(size)

    return create


def test_oom_once_releases_cache_and_retries(mdev, monkeypatch):
    trash = wgpar.zeros(4096, device=mdev)
    trash.numpy()  # leaves a staging buffer cached too
    del trash
    gc.collect()
    assert wgpar.memory_stats(mdev)["cached_bytes"] > 0
    alloc = mdev.allocator
    seen: list[int] = []
    cached_at_retry: list[int] = []
    real = alloc._create

    def create(size):
        seen.append(size)
        if len(seen) == 1:
            raise wgpu.GPUValidationError("Not enough memory left")
        cached_at_retry.append((alloc.cached_bytes, len(mdev._staging)))
        return real(size)

    monkeypatch.setattr(alloc, "_create", create)
    t = wgpar.full((12345,), 2.5, device=mdev)  # a size the cache cannot serve
    assert len(seen) == 2 and cached_at_retry == [(0, 0)]  # every cached buffer went back first
    assert_close(t.numpy(), np.full(12345, 2.5))
    assert wgpar.memory_stats(mdev)["num_ooms"] == 0


def test_oom_twice_raises_out_of_memory_and_device_survives(mdev, monkeypatch, rng):
    alloc = mdev.allocator
    seen: list[int] = []
    monkeypatch.setattr(alloc, "_create", _failing_create(alloc._create, 2, seen))
    before = stats(mdev)
    with pytest.raises(wgpar.OutOfMemoryError) as info:
        wgpar.empty(54321, device=mdev)
    assert isinstance(info.value, MemoryError)
    msg = str(info.value)
    assert str(4 * 54321) in msg and str(mdev) in msg  # the bytes asked for, and where
    after = stats(mdev)
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["num_ooms"] == before["num_ooms"] + 1
    # the device keeps working: the patched allocator succeeds from the third call on
    a = rng.standard_normal((33, 7)).astype(np.float32)
    x = wgpar.tensor(a, device=mdev)
    assert_close((x * x).sum(1).numpy(), (a.astype(np.float64) ** 2).sum(1), rtol=1e-5)


def test_oom_inside_an_op(mdev, monkeypatch, rng):
    a = rng.standard_normal(777).astype(np.float32)
    x = wgpar.tensor(a, device=mdev)
    mdev.empty_cache()
    alloc = mdev.allocator
    monkeypatch.setattr(alloc, "_create", _failing_create(alloc._create, 10**9, []))
    with pytest.raises(wgpar.OutOfMemoryError, match=str(mdev.index)):
        x @ wgpar.ones(777, 50, device=mdev)
    monkeypatch.undo()
    assert_close((x + 1).numpy(), a + 1.0)


def test_other_creation_errors_are_not_oom(mdev, monkeypatch):
    alloc = mdev.allocator

    def create(size):
        raise wgpu.GPUValidationError("Buffer usage is invalid")

    monkeypatch.setattr(alloc, "_create", create)
    with pytest.raises(wgpu.GPUValidationError):
        wgpar.empty(99991, device=mdev)


# -- out of memory in host transfers ------------------------------------------------------------------
def _failing_buffers(monkeypatch, d, label: str, fails: int, seen: list, error: str = "Not enough memory left"):
    """Make ``d``'s wgpu buffers labelled ``wgpar:<i>:<label>`` fail to create ``fails`` times; ``seen``
    gets (size, cached bytes of the allocator) per try."""
    real = d._dev.create_buffer

    def create(**kw):
        if kw["label"] == f"wgpar:{d.index}:{label}":
            seen.append((kw["size"], d.allocator.cached_bytes))
            if len(seen) <= fails:
                raise wgpu.GPUValidationError(error)
        return real(**kw)

    monkeypatch.setattr(d._dev, "create_buffer", create)


def _fill_cache(d):
    trash = [wgpar.zeros(n, device=d) for n in (1000, 3000)]
    del trash
    gc.collect()
    assert wgpar.memory_stats(d)["cached_bytes"] > 0


def test_readback_staging_oom_releases_cache_and_retries(mdev, monkeypatch, rng):
    a = rng.standard_normal(5003).astype(np.float32)
    t = wgpar.tensor(a, device=mdev)
    mdev.empty_cache()  # no staging buffer of this size is cached
    _fill_cache(mdev)
    seen: list = []
    _failing_buffers(monkeypatch, mdev, "staging", 1, seen)
    np.testing.assert_array_equal(t.numpy(), a)
    assert len(seen) == 2 and seen[1][1] == 0  # the retry came after the cache went back to wgpu
    assert wgpar.memory_stats(mdev)["cached_bytes"] == 0


def test_readback_staging_oom_twice_raises_out_of_memory_and_device_survives(mdev, monkeypatch, rng):
    a = rng.standard_normal(7001).astype(np.float32)
    t = wgpar.tensor(a, device=mdev)
    mdev.empty_cache()
    seen: list = []
    _failing_buffers(monkeypatch, mdev, "staging", 2, seen)
    with pytest.raises(wgpar.OutOfMemoryError) as info:
        t.numpy()
    assert isinstance(info.value, MemoryError)
    msg = str(info.value)
    assert str(mdev) in msg and str(seen[0][0]) in msg and "staging" in msg, msg
    monkeypatch.undo()
    np.testing.assert_array_equal(t.numpy(), a)  # nothing was left recorded or mapped
    np.testing.assert_array_equal((t * 2).numpy(), a * 2)


@pytest.mark.parametrize("fails", [1, 2])
def test_upload_buffer_oom_releases_cache_and_retries(mdev, monkeypatch, rng, fails):
    a = rng.standard_normal(300_007).astype(np.float32)  # 1.2 MB: through the upload ring
    mdev.empty_cache()  # no upload ring yet
    _fill_cache(mdev)
    before = stats(mdev)["allocated_bytes"]
    seen: list = []
    _failing_buffers(monkeypatch, mdev, "upload", fails, seen)
    if fails == 1:
        t = wgpar.tensor(a, device=mdev)
        assert len(seen) == 2 and seen[1][1] == 0
        monkeypatch.undo()
        np.testing.assert_array_equal(t.numpy(), a)
        return
    with pytest.raises(wgpar.OutOfMemoryError) as info:
        wgpar.tensor(a, device=mdev)
    msg = str(info.value)
    assert str(mdev) in msg and str(seen[0][0]) in msg and "upload" in msg, msg
    del info  # its traceback holds the frame that held the tensor
    assert stats(mdev)["allocated_bytes"] == before  # the tensor that could not be filled is gone
    monkeypatch.undo()
    np.testing.assert_array_equal(wgpar.tensor(a, device=mdev).numpy(), a)


def test_transfer_buffers_share_the_retry(mdev, monkeypatch, rng):
    from wgpar.runtime.transfer import StagingBuffer, UploadBuffer

    a = rng.standard_normal(999).astype(np.float32)
    t = wgpar.tensor(a, device=mdev)
    for cls, label in ((StagingBuffer, "collective-read"), (UploadBuffer, "collective-write")):
        _fill_cache(mdev)
        seen: list = []
        _failing_buffers(monkeypatch, mdev, label, 1, seen)
        buf = cls(mdev, a.nbytes, label)
        assert len(seen) == 2 and seen[1][1] == 0
        monkeypatch.undo()
        if cls is StagingBuffer:
            buf.start(t._storage.buffer, 0, a.nbytes)
            np.testing.assert_array_equal(np.frombuffer(buf.wait(10.0), np.float32), a)
        else:
            out = wgpar.empty(999, device=mdev)
            np.frombuffer(buf.view(10.0), np.float32)[:999] = a[::-1]
            buf.commit(out._storage.buffer, 0, a.nbytes)
            np.testing.assert_array_equal(out.numpy(), a[::-1])


def test_other_staging_errors_are_not_oom(mdev, monkeypatch, rng):
    t = wgpar.tensor(rng.standard_normal(6007).astype(np.float32), device=mdev)
    mdev.empty_cache()
    _fill_cache(mdev)
    cached = wgpar.memory_stats(mdev)["cached_bytes"]
    seen: list = []
    _failing_buffers(monkeypatch, mdev, "staging", 10, seen, error="Buffer usage is invalid")
    with pytest.raises(wgpu.GPUValidationError, match="usage"):
        t.numpy()
    assert len(seen) == 1 and wgpar.memory_stats(mdev)["cached_bytes"] == cached  # no retry, cache kept


# -- binding limit ---------------------------------------------------------------------------------
def test_tensor_over_binding_limit_raises_without_allocating(mdev):
    limit = mdev.max_binding
    before = stats(mdev)
    n = limit // 4 + 1
    with pytest.raises(wgpar.BindingLimitError) as info:
        wgpar.zeros(n, device=mdev)
    assert isinstance(info.value, ValueError)
    assert str(4 * n) in str(info.value) and str(limit) in str(info.value)
    with pytest.raises(wgpar.BindingLimitError, match=str(2 * (limit // 2 + 2))):
        wgpar.empty(limit // 2 + 2, dtype=wgpar.float16, device=mdev)
    with pytest.raises(wgpar.BindingLimitError):
        wgpar.from_numpy(np.broadcast_to(np.float32(1), (limit // 4 + 7,)), device=mdev)
    with pytest.raises(wgpar.BindingLimitError):  # a result too large: expand is a view, contiguous copies
        wgpar.ones(1, device=mdev).expand(limit // 4 + 1).contiguous()
    side = math.isqrt(limit // 4) + 1  # an [side, side] float32 result is over the limit, its operands tiny
    with pytest.raises(wgpar.BindingLimitError):
        wgpar.ones(side, 1, device=mdev) @ wgpar.ones(1, side, device=mdev)
    after = stats(mdev)
    assert after["num_allocs"] - after["num_frees"] == before["num_allocs"] - before["num_frees"]
    assert after["allocated_bytes"] == before["allocated_bytes"]
    x = wgpar.ones(limit // 4, device=mdev)  # exactly at the limit is fine
    assert x.nbytes == limit - limit % 4
    del x
    mdev.empty_cache()


def test_readback_staging_stays_within_max_buffer_size(monkeypatch, rng):
    # Staging buffers come in powers of two; near max-buffer-size (real GPUs allow 1.5 GiB tensors
    # under a 2 GiB - 1 limit) the next power of two is not allowed. Shrink the limit to see it here.
    d = wgpar.runtime.open_device(6)
    a = rng.standard_normal(150_001).astype(np.float32)  # 600004 bytes: its power of two is 1 MiB
    t = wgpar.tensor(a, device=d)
    d.empty_cache()
    monkeypatch.setattr(d, "max_buffer", 700_000)
    np.testing.assert_array_equal(t.numpy(), a)
    assert all(b.size <= 700_000 for b in d._staging.values())
    monkeypatch.undo()
    d.empty_cache()


def test_memory_limit_refuses_like_a_full_device(rng):
    """set_memory_limit caps reserved bytes: past it the cache is released and the allocation retried
    once, then OutOfMemoryError names the limit; the device works on and the limit can be lifted."""
    d = wgpar.runtime.open_device(12)  # a device of its own: the limit must not touch other tests
    gc.collect()
    wgpar.empty_cache(d)
    held = wgpar.memory_reserved(d)
    assert wgpar.set_memory_limit(held + (3 << 19), d) is None
    try:
        a = wgpar.empty(200_000, device=d)  # 800 KB: fits
        del a
        assert stats(d)["cached_bytes"] > 0
        b = wgpar.empty(150_000, 2, device=d)  # 1.2 MB (a 1.25 MiB block): fits only once the cached block goes back
        assert stats(d)["cached_bytes"] == 0
        del b
        with pytest.raises(wgpar.OutOfMemoryError, match=r"out of memory allocating 4400000 bytes.*memory limit"):
            wgpar.empty(1_100_000, device=d)
        x = rng.standard_normal(1000).astype(np.float32)
        assert_close((wgpar.tensor(x, device=d) * 2).numpy(), 2 * x)
        with pytest.raises(ValueError, match="number of bytes"):
            wgpar.set_memory_limit(-1, d)
    finally:
        assert wgpar.set_memory_limit(None, d) == held + (3 << 19)
    big = wgpar.empty(1_100_000, device=d)
    assert big.nbytes == 4_400_000


@pytest.mark.parametrize("raw,want", [("", None), ("4096", 4096), ("512M", 512 << 20), ("2g", 2 << 30),
                                      ("64K", 64 << 10)])
def test_memory_limit_env_var(monkeypatch, raw, want):
    from wgpar.runtime import config

    monkeypatch.setenv("WGPAR_MEMORY_LIMIT", raw)
    assert config.load().memory_limit == want
    monkeypatch.setenv("WGPAR_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="WGPAR_MEMORY_LIMIT='lots'"):
        config.load()


# -- buffer reuse is the same every step (bind groups are kept) ----------------------------------------
def test_the_cache_hands_out_the_lowest_free_buffer_whatever_the_free_order(mdev):
    alloc = mdev.allocator
    mdev.empty_cache()  # no other cached buffer of the bucket
    blocks = [alloc.malloc(4096) for _ in range(3)]
    serials = sorted(b.serial for b in blocks)
    for perm in ((0, 1, 2), (2, 1, 0), (1, 2, 0)):
        order = [blocks[i] for i in perm]
        buffers = {b.serial: b.buffer for b in order}
        for b in order:
            alloc.free(b)
        again = [alloc.malloc(4096) for _ in range(3)]
        assert [b.serial for b in again] == serials
        assert [b.buffer for b in again] == [buffers[s] for s in serials]
        blocks = again
    for b in blocks:
        alloc.free(b)


def test_a_repeated_training_step_makes_no_new_bind_groups(mdev, rng):
    # Every dispatch binds its buffers through a bind group cached per buffer set; a step that is
    # handed different buffers each time makes new ones at every dispatch (host time, issue 26).
    from wgpar import nn, optim
    from wgpar.nn import functional as F

    wgpar.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 5, 10)).to(mdev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = wgpar.tensor(rng.standard_normal((3, 3, 7, 5)).astype(np.float32), device=mdev)
    y = wgpar.tensor(rng.integers(0, 10, 3).astype(np.int32), device=mdev)
    made = []
    real = mdev._dev.create_bind_group

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    mdev._dev.create_bind_group = counting
    try:
        per_step = []
        for _ in range(6):
            made.clear()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            per_step.append(len(made))
    finally:
        del mdev._dev.create_bind_group
    assert per_step[0] > 0 and per_step[3:] == [0, 0, 0], per_step
