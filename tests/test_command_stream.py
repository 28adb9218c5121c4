"""The command stream: grids within max-compute-workgroups-per-dimension, recovery from a failed submit."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

import wgpar
from wgpar.nn import functional as F
from wgpar.ops import plans

from .helpers import assert_close

mm = sys.modules["wgpar.ops.matmul"]  # the module (wgpar.ops.matmul is the function)


@pytest.fixture
def small_limit(dev, monkeypatch):
    """Pretend ``dev`` allows 16 workgroups per grid dimension, so small shapes need split grids."""
    monkeypatch.setattr(dev, "max_workgroups", 16)
    plans.forget_all()  # the plans remembered hold grids made for the real limit
    yield dev
    plans.forget_all()


def test_ops_split_their_grids_within_the_device_limit(small_limit, rng):
    d = small_limit
    x = rng.standard_normal(5001).astype(np.float32)  # 20 workgroups: a 10 x 2 grid
    t = wgpar.tensor(x, device=d)
    assert_close((t * 2 + 1).numpy(), x * 2 + 1)
    v = rng.standard_normal(4 * 4097).astype(np.float32)  # the vec4 kernel: 17 workgroups
    assert_close((wgpar.tensor(v, device=d) - 1).numpy(), v - 1)
    m = rng.standard_normal((90, 70)).astype(np.float32)
    tm = wgpar.tensor(m, device=d)
    assert_close((tm.T + 1).numpy(), m.T + 1)  # strided kernel into a fresh output
    assert_close((tm.T * tm.T).numpy(), m.T * m.T)
    # reductions: rows, columns, two-pass long rows, argmax's two passes
    r = rng.standard_normal((250, 9)).astype(np.float32)
    tr = wgpar.tensor(r, device=d)
    assert_close(tr.sum(1).numpy(), r.sum(1), rtol=1e-5, atol=1e-5)
    assert_close(tr.amax(0).numpy(), r.max(0))
    long = rng.standard_normal((2, 20000)).astype(np.float32)
    tl = wgpar.tensor(long, device=d)
    assert_close(tl.sum(1).numpy(), long.sum(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(tl.argmax(1).numpy(), long.argmax(1))
    assert_close(tr.softmax(-1).numpy(), np.exp(r) / np.exp(r).sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    tgt = rng.integers(0, 9, 250)
    lsm = r - r.max(1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
    assert_close(F.cross_entropy(tr, tgt).item(), -lsm[np.arange(250), tgt].mean(), rtol=1e-5)
    idx = rng.integers(0, 90, 300)
    assert_close(tm.index_select(0, idx).numpy(), m[idx])


@pytest.mark.parametrize("variant,a_shape,b_shape", [
    ("general", (1100, 3), (3, 5)),            # 18 row tiles
    ("general", (3, 2), (2, 1100)),            # 18 column tiles
    ("general", (20, 3, 4), (20, 4, 5)),       # a batch of 20
    ("tile64x64x16r8x8u", (64 * 17, 16), (16, 64)),
    ("tile64x128x16r8x8u", (64, 16), (16, 128 * 17)),
    ("tile64x64x16r8x8u", (18, 64, 16), (18, 16, 64)),
])
def test_matmul_splits_its_grid(small_limit, rng, variant, a_shape, b_shape):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    with mm.force_variant(variant):
        got = (wgpar.tensor(a, device=small_limit) @ wgpar.tensor(b, device=small_limit)).numpy()
    assert_close(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_grid_beyond_the_limit_raises_before_recording(small_limit):
    d = small_limit
    pending = d._pending
    with pytest.raises(wgpar.WgparError, match="max-compute-workgroups-per-dimension") as info:
        wgpar.ones(16 * 16 * 256 + 1, device=d) + 1  # 257 workgroups: no 16 x 16 grid holds them
    assert str(d) in str(info.value)
    assert d._pending == pending  # nothing recorded: the batch around it still submits
    np.testing.assert_array_equal((wgpar.ones(3, device=d) * 4).numpy(), [4, 4, 4])


def test_elementwise_beyond_65535_workgroups_at_the_real_limit(dev):
    n = dev.max_workgroups * 256 + 1001  # more workgroups than one grid dimension holds
    x = wgpar.full((n,), 1.0, device=dev)
    x[n - 1] = 5.0
    y = x * 2
    assert y.max().item() == 10.0 and y.min().item() == 2.0  # the last element, and none left unwritten


def test_matmul_beyond_65535_row_tiles_at_the_real_limit(dev, rng):
    if dev.adapter_type.lower() == "cpu":
        pytest.skip("65537 matmul workgroups take ~30 s on lavapipe; test_matmul_splits_its_grid covers the split")
    m = dev.max_workgroups * 64 + 65  # [M, 1] @ [1, 1]: the general kernel's grid needs M / 64 rows of tiles
    a = rng.standard_normal((m, 1)).astype(np.float32)
    out = (wgpar.tensor(a) @ wgpar.tensor(np.array([[3.0]], np.float32))).numpy()
    np.testing.assert_array_equal(out, a * np.float32(3.0))


# -- a failed submit ---------------------------------------------------------------------------
def _record_invalid_copy(d):
    """Record a copy that reads past a buffer's end: wgpu rejects it only at encoder.finish()."""
    src = wgpar.ones(4, device=d)
    dst = wgpar.zeros(4, device=d)
    d.copy(src._storage.buffer, src._storage.buffer.size, dst._storage.buffer, 0, 4)


def test_a_failed_submit_leaves_the_device_usable(rng):
    d = wgpar.runtime.open_device(8)  # its own device: the failure discards whatever else was recorded on it
    x = rng.standard_normal((33, 7)).astype(np.float32)
    t = wgpar.tensor(x, device=d)
    lost = t * 2  # recorded, not yet submitted: goes down with the failed batch
    _record_invalid_copy(d)
    with pytest.raises(wgpar.WgparError) as info:
        (t + 1).numpy()
    msg = str(info.value)
    assert str(d) in msg and "discarded" in msg and "stays usable" in msg
    del lost
    # the device goes on: ops, small and large uploads (the upload ring), readbacks, synchronize
    assert_close((t * 3 - 1).numpy(), x * 3 - 1)
    big = rng.standard_normal(400_000).astype(np.float32)  # 1.6 MB: through the upload ring
    assert_close(wgpar.tensor(big, device=d).sum().item(), big.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    d.synchronize()
    # a failure in the middle of a large upload leaves the ring usable too
    _record_invalid_copy(d)
    with pytest.raises(wgpar.WgparError):
        wgpar.tensor(big, device=d)
    assert_close(wgpar.tensor(big * 2, device=d).numpy(), big * 2)
    assert d._pending == 0 or d._encoder is not None


def _batches_after_a_wait(dev, x, count):
    """The sizes of the batches submitted while ``count`` dispatches are recorded after a readback."""
    x.numpy()  # a readback: the host waited
    batches, pending = [], 0
    for _ in range(count):
        before = dev.num_submits
        x = x + 1
        pending += 1
        if dev.num_submits != before:
            batches.append(pending)
            pending = 0
    return batches, x, pending


@pytest.mark.parametrize("early", [False, True], ids=["cpu-ramp", "gpu-ramp"])
def test_after_a_wait_the_next_work_is_submitted_early(dev, monkeypatch, early):
    """Once the host has waited for the GPU (synchronize, a readback) the GPU is idle: the next work is
    submitted early, the batch growing back to the submit threshold, so the GPU is not left idle while the
    host records a whole threshold's worth: on a CPU adapter after _RAMP dispatches, doubling; on a GPU the
    first dispatch at once, then 4, 16, doubling (the time rule is switched off here: its own test)."""
    from wgpar.runtime.config import CONFIG

    device_mod = sys.modules["wgpar.runtime.device"]  # the module (wgpar.runtime.device is a function)
    monkeypatch.setattr(dev, "_early", early)
    monkeypatch.setattr(device_mod, "_EARLY_S", 0.0)
    x = wgpar.ones((64,), device=dev)
    batches, x, pending = _batches_after_a_wait(dev, x, 5 * CONFIG.submit_threshold)
    want, t = [], (1 if early else device_mod._RAMP)
    while sum(want) + t <= 5 * CONFIG.submit_threshold:
        want.append(t)
        t = min(4 * t if t < device_mod._RAMP else 2 * t, CONFIG.submit_threshold)
    assert batches == want
    assert want[-1] == CONFIG.submit_threshold
    assert float(x[0].item()) == 1 + sum(batches) + pending


def test_on_a_gpu_a_short_burst_is_submitted_by_time(dev, monkeypatch):
    """In the first _EARLY_S after a wait a GPU's work is also submitted once _EARLY_GAP_S passed since the
    last submit (a few slow calls then a wait would otherwise leave their whole batch to the wait); after
    that window only the count does."""
    device_mod = sys.modules["wgpar.runtime.device"]
    monkeypatch.setattr(dev, "_early", True)
    monkeypatch.setattr(device_mod, "_EARLY_S", 10.0)
    monkeypatch.setattr(device_mod, "_EARLY_GAP_S", 0.002)
    x = wgpar.ones((64,), device=dev)
    x.numpy()
    x = x + 1  # the first dispatch: submitted at once
    submits = dev.num_submits
    x = x + 1
    x = x + 1  # within the gap: nothing submitted (the count is 4 here)
    assert dev.num_submits == submits
    time.sleep(0.003)
    x = x + 1  # the gap passed: submitted
    assert dev.num_submits == submits + 1
    monkeypatch.setattr(device_mod, "_EARLY_S", 0.0)
    x.numpy()  # a new wait: the window is over at once
    x = x + 1
    submits = dev.num_submits
    time.sleep(0.003)
    for _ in range(2):
        x = x + 1
    assert dev.num_submits == submits  # only the count (4) submits now
    assert float(x[0].item()) == 8


# -- dispatch through wgpu-native (runtime/native.py) ------------------------------------------
def test_native_and_public_dispatch_calls_agree(rng, monkeypatch):
    d = wgpar.runtime.open_device(9)
    if d._native is None:
        pytest.skip("this wgpu-py has no wgpu-native internals: every dispatch takes the public calls")
    x = rng.standard_normal((37, 29)).astype(np.float32)

    def run():
        t = wgpar.tensor(x, device=d)
        return ((t * 2 + 1).T @ t).softmax(-1).sum(0).numpy()

    native = run()
    monkeypatch.setattr(d, "_native", None)
    np.testing.assert_array_equal(run(), native)


def test_a_pass_error_recorded_natively_is_reported_at_submit(rng, monkeypatch):
    d = wgpar.runtime.open_device(10)  # its own device: the failure discards what was recorded on it
    t = wgpar.tensor(rng.standard_normal(64).astype(np.float32), device=d)
    _ = t * 2
    monkeypatch.setattr(d, "_slot", 4)  # the next dispatches' dynamic offsets break the uniform alignment
    lost = t + 1
    monkeypatch.setattr(d, "_slot", 256)
    with pytest.raises(wgpar.WgparError, match="alignment") as info:
        lost.numpy()
    assert "discarded" in str(info.value)
    assert_close((t * 3).numpy(), t.numpy() * 3)


def test_synchronize_is_one_submit_that_waits_for_the_pending_work(dev, rng, monkeypatch):
    """synchronize puts its fence at the end of the pending batch: one submit (each costs the host tens of
    microseconds on a GPU), not a flush and a fence of its own; an idle synchronize submits the fence alone.
    It still waits for all of the work: a readback of its result afterwards takes a fraction of the wait."""
    # a few hundred milliseconds of products: small ones on lavapipe, 4096^3 ones on a GPU
    n, count = (640, 6) if dev.adapter_type.lower() == "cpu" else (4096, 20)
    a_np = (rng.random((n, n)) / (0.5 * n)).astype(np.float32)  # rows summing to about 1: no growth, no cancelling
    a = wgpar.tensor(a_np, device=dev)
    monkeypatch.setattr(dev, "_early", False)  # no early submits after the wait: all of it pending
    monkeypatch.setattr(sys.modules["wgpar.runtime.device"], "_RAMP", 10**6)
    wgpar.synchronize(dev)
    y = a
    for _ in range(count):
        y = y @ a
    assert dev._pending > 0
    submits = dev.num_submits
    t0 = time.perf_counter()
    wgpar.synchronize(dev)
    waited = time.perf_counter() - t0
    assert dev.num_submits == submits + 1 and dev._pending == 0
    t0 = time.perf_counter()
    got = y[:2, :3].numpy()
    read = time.perf_counter() - t0
    assert read < waited / 2, f"synchronize returned before the work was done: {waited:.4f} s, readback {read:.4f} s"
    ref = a_np[:2].astype(np.float64)
    for _ in range(count):
        ref = ref @ a_np.astype(np.float64)
    assert_close(got, ref[:, :3], rtol=1e-4, atol=0)
    submits = dev.num_submits
    wgpar.synchronize(dev)
    assert dev.num_submits == submits + 1  # idle: the fence alone


def test_synchronize_gives_up_after_its_deadline_and_the_device_stays_usable(dev, monkeypatch, rng):
    """synchronize's wait has a deadline (wgpu-py's map_sync had none): a fence that never completes raises a
    TransferTimeout naming the device; the next synchronize, and the work after it, run as usual."""
    from wgpar.runtime import transfer

    device_mod = sys.modules["wgpar.runtime.device"]  # the module (wgpar.runtime.device is also a function)

    class Never:  # a map that never completes
        _thread_event = __import__("threading").Event()

        @staticmethod
        def _wgpar_poll(block):
            pass

    x = rng.standard_normal(1000).astype(np.float32)
    y = wgpar.tensor(x, device=dev) * 2.0
    with monkeypatch.context() as m:
        m.setattr(transfer, "map_async", lambda *a, **k: Never())
        m.setattr(device_mod, "_UPLOAD_TIMEOUT", 0.05)
        with pytest.raises(transfer.TransferTimeout, match=r"synchronize on .*not finished after"):
            wgpar.synchronize(dev)
    wgpar.synchronize(dev)
    assert_close((y + 1.0).numpy(), 2.0 * x + 1.0)
