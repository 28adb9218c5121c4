"""DataParallel trains exactly like single-device training on the whole batch; memory stays flat."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import (
    AllReduceSync,
    DataParallel,
    DistributedDataParallel,
    MultiAdapterContext,
    RankError,
    run_spmd,
)
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice


def _model(seed: int, device=0) -> nn.Module:
    wgpar.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 33, device=device), nn.GELU(), nn.LayerNorm(33, device=device),
                         nn.Linear(33, 4, device=device))


def _single_device(seed, X, Y, make_opt, steps):
    m = _model(seed)
    opt = make_opt(m.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(m(wgpar.tensor(X)), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return m, losses


OPTS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.2, momentum=0.9),
    # eps well above float32 noise: with the default 1e-8, a gradient entry of ~1e-8 makes Adam's step
    # depend on the sign of summation noise, and single-device and split batches sum in other orders.
    "adam": lambda ps: optim.Adam(ps, lr=0.01, eps=1e-4),
}


@pytest.mark.parametrize("world,batch", [(2, 16), (4, 10)], ids=["2dev-even", "4dev-uneven"])
@pytest.mark.parametrize("opt_name", sorted(OPTS))
def test_matches_single_device_training(world, batch, opt_name, rng):
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((batch, 6)).astype(np.float32)
    Y = rng.integers(0, 4, batch).astype(np.int32)
    ref, ref_losses = _single_device(seed, X, Y, OPTS[opt_name], 10)
    with MultiAdapterContext(world, timeout=60) as ctx:
        dp = DataParallel(_model(seed), ctx, bucket_cap_mb=0.001)  # several buckets
        assert len(dp.sync.bucket_sizes()) > 1
        opts = dp.optimizers(OPTS[opt_name])
        losses = [dp.train_step(X, Y, F.cross_entropy, opts).item() for _ in range(10)]
        # A loss near zero is log-sum-exp less the target's logit: its error is absolute (float32's
        # epsilon times the logits), so a relative bound alone fails by chance as training converges.
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6 * max(ref_losses))
        want = {k: v.numpy() for k, v in ref.state_dict().items()}
        for r, replica in enumerate(dp.replicas):
            assert replica.device is ctx.devices[r]
            for k, v in replica.state_dict().items():
                got = v.numpy()
                rel = np.abs(got - want[k]).max() / max(np.abs(want[k]).max(), 1e-12)
                assert rel < 1e-5, f"rank {r} {k}: relative difference {rel}"


def test_forward_loss_backward_api_and_overlap(rng):
    X = rng.standard_normal((9, 6)).astype(np.float32)
    Y = rng.integers(0, 4, 9).astype(np.int32)
    ref = _model(5)
    F.cross_entropy(ref(wgpar.tensor(X)), Y).backward()
    with MultiAdapterContext(2, timeout=60) as ctx:
        dp = DataParallel(_model(5), ctx, bucket_cap_mb=0.001)
        outs = dp(X)
        assert [o.shape for o in outs] == [(5, 4), (4, 4)]
        assert [o.device for o in outs] == ctx.devices
        dp.backward(dp.loss(F.cross_entropy, outs, Y))
        # buckets whose gradients were complete went out while backward still ran
        assert dp.sync.launched_in_backward == len(dp.sync.bucket_sizes())
        for (k, p), q in zip(ref.named_parameters(), dp.replicas[1].parameters()):
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=k)


def test_all_reduce_sync_averages_gradients(rng):
    grads = [rng.standard_normal((7, 3)).astype(np.float32) for _ in range(2)]

    def f(group):
        p = nn.Parameter(wgpar.zeros(7, 3, device=group.device))
        sync = AllReduceSync(group, [p], bucket_cap_mb=1)
        sync.prepare()
        (p * wgpar.tensor(grads[group.rank], device=group.device)).sum().backward()
        sync.finish()
        return p.grad.numpy()

    for o in run_spmd(f, 2, timeout=60):
        np.testing.assert_allclose(o, (grads[0] + grads[1]) / 2, rtol=1e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_gradient_accumulation_without_zero_grad(world, rng):
    """Two forward/backward rounds without zero_grad give g1 + g2 (not N * g1 + g2), as on one device;
    with no_sync the first round stays local and the second reduces both."""
    X = rng.standard_normal((2, 11, 6)).astype(np.float32)
    Y = rng.integers(0, 4, (2, 11)).astype(np.int32)
    seed = int(rng.integers(1 << 30))
    ref = _model(seed)
    for k in range(2):
        F.cross_entropy(ref(wgpar.tensor(X[k])), Y[k]).backward()
    want = [p.grad.numpy() for p in ref.parameters()]
    with MultiAdapterContext(world, timeout=60) as ctx:
        for use_no_sync in (False, True):
            dp = DataParallel(_model(seed), ctx, bucket_cap_mb=0.001)
            assert len(dp.sync.bucket_sizes()) > 1
            for k in range(2):
                outs = dp(X[k])
                losses = dp.loss(F.cross_entropy, outs, Y[k])
                if use_no_sync and k == 0:
                    with dp.no_sync():
                        dp.backward(losses)
                else:
                    dp.backward(losses)
            for r, replica in enumerate(dp.replicas):
                for (name, _), p, w in zip(ref.named_parameters(), replica.parameters(), want):
                    np.testing.assert_allclose(p.grad.numpy(), w, rtol=1e-4, atol=1e-6,
                                               err_msg=f"rank {r} {name} no_sync={use_no_sync}")


def test_distributed_data_parallel_spmd_matches_single_device(rng):
    """The per-rank wrapper, written against one rank's group, trains like one device on the whole batch
    (equal shares, op="mean")."""
    X = rng.standard_normal((3, 12, 6)).astype(np.float32)
    Y = rng.integers(0, 4, (3, 12)).astype(np.int32)
    seed = int(rng.integers(1 << 30))
    ref = _model(seed)
    init = {k: v.numpy() for k, v in ref.state_dict().items()}
    opt = OPTS["adam"](ref.parameters())
    for k in range(3):
        opt.zero_grad()
        F.cross_entropy(ref(wgpar.tensor(X[k])), Y[k]).backward()
        opt.step()
    want = {k: v.numpy() for k, v in ref.state_dict().items()}

    def train(group):
        model = nn.Sequential(nn.Linear(6, 33, device=group.device), nn.GELU(), nn.LayerNorm(33, device=group.device),
                              nn.Linear(33, 4, device=group.device))
        if group.rank == 0:  # the other ranks start from other weights: the broadcast must fix them
            model.load_state_dict(init)
        ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.001)
        o = OPTS["adam"](ddp.parameters())
        lo, hi = group.rank * 4, group.rank * 4 + 4
        for k in range(3):
            o.zero_grad()
            F.cross_entropy(ddp(wgpar.tensor(X[k, lo:hi], device=group.device)), Y[k, lo:hi]).backward()
            assert all(b.work is None for b in ddp.sync._buckets)  # backward waited for the all-reduce
            o.step()
        return {k: v.numpy() for k, v in ddp.module.state_dict().items()}

    for got in run_spmd(train, 3, timeout=60):
        for k, w in want.items():
            np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=1e-6, err_msg=k)


def test_replica_failure_raises_on_every_rank(rng):
    X = rng.standard_normal((8, 6)).astype(np.float32)
    Y = rng.integers(0, 4, 8).astype(np.int32)
    with MultiAdapterContext(2, timeout=30) as ctx:
        dp = DataParallel(_model(1), ctx)
        opts = dp.optimizers(OPTS["sgd"])

        def bad_loss(out, y):
            if out.device is ctx.devices[1]:
                raise RuntimeError("injected loss failure")
            return F.cross_entropy(out, y)

        with pytest.raises(RankError, match="rank 1 raised RuntimeError: injected"):
            dp.train_step(X, Y, bad_loss, opts)
        ctx.reset()
        dp.train_step(X, Y, F.cross_entropy, opts)  # the devices and the group still work


def test_memory_does_not_grow_over_100_steps(rng):
    X = rng.standard_normal((12, 6)).astype(np.float32)
    Y = rng.integers(0, 4, 12).astype(np.int32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        dp = DataParallel(_model(2), ctx, bucket_cap_mb=0.001)
        opts = dp.optimizers(OPTS["adam"])
        for _ in range(3):
            dp.train_step(X, Y, F.cross_entropy, opts)
        gc.collect()  # tensors of earlier tests on these shared devices
        before = [wgpar.memory_stats(d) for d in ctx.devices]
        for _ in range(100):
            dp.train_step(X, Y, F.cross_entropy, opts)
        gc.collect()
        after = [wgpar.memory_stats(d) for d in ctx.devices]
        for r, (a, b) in enumerate(zip(before, after)):
            assert b["allocated_bytes"] == a["allocated_bytes"], f"rank {r} allocated grew"
            assert b["reserved_bytes"] == a["reserved_bytes"], f"rank {r} reserved grew"
            assert b["num_buffer_creates"] == a["num_buffer_creates"], f"rank {r} created buffers"


def test_reset_recovers_after_a_failure_mid_backward_with_several_buckets(rng):
    """A hook raising on one rank while other buckets are in flight: every rank raises, and after reset
    the same DataParallel trains again (no staging buffer is left mapped or pending)."""
    X = rng.standard_normal((12, 6)).astype(np.float32)
    Y = rng.integers(0, 4, 12).astype(np.int32)
    with MultiAdapterContext(2, timeout=30) as ctx:
        dp = DataParallel(_model(3), ctx, bucket_cap_mb=0.0005)
        assert len(dp.sync.bucket_sizes()) >= 3
        opts = dp.optimizers(OPTS["sgd"])
        first = dp.replicas[1][0].weight  # the last gradient backward produces: buckets are in flight by then
        state = {"armed": True}

        def hook(p):
            if state["armed"]:
                state["armed"] = False
                raise RuntimeError("injected hook failure")

        first.register_post_accumulate_grad_hook(hook)
        with pytest.raises(RankError, match="injected hook failure"):
            dp.train_step(X, Y, F.cross_entropy, opts)
        ctx.reset()
        for _ in range(3):
            loss = dp.train_step(X, Y, F.cross_entropy, opts)
        assert np.isfinite(loss.item())
        a, b = (dict(m.state_dict()) for m in dp.replicas)
        for k in a:
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


def test_bad_input():
    with MultiAdapterContext(2) as ctx:
        with pytest.raises(TypeError, match="Module"):
            DataParallel(object(), ctx)
        dp = DataParallel(_model(0), ctx)
        with pytest.raises(ValueError, match="1 rows cannot feed 2"):
            dp(np.zeros((1, 6), np.float32))
        opts = dp.optimizers(OPTS["sgd"])
        with pytest.raises(ValueError, match=r"step: needs one per rank \(2\), got 1"):
            dp.step(opts[:1])


def test_a_nan_input_row_gives_a_nan_loss_and_gradients(rng):
    """A NaN in one rank's share of the batch must reach the loss every rank returns and every replica's
    gradients (the host reduction propagates it); nothing may turn it into a normal-looking number."""
    X = rng.standard_normal((9, 6)).astype(np.float32)
    X[7, 2] = np.nan  # on rank 1
    Y = rng.integers(0, 4, 9).astype(np.int32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        dp = DataParallel(_model(6), ctx)
        opts = dp.optimizers(OPTS["sgd"])
        loss = dp.train_step(X, Y, F.cross_entropy, opts)
        assert np.isnan(loss.item())
        for r, replica in enumerate(dp.replicas):
            assert np.isnan(replica[0].weight.grad.numpy()).any(), f"rank {r}: the NaN did not reach the gradient"
            assert np.isnan(replica[0].weight.numpy()).any(), f"rank {r}: the step dropped the NaN"
