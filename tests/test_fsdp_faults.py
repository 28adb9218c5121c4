"""FSDP under failure: a rank failing mid-forward, and ranks that disagree on which units run.

Every rank must raise within the group's timeout (nothing hangs), the error must name the rank
or the units, and after ``reset()`` the same model trains on.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import FSDP, CollectiveError, MultiAdapterContext, RankError
from wgpar.distributed.fsdp import full_state_dict, fully_shard
from wgpar.nn import functional as F

from .fsdp_models import OPTS, make_net

pytestmark = pytest.mark.multidevice

TIMEOUT = 8.0


def test_a_rank_failing_mid_forward_makes_every_rank_raise(rng):
    X = rng.standard_normal((8, 6)).astype(np.float32)
    Y = rng.integers(0, 3, 8).astype(np.int32)
    with MultiAdapterContext(4, timeout=TIMEOUT) as ctx:
        fsdp = FSDP(make_net(5), ctx, persist_threshold=0)
        opts = fsdp.optimizers(OPTS["sgd"])
        fsdp.train_step(X, Y, F.cross_entropy, opts)
        victim = fsdp.modules[2].block
        forward = victim.forward
        calls = []

        def failing(x):
            calls.append(1)
            if len(calls) == 2:  # the second use of the block, with other units gathered or in flight
                raise RuntimeError("injected failure on rank 2")
            return forward(x)

        object.__setattr__(victim, "forward", failing)
        errors: dict[int, BaseException] = {}

        def step(r: int) -> None:
            try:
                opts[r].zero_grad()
                loss = F.cross_entropy(fsdp.modules[r](wgpar.tensor(X[2 * r:2 * r + 2], device=ctx.devices[r])),
                                       Y[2 * r:2 * r + 2])
                loss.backward()
            except BaseException as exc:
                errors[r] = exc
                raise

        start = time.monotonic()
        with pytest.raises(RankError, match="rank 2 raised RuntimeError: injected failure"):
            ctx.run(step)
        assert time.monotonic() - start < TIMEOUT
        assert sorted(errors) == [0, 1, 2, 3]
        for r in (0, 1, 3):
            assert isinstance(errors[r], CollectiveError) and "rank 2 failed" in str(errors[r]), errors[r]
        object.__delattr__(victim, "forward")
        ctx.reset()
        losses = [fsdp.train_step(X, Y, F.cross_entropy, opts).item() for _ in range(2)]
        assert np.isfinite(losses).all()
        for m in fsdp.modules:  # nothing stayed gathered, no stale gradient
            assert all(fp.unsharded.untyped_storage().is_freed for g in m.fsdp_groups() for fp in g.params)


class Stack(nn.Module):
    """Blocks run in order; ``skip`` and ``twice`` make one rank diverge (as generate() or MoE routing do)."""

    def __init__(self, device) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(8, 8, device=device) for _ in range(4)])
        self.skip: set[int] = set()
        self.twice: set[int] = set()

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if i in self.skip:
                continue
            x = block(x).tanh()
            if i in self.twice:
                x = block(x).tanh()
        return x


@pytest.mark.parametrize("divergence", ["skip", "twice"])
@pytest.mark.parametrize("prefetch", [0, 1])
def test_ranks_that_disagree_on_a_unit_raise_naming_it(divergence, prefetch, rng):
    """Rank 1 skips block 2 (or runs it twice): DeepSpeed ZeRO-3 hangs there; here the labelled collectives
    disagree, every rank raises a CollectiveError naming the units and ranks within the timeout, and after
    reset() the model trains on, identically on both ranks."""
    x = rng.standard_normal((3, 8)).astype(np.float32)
    with MultiAdapterContext(2, timeout=TIMEOUT) as ctx:
        models, opts = [None, None], [None, None]

        def build(r: int) -> None:
            group = ctx.comm(r)
            model = Stack(group.device)
            for block in model.blocks:
                fully_shard(block, group, persist_threshold=0, prefetch=prefetch, sync_module_states=True)
            fully_shard(model, group, persist_threshold=0, prefetch=prefetch)
            models[r], opts[r] = model, optim.SGD(model.parameters(), lr=0.1)

        def step(r: int) -> None:
            opts[r].zero_grad()
            models[r](wgpar.tensor(x, device=ctx.devices[r])).sum().backward()
            opts[r].step()

        def diverging_step(r: int) -> tuple[str, float]:
            if r == 1:
                getattr(models[r], divergence).add(2)
            start = time.monotonic()
            try:
                step(r)
            except CollectiveError as exc:
                return str(exc), time.monotonic() - start
            finally:
                getattr(models[r], divergence).clear()
            return "no error", time.monotonic() - start

        ctx.run(build)
        ctx.run(step)
        results = ctx.run(diverging_step)
        for message, elapsed in results:
            assert elapsed < TIMEOUT, message
            assert "fsdp:blocks." in message and "rank" in message, message
        ctx.reset()
        for _ in range(2):
            ctx.run(step)
        states = ctx.run(lambda r: full_state_dict(models[r]))
    for k, v in states[0].items():
        assert np.isfinite(v).all()
        np.testing.assert_array_equal(states[1][k], v, err_msg=k)
