"""DataParallel trains exactly like single-device training on the whole batch; memory stays flat."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.nn import functional as F
from wgpar.parallel import AllReduceSync, DataParallel, MultiAdapterContext, RankError

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
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
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
        assert dp.sync.launched_in_backward[0] == len(dp.sync.bucket_sizes())
        for (k, p), q in zip(ref.named_parameters(), dp.replicas[1].parameters()):
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=k)


def test_all_reduce_sync_averages_gradients(rng):
    with MultiAdapterContext(2, timeout=60) as ctx:
        sync = AllReduceSync(ctx, bucket_cap_mb=1)
        grads = [rng.standard_normal((7, 3)).astype(np.float32) for _ in range(2)]

        def f(r, g):
            p = nn.Parameter(wgpar.zeros(7, 3, device=ctx.devices[r]))
            sync.register(r, [p])
            sync.prepare(r)
            (p * wgpar.tensor(g, device=ctx.devices[r])).sum().backward()
            sync.finish(r)
            return p.grad.numpy()

        out = ctx.run(f, grads)
        for o in out:
            np.testing.assert_allclose(o, (grads[0] + grads[1]) / 2, rtol=1e-6)


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


def test_bad_input():
    with MultiAdapterContext(2) as ctx:
        with pytest.raises(TypeError, match="Module"):
            DataParallel(object(), ctx)
        dp = DataParallel(_model(0), ctx)
        with pytest.raises(ValueError, match="1 rows cannot feed 2"):
            dp(np.zeros((1, 6), np.float32))
