"""GradScaler across ranks: an inf / NaN in one rank's part of a model makes every rank skip its step
and back off together (FSDP shards, pipeline stages, an explicit process_group); its argument and
state_dict errors name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.distributed import MultiAdapterContext, PipelineExecutor, run_spmd
from wgpar.distributed.fsdp import full_state_dict, fully_shard
from wgpar.nn import functional as F

from .helpers import assert_close

pytestmark = pytest.mark.multidevice

INIT = 1024.0


def _net(seed: int, device) -> nn.Sequential:
    with wgpar.rng_stream(seed):
        return nn.Sequential(nn.Linear(6, 10, device=device), nn.GELU(), nn.Linear(10, 3, device=device))


def _poison(params) -> None:
    """Make one gradient of this rank inf (only this rank: the others' stay finite)."""
    for p in params:
        if p.grad is not None and p.grad.numel():
            p.grad.fill_(float("inf"))
            return
    raise AssertionError("no gradient to poison")


def test_fsdp_ranks_skip_together(rng):
    """Rank 1's shard alone sees an inf: both ranks skip, both halve their own scaler's scale, and the next
    clean step matches one device."""
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((2, 8, 6)).astype(np.float32)
    Y = rng.integers(0, 3, (2, 8)).astype(np.int32)
    ref = _net(seed, 0)
    before = {k: v.numpy() for k, v in ref.state_dict().items()}
    opt = optim.SGD(ref.parameters(), lr=0.5)
    F.cross_entropy(ref(wgpar.tensor(X[1])), Y[1]).backward()
    opt.step()
    want = {k: v.numpy() for k, v in ref.state_dict().items()}

    def train(group):
        model = _net(seed, group.device)
        for child in model.children():
            if list(child.parameters()):
                fully_shard(child, group, persist_threshold=0)
        fully_shard(model, group, persist_threshold=0)
        o = optim.SGD(model.parameters(), lr=0.5)
        scaler = GradScaler(init_scale=INIT)  # one per rank: each would decide alone
        n = 8 // group.world_size
        out = []
        for k in range(2):
            o.zero_grad()
            rows = slice(group.rank * n, (group.rank + 1) * n)
            scaler.scale(F.cross_entropy(model(wgpar.tensor(X[k, rows], device=group.device)), Y[k, rows])).backward()
            if k == 0 and group.rank == 1:
                _poison(model.parameters())
            scaler.step(o)
            scaler.update()
            out.append((full_state_dict(model), scaler.get_scale()))
        return out

    results = run_spmd(train, 2, timeout=30)
    for r, ((skipped, scale), (stepped, _)) in enumerate(results):
        assert scale == INIT / 2, f"rank {r}: scale {scale}, want {INIT / 2}"
        for k in before:
            assert_close(skipped[k], before[k], rtol=0, atol=0, what=f"rank {r} {k} after the skipped step")
            assert_close(stepped[k], want[k], rtol=1e-5, atol=1e-6, what=f"rank {r} {k} after the clean step")


def test_pipeline_stages_skip_together(rng):
    """The last stage alone sees an inf: every stage skips and backs off (one scaler per rank)."""
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((6, 6)).astype(np.float32)
    Y = rng.integers(0, 3, 6).astype(np.int32)
    with MultiAdapterContext(2, timeout=20) as ctx:
        pipe = PipelineExecutor(list(_net(seed, 0).children()), ctx, 2, "1f1b", F.cross_entropy)
        before = [p.numpy() for p in pipe.parameters()]
        opts = pipe.optimizers(lambda ps: optim.SGD(ps, lr=0.5))
        scalers = [GradScaler(init_scale=INIT) for _ in range(2)]

        def work(r: int):
            p, o, sc = pipe.ranks[r], opts[r], scalers[r]
            o.zero_grad()
            p.step(X if p.has_first else None, Y if p.has_last else None)
            if p.has_last:
                _poison(p.parameters())
            sc.step(o)
            sc.update()

        ctx.run(work)
        after = [p.numpy() for p in pipe.parameters()]
    for r, sc in enumerate(scalers):
        assert sc.get_scale() == INIT / 2, f"rank {r}: scale {sc.get_scale()}"
    for i, (got, want) in enumerate(zip(after, before)):
        assert_close(got, want, rtol=0, atol=0, what=f"parameter {i}")


def test_explicit_process_group_agrees(rng):
    """Ranks holding different parts of a model the library does not track (here: two independent layers)
    agree through process_group=; a scaler shared by thread ranks with one rank's group is refused."""
    seed = int(rng.integers(1 << 30))

    def train(group):
        with wgpar.rng_stream(seed + group.rank):
            layer = nn.Linear(4, 2, device=group.device)
        before = [p.numpy() for p in layer.parameters()]
        o = optim.SGD(layer.parameters(), lr=0.5)
        scaler = GradScaler(init_scale=INIT, process_group=group)
        scaler.scale(layer(wgpar.ones((3, 4), device=group.device)).sum()).backward()
        if group.rank == 0:
            _poison(layer.parameters())
        scaler.step(o)
        scaler.update()
        return [p.numpy() for p in layer.parameters()], before, scaler.get_scale()

    results = run_spmd(train, 2, timeout=30)
    for r, (after, before, scale) in enumerate(results):
        assert scale == INIT / 2, f"rank {r}: scale {scale}"
        for i, (a, b) in enumerate(zip(after, before)):
            assert_close(a, b, rtol=0, atol=0, what=f"rank {r} parameter {i}")

    with MultiAdapterContext(2, timeout=20) as ctx:
        shared = GradScaler(process_group=ctx.comm(0))
        layer = nn.Linear(4, 2, device=ctx.devices[1])
        layer(wgpar.ones((3, 4), device=ctx.devices[1])).sum().backward()
        with pytest.raises(ValueError, match="its own GradScaler"):
            shared.unscale_(optim.SGD(layer.parameters(), lr=0.1))


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("inf"), float("nan")])
def test_init_scale_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="init_scale"):
        GradScaler(init_scale=bad)


def test_load_state_dict_names_the_missing_key():
    state = GradScaler(init_scale=8.0).state_dict()
    del state["growth_interval"]
    with pytest.raises(KeyError, match="load_state_dict.*growth_interval"):
        GradScaler().load_state_dict(state)
    with pytest.raises(ValueError, match="'scale'"):
        GradScaler().load_state_dict({**GradScaler().state_dict(), "scale": 0.0})
