"""FSDP's memory lifecycle, proven by memory_stats on every device (2 and 4 logical devices).

Each claim is an exact byte count or a bound computed from the layout (memory_estimate, which
these tests also check): shards after sharding, gathered units only while they compute, gradients
only as shards after backward, optimizer state 1/N of DataParallel's, no growth over 200 steps,
and a model DataParallel cannot train under a per-device memory limit trains under FSDP.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import optim
from wgpar.distributed import FSDP, DataParallel, MultiAdapterContext, RankError
from wgpar.distributed.fsdp import OffloadPolicy
from wgpar.distributed.fsdp.estimate import memory_estimate
from wgpar.nn import functional as F

from .fsdp_models import mlp

pytestmark = pytest.mark.multidevice


def allocated(d) -> int:
    return wgpar.memory_stats(d)["allocated_bytes"]


def _shard_numel(model, world: int) -> int:
    """Sum over parameters of ceil(rows / N) rows: what a rank's optimizer state covers."""
    total = 0
    for p in model.parameters():
        rows = p.shape[0] if p.ndim else 1
        total += -(-rows // world) * (p.numel() // max(rows, 1))
    return total


@pytest.mark.parametrize("world", [2, 4])
def test_lifecycle_of_shards_gathered_units_gradients_and_optimizer_state(world, rng):
    width, layers, batch = 32, 8, 9
    X = rng.standard_normal((batch, width)).astype(np.float32)
    Y = rng.integers(0, 5, batch).astype(np.int32)
    gc.collect()
    # What a single device holds for the same forward, beyond the parameters: activations and temporaries.
    solo = wgpar.device(9)
    plain = mlp(0, width, layers, 5, device=solo)
    xs = wgpar.tensor(X[:-(-batch // world)], device=solo)
    wgpar.reset_peak_memory_stats(solo)
    before = allocated(solo)
    out = plain(xs)
    act_peak = wgpar.memory_stats(solo)["peak_allocated_bytes"] - before
    del out, plain, xs
    P = sum(p.numel() for p in mlp(0, width, layers, 5, device=solo).parameters())
    with MultiAdapterContext(world, timeout=60) as ctx:
        source = mlp(1, width, layers, 5, device=ctx.devices[0])
        est = memory_estimate(source, world, "FULL_SHARD", persist_threshold=0, optimizer="adamw")
        gc.collect()
        base = [allocated(d) - (P * 4 if r == 0 else 0) for r, d in enumerate(ctx.devices)]  # the source goes
        fsdp = FSDP(source, ctx, persist_threshold=0)
        sgo = FSDP(mlp(1, width, layers, 5, device=ctx.devices[0]), ctx, strategy="SHARD_GRAD_OP",
                   persist_threshold=0)
        del source
        gc.collect()
        shard_bytes = sum(g.shard_bytes() for g in fsdp.module.fsdp_groups())
        assert shard_bytes == est.params == 4 * sum(g.chunk for g in fsdp.module.fsdp_groups())
        assert shard_bytes <= 4 * (P / world + 3 * layers * world)  # 1/N, plus padding rows and alignment
        for r, d in enumerate(ctx.devices):  # both models: shards only
            assert allocated(d) - base[r] == 2 * shard_bytes, f"rank {r}"
        opts = fsdp.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
        full_bytes = 4 * P
        sizes = [len(s) for s in np.array_split(np.arange(batch), world)]

        def forward_backward(r: int, model, opt) -> dict:
            d = ctx.devices[r]
            lo = sum(sizes[:r])
            x = wgpar.tensor(X[lo:lo + sizes[r]], device=d)
            y = Y[lo:lo + sizes[r]]
            start = allocated(d)
            wgpar.reset_peak_memory_stats(d)
            out = model(x)
            seen = {"peak": wgpar.memory_stats(d)["peak_allocated_bytes"] - start, "after": allocated(d) - start,
                    "gathered": [not fp.unsharded.untyped_storage().is_freed
                                 for g in model.fsdp_groups() for fp in g.params]}
            loss = F.cross_entropy(out, y)
            del out
            loss.backward()
            del loss
            seen["grads"] = allocated(d) - start
            seen["full_grads"] = [fp.unsharded.grad is not None for g in model.fsdp_groups() for fp in g.params]
            seen["freed"] = all(fp.unsharded.untyped_storage().is_freed for g in model.fsdp_groups()
                                for fp in g.params)
            if opt is not None:
                before_step = allocated(d)
                opt.step()
                seen["state"] = allocated(d) - before_step
            return seen

        full = ctx.run(lambda r: forward_backward(r, fsdp.modules[r], opts[r]))
        kept = ctx.run(lambda r: forward_backward(r, sgo.modules[r], None))
    for r in range(world):
        f, k = full[r], kept[r]
        # FULL_SHARD: nothing gathered after forward; the peak stays within the prefetched units + activations.
        assert not any(f["gathered"]), f"rank {r}"
        assert f["peak"] <= est.gathered + act_peak, (r, f["peak"], est.gathered, act_peak)
        assert f["peak"] < full_bytes + act_peak
        # SHARD_GRAD_OP keeps every unit gathered from forward to backward: the same activations + the model.
        assert all(k["gathered"]) and k["after"] - f["after"] == full_bytes, f"rank {r}"
        # After backward: only the gradients' shards, nothing full (parameters or gradients).
        assert f["grads"] == est.grads == shard_bytes, f"rank {r}"
        assert f["freed"] and not any(f["full_grads"]) and k["freed"] and not any(k["full_grads"])
        # AdamW's two moments over this rank's rows only: 1/N of DataParallel's 8 bytes per parameter.
        assert f["state"] == est.optimizer == 8 * _shard_numel(mlp(0, width, layers, 5, device=solo), world)
        assert f["state"] <= 8 * P / world * 1.1
        assert est.data_parallel == 16 * P


def test_offloaded_shards_use_no_device_memory_between_steps(rng):
    X = rng.standard_normal((6, 24)).astype(np.float32)
    Y = rng.integers(0, 3, 6).astype(np.int32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        source = mlp(2, 24, 4, 3, device=ctx.devices[0])
        est = memory_estimate(source, 2, offload=True, persist_threshold=0)
        gc.collect()
        base = [allocated(d) for d in ctx.devices]
        fsdp = FSDP(source, ctx, persist_threshold=0, offload_policy=OffloadPolicy())
        del source
        opts = fsdp.optimizers(lambda ps: wgpar.distributed.HostAdamW(ps, lr=1e-3))
        fsdp.train_step(X, Y, F.cross_entropy, opts)
        gc.collect()
        shards = sum(g.host_flat.nbytes for g in fsdp.module.fsdp_groups())
        assert est.params == est.optimizer == 0 and est.host >= shards + est.grads
        for r, d in enumerate(ctx.devices):
            assert allocated(d) <= base[r] - (est.data_parallel // 4 if r == 0 else 0) + 64, f"rank {r}"


def test_data_parallel_runs_out_of_memory_where_fsdp_trains_on_4_devices(rng):
    """Under the same per-device limit (wgpar.set_memory_limit), DataParallel's full replica, gradients
    and Adam moments do not fit; FSDP's quarter of them, plus the units it gathers, does."""
    width, layers, batch = 80, 10, 8
    X = rng.standard_normal((batch, width)).astype(np.float32)
    Y = rng.integers(0, 4, batch).astype(np.int32)
    P = sum(p.numel() for p in mlp(0, width, layers, 4, device=wgpar.device(9)).parameters())
    budget = 10 * P  # bytes: DataParallel needs more than 16 per parameter, FSDP on 4 ranks about 6
    with MultiAdapterContext(4, timeout=60) as ctx:
        gc.collect()
        wgpar.empty_cache()
        limits = [wgpar.memory_reserved(d) + budget for d in ctx.devices]
        try:
            for d, lim in zip(ctx.devices, limits):
                wgpar.set_memory_limit(lim, d)
            dp = DataParallel(mlp(3, width, layers, 4, device=ctx.devices[0]), ctx)
            opts = dp.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
            with pytest.raises(RankError) as err:
                dp.train_step(X, Y, F.cross_entropy, opts)
            assert isinstance(err.value.__cause__, wgpar.OutOfMemoryError), err.value
            del dp, opts, err
            gc.collect()
            ctx.reset()
            wgpar.empty_cache()
            fsdp = FSDP(mlp(3, width, layers, 4, device=ctx.devices[0]), ctx, persist_threshold=0)
            opts = fsdp.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
            losses = [fsdp.train_step(X, Y, F.cross_entropy, opts).item() for _ in range(2)]
            assert losses[-1] < losses[0]
            for d, lim in zip(ctx.devices, limits):
                assert wgpar.memory_reserved(d) <= lim
        finally:
            for d in ctx.devices:
                wgpar.set_memory_limit(None, d)


def test_200_steps_do_not_grow(rng):
    """FULL_SHARD with prefetch: after 10 warm-up steps, 190 more leave every device's allocated and
    reserved bytes exactly where they were, and create no new buffer."""
    X = rng.standard_normal((5, 12)).astype(np.float32)
    Y = rng.integers(0, 3, 5).astype(np.int32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        fsdp = FSDP(mlp(4, 12, 2, 3, device=ctx.devices[0]), ctx, persist_threshold=0)  # two units
        opts = fsdp.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))

        def train(r: int, steps: int) -> None:
            rows = slice(0, 3) if r == 0 else slice(3, 5)
            x, y = wgpar.tensor(X[rows], device=ctx.devices[r]), Y[rows]
            for _ in range(steps):
                opts[r].zero_grad()
                F.cross_entropy(fsdp.modules[r](x), y).backward()
                opts[r].step()
            ctx.devices[r].synchronize()

        ctx.run(train, [10, 10])
        gc.collect()
        before = [wgpar.memory_stats(d) for d in ctx.devices]
        ctx.run(train, [190, 190])
        gc.collect()
        after = [wgpar.memory_stats(d) for d in ctx.devices]
        assert fsdp.module.fsdp_state.counters["prefetched"] >= 200
    for r, (b, a) in enumerate(zip(before, after)):
        assert a["allocated_bytes"] == b["allocated_bytes"], f"rank {r}"
        assert a["reserved_bytes"] == b["reserved_bytes"], f"rank {r}"
        assert a["num_buffer_creates"] == b["num_buffer_creates"], f"rank {r}"
