"""The single-controller driver (wgpar/distributed/single_controller/): DataParallel, FSDP and
PipelineExecutor's ``train_step`` with gradient accumulation, a GradScaler and clipping equals
single-device training on the whole batch; ``clip_grad_norm_(group=)`` clips by the whole model's norm;
the old import paths still work and warn."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.distributed import FSDP, DataParallel, MultiAdapterContext, PipelineExecutor, run_spmd
from wgpar.nn import functional as F

from .helpers import assert_close

pytestmark = pytest.mark.multidevice


def _model(seed: int, device=0) -> nn.Sequential:
    with wgpar.rng_stream(seed):
        return nn.Sequential(nn.Linear(5, 17, device=device), nn.GELU(), nn.Linear(17, 3, device=device))


def _reference(seed, X, Y, steps, max_norm, scaler):
    """Single device, whole batch: forward, loss, (scaled) backward, unscale, clip, step."""
    m = _model(seed)
    opt = optim.SGD(m.parameters(), lr=0.3, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(m(wgpar.tensor(X)), Y)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        scaler.step(opt) if scaler else opt.step()
        if scaler:
            scaler.update()
        losses.append(loss.item())
    return [p.numpy() for p in m.parameters()], losses


def _wrap(kind, seed, ctx):
    if kind == "dp":
        return DataParallel(_model(seed), ctx, bucket_cap_mb=0.0001)
    if kind == "fsdp":
        return FSDP(_model(seed), ctx, persist_threshold=0)
    return PipelineExecutor(_model(seed), ctx, n_microbatches=2, loss_fn=F.cross_entropy)


def _weights(kind, w) -> list[np.ndarray]:
    """The trained parameters in the model's order."""
    if kind == "fsdp":
        return list(w.full_state_dict().values())
    mods = [w.module] if kind == "dp" else w.modules
    return [p.numpy() for m in mods for p in m.parameters()]


@pytest.mark.parametrize("kind", ["dp", "fsdp", "pipeline"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "scaler"])
def test_accumulation_scaler_and_clipping_match_one_device(kind, amp, rng):
    """An uneven batch of 11 in 3 micro-batches on 2 ranks, clipping active, with or without a GradScaler
    that grows every 2 steps: the losses and weights follow one device's whole-batch training, and the one
    scaler serving every rank grows as one device's does (test_scaler_ranks.py: skipping together)."""
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((11, 5)).astype(np.float32)
    Y = rng.integers(0, 3, 11).astype(np.int32)
    init = 2.0 ** 10
    want, want_losses = _reference(seed, X, Y, 4, 0.05, GradScaler(init_scale=init, growth_interval=2) if amp else None)
    with MultiAdapterContext(2, timeout=60) as ctx:
        w = _wrap(kind, seed, ctx)
        opts = w.optimizers(lambda ps: optim.SGD(ps, lr=0.3, momentum=0.9))
        scaler = GradScaler(init_scale=init, growth_interval=2) if amp else None
        if kind == "pipeline":
            got = [w.train_step(X, Y, opts, accumulate=3, scaler=scaler, max_norm=0.05).item() for _ in range(4)]
        else:
            got = [w.train_step(X, Y, F.cross_entropy, opts, accumulate=3, scaler=scaler, max_norm=0.05).item()
                   for _ in range(4)]
        if amp:
            assert scaler.get_scale() == init * 4
        weights = _weights(kind, w)
    assert_close(got, want_losses, rtol=1e-5, atol=1e-6)
    assert len(weights) == len(want)
    for got_w, want_w in zip(weights, want):
        assert_close(got_w, want_w, rtol=1e-4, atol=1e-6)


def test_accumulate_is_checked():
    with MultiAdapterContext(2, timeout=60) as ctx:
        dp = DataParallel(_model(0), ctx)
        opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=0.1))
        with pytest.raises(ValueError, match="accumulate must be an int >= 1"):
            dp.train_step(np.zeros((4, 5), np.float32), np.zeros(4, np.int32), F.cross_entropy, opts, accumulate=0)


@pytest.mark.parametrize("norm_type", [2.0, float("inf")], ids=["l2", "inf"])
def test_clip_grad_norm_over_a_group_uses_the_whole_model(norm_type, rng):
    """Each rank holds different rows of one model plus a replicated piece: every rank scales by the norm of
    the rows of all ranks plus the replicated piece once, as one device holding all of it would."""
    rows = rng.standard_normal((3, 7)).astype(np.float32)
    rep = rng.standard_normal(4).astype(np.float32)
    whole = [wgpar.zeros(7 * 3), wgpar.zeros(4)]
    for p, g in zip(whole, (rows.reshape(-1), rep)):
        p.grad = wgpar.tensor(g)
    want_norm = nn.utils.clip_grad_norm_(whole, 0.5, norm_type).item()

    def rank(group):
        mine = wgpar.zeros(7, device=group.device)
        shared = wgpar.zeros(4, device=group.device)
        mine.grad = wgpar.tensor(rows[group.rank], device=group.device)
        shared.grad = wgpar.tensor(rep, device=group.device)
        norm = nn.utils.clip_grad_norm_([mine, shared], 0.5, norm_type, group=group, replicated=[shared])
        return norm.item(), mine.grad.numpy(), shared.grad.numpy()

    got = run_spmd(rank, 3)
    for r, (norm, g, s) in enumerate(got):
        assert_close(norm, want_norm, rtol=1e-5)
        assert_close(g, whole[0].grad.numpy().reshape(3, 7)[r], rtol=1e-5, atol=1e-7)
        assert_close(s, whole[1].grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("old,name", [("wgpar.distributed.context", "MultiAdapterContext"),
                                      ("wgpar.distributed.data_parallel", "DataParallel"),
                                      ("wgpar.distributed.data_parallel", "split_batch"),
                                      ("wgpar.distributed.fsdp.wrapper", "FSDP"),
                                      ("wgpar.distributed.pipeline.executor", "PipelineExecutor")])
def test_old_import_paths_warn(old, name):
    new = getattr(importlib.import_module("wgpar.distributed.single_controller"), name)
    with pytest.warns(DeprecationWarning, match="single_controller"):
        assert getattr(importlib.import_module(old), name) is new
