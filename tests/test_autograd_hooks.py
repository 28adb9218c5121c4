"""Backward hooks: node pre-hooks, Tensor.register_hook (against torch), queue_callback, preserve_version."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wgpar
from wgpar.autograd import Function, no_grad, preserve_version, queue_callback

from .helpers import assert_close


class Logged(Function):
    """y = x * w, logging when its backward function runs."""

    log: list = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        Logged.log.append("backward_fn")
        x, w = ctx.saved_tensors
        return g * w, g * x


def test_prehook_runs_before_the_version_check_and_the_backward_function(rng):
    Logged.log = []
    x = wgpar.tensor(rng.standard_normal(5), requires_grad=True)
    w = wgpar.tensor(rng.standard_normal(5))
    y = Logged.apply(x, w)
    y.grad_fn.register_prehook(lambda g: Logged.log.append("prehook"))
    with no_grad():
        w.add_(1.0)  # a saved tensor changed: the version check must fail, after the pre-hook ran
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()
    assert Logged.log == ["prehook"]


def test_prehook_restores_a_saved_tensor_before_backward_uses_it(rng):
    """FSDP's pattern: a saved weight is overwritten after forward and restored in the pre-hook."""
    a = rng.standard_normal((6, 7)).astype(np.float32)
    wv = rng.standard_normal((7, 3)).astype(np.float32)
    x = wgpar.tensor(a, requires_grad=True)
    w = wgpar.tensor(wv, requires_grad=True)
    y = x @ w
    keep = w.detach().clone()
    with no_grad(), preserve_version(w):
        w.fill_(0.0)  # "resharded": values gone, version kept

    def regather(g):
        with no_grad(), preserve_version(w):
            w.copy_(keep)

    y.grad_fn.register_prehook(regather)
    g = rng.standard_normal((6, 3)).astype(np.float32)
    y.backward(wgpar.tensor(g))
    assert_close(x.grad.numpy(), g.astype(np.float64) @ wv.T, rtol=1e-5, atol=1e-5)
    assert_close(w.grad.numpy(), a.T.astype(np.float64) @ g, rtol=1e-5, atol=1e-5)


def test_prehook_replaces_the_gradient_and_handles_remove(rng):
    a = rng.standard_normal(9)
    x = wgpar.tensor(a, requires_grad=True)
    y = x.exp()
    seen = []
    h1 = y.grad_fn.register_prehook(lambda g: seen.append(g.numpy()) or g * 3.0)
    y.grad_fn.register_prehook(lambda g: seen.append(g.numpy()))  # sees the first hook's result
    y.sum().backward(retain_graph=True)
    assert_close(seen[0], np.ones(9))
    assert_close(seen[1], 3 * np.ones(9))
    assert_close(x.grad.numpy(), 3 * np.exp(a), rtol=1e-5)
    h1.remove()
    h1.remove()
    x.grad = None
    y.sum().backward()
    assert_close(x.grad.numpy(), np.exp(a), rtol=1e-5)
    assert len(seen) == 3


def test_tensor_hooks_match_torch(rng, torch):
    a = rng.standard_normal((4, 5))
    b = rng.standard_normal((4, 5))
    x = wgpar.tensor(a, requires_grad=True)
    w = wgpar.tensor(b, requires_grad=True)
    xt = torch.tensor(a, requires_grad=True)
    wt = torch.tensor(b, requires_grad=True)
    got = {}
    want = {}

    def rec(store, name, scale=None):
        def hook(g):
            store.setdefault(name, []).append(g.numpy() if isinstance(g, wgpar.Tensor) else g.detach().numpy())
            return None if scale is None else g * scale
        return hook

    for lib, store, xx, ww in ((wgpar, got, x, w), (torch, want, xt, wt)):
        h = xx * ww
        h.retain_grad()
        h.register_hook(rec(store, "h"))
        h.register_hook(rec(store, "h2", 2.0))  # doubles what flows back from h, and what .grad keeps
        xx.register_hook(rec(store, "x", -1.0))  # leaf: replaces what accumulates into x.grad
        ww.register_hook(rec(store, "w"))
        ((h * h).sum() + (h * 0.5).exp().sum()).backward()
        (xx * 3).sum().backward()  # a second pass: x's hook runs again and .grad accumulates
        store["x.grad"] = xx.grad.detach().numpy() if lib is torch else xx.grad.numpy()
        store["w.grad"] = ww.grad.detach().numpy() if lib is torch else ww.grad.numpy()
        store["h.grad"] = h.grad.detach().numpy() if lib is torch else h.grad.numpy()
    assert got.keys() == want.keys()
    for k in want:
        assert_close(np.array(got[k]), np.array(want[k]), rtol=1e-5, atol=1e-6, what=k)


def test_hook_errors():
    x = wgpar.ones(3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        x.register_hook(lambda g: None)
    y = wgpar.ones(3, requires_grad=True)
    with y.register_hook(lambda g: wgpar.ones(4)):
        with pytest.raises(RuntimeError, match=r"shape \(4,\).*expected shape \(3,\)"):
            (y * 2).sum().backward()
    assert y.grad is None
    z = y * 2
    z.register_hook(lambda g: 1.0)
    with pytest.raises(TypeError, match="returned float"):
        z.sum().backward()


def test_hook_removing_itself_during_backward(rng):
    x = wgpar.tensor(rng.standard_normal(4), requires_grad=True)
    calls = []
    handles = []

    def once(g):
        calls.append(1)
        handles[0].remove()

    handles.append(x.register_hook(once))
    for _ in range(3):
        (x * 2).sum().backward()
    assert calls == [1]
    assert_close(x.grad.numpy(), 6 * np.ones(4))


# -- queue_callback ----------------------------------------------------------------------------------
def test_queue_callback_runs_once_after_every_node_and_leaf(rng):
    a = rng.standard_normal(5)
    x = wgpar.tensor(a, requires_grad=True)
    w = wgpar.tensor(rng.standard_normal(5), requires_grad=True)
    log = []

    def final():
        log.append(("final", x.grad.numpy(), w.grad.numpy(), wgpar.is_grad_enabled()))
        queue_callback(lambda: log.append(("queued by a callback",)))

    y = x * w
    y.register_hook(lambda g: queue_callback(final) or log.append(("hook",)))
    x.register_post_accumulate_grad_hook(lambda t: log.append(("x accumulated",)))
    w.register_post_accumulate_grad_hook(lambda t: log.append(("w accumulated",)))
    (y * y).sum().backward()
    names = [e[0] for e in log]
    assert names[0] == "hook" and names[-2:] == ["final", "queued by a callback"]
    assert {"x accumulated", "w accumulated"} == set(names[1:3])
    _, xg, wg, grad_mode = log[-2]
    assert_close(xg, 2 * (a * w.numpy()) * w.numpy(), rtol=1e-5)
    assert grad_mode is False
    log.clear()
    (x * 1.0).sum().backward()  # the callback was for one pass only
    assert log == [("x accumulated",)]


def test_queue_callback_outside_backward_and_after_a_failed_pass():
    with pytest.raises(RuntimeError, match="no backward pass is running"):
        queue_callback(lambda: None)
    x = wgpar.ones(3, requires_grad=True)
    ran = []

    def hook(g):
        queue_callback(lambda: ran.append(1))
        raise ValueError("hook failed")

    y = x * 2
    y.register_hook(hook)
    with pytest.raises(ValueError, match="hook failed"):
        y.sum().backward()
    assert ran == []  # as in torch: a failed pass runs no callbacks
    with pytest.raises(RuntimeError, match="no backward pass is running"):
        queue_callback(lambda: None)


def test_queue_callback_from_a_nested_backward_belongs_to_the_inner_pass():
    x = wgpar.ones(2, requires_grad=True)
    z = wgpar.ones(2, requires_grad=True)
    log = []

    def hook(g):
        queue_callback(lambda: log.append("outer"))
        with wgpar.enable_grad():  # backward runs its hooks under no_grad (as torch does)
            inner = z * 3
            inner.register_hook(lambda gi: queue_callback(lambda: log.append("inner")))
            inner.sum().backward()
        log.append("inner backward returned")

    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert log == ["inner", "inner backward returned", "outer"]


def test_queue_callback_is_per_thread():
    """A thread in its own backward queues into its own pass; another thread's call raises."""
    in_hook = threading.Event()
    checked = threading.Event()
    results = {}

    def worker():
        x = wgpar.ones(3, requires_grad=True)
        y = x * 2

        def hook(g):
            queue_callback(lambda: results.setdefault("worker callback", threading.get_ident()))
            in_hook.set()
            checked.wait(30)

        y.register_hook(hook)
        y.sum().backward()

    t = threading.Thread(target=worker)
    t.start()
    assert in_hook.wait(30)
    try:
        with pytest.raises(RuntimeError, match="no backward pass is running on this thread"):
            queue_callback(lambda: results.setdefault("main", 1))
    finally:
        checked.set()
        t.join(30)
    assert not t.is_alive()
    assert list(results) == ["worker callback"] and results["worker callback"] == t.ident


# -- preserve_version --------------------------------------------------------------------------------
def test_preserve_version_keeps_the_counter_only_on_success():
    t = wgpar.zeros(4)
    v = t._storage.version
    with preserve_version(t[1:]):  # any view of the storage
        t.add_(1.0)
        t[0] = 5.0
    assert t._storage.version == v
    assert_close(t.numpy(), [5, 1, 1, 1])
    with pytest.raises(ValueError):
        with preserve_version(t):
            t.add_(1.0)
            raise ValueError("half written")
    assert t._storage.version == v + 1  # a half-restored tensor must not pass the version check
    with pytest.raises(TypeError, match="wgpar.Tensor"):
        with preserve_version(np.zeros(3)):
            pass
