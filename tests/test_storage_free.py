"""Freeing and re-materialising a Storage under live tensors: exact counts, views, errors, autograd.

And the three FSDP hooks together: a Linear whose weight exists only while it runs (forward
pre-hook / forward hook / backward pre-hook), with the same gradients as without any freeing.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.autograd import no_grad, preserve_version

from .helpers import assert_close


@pytest.fixture(scope="module")
def sdev():
    """A logical device of its own, so other tests' tensors never blur the exact counts."""
    return wgpar.runtime.open_device(8)


def allocated(d) -> int:
    gc.collect()
    return wgpar.memory_stats(d)["allocated_bytes"]


@pytest.mark.parametrize("shape,dtype", [((1000,), wgpar.float32), ((7, 33), wgpar.float16),
                                         ((3, 129), wgpar.int32), ((5,), wgpar.bool_)])
def test_free_and_materialize_move_allocated_by_exactly_nbytes(sdev, shape, dtype):
    t = wgpar.zeros(*shape, dtype=dtype, device=sdev)
    s = t.untyped_storage()
    base = allocated(sdev)
    frees = wgpar.memory_stats(sdev)["num_frees"]
    s.free()
    assert s.is_freed and wgpar.memory_allocated(sdev) == base - t.nbytes
    s.free()  # twice: a no-op
    assert wgpar.memory_allocated(sdev) == base - t.nbytes
    assert wgpar.memory_stats(sdev)["num_frees"] == frees + 1
    s.materialize()
    assert not s.is_freed and wgpar.memory_allocated(sdev) == base
    s.materialize()  # on a live storage: a no-op
    assert wgpar.memory_allocated(sdev) == base
    s.free()
    del t, s  # dropping a freed storage frees nothing twice
    assert allocated(sdev) == base - int(np.prod(shape)) * dtype.itemsize


def test_zero_size_storage_is_never_freed(sdev):
    t = wgpar.empty(0, 4, device=sdev)
    t.untyped_storage().free()
    assert not t.untyped_storage().is_freed
    assert t.numpy().shape == (0, 4) and (t + 1).shape == (0, 4)


def test_tensor_and_views_stay_the_same_objects_and_see_new_data(sdev, rng):
    a = rng.standard_normal((6, 10)).astype(np.float32)
    p = nn.Parameter(wgpar.tensor(a, device=sdev))
    row = p[2]
    col = p.T[3]  # a strided view: column 3
    s = p.untyped_storage()
    s.free()
    assert p.untyped_storage() is s is row.untyped_storage()
    s.materialize()
    b = rng.standard_normal((6, 10)).astype(np.float32)
    with no_grad():
        p.copy_(wgpar.tensor(b, device=sdev))
    assert_close(row.numpy(), b[2])
    assert_close(col.numpy(), b[:, 3])
    assert_close((p * 2).numpy(), 2 * b)


@pytest.mark.parametrize("use", ["quick op", "strided op", "reduction", "matmul", "readback", "copy into",
                                 "copy from", "to another device", "optimizer step"])
def test_freed_storage_raises_a_clear_error(sdev, devs2, use):
    x = wgpar.ones(4, 6, device=sdev)
    other = wgpar.ones(4, 6, device=sdev)
    x.untyped_storage().free()
    ops = {
        "quick op": lambda: x + other,
        "strided op": lambda: x.T + other.T.contiguous(),
        "reduction": lambda: x.sum(1),
        "matmul": lambda: x @ other.T,
        "readback": lambda: x.numpy(),
        "copy into": lambda: x.copy_(other),
        "copy from": lambda: other.copy_(x),
        "to another device": lambda: x.to(devs2[1]),
        "optimizer step": lambda: _sgd_step(x, other),
    }
    with pytest.raises(wgpar.StorageFreedError, match=r"24 float32 elements, 96 bytes, on wgpu:8.*was freed"):
        ops[use]()
    assert isinstance(wgpar.StorageFreedError("x"), RuntimeError)
    assert "freed storage" in repr(x)
    x.untyped_storage().materialize()
    x.fill_(3.0)
    assert_close((x + other).numpy(), np.full((4, 6), 4.0))


def _sgd_step(p, g):
    p = nn.Parameter(p)
    p.grad = g
    wgpar.optim.SGD([p], lr=0.1).step()


@pytest.mark.parametrize("n", [4096, 300_000])  # small uploads use write_buffer, large ones a GPU copy
def test_freeing_while_queued_work_reads_the_buffer_is_safe(sdev, rng, n):
    """Free tensors right after recording kernels that read them; their buffers are handed out
    again at once and overwritten (by an upload, by a kernel) before anything was submitted. The
    earlier kernels still see the old values: the new writes are recorded after them on the
    device's one queue (and an upload through write_buffer flushes the recorded work first)."""
    a1, a2 = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x1, x2 = wgpar.tensor(a1, device=sdev), wgpar.tensor(a2, device=sdev)
    wgpar.synchronize(sdev)
    b1, b2 = x1.untyped_storage().buffer, x2.untyped_storage().buffer
    results = [x1 * float(k) + x2 for k in range(1, 5)]  # recorded, not yet submitted
    assert sdev._pending > 0
    x1.untyped_storage().free()
    up = wgpar.tensor(np.full(n, 7.0, np.float32), device=sdev)  # an upload into x1's old buffer
    assert up.untyped_storage().buffer is b1
    x2.untyped_storage().free()
    filled = wgpar.empty(n, device=sdev)
    assert filled.untyped_storage().buffer is b2
    filled.fill_(-1.0)  # a kernel write into x2's old buffer
    for k, r in enumerate(results, 1):
        assert_close(r.numpy(), k * a1.astype(np.float64) + a2, rtol=1e-6, atol=1e-6)
    assert_close(up.numpy(), np.full(n, 7.0))
    assert_close(filled.numpy(), -np.ones(n))


def test_bind_groups_follow_buffers_not_storages(sdev, rng):
    """The bind-group cache is keyed by buffers: a re-materialised storage on another buffer, a
    second storage on its old buffer, and a storage whose old buffer went back to wgpu all compute
    with their own values."""
    a, b = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
    x = wgpar.tensor(a, device=sdev)
    ones = wgpar.ones(300, device=sdev)
    assert_close((x + ones).numpy(), a + 1.0, rtol=1e-6)  # caches a bind group on x's buffer
    old = x.untyped_storage().buffer
    x.untyped_storage().free()
    y = wgpar.tensor(b, device=sdev)  # takes x's old buffer
    assert y.untyped_storage().buffer is old
    x.untyped_storage().materialize()
    assert x.untyped_storage().buffer is not old
    x.copy_(wgpar.tensor(2 * a, device=sdev))
    assert_close((x + ones).numpy(), 2 * a + 1.0, rtol=1e-6)
    assert_close((y + ones).numpy(), b + 1.0, rtol=1e-6)
    second = x.untyped_storage().buffer
    assert any(bb is second for key in sdev._bind_groups for bb in key[1])
    x.untyped_storage().free()
    wgpar.empty_cache(sdev)  # x's second buffer goes back to wgpu; its bind groups are forgotten
    assert not any(bb is second for key in sdev._bind_groups for bb in key[1])
    del second
    x.untyped_storage().materialize()
    x.copy_(wgpar.tensor(3 * a, device=sdev))
    assert_close((x + ones).numpy(), 3 * a + 1.0, rtol=1e-6)


# -- with autograd ---------------------------------------------------------------------------------
def _linear_grads(free: str, x: np.ndarray, w: np.ndarray, g: np.ndarray, dev):
    """Gradients of (x @ w.T) seeded with g; the weight's storage is freed after forward when
    ``free`` says so, and restored (or not) before backward reaches the matmul."""
    xt = wgpar.tensor(x, device=dev, requires_grad=True)
    wt = nn.Parameter(wgpar.tensor(w, device=dev))
    y = xt @ wt.T
    keep = wgpar.tensor(w, device=dev)
    if free != "no":
        wt.untyped_storage().free()

    def restore(grad):
        if free == "restored":
            with no_grad(), preserve_version(wt):
                wt.untyped_storage().materialize()
                wt.copy_(keep)
        elif free == "materialized without preserve_version":
            wt.untyped_storage().materialize()
            with no_grad():
                wt.copy_(keep)

    y.register_hook(restore)
    y.backward(wgpar.tensor(g, device=dev))
    return xt.grad.numpy(), wt.grad.numpy()


def test_backward_through_a_freed_and_restored_saved_tensor(sdev, rng):
    x = rng.standard_normal((9, 5)).astype(np.float32)
    w = rng.standard_normal((7, 5)).astype(np.float32)
    g = rng.standard_normal((9, 7)).astype(np.float32)
    want = _linear_grads("no", x, w, g, sdev)
    got = _linear_grads("restored", x, w, g, sdev)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert_close(want[0], g.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="modified in place.*preserve_version"):
        _linear_grads("materialized without preserve_version", x, w, g, sdev)
    with pytest.raises(wgpar.StorageFreedError, match="was freed"):
        _linear_grads("never restored", x, w, g, sdev)


def test_fsdp_shaped_lifecycle_with_module_and_backward_hooks(sdev, rng):
    """Weights exist only while their layer runs, in forward and in backward: memory_stats shows
    it, and the gradients equal those of the same model without any freeing."""
    x = rng.standard_normal((16, 12)).astype(np.float32)
    ref = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 8)).to(sdev)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 8)).to(sdev)
    model.load_state_dict(ref.state_dict())
    layers = [model[0], model[2]]
    saved = {id(p): p.numpy() for m in layers for p in m.parameters()}  # stands in for the shards
    log = []

    def unshard(m):
        for p in m.parameters():
            with no_grad(), preserve_version(p):  # preserve: backward's nodes saved these tensors
                p.untyped_storage().materialize()
                p.copy_(wgpar.tensor(saved[id(p)], device=sdev))

    def reshard(m):
        for p in m.parameters():
            p.untyped_storage().free()

    def live_param_bytes():
        return sum(p.nbytes for p in model.parameters() if not p.untyped_storage().is_freed)

    def pre_forward(m, args):
        before = allocated(sdev)
        unshard(m)
        log.append(("unshard", m.out_features, allocated(sdev) - before, live_param_bytes()))

    def post_forward(m, args, out):
        before = allocated(sdev)
        reshard(m)
        log.append(("reshard", m.out_features, before - allocated(sdev), live_param_bytes()))
        out.register_hook(lambda g: unshard(m) or log.append(("unshard for backward", m.out_features)))
        return out

    done, queued = [], []

    def post_backward(m):
        def hook(p):
            if all(q.grad is not None for q in m.parameters()):
                reshard(m)
                log.append(("reshard after backward", m.out_features))
                if not queued:  # once per backward: what FSDP does at the end of backward
                    queued.append(True)
                    wgpar.autograd.queue_callback(
                        lambda: done.append(all(q.untyped_storage().is_freed for q in model.parameters())))
        return hook

    for m in layers:
        reshard(m)
        m.register_forward_pre_hook(pre_forward)
        m.register_forward_hook(post_forward)
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(post_backward(m))
    param_bytes = {m.out_features: sum(p.nbytes for p in m.parameters()) for m in layers}
    out = model(wgpar.tensor(x, device=sdev))
    (out * out).sum().backward()
    want_out = ref(wgpar.tensor(x, device=sdev))
    (want_out * want_out).sum().backward()

    assert_close(out.numpy(), want_out.numpy(), rtol=0, atol=0)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=name)
    steps = [e[:2] for e in log]
    assert steps == [("unshard", 32), ("reshard", 32), ("unshard", 8), ("reshard", 8),
                     ("unshard for backward", 8), ("reshard after backward", 8),
                     ("unshard for backward", 32), ("reshard after backward", 32)]
    # Unshard and reshard move allocated_bytes by exactly a layer's parameters, and while a layer
    # runs its parameters are the only ones materialised.
    for name, features, moved, live in log[:4]:
        assert moved == param_bytes[features]
        assert live == (param_bytes[features] if name == "unshard" else 0)
    assert done == [True]  # the callback ran once, after the last layer had resharded
