"""Every training-loop order PyTorch accepts gives single-device training's gradients under
DistributedDataParallel and DataParallel: zero_grad before or after the forward (to None or to
zeros, through the optimizer, the module or ``p.grad.zero_()``), accumulation over several
backward passes (synchronised or in ``no_sync``), and forwards between ``backward`` and ``step``."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import DataParallel, DistributedDataParallel, MultiAdapterContext, run_spmd
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice

STEPS, MICRO, ROWS, WORLD = 3, 2, 10, 2  # ROWS per micro-batch, split evenly over the ranks


def _model(state: dict, device) -> nn.Module:
    m = nn.Sequential(nn.Linear(5, 7, device=device), nn.Tanh(), nn.Linear(7, 3, device=device))
    m.load_state_dict(state)
    return m


def _zero(how: str, model: nn.Module, opt) -> None:
    if how == "opt":
        opt.zero_grad()
    elif how == "opt_keep":
        opt.zero_grad(set_to_none=False)
    elif how == "module":
        model.zero_grad()
    elif how == "grad_zero_":
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()


# name: (where zero_grad goes: "before" the first forward of a step, "after" it, "after_last" (after the
# last micro-batch's forward, dropping the earlier ones) or "never"; how; micro-batches per step; no_sync
# on all but the last; extra forward between backward and step: None, "no_grad" or "grad")
ORDERS = {
    "zero_before_forward": ("before", "opt", 1, False, None),
    "zero_after_forward": ("after", "opt", 1, False, None),
    "zero_after_forward_keep": ("after", "opt_keep", 1, False, None),
    "grad_zero__after_forward": ("after", "grad_zero_", 1, False, None),
    "module_zero_grad_after_forward": ("after", "module", 1, False, None),
    "accumulate_2_backwards": ("before", "opt", MICRO, False, None),
    "accumulate_zero_after_first_forward": ("after", "opt_keep", MICRO, False, None),
    "accumulate_no_sync": ("before", "opt", MICRO, True, None),
    "never_zero": ("never", None, 1, False, None),
    "never_zero_no_sync": ("never", None, MICRO, True, None),
    "no_sync_zero_keep_after_last_forward": ("after_last", "opt_keep", MICRO, True, None),
    "no_sync_grad_zero__after_last_forward": ("after_last", "grad_zero_", MICRO, True, None),
    "no_sync_zero_after_last_forward": ("after_last", "opt", MICRO, True, None),
    "no_grad_forward_before_step": ("before", "opt", 1, False, "no_grad"),
    "forward_before_step": ("before", "opt", 1, False, "grad"),
}


def _zero_now(where: str, k: int, micro: int) -> bool:
    return (where == "after" and k == 0) or (where == "after_last" and k == micro - 1)


def _loop(order: str, model, call, opt, batches, no_sync) -> list[float]:
    """PyTorch's loop in the given order; ``call(x)`` is the forward, ``batches[s][k]`` micro-batch k of step s."""
    where, how, micro, use_no_sync, extra = ORDERS[order]
    losses = []
    for s in range(STEPS):
        if where == "before":
            _zero(how, model, opt)
        for k in range(micro):
            x, y = batches[s][k]
            out = call(x)
            if _zero_now(where, k, micro):
                _zero(how, model, opt)
            loss = F.cross_entropy(out, y)
            ctx = no_sync() if use_no_sync and k < micro - 1 else contextlib.nullcontext()
            with ctx:
                loss.backward()
            losses.append(loss.item())
        if extra == "no_grad":
            with wgpar.no_grad():
                call(batches[s][0][0])
        elif extra == "grad":
            call(batches[s][0][0])
        opt.step()
    return losses


def _data(rng):
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    state = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in m.state_dict().items()}
    X = rng.standard_normal((STEPS, MICRO, ROWS, 5)).astype(np.float32)
    Y = rng.integers(0, 3, (STEPS, MICRO, ROWS)).astype(np.int32)
    return state, X, Y


def _opt(params):
    return optim.SGD(params, lr=0.3, momentum=0.5)


def _reference(order, state, X, Y):
    m = _model(state, 0)
    batches = [[(wgpar.tensor(X[s, k]), Y[s, k]) for k in range(MICRO)] for s in range(STEPS)]
    _loop(order, m, m, _opt(m.parameters()), batches, contextlib.nullcontext)
    return {k: v.numpy() for k, v in m.state_dict().items()}


def _check(got: dict, want: dict, what: str) -> None:
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=2e-5, atol=2e-6, err_msg=f"{what}: {k}")


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_ddp_loop_order_matches_single_device(order, rng):
    state, X, Y = _data(rng)
    want = _reference(order, state, X, Y)
    half = ROWS // WORLD

    def rank(group):
        ddp = DistributedDataParallel(_model(state, group.device), group, bucket_cap_mb=0.0001)
        r = group.rank
        batches = [[(wgpar.tensor(X[s, k, r * half:(r + 1) * half], device=group.device),
                     Y[s, k, r * half:(r + 1) * half]) for k in range(MICRO)] for s in range(STEPS)]
        _loop(order, ddp, ddp, _opt(ddp.parameters()), batches, ddp.no_sync)
        return {k: v.numpy() for k, v in ddp.module.state_dict().items()}

    for r, got in enumerate(run_spmd(rank, WORLD, timeout=60)):
        _check(got, want, f"{order}, rank {r}")


# DataParallel: the controller's loop; zero_grad through every replica's optimizer or the wrapper.
DP_ORDERS = ["zero_before_forward", "zero_after_forward", "zero_after_forward_keep", "accumulate_2_backwards",
             "never_zero", "never_zero_no_sync", "no_sync_zero_keep_after_last_forward", "no_grad_forward_before_step"]


@pytest.mark.parametrize("order", DP_ORDERS)
def test_data_parallel_loop_order_matches_single_device(order, rng):
    state, X, Y = _data(rng)
    X, Y = X[:, :, :9], Y[:, :, :9]  # 5 + 4 rows: uneven shares
    want = _reference(order, state, X, Y)
    where, how, micro, use_no_sync, extra = ORDERS[order]
    with MultiAdapterContext(WORLD, timeout=60) as ctx:
        dp = DataParallel(_model(state, 0), ctx, bucket_cap_mb=0.0001)
        opts = dp.optimizers(_opt)
        for s in range(STEPS):
            if where == "before":
                for o in opts:
                    o.zero_grad(set_to_none=how != "opt_keep")
            for k in range(micro):
                outs = dp(X[s, k])
                if _zero_now(where, k, micro):
                    for o in opts:
                        o.zero_grad(set_to_none=how != "opt_keep")
                with dp.no_sync() if use_no_sync and k < micro - 1 else contextlib.nullcontext():
                    dp.backward(dp.loss(F.cross_entropy, outs, Y[s, k]))
            if extra == "no_grad":
                with wgpar.no_grad():
                    dp(X[s, 0])
            dp.step(opts)
        for r, replica in enumerate(dp.replicas):
            _check({k: v.numpy() for k, v in replica.state_dict().items()}, want, f"{order}, rank {r}")


def test_forward_between_backward_and_step_keeps_gradients(rng):
    """A validation forward after backward leaves every reduced gradient in place."""
    state, X, Y = _data(rng)

    def rank(group):
        ddp = DistributedDataParallel(_model(state, group.device), group)
        F.cross_entropy(ddp(wgpar.tensor(X[0, 0], device=group.device)), Y[0, 0]).backward()
        before = [p.grad.numpy() for p in ddp.parameters()]
        with wgpar.no_grad():
            ddp(wgpar.tensor(X[0, 1], device=group.device))
        return before, [None if p.grad is None else p.grad.numpy() for p in ddp.parameters()]

    for before, after in run_spmd(rank, WORLD, timeout=60):
        for b, a in zip(before, after):
            assert a is not None
            np.testing.assert_array_equal(a, b)
