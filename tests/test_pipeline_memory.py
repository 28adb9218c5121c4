"""Pipeline memory follows the schedule (memory_stats per device): each micro-batch's activations are freed
by its backward, 1F1B holds at most num_stages - s micro-batches on stage s and GPipe all of them, and a
long run does not grow."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice

H, ROWS, M = 32, 8, 6  # width, rows per micro-batch, micro-batches
MSG = ROWS * H * 4  # bytes of one activation (or gradient) message between stages


def _blocks(stages: int) -> list[nn.Module]:
    with wgpar.rng_stream(7):
        return [b for _ in range(stages) for b in (nn.Linear(H, H), nn.GELU(), nn.Linear(H, H))]


def _allocated(ctx) -> list[int]:
    return [wgpar.memory_stats(d)["allocated_bytes"] for d in ctx.devices]


def _measured_step(ctx, schedule: str, m: int, rng):
    """Warm up (gradients exist), then one step with fresh peak counters: (base, peak, traces, schedule)."""
    X = rng.standard_normal((ROWS * m, H)).astype(np.float32)
    pipe = PipelineExecutor(_blocks(ctx.world_size), ctx, m, schedule, F.mse_loss)
    pipe.step(X, X)
    gc.collect()  # an earlier test's tensors in a reference cycle would otherwise be freed mid-test
    base = _allocated(ctx)
    for d in ctx.devices:
        wgpar.reset_peak_memory_stats(d)
    pipe.step(X, X)
    peak = [wgpar.memory_stats(d)["peak_allocated_bytes"] for d in ctx.devices]
    return base, peak, pipe.last_traces(), pipe.schedule


@pytest.mark.parametrize("ranks", [2, 4])
def test_activations_follow_the_schedule(rng, ranks):
    with MultiAdapterContext(ranks, timeout=60) as ctx:
        # One micro-batch: what a micro-batch's activations take on each stage, and the peak with its
        # backward's temporaries.
        base1, peak1, traces1, _ = _measured_step(ctx, "gpipe", 1, rng)
        act = [tr[0].allocated_bytes - b for tr, b in zip(traces1, base1)]  # after the only forward
        one = [p - b for p, b in zip(peak1, base1)]
        assert all(a >= 2 * MSG for a in act)
        peaks = {}
        for schedule in ("gpipe", "1f1b", "zb"):
            base, peak, traces, plan = _measured_step(ctx, schedule, M, rng)
            assert base == base1  # the run before left nothing behind
            held = plan.peak_activations()
            for s, trace in enumerate(traces):
                assert max(t.live for t in trace) == held[s] == {"gpipe": M}.get(schedule, ranks - s)
                for t in trace:
                    extra = t.allocated_bytes - base[s] - t.live * act[s]
                    # Exactly the micro-batches in flight, plus received messages not yet used (posted ahead)
                    # and the last stage's 4-byte losses; a zero-bubble W also frees what its I kept.
                    kept_by_i = MSG * (3 if s == ranks - 1 else 2) if schedule == "zb" and t.action.kind == "I" else 0
                    # An I releases the nodes it finished, and a released node keeps no inputs: on the last
                    # stage what the loss node took as inputs (a message and a 4-byte scalar) is freed then.
                    freed_by_i = MSG + 4 if schedule == "zb" and t.action.kind == "I" and s == ranks - 1 else 0
                    assert -freed_by_i <= extra <= t.receives_posted * MSG + 4 * M + kept_by_i, (schedule, s, t)
                    if t.action.kind in "BW":  # a micro-batch's backward is done: its activations are gone
                        assert extra <= t.receives_posted * MSG + 4 * M, (schedule, s, t)
            # Peak: what the stage holds at most, plus messages received ahead (one more may land during an
            # action), plus one micro-batch's backward temporaries (in `one`).
            peaks[schedule] = [(p - b, (max(t.receives_posted for t in tr) + 1) * MSG)
                               for p, b, tr in zip(peak, base, traces)]
        for s in range(ranks):
            # 1F1B and ZB-H1: stage s never holds more than num_stages - s micro-batches; GPipe holds all M.
            for schedule, kept_by_i in (("1f1b", 0), ("zb", 2 * MSG)):
                got, ahead = peaks[schedule][s]
                assert got <= (ranks - s - 1) * act[s] + one[s] + ahead + kept_by_i, (schedule, s)
            assert peaks["gpipe"][s][0] >= M * act[s]
        assert peaks["1f1b"][0][0] < peaks["gpipe"][0][0]


@pytest.mark.parametrize("ranks,steps,schedule", [(2, 200, "zb"), (4, 30, "1f1b")])
def test_training_does_not_grow(rng, ranks, steps, schedule):
    with MultiAdapterContext(ranks, timeout=60) as ctx:
        with wgpar.rng_stream(3):
            blocks = [b for _ in range(ranks) for b in (nn.Linear(8, 8), nn.Dropout(0.2))]
        pipe = PipelineExecutor(blocks, ctx, 2, schedule, F.mse_loss)
        opts = pipe.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
        X = rng.standard_normal((5, 8)).astype(np.float32)
        for _ in range(3):
            pipe.train_step(X, X, opts)
        first = [wgpar.memory_stats(d) for d in ctx.devices]
        for _ in range(steps):
            loss = pipe.train_step(X, X, opts).item()
        assert np.isfinite(loss)
        for d, before in zip(ctx.devices, first):
            now = wgpar.memory_stats(d)
            assert now["allocated_bytes"] == before["allocated_bytes"], d
            assert now["reserved_bytes"] == before["reserved_bytes"], d
