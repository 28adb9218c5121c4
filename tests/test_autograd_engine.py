"""The autograd engine: accumulation, modes, tapes per thread, Function, version counters, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import wgpar
from wgpar.autograd import Function, backward_with_grad, install_tape, no_grad, take_tape
from wgpar.nn import functional as F

from .helpers import assert_close


def test_grad_accumulates_across_backward_calls(rng):
    a = rng.standard_normal((3, 4))
    x = wgpar.tensor(a, requires_grad=True)
    (x * 2).sum().backward()
    (x * x).sum().backward()
    assert_close(x.grad.numpy(), 2 + 2 * a, rtol=1e-6)


def test_shared_subexpression_gets_summed_gradient(rng):
    a = rng.standard_normal((5,))
    x = wgpar.tensor(a, requires_grad=True)
    y = x.exp()
    (y * y + y).sum().backward()
    assert_close(x.grad.numpy(), 2 * np.exp(2 * a) + np.exp(a), rtol=1e-5)


def test_same_tensor_reaching_two_leaves_is_not_aliased():
    x = wgpar.ones(3, requires_grad=True)
    y = wgpar.ones(3, requires_grad=True)
    (x + y).sum().backward()
    with no_grad():
        x.grad.mul_(5.0)
    assert_close(y.grad.numpy(), np.ones(3))


def test_no_grad_detach_and_requires_grad_flags():
    x = wgpar.ones(2, 2, requires_grad=True)
    with no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = x.detach() * 2
    assert not z.requires_grad
    w = x * 2
    assert w.requires_grad and w.grad_fn is not None and not w.is_leaf

    @no_grad()
    def f(t):
        return t + 1

    assert not f(x).requires_grad


def test_retain_grad_on_intermediate(rng):
    x = wgpar.tensor(rng.standard_normal(4), requires_grad=True)
    h = (x * 3).retain_grad()
    (h * h).sum().backward()
    assert_close(h.grad.numpy(), 2 * h.numpy(), rtol=1e-6)


def test_ten_thousand_op_chain_backpropagates():
    x = wgpar.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0
    y.sum().backward()
    assert_close(x.grad.numpy(), [1.0])


def test_backward_errors():
    x = wgpar.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        wgpar.ones(3).sum().backward()
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()
    z = (x * x).sum()
    z.backward(retain_graph=True)
    z.backward()
    assert_close(x.grad.numpy(), [6.0, 6.0, 6.0])
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        (x * 2).backward(wgpar.ones(2))


def test_in_place_change_of_saved_tensor_is_caught():
    x = wgpar.ones(3, requires_grad=True)
    y = x * 2
    z = y * y  # saves y
    with no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        z.sum().backward()


def _index_cases():
    """(op name in the error, forward building a scalar loss from x and an int32 tensor, index values)."""
    return [
        ("index_select", lambda x, i: x.index_select(0, i).sum(), [0, 2, 2]),
        ("indexing", lambda x, i: (x[i] * x[i]).sum(), [1, -1]),
        ("indexing", lambda x, i: x[:, i].sum(), [0, 3]),
        ("embedding", lambda x, i: F.embedding(i, x).sum(), [3, 0]),
        ("cross_entropy", lambda x, i: F.cross_entropy(x, i), [0, 3, 1, 2]),
        ("cross_entropy", lambda x, i: F.cross_entropy(x, i, reduction="none").sum(), [1, 1, 0, 2]),
        ("cross_entropy", lambda x, i: F.cross_entropy(x, i, reduction="sum"), [3, 3, 3, 3]),
    ]


@pytest.mark.parametrize("case", range(len(_index_cases())))
@pytest.mark.parametrize("change", ["add_", "setitem", "fill_", "copy_"])
def test_in_place_change_of_an_index_or_target_after_forward_is_caught(case, change):
    name, forward, values = _index_cases()[case]
    x = wgpar.tensor(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, requires_grad=True)
    idx = wgpar.tensor(np.array(values, np.int32))
    loss = forward(x, idx)
    {"add_": lambda: idx.add_(0), "setitem": lambda: idx.__setitem__(0, 1), "fill_": lambda: idx.fill_(2),
     "copy_": lambda: idx.copy_(wgpar.tensor(np.array(values[::-1], np.int32)))}[change]()
    with pytest.raises(RuntimeError, match=f"saved by {name} for backward was modified in place"):
        loss.backward()
    assert x.grad is None


@pytest.mark.parametrize("which", ["min", "max", "both"])
def test_in_place_change_of_a_clamp_bound_after_forward_is_caught(rng, which):
    x = wgpar.tensor(rng.standard_normal(7).astype(np.float32), requires_grad=True)
    lo, hi = wgpar.full((7,), -0.3), wgpar.full((1,), 0.4)
    out = x.clamp(min=lo if which != "max" else None, max=hi if which != "min" else None)
    with no_grad():
        (lo if which == "min" else hi).mul_(0.5)
    with pytest.raises(RuntimeError, match="saved by clamp for backward was modified in place"):
        out.sum().backward()


def test_nll_loss_target_changed_after_forward_keeps_the_forward_gradient(rng, torch):
    # nll_loss turns targets into flat positions during forward and never reads them again, so a later
    # change cannot move its gradient: it stays the gradient of the loss that was computed.
    z = rng.standard_normal((5, 4)).astype(np.float32)
    tgt = np.array([0, 3, 1, 1, 2], np.int32)
    x = wgpar.tensor(z, requires_grad=True)
    t = wgpar.tensor(tgt)
    loss = F.nll_loss(x, t)
    t.fill_(0)
    loss.backward()
    xt = torch.tensor(z, requires_grad=True)
    torch.nn.functional.nll_loss(xt, torch.tensor(tgt, dtype=torch.int64)).backward()
    assert_close(x.grad.numpy(), xt.grad.numpy())


@pytest.mark.parametrize("lo_shape,hi_shape", [((6, 5), (6, 5)), ((5,), (6, 1)), ((1, 5), None), (None, (5,))])
def test_clamp_tensor_bounds_get_gradients_as_in_torch(rng, lo_shape, hi_shape, torch):
    a = rng.standard_normal((6, 5)).astype(np.float32)
    lo = rng.uniform(-1.0, 0.2, lo_shape).astype(np.float32) if lo_shape else None
    hi = rng.uniform(-0.2, 1.0, hi_shape).astype(np.float32) if hi_shape else None  # some hi < lo
    g = rng.standard_normal((6, 5)).astype(np.float32)
    w = [wgpar.tensor(v, requires_grad=True) if v is not None else None for v in (a, lo, hi)]
    t = [torch.tensor(v, requires_grad=True) if v is not None else None for v in (a, lo, hi)]
    (wgpar.clamp(w[0], w[1], w[2]) * wgpar.tensor(g)).sum().backward()
    (torch.clamp(t[0], t[1], t[2]) * torch.tensor(g)).sum().backward()
    for wi, ti, what in zip(w, t, ("input", "min", "max")):
        if wi is not None:
            assert_close(wi.grad.numpy(), ti.grad.numpy(), what=what)


def test_in_place_on_leaf_requiring_grad_is_refused():
    x = wgpar.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        x.add_(1.0)
    with no_grad():
        x.add_(1.0)
    assert_close(x.numpy(), [2, 2, 2])


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3.0 * x * x


class ScaleBy(Function):
    @staticmethod
    def forward(ctx, x, k: float):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def test_custom_function(rng):
    a = rng.standard_normal(6)
    x = wgpar.tensor(a, requires_grad=True)
    y = ScaleBy.apply(Cube.apply(x), 2.0)
    assert_close(y.numpy(), 2 * a ** 3, rtol=1e-5)
    y.sum().backward()
    assert_close(x.grad.numpy(), 6 * a ** 2, rtol=1e-5)


def test_custom_function_version_check():
    x = wgpar.ones(3, requires_grad=True)
    h = x * 1.0
    y = Cube.apply(h)
    with no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


def test_explicit_tape_and_backward_with_grad(rng):
    a, g = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    x = wgpar.tensor(a, requires_grad=True)
    install_tape()
    y = (x * x).tanh()
    tape = take_tape()
    assert len(tape) == 2
    backward_with_grad(y, wgpar.tensor(g))
    # tanh's backward is g * (1 - y^2) from the float32 y: near saturation 1 - y^2 keeps only y's absolute
    # error (a few float32 ulps of 1), so the bound is relative to g * 2a, not to the tiny gradient.
    t = y.numpy().astype(np.float64)
    want = g * (1 - t ** 2) * 2 * a
    err = np.abs(x.grad.numpy() - want)
    assert np.all(err <= 1e-4 * np.abs(want) + 5e-7 * np.abs(g * 2 * a) + 1e-7), (err, want)
    assert_close(x.grad.numpy(), g * (1 - np.tanh(a * a) ** 2) * 2 * a, rtol=1e-3, atol=1e-5)
    tape.release()


def test_threads_record_their_own_graphs_with_unique_ids(devs2, rng):
    """Each thread drives its own device and tape; node ids never collide."""
    arrays = [rng.standard_normal((4, 5)) for _ in devs2]
    results, ids, errors = {}, {}, []

    def work(rank):
        try:
            tape = install_tape()
            x = wgpar.tensor(arrays[rank], device=devs2[rank], requires_grad=True)
            y = ((x * (rank + 1)).relu() * x).sum()
            ids[rank] = {n.id for n in tape.nodes}
            y.backward()
            results[rank] = x.grad.numpy()
            take_tape()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(devs2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not (ids[0] & ids[1])
    for r, a in enumerate(arrays):
        k = r + 1
        want = np.where(a * k > 0, 2 * k * a, 0.0)
        assert_close(results[r], want, rtol=1e-5)


def test_loss_on_another_device_is_refused(devs2):
    x = wgpar.ones(3, device=devs2[0], requires_grad=True)
    y = wgpar.ones(3, device=devs2[1])
    with pytest.raises(ValueError, match="different devices"):
        (x * y).sum()
    out = (x * 2).sum()
    with pytest.raises(ValueError, match="gradient on"):
        out.backward(wgpar.ones((), device=devs2[1]))


def test_unused_graph_frees_its_memory_without_the_cycle_collector(dev):
    """Saved outputs are detached aliases, so a dropped graph is freed by reference counting alone."""
    import gc

    x = wgpar.randn(64, 33, requires_grad=True)
    gc.collect()
    gc.disable()
    try:
        base = wgpar.memory_stats(dev)["allocated_bytes"]
        y = (x.exp() / (x.sigmoid() + 1.0)).tanh().softmax(-1).amax(1) ** 2.0
        z = y.sum()
        assert wgpar.memory_stats(dev)["allocated_bytes"] > base
        del y, z
        assert wgpar.memory_stats(dev)["allocated_bytes"] == base
    finally:
        gc.enable()


def test_elementwise_nodes_save_only_what_the_needed_gradients_read(rng):
    # As torch: x * w with only x requiring grad keeps w (x's gradient reads it), not x. So an in-place
    # change to x before backward is harmless and not refused; one to w still is.
    a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    x, w = wgpar.tensor(a, requires_grad=True), wgpar.tensor(b)
    h = x * 1.0  # a non-leaf, so it can be changed in place under no_grad
    y = h * w
    with no_grad():
        h.add_(3.0)
    y.sum().backward()
    assert_close(x.grad.numpy(), b)
    x.grad = None
    y = (x * 1.0) * w
    with no_grad():
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match="saved by mul for backward was modified in place"):
        y.sum().backward()
    # an op whose gradient reads its output (exp) still saves it
    h = x * 1.0
    e = h.exp()
    with no_grad():
        e.add_(1.0)
    with pytest.raises(RuntimeError, match="saved by exp for backward was modified in place"):
        e.sum().backward()
