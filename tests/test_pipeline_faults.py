"""Pipeline faults and misuse: a stage that never returns is named, the context says plainly it cannot run
until that stage returns and works again after; wrong arguments raise errors naming what is wrong."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
from wgpar.distributed.pipeline import PipelineError, Schedule, ScheduleError, gpipe
from wgpar.models.gpt import GPT, GPTConfig, lm_loss
from wgpar.nn import functional as F

from .helpers import assert_close

pytestmark = pytest.mark.multidevice


class Stall(nn.Module):
    """Once armed, blocks its next call until ``gate`` is set (a stage that never returns, as far as a step
    can tell)."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.armed = False

    def forward(self, x):
        if self.armed:
            self.armed = False
            self.gate.wait(30)
        return x


def test_a_stuck_stage_is_named_and_the_context_recovers(rng):
    gate = threading.Event()
    with wgpar.rng_stream(int(rng.integers(1 << 30))):
        blocks = [nn.Linear(5, 4), nn.GELU(), Stall(gate), nn.Linear(4, 3)]
    X = rng.standard_normal((4, 5)).astype(np.float32)
    Y = rng.integers(0, 3, 4).astype(np.int32)
    want = F.cross_entropy(nn.Sequential(*blocks)(wgpar.tensor(X)), Y).item()
    blocks[2].armed = True
    with MultiAdapterContext(2, timeout=1) as ctx:
        pipe = PipelineExecutor(blocks, ctx, 2, "gpipe", F.cross_entropy, boundaries=[2], step_timeout=3)
        t0 = time.perf_counter()
        with pytest.raises(PipelineError, match=r"rank 1 \(stage 1\).*forward of micro-batch 0.*not returned"):
            pipe.step(X, Y)
        assert time.perf_counter() - t0 < 15
        ctx.reset()
        t0 = time.perf_counter()
        with pytest.raises(PipelineError, match=r"rank 1 \(stage 1\) is still running 1F0 \(forward of micro-batch 0"):
            pipe.step(X, Y)
        assert time.perf_counter() - t0 < 1  # said at once, not after another timeout
        assert list(pipe.stuck) == [1]
        gate.set()
        deadline = time.perf_counter() + 10
        while pipe.stuck and time.perf_counter() < deadline:
            time.sleep(0.05)
        assert not pipe.stuck
        ctx.reset()
        pipe.zero_grad()
        assert_close(pipe.step(X, Y).item(), want, rtol=1e-5, atol=1e-6, what="loss after recovery")


def _blocks():
    return [nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)]


def test_a_schedule_for_more_ranks_than_the_context_is_refused():
    with MultiAdapterContext(2, timeout=5) as ctx:
        with pytest.raises(ScheduleError, match="3 ranks.*context has 2"):
            PipelineExecutor(_blocks(), ctx, 2, gpipe(3, 2), F.cross_entropy)


def test_a_rank_without_actions_is_refused():
    with pytest.raises(ScheduleError, match="rank 1 has no actions"):
        Schedule.from_actions([["0F0", "0B0"], []], 1)


@pytest.mark.parametrize("costs,match", [({"F": -1.0}, "'F'"), ({"B": float("nan")}, "'B'"), ({"X": 1.0}, "'X'")])
def test_bubble_fraction_refuses_bad_costs(costs, match):
    with pytest.raises(ValueError, match=f"costs.*{match}"):
        gpipe(2, 3).bubble_fraction(costs)


def test_gpt_pipeline_blocks_with_the_tied_weight_across_ranks_is_refused():
    gpt = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    with MultiAdapterContext(2, timeout=5) as ctx:
        with pytest.raises(ValueError, match="stage 0.*wte.weight.*stage 1.*lm_head.weight.*untie"):
            PipelineExecutor(gpt.pipeline_blocks(), ctx, 2, "gpipe", lm_loss)
