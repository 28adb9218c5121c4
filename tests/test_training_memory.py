"""A training loop's memory: flat after the first step, peak near what training needs."""

from __future__ import annotations

import gc

import numpy as np

import wgpar
from wgpar import nn, optim
from wgpar.nn import functional as F


def test_training_loop_memory_is_flat_and_peak_is_bounded(dev, rng):
    B, D, H, C = 64, 48, 96, 10
    X = rng.standard_normal((B, D)).astype(np.float32)
    Y = rng.integers(0, C, B).astype(np.int32)
    gc.collect()
    wgpar.reset_peak_memory_stats(dev)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    model = nn.Sequential(nn.Linear(D, H, device=dev), nn.ReLU(), nn.Linear(H, H, device=dev), nn.ReLU(),
                          nn.Linear(H, C, device=dev))
    opt = optim.Adam(model.parameters(), lr=1e-3)
    xb = wgpar.tensor(X, device=dev)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), Y)
        loss.backward()
        opt.step()

    step()
    gc.collect()
    after_first = wgpar.memory_stats(dev)["allocated_bytes"]
    step()  # the second step is the first to hold old gradients while new ones are made
    creates = wgpar.memory_stats(dev)["num_buffer_creates"]
    for _ in range(198):
        step()
    gc.collect()
    stats = wgpar.memory_stats(dev)
    assert stats["allocated_bytes"] == after_first, "allocated_bytes grew over 200 steps"
    assert stats["num_buffer_creates"] == creates, "the loop kept creating buffers instead of reusing them"

    # What training needs: parameters, gradients, Adam's two moments, and one batch's activations
    # (the input, each layer's output and its ReLU, logits), plus the int32 targets.
    n_params = sum(p.numel() for p in model.parameters())
    activations = B * (D + 2 * H + 2 * H + C) + B
    need = 4 * (4 * n_params + activations)
    peak = stats["peak_allocated_bytes"] - base
    print(f"peak {peak} bytes, need {need} bytes, ratio {peak / need:.2f}")
    assert peak <= 1.5 * need, f"peak {peak} bytes exceeds 1.5x the {need} bytes training needs"
    assert peak >= 4 * 4 * n_params, "peak must at least hold params, grads and Adam state"


def test_the_graph_keeps_only_what_gradients_read(rng):
    """An elementwise node keeps what its gradient expressions read (registry.SAVES) and nothing more:
    a target that needs no gradient is freed once the caller drops it, before backward (a loss's
    target no longer lives as long as the graph)."""
    d = wgpar.runtime.open_device(9)  # its own device: exact counts
    x = wgpar.tensor(rng.standard_normal(1000).astype(np.float32), device=d, requires_grad=True)
    t = wgpar.tensor(rng.standard_normal(1000).astype(np.float32), device=d)
    loss = ((x - t) * 3.0).sum()  # sub's gradients read nothing, mul's read the scalar 3.0
    before = wgpar.memory_stats(d)["allocated_bytes"]
    t_host = t.numpy()
    del t
    gc.collect()
    assert before - wgpar.memory_stats(d)["allocated_bytes"] == 4000
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(1000, 3.0), rtol=0)
    assert np.isfinite(t_host).all()


def test_kept_losses_hold_no_activations(rng):
    """A training loop that keeps each step's loss (a list of losses, as a benchmark or a logger does)
    holds no activations: backward frees what the graph saved and what its nodes took as inputs
    (a released node keeps its inputs' producers, not the tensors). Before, every kept loss held its
    step's activations: a ResNet-18 step's peak was 8.7x torch's."""
    d = wgpar.runtime.open_device(10)  # its own device: exact counts
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).to(d)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = wgpar.tensor(rng.standard_normal((4, 3, 16, 16)).astype(np.float32), device=d)
    y = wgpar.tensor(rng.integers(0, 10, 4).astype(np.int32), device=d)
    losses = []

    def step():
        opt.zero_grad()
        h = model(x)
        loss = F.cross_entropy(h + h * 0.5, y)
        loss.backward()
        opt.step()
        losses.append(loss)

    step()
    step()
    gc.collect()
    after = wgpar.memory_stats(d)["allocated_bytes"]
    for _ in range(3):
        step()
    gc.collect()
    assert wgpar.memory_stats(d)["allocated_bytes"] - after == 3 * 4, "each kept loss held more than its 4 bytes"
    with __import__("pytest").raises(RuntimeError, match="second time"):
        losses[-1].backward()
