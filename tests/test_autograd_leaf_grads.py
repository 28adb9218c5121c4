""".grad takes a leaf's gradient as is when nothing else can see it (as torch does), and a copy otherwise:
optimizers and clip_grad_norm_ update .grad in place, so an alias would be a silent wrong result. Every
case where the gradient is shared (one gradient reaching two leaves, a hook keeping it, a retained or a
view gradient, a retained graph's second backward) is checked, after an in-place clip and optimizer
step, against PyTorch or NumPy float64; plus the copies and the memory that stealing saves."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F

from .helpers import assert_close, record_dispatches

A, B, W, W2 = (np.random.default_rng(k).standard_normal(s).astype(np.float32) for k, s in
               ((1, (3, 4)), (2, (3, 4)), (3, (3, 4)), (4, (6, 4))))


def _add_shared(lib, a, b, kept):  # add's backward hands one tensor to both leaves
    return ((a + b) * lib.tensor(W)).sum()


def _twice(lib, a, b, kept):  # x + x: two gradients of one leaf, summed
    return ((a + a) * lib.tensor(W)).sum() + (b * 2.0).sum()


def _leaf_hook(lib, a, b, kept):  # a tensor hook keeps the gradient it was given
    a.register_hook(lambda g: kept.append(g))
    return (a * lib.tensor(W)).sum() + (b * lib.tensor(W)).sum()


def _clone_hook(lib, a, b, kept):  # clone's backward passes its gradient on: the hook's tensor is a's gradient
    y = a.clone()
    y.register_hook(lambda g: kept.append(g))
    return (y * lib.tensor(W)).sum() + (b * 3.0).sum()


def _retained_view(lib, a, b, kept):  # a's gradient is a view of y's retained .grad
    y = a.reshape(12)
    y.retain_grad()
    kept.append(y)
    return (y * lib.tensor(W.reshape(12))).sum() + (b * lib.tensor(W)).sum()


def _expanded(lib, a, b, kept):  # sum's backward expands: a 0-stride view
    return a.sum() + (b * lib.tensor(W)).sum()


def _cat_slices(lib, a, b, kept):  # cat's backward: two slices of one buffer
    return (lib.cat([a, b]) * lib.tensor(W2)).sum()


def _cat_one_side(lib, a, b, kept):  # one slice alone: offset 0 but only half its buffer
    return (lib.cat([a, lib.tensor(B)]) * lib.tensor(W2)).sum() + (b * 2.0).sum()


CASES = [_add_shared, _twice, _leaf_hook, _clone_hook, _retained_view, _expanded, _cat_slices, _cat_one_side]


def _run(lib, case, twice: bool) -> list[np.ndarray]:
    """The case's gradients, then an in-place clip and momentum SGD step: every tensor touched, as NumPy."""
    a, b = lib.nn.Parameter(lib.tensor(A)), lib.nn.Parameter(lib.tensor(B))
    kept: list = []
    loss = case(lib, a, b, kept)
    loss.backward(retain_graph=twice)
    if twice:
        loss.backward()
    grads = [a.grad.numpy().copy(), b.grad.numpy().copy()]
    opt = lib.optim.SGD([a, b], lr=0.5, momentum=0.9)
    lib.nn.utils.clip_grad_norm_([a, b], 1.0)
    opt.step()
    opt.step()  # the second step reads the clipped grads and the momentum buffers
    with lib.no_grad():
        a.grad.mul_(-3.0)  # after the step: nothing else may see it
    kept = [k.grad if getattr(k, "grad", None) is not None else k for k in kept]
    return grads + [a.grad.numpy(), b.grad.numpy(), a.detach().numpy(), b.detach().numpy()] + \
        [k.detach().numpy() for k in kept]


def _numpy(case, twice: bool) -> list[np.ndarray]:
    A64, W64, W264 = A.astype(np.float64), W.astype(np.float64), W2.astype(np.float64)
    ga, gb = {
        _add_shared: (W64, W64), _twice: (2 * W64, np.full_like(W64, 2.0)), _leaf_hook: (W64, W64),
        _clone_hook: (W64, np.full_like(W64, 3.0)), _retained_view: (W64, W64), _expanded: (np.ones_like(W64), W64),
        _cat_slices: (W264[:3], W264[3:]), _cat_one_side: (W264[:3], np.full_like(W64, 2.0)),
    }[case]
    n = 2 if twice else 1
    ga, gb = n * ga, n * gb
    coef = min(1.0, 1.0 / (np.sqrt((ga ** 2).sum() + (gb ** 2).sum()) + 1e-6))
    ca, cb = coef * ga, coef * gb
    pa = A64 - 0.5 * ca - 0.5 * (0.9 * ca + ca)
    pb = B.astype(np.float64) - 0.5 * cb - 0.5 * (0.9 * cb + cb)
    kept = {_leaf_hook: [W64] * n, _clone_hook: [W64] * n, _retained_view: [W64.reshape(12)]}.get(case, [])
    return [ga, gb, -3 * ca, cb, pa, pb] + kept


# Not _retained_view twice: wgpar's retain_grad keeps the last pass's gradient, torch's sums them.
RUNS = [(c, t) for t in (False, True) for c in CASES if not (t and c is _retained_view)]


@pytest.mark.parametrize("case,twice", RUNS, ids=[c.__name__[1:] + ("-retain_graph" if t else "") for c, t in RUNS])
def test_in_place_updates_of_grad_change_nothing_else(case, twice, reference):
    got = _run(wgpar, case, twice)
    want = _numpy(case, twice) if reference is None else _run(reference, case, twice)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol=2e-5, atol=1e-6, what=f"value {k}")


def _mlp():
    return nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 5))


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 5))


@pytest.mark.parametrize("make,shape", [(_mlp, (7, 12)), (_cnn, (2, 3, 8, 8))], ids=["mlp", "cnn"])
def test_backward_copies_no_gradient_into_grad(rng, monkeypatch, make, shape):
    """A first backward dispatches one kernel fewer per parameter than one that accumulates into .grad
    (an add each): .grad is the gradient backward computed, with no copy (before: a clone per parameter;
    batch norm's weight and bias gradients were rows of one buffer, now buffers of their own)."""
    model = make()
    x = wgpar.tensor(rng.standard_normal(shape).astype(np.float32))
    calls = record_dispatches(monkeypatch)

    def count() -> int:
        loss = (model(x) ** 2).mean()
        calls.clear()
        loss.backward()
        return len(calls)

    first = count()
    grads = [p.grad.numpy() for p in model.parameters()]
    accumulating = count()
    params = list(model.parameters())
    assert first == accumulating - len(params), (first, accumulating, len(params))
    for p, g in zip(params, grads):
        assert_close(p.grad.numpy(), 2 * g, rtol=1e-4, atol=1e-6)


def test_backward_peak_does_not_hold_the_gradients_twice(rng):
    """One large weight: a backward's peak is its gradient once (before: the gradient and its clone)."""
    d = wgpar.runtime.open_device(9)  # its own device: exact counts
    w = wgpar.tensor(rng.standard_normal((512, 1024)).astype(np.float32), device=d, requires_grad=True)
    x = wgpar.tensor(rng.standard_normal((2, 1024)).astype(np.float32), device=d)
    loss = F.linear(x, w).sum()
    gc.collect()
    before = wgpar.memory_stats(d)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(d)
    loss.backward()
    peak = wgpar.memory_stats(d)["peak_allocated_bytes"] - before
    assert w.nbytes <= peak < 1.25 * w.nbytes, (peak, w.nbytes)
