"""Command batching, and threads driving devices: one device each, or several sharing one."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import wgpar

from .test_matmul import rel_err


def test_ops_are_batched_into_few_submits(dev, rng):
    a = rng.standard_normal((33, 7)).astype(np.float32)
    x = wgpar.tensor(a)
    dev.synchronize()
    s0, d0 = dev.num_submits, dev.num_dispatches
    y = x
    want = a.astype(np.float64)
    for k in range(200):
        y = y * 0.99 + 0.01 if k % 2 else (y - 0.5).tanh()
        want = want * 0.99 + 0.01 if k % 2 else np.tanh(want - 0.5)
    dispatches = dev.num_dispatches - d0
    assert dispatches >= 200
    # After the wait the batches grow (Device._idle: 16, 32, 64, ... on a CPU adapter; 1, 4, 16, 32, ... on a
    # GPU, with at most one more a _EARLY_GAP_S for _EARLY_S): a handful of submits, not one per op.
    dm = sys.modules["wgpar.runtime.device"]
    most = (dispatches // 16).bit_length() + (2 + int(dm._EARLY_S / dm._EARLY_GAP_S) if dev._early else 0)
    assert dev.num_submits - s0 <= most
    got = y.numpy()  # the readback submits the rest at once
    assert dev.num_submits - s0 <= most + 1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_submit_threshold_bounds_pending_work(dev, monkeypatch):
    import dataclasses

    device_mod = sys.modules["wgpar.runtime.device"]
    monkeypatch.setattr(device_mod, "CONFIG", dataclasses.replace(device_mod.CONFIG, submit_threshold=16))
    monkeypatch.setattr(dev, "_early", False)  # only the count here (a GPU also submits by time after a wait)
    dev.synchronize()
    x = wgpar.zeros(129)
    s0, d0 = dev.num_submits, dev.num_dispatches
    for _ in range(100):
        x = x + 1.0
    dispatches = dev.num_dispatches - d0
    submits = dev.num_submits - s0
    assert dispatches // 16 <= submits <= dispatches // 16 + 1
    np.testing.assert_array_equal(x.numpy(), np.full(129, 100.0))


def test_synchronize_waits_and_counts(dev):
    x = wgpar.ones(1000) * 3
    wgpar.synchronize()
    wgpar.synchronize(dev)
    assert dev._encoder is None and dev._pending == 0
    assert x.sum().item() == 3000.0


def _worker(device, seed, rounds, results, errors, key):
    try:
        rng = np.random.default_rng(seed)
        worst = 0.0
        for _ in range(rounds):
            a = rng.uniform(-1, 1, (33, 65)).astype(np.float32)
            w = rng.uniform(-1, 1, (65, 17)).astype(np.float32)
            x, wt = wgpar.tensor(a, device=device), wgpar.tensor(w, device=device)
            y = ((x @ wt).tanh() * 2.0 + 1.0).softmax(-1).sum(0)
            want_h = np.tanh(a.astype(np.float64) @ w) * 2 + 1
            e = np.exp(want_h - want_h.max(-1, keepdims=True))
            want = (e / e.sum(-1, keepdims=True)).sum(0)
            assert y.device is device
            worst = max(worst, rel_err(y.numpy(), want))
        results[key] = worst
    except BaseException as exc:  # surfaced by the main thread
        errors.append((key, exc))


def _run_threads(targets, timeout=120):
    threads = [threading.Thread(target=_worker, args=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread hung"


@pytest.mark.multidevice
@pytest.mark.timeout(180)
def test_one_thread_per_logical_device(rng):
    devs = wgpar.devices(3)
    assert len({id(d) for d in devs}) == 3
    results, errors = {}, []
    _run_threads([(d, int(rng.integers(2**31)), 8, results, errors, d.index) for d in devs])
    assert not errors, errors
    assert sorted(results) == [0, 1, 2]
    assert max(results.values()) < 1e-5, results


@pytest.mark.timeout(180)
def test_threads_sharing_one_device(dev, rng):
    results, errors = {}, []
    _run_threads([(dev, int(rng.integers(2**31)), 8, results, errors, k) for k in range(3)])
    assert not errors, errors
    assert len(results) == 3 and max(results.values()) < 1e-5, results


@pytest.mark.multidevice
@pytest.mark.timeout(120)
def test_threads_moving_tensors_between_devices(devs2, rng):
    d0, d1 = devs2
    a = rng.standard_normal((4, 129)).astype(np.float32)
    src = wgpar.tensor(a, device=d0)
    out, errors = [None] * 4, []

    def mover(k):
        try:
            y = src[k].to(d1) * (k + 1)
            out[k] = y.to(0).numpy()
            assert y.device is d1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=mover, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for k in range(4):
        np.testing.assert_allclose(out[k], a[k] * (k + 1), rtol=1e-6)


@pytest.mark.timeout(120)
def test_tensors_freed_on_other_threads(dev, rng):
    # Tensors made on one thread and dropped on another return their buffers exactly once.
    import gc

    gc.collect()
    base = wgpar.memory_allocated(dev)
    made = [wgpar.tensor(rng.standard_normal(n).astype(np.float32)) for n in (1, 33, 1000, 4097)]
    nbytes = sum(t.nbytes for t in made)
    assert wgpar.memory_allocated(dev) == base + nbytes

    def drop():
        while True:
            try:
                t = made.pop()
            except IndexError:
                return
            (t * 2).sum().item()
            del t

    ts = [threading.Thread(target=drop) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    gc.collect()
    assert wgpar.memory_allocated(dev) == base
