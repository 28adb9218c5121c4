"""backward_input: input gradients now, weight gradients later (DeferredGrad), together one backward."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn, ops
from wgpar.autograd import backward_input, no_grad
from wgpar.nn import functional as F

from .helpers import assert_close


def _net(rng, x_grad: bool):
    """Leaves (arrays) and a function building the graph: a shared square weight, a LayerNorm, a branch
    from the input that skips the hidden layers, and a bias on a broadcast add."""
    arrays = {
        "x": rng.standard_normal((7, 5)), "w1": rng.standard_normal((9, 5)) * 0.4, "b1": rng.standard_normal(9),
        "w2": rng.standard_normal((9, 9)) * 0.3, "ln_w": 1 + 0.1 * rng.standard_normal(9),
        "ln_b": 0.1 * rng.standard_normal(9), "w3": rng.standard_normal((9, 5)) * 0.4,
    }

    def build():
        t = {k: wgpar.tensor(v.astype(np.float32), requires_grad=(k != "x" or x_grad)) for k, v in arrays.items()}
        h = F.gelu(F.linear(t["x"], t["w1"], t["b1"]))
        h = F.layer_norm(F.linear(h, t["w2"]), (9,), t["ln_w"], t["ln_b"])
        h = F.linear(h.tanh(), t["w2"])  # w2 used twice
        out = h + F.linear(t["x"], t["w3"])
        return t, out

    return build


def _grads(t):
    return {k: (v.grad.numpy() if v.grad is not None else None) for k, v in t.items()}


@pytest.mark.parametrize("x_grad", [True, False], ids=["input-wanted", "first-stage"])
def test_input_half_plus_weight_half_equals_one_backward(rng, x_grad):
    build = _net(rng, x_grad)
    g = rng.standard_normal((7, 9)).astype(np.float32)
    ref_t, ref_out = build()
    ref_out.backward(wgpar.tensor(g))
    want = _grads(ref_t)

    t, out = build()
    deferred = backward_input(out, wgpar.tensor(g), [t["x"]] if x_grad else [])
    now = _grads(t)
    # After the input half: the input's gradient is final, no weight has one yet.
    for k in t:
        if k == "x" and x_grad:
            assert_close(now[k], want[k], rtol=1e-6, atol=1e-7, what=k)
        else:
            assert now[k] is None, f"{k} got a gradient in the input half"
    assert deferred.pending > 0
    deferred.run()
    assert deferred.pending == 0
    for k, v in _grads(t).items():
        if want[k] is None:
            assert v is None
        else:
            assert_close(v, want[k], rtol=1e-6, atol=1e-7, what=k)
    deferred.run()  # a second run has nothing left to do
    assert_close(t["w2"].grad.numpy(), want["w2"], rtol=1e-6, atol=1e-7)


def test_weight_half_does_not_repeat_the_input_halfs_matmuls(rng, monkeypatch):
    build = _net(rng, True)
    g = wgpar.tensor(rng.standard_normal((7, 9)).astype(np.float32))
    calls = []
    real = ops.matmul
    monkeypatch.setattr(ops, "matmul", lambda a, b, *dt: calls.append(1) or real(a, b, *dt))

    _, out = build()
    calls.clear()
    out.backward(g)
    plain = len(calls)

    t, out = build()
    calls.clear()
    deferred = backward_input(out, g, [t["x"]])
    input_half = len(calls)
    deferred.run()
    # 4 matmuls in the forward: each has an input-side and a weight-side product, computed once.
    assert plain == 8
    assert input_half == 4 and len(calls) == plain


def test_saved_tensors_live_until_the_weight_half_and_are_checked(rng):
    lin = nn.Linear(6, 4)
    x = wgpar.tensor(rng.standard_normal((3, 6)).astype(np.float32), requires_grad=True)
    out = lin(x)
    fired = []
    lin.weight.register_post_accumulate_grad_hook(lambda p: fired.append(p.shape))
    deferred = backward_input(out, wgpar.ones(3, 4), [x])
    assert x.grad is not None and lin.weight.grad is None and not fired
    with no_grad():
        x.add_(1.0)  # x is saved for the weight gradient: changing it in between is caught
    with pytest.raises(RuntimeError, match="modified in place"):
        deferred.run()


def test_release_drops_the_deferred_work(rng):
    lin = nn.Linear(6, 4)
    x = wgpar.tensor(rng.standard_normal((3, 6)).astype(np.float32), requires_grad=True)
    deferred = backward_input(lin(x), wgpar.ones(3, 4), [x])
    deferred.release()
    deferred.run()
    assert lin.weight.grad is None and deferred.pending == 0


def test_inputs_must_be_leaves_that_require_grad(rng):
    x = wgpar.tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    y = x * 2
    with pytest.raises(ValueError, match="leaf tensors that require grad"):
        backward_input(y.sum(), None, [y])
    with pytest.raises(ValueError, match="leaf tensors that require grad"):
        backward_input((x * 3).sum(), None, [wgpar.ones(2)])
