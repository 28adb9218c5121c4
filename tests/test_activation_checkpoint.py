"""Activation checkpointing (wgpar.utils.checkpoint): the same losses and gradients as without it, bit for
bit (the recomputation runs the same kernels in the same order, with the same dropout masks), less memory
kept between forward and backward, and the compositions: kwargs, several outputs, inputs without grad,
nesting, retain_graph, autocast, checkpoint_sequential, thread ranks and FSDP units."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.distributed import FSDP, MultiAdapterContext, run_spmd
from wgpar.models.gpt import GPT, GPTConfig
from wgpar.nn import functional as F
from wgpar.utils.checkpoint import checkpoint, checkpoint_sequential

from .fsdp_models import OPTS, max_rel

pytestmark = pytest.mark.timeout(600)


def _gpt(ckpt: bool, device=0, dropout=0.1, n_layer=3) -> GPT:
    wgpar.manual_seed(11)
    cfg = GPTConfig(vocab_size=37, block_size=24, n_layer=n_layer, n_head=2, n_embd=32, dropout=dropout)
    return GPT(cfg, device=device, gradient_checkpointing=ckpt)


def _gpt_step(model: GPT, idx: np.ndarray) -> tuple[float, dict[str, np.ndarray], int, np.ndarray]:
    """Loss, gradients, peak bytes allocated above the model during the step, and the next random draw."""
    dev = model.wte.weight.device
    wgpar.manual_seed(5)
    base = wgpar.memory_stats(dev)["allocated_bytes"]
    wgpar.reset_peak_memory_stats(dev)
    loss = model(idx, idx)
    loss.backward()
    peak = wgpar.memory_stats(dev)["peak_allocated_bytes"] - base
    after = wgpar.rand(4, device=dev).numpy()
    return loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}, peak, after


def test_gpt_step_is_bit_identical_and_keeps_less(rng):
    idx = rng.integers(0, 37, (3, 24)).astype(np.int32)
    loss0, grads0, peak0, after0 = _gpt_step(_gpt(False, n_layer=6), idx)
    loss1, grads1, peak1, after1 = _gpt_step(_gpt(True, n_layer=6), idx)
    assert loss1 == loss0  # dropout active: the recomputation drew the same masks
    for name, g in grads0.items():
        np.testing.assert_array_equal(grads1[name], g, err_msg=name)
    np.testing.assert_array_equal(after1, after0)  # backward left the random stream where it was
    # Six blocks: without checkpointing backward starts holding every block's activations; with it, the
    # block boundaries and one block's recomputation. Measured on lavapipe: 2,535,012 -> 869,220 bytes (0.34x).
    assert peak1 < 0.5 * peak0, (peak1, peak0)


def test_gpt_config_flag_and_training_steps_match(rng):
    idx = rng.integers(0, 37, (2, 24)).astype(np.int32)
    losses = []
    for ckpt in (False, True):
        wgpar.manual_seed(11)
        cfg = GPTConfig(vocab_size=37, block_size=24, n_layer=2, n_head=2, n_embd=32, dropout=0.1,
                        checkpoint_activations=ckpt)
        model = GPT(cfg)
        assert model.cfg.checkpoint_activations is ckpt
        opt = wgpar.optim.AdamW(model.parameters(), lr=1e-2)
        wgpar.manual_seed(7)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = model(idx, idx)
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append((run, {n: p.numpy() for n, p in model.named_parameters()}))
    assert losses[0][0] == losses[1][0]
    for name, p in losses[0][1].items():
        np.testing.assert_array_equal(losses[1][1][name], p, err_msg=name)


class _TwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(7, 5)
        self.b = nn.Linear(7, 3)

    def forward(self, x, scale=1.0, gate=None):
        h = F.gelu(self.a(x)) * scale
        return h, {"side": self.b(F.dropout(x, 0.3, True)) * gate}, "label"


def _grads(mod: nn.Module, *tensors) -> list[np.ndarray]:
    return [p.grad.numpy() for p in mod.parameters()] + [t.grad.numpy() for t in tensors]


def test_kwargs_several_outputs_and_an_input_without_grad(rng):
    x = rng.standard_normal((4, 7)).astype(np.float32)
    gate = rng.standard_normal((4, 3)).astype(np.float32)
    wgpar.manual_seed(2)
    mod = _TwoOut()
    results = []
    for use in (False, True):
        mod.zero_grad()
        xt = wgpar.tensor(x, requires_grad=True)
        gt = wgpar.tensor(gate)  # needs no gradient
        wgpar.manual_seed(9)
        if use:
            h, side, label = checkpoint(mod, xt, scale=0.5, gate=gt)
        else:
            h, side, label = mod(xt, scale=0.5, gate=gt)
        assert label == "label" and h.requires_grad and side["side"].requires_grad
        ((h * h).sum() + side["side"].sum() * 3.0).backward()
        results.append(_grads(mod, xt))
    for a, b in zip(*results):
        np.testing.assert_array_equal(b, a)


def test_only_one_of_several_outputs_used_and_no_input_requires_grad(rng):
    x = wgpar.tensor(rng.standard_normal((4, 7)).astype(np.float32))
    wgpar.manual_seed(2)
    mod = _TwoOut()
    g = wgpar.ones(4, 3)
    h, side, _ = checkpoint(mod, x, gate=g)
    assert h.requires_grad  # the parameters require grad, the input does not
    h.sum().backward()
    got = [p.grad.numpy() if p.grad is not None else None for p in mod.parameters()]
    mod.zero_grad()
    mod(x, gate=g)[0].sum().backward()
    for a, b in zip(got, [p.grad.numpy() if p.grad is not None else None for p in mod.parameters()]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_nested_checkpoints_and_retain_graph(rng):
    x = rng.standard_normal((6, 8)).astype(np.float32)
    wgpar.manual_seed(4)
    inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 8))
    outer = nn.Linear(8, 8)

    def block(t, nested):
        t = checkpoint(inner, t) if nested else inner(t)
        return F.gelu(outer(t)) + t

    results = []
    for nested in (False, True):
        inner.zero_grad()
        outer.zero_grad()
        xt = wgpar.tensor(x, requires_grad=True)
        wgpar.manual_seed(1)
        y = checkpoint(block, xt, nested) if nested else block(xt, nested)
        loss = (y * y).mean()
        loss.backward(retain_graph=True)
        loss.backward()  # a second backward recomputes again and accumulates
        results.append(_grads(inner, xt) + _grads(outer))
    for a, b in zip(*results):
        np.testing.assert_array_equal(b, a)


def test_checkpoint_sequential_matches(rng):
    x = rng.standard_normal((5, 6)).astype(np.float32)
    wgpar.manual_seed(3)
    seq = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(6, 6), nn.ReLU())])
    results = []
    for segments in (None, 3):
        seq.zero_grad()
        xt = wgpar.tensor(x, requires_grad=True)
        y = seq(xt) if segments is None else checkpoint_sequential(seq, segments, xt)
        y.sum().backward()
        results.append(_grads(seq, xt))
    for a, b in zip(*results):
        np.testing.assert_array_equal(b, a)
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential(seq, 9, wgpar.tensor(x))


def test_under_autocast(rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    idx = rng.integers(0, 37, (2, 24)).astype(np.int32)
    results = []
    for ckpt in (False, True):
        model = _gpt(ckpt, dropout=0.0)
        with wgpar.autocast():
            loss = model(idx, idx)
        loss.backward()  # outside the region: the recomputation restores autocast itself
        results.append((loss.item(), [p.grad.numpy() for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(b, a)


def test_thread_ranks_recompute_their_own_dropout_masks(rng):
    idx = rng.integers(0, 37, (2, 24)).astype(np.int32)

    def per_rank(group):
        out = []
        for ckpt in (False, True):
            model = _gpt(ckpt, device=group.device)
            wgpar.manual_seed(100 + group.rank)  # each rank's own generator, its own masks
            loss = model(idx, idx)
            loss.backward()
            out.append((loss.item(), [p.grad.numpy() for p in model.parameters()]))
        return out

    results = run_spmd(per_rank, 2, timeout=120)
    assert results[0][0][0] != results[1][0][0]  # the ranks drew different masks
    for (l0, g0), (l1, g1) in results:
        assert l0 == l1
        for a, b in zip(g0, g1):
            np.testing.assert_array_equal(b, a)


@pytest.mark.multidevice
def test_fsdp_units_inside_checkpoints_train_as_on_one_device(rng):
    X = rng.integers(0, 37, (6, 24)).astype(np.int32)
    Y = rng.integers(0, 37, (6, 24)).astype(np.int32)

    def lm_loss(logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    ref = _gpt(False, dropout=0.0, n_layer=2)
    opt = OPTS["adamw"](ref.parameters())
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = lm_loss(ref(wgpar.tensor(X, device=ref.device)), wgpar.tensor(Y, device=ref.device))
        loss.backward()
        opt.step()
        want.append(loss.item())
    with MultiAdapterContext(2, timeout=60) as ctx:
        fsdp = FSDP(_gpt(True, ctx.devices[0], dropout=0.0, n_layer=2), ctx, persist_threshold=0)
        assert {"blocks.0", "blocks.1"} <= {g.name for g in fsdp.module.fsdp_groups()}
        opts = fsdp.optimizers(OPTS["adamw"])
        got = [fsdp.train_step(X, Y, lm_loss, opts).item() for _ in range(3)]
        full = fsdp.full_state_dict()
    np.testing.assert_allclose(got, want, rtol=2e-4)
    for name, p in ref.named_parameters():
        assert max_rel(full[name], p.numpy()) < 2e-3, name


def test_unsupported_options_and_no_grad(rng):
    lin = nn.Linear(3, 3)
    x = wgpar.tensor(rng.standard_normal((2, 3)).astype(np.float32))
    with pytest.raises(ValueError, match="context_fn"):
        checkpoint(lin, x, debug=True)
    with wgpar.no_grad():
        assert not checkpoint(lin, x).requires_grad
