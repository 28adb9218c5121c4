"""Pipeline parallelism trains exactly like one device on the whole batch; failures stop every stage."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import (
    MultiAdapterContext,
    PipelineExecutor,
    PipelineSchedule,
    PipelineStage,
    RankError,
    pipeline_mesh,
    run_spmd,
    split_module,
)
from wgpar.distributed.pipeline import PipelineShapeError, PipelineStageError, Schedule
from wgpar.nn import functional as F

from .helpers import assert_close

pytestmark = pytest.mark.multidevice

WIDTHS = (5, 16, 12, 16, 9, 4)  # five Linear layers: with 4 stages some stage holds two


def _blocks(seed: int, dropout: float = 0.0, device=0) -> list[nn.Module]:
    acts = [nn.GELU, nn.Tanh, nn.ReLU, nn.GELU]
    blocks: list[nn.Module] = []
    with wgpar.rng_stream(seed):  # this thread's own generator: ranks may build their copies at once
        for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
            blocks.append(nn.Linear(a, b, device=device))
            if i < len(WIDTHS) - 2:
                blocks.append(acts[i]())
                if dropout:
                    blocks.append(nn.Dropout(dropout))
    return blocks


OPTS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    # eps well above float32 noise (see test_data_parallel.py): micro-batches sum in another order
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, eps=1e-4, weight_decay=0.05),
}


def _reference(seed, X, Y, make_opt, steps):
    model = nn.Sequential(*_blocks(seed))
    opt = make_opt(list(model.parameters()))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(wgpar.tensor(X)), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.numpy() for p in model.parameters()], losses


@pytest.fixture(scope="module")
def contexts():
    made: dict[int, MultiAdapterContext] = {}

    def get(n: int) -> MultiAdapterContext:
        if n not in made:
            made[n] = MultiAdapterContext(n, timeout=60)
        return made[n]

    yield get
    for ctx in made.values():
        ctx.close()


@pytest.mark.parametrize("schedule,ranks,batch,micro,opt_name", [
    ("gpipe", 3, 11, 4, "adamw"),
    ("gpipe", 2, 9, 2, "sgd"),
    ("1f1b", 4, 10, 3, "sgd"),       # fewer micro-batches than stages
    ("1f1b", 2, 13, 5, "adamw"),
    ("interleaved", 2, 11, 4, "sgd"),  # 4 stages on 2 ranks
    ("interleaved", 2, 7, 3, "adamw"),
    ("zb", 3, 10, 4, "sgd"),
    ("zb", 4, 9, 4, "adamw"),
])
def test_pipeline_trains_like_one_device(contexts, rng, schedule, ranks, batch, micro, opt_name):
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((batch, WIDTHS[0])).astype(np.float32)
    Y = rng.integers(0, WIDTHS[-1], batch).astype(np.int32)
    want_params, want_losses = _reference(seed, X, Y, OPTS[opt_name], 10)
    pipe = PipelineExecutor(_blocks(seed), contexts(ranks), micro, schedule, F.cross_entropy)
    assert len(pipe.stages) == ranks * (2 if schedule == "interleaved" else 1)
    assert any(sum(isinstance(b, nn.Linear) for b in m.children()) > 1 for m in pipe.modules)
    opts = pipe.optimizers(OPTS[opt_name])
    losses = [pipe.train_step(X, Y, opts).item() for _ in range(10)]
    assert_close(losses, want_losses, rtol=1e-5, atol=1e-7, what="losses")
    got = [p.numpy() for p in pipe.parameters()]
    assert len(got) == len(want_params)
    for i, (g, w) in enumerate(zip(got, want_params)):
        assert_close(g, w, rtol=1e-5, atol=1e-6, what=f"parameter {i}")


def test_a_user_written_schedule_runs(contexts, rng):
    """Stage 0 splits its backward (I now, W later, in its own order), stage 1 does not."""
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((7, WIDTHS[0])).astype(np.float32)
    Y = rng.integers(0, WIDTHS[-1], 7).astype(np.int32)
    want_params, want_losses = _reference(seed, X, Y, OPTS["sgd"], 3)
    plan = Schedule.from_actions([["0F0", "0F1", "0I0", "0F2", "0I1", "0W0", "0I2", "0W2", "0W1"],
                                  ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]], 3)
    pipe = PipelineExecutor(_blocks(seed), contexts(2), 3, plan, F.cross_entropy)
    opts = pipe.optimizers(OPTS["sgd"])
    assert_close([pipe.train_step(X, Y, opts).item() for _ in range(3)], want_losses, rtol=1e-5, atol=1e-7)
    for i, (g, w) in enumerate(zip(pipe.parameters(), want_params)):
        assert_close(g.numpy(), w, rtol=1e-5, atol=1e-6, what=f"parameter {i}")


def test_dropout_uses_one_rng_stream_per_microbatch(contexts, rng):
    """With dropout the pipeline equals gradient accumulation over the same micro-batches on one device, each
    micro-batch's forward on stage s drawing from rng_stream([seed, step, s, i])."""
    seed, stream = int(rng.integers(1 << 30)), int(rng.integers(1 << 30))
    X = rng.standard_normal((10, WIDTHS[0])).astype(np.float32)
    Y = rng.integers(0, WIDTHS[-1], 10).astype(np.int32)
    sizes, steps = [4, 3, 3], 3
    parts = split_module(_blocks(seed, dropout=0.3), 2)
    params = [p for m in parts for p in m.parameters()]
    opt = optim.SGD(params, lr=0.1)
    want = []
    for t in range(steps):
        opt.zero_grad()
        total, start = 0.0, 0
        for i, n in enumerate(sizes):
            h = wgpar.tensor(X[start:start + n])
            for s, part in enumerate(parts):
                with wgpar.rng_stream([stream, t, s, i]):
                    h = part(h)
            loss = F.cross_entropy(h, Y[start:start + n]) * (n / 10)
            loss.backward()
            total += loss.item()
            start += n
        opt.step()
        want.append(total)
    pipe = PipelineExecutor(_blocks(seed, dropout=0.3), contexts(2), 3, "1f1b", F.cross_entropy, seed=stream)
    opts = pipe.optimizers(lambda ps: optim.SGD(ps, lr=0.1))
    got = [pipe.train_step(X, Y, opts).item() for _ in range(steps)]
    assert_close(got, want, rtol=1e-5, atol=1e-7, what="losses")
    for i, (g, w) in enumerate(zip(pipe.parameters(), params)):
        assert_close(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, what=f"parameter {i}")
    pipe.train(False)  # eval: no dropout, so the loss differs from the training run's
    assert abs(pipe.step(X, Y).item() - got[-1]) > 1e-4


class _FailOn(nn.Module):
    """Identity that raises on its ``n``-th call (micro-batch ``n - 1`` of the first step)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError("injected fault")
        return x


@pytest.mark.parametrize("schedule", ["1f1b", "zb"])
def test_a_failing_stage_stops_every_stage_and_the_devices_stay_usable(rng, schedule):
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((8, WIDTHS[0])).astype(np.float32)
    Y = rng.integers(0, WIDTHS[-1], 8).astype(np.int32)
    blocks = _blocks(seed)
    fault = _FailOn(3)
    blocks.insert(4, fault)  # inside stage 1 of 3
    threads_before = {t.name for t in threading.enumerate()}
    with MultiAdapterContext(3, timeout=20) as ctx:
        pipe = PipelineExecutor(blocks, ctx, 4, schedule, F.cross_entropy, boundaries=[2, 6])
        assert any(m is fault for m in pipe.modules[1].children())
        gc.collect()  # earlier tests' garbage (models in reference cycles) must not be freed between the counts
        before = [wgpar.memory_stats(d)["allocated_bytes"] for d in ctx.devices]
        t0 = time.monotonic()
        with pytest.raises(RankError) as info:
            pipe.step(X, Y)
        assert time.monotonic() - t0 < 10  # far below the 20 s timeout: the others were aborted
        err = info.value
        assert err.rank == 1 and isinstance(err.__cause__, PipelineStageError)
        assert "stage 1 on rank 1, 1F2 (forward of micro-batch 2 on stage 1)" in str(err)
        assert "injected fault" in str(err)
        del err, info  # the traceback's frames hold the failed step's tensors until the error is dropped
        gc.collect()
        ctx.reset()
        pipe.zero_grad()
        # Nothing of the failed step is left (activations, graphs, received tensors): as before it.
        assert [wgpar.memory_stats(d)["allocated_bytes"] for d in ctx.devices] == before
        fault.n = -1
        assert np.isfinite(pipe.step(X, Y).item())
    # Every rank returned from the failed step (or run() would not have raised); once the context is closed
    # no rank or communication thread is left.
    assert not [t.name for t in threading.enumerate() if t.name.startswith("wgpar-") and t.name not in threads_before]


def test_a_shape_mismatch_between_stages_is_named(contexts, rng):
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    blocks = [nn.Linear(5, 16), nn.ReLU(), nn.Linear(7, 4)]
    pipe = PipelineExecutor(blocks, contexts(2), 2, "gpipe", F.cross_entropy, boundaries=[2])
    with pytest.raises(RankError) as info:
        pipe.step(rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 4, 6))
    assert isinstance(info.value.__cause__, PipelineShapeError)
    assert ("stage 1 expects activations whose last dimension is 7 (its first layer's in_features) but stage 0 "
            "sent (3, 16) for micro-batch 0") in str(info.value)
    contexts(2).reset()


def test_stages_times_data_parallel_trains_like_one_device(rng):
    """2 replicas of a 2-stage pipeline (4 ranks, SPMD): each replica takes its share of the batch, each stage's
    gradients are summed over its replicas."""
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((11, WIDTHS[0])).astype(np.float32)
    Y = rng.integers(0, WIDTHS[-1], 11).astype(np.int32)
    want_params, want_losses = _reference(seed, X, Y, OPTS["sgd"], 3)

    def train(group):
        pipe_group, dp_group = pipeline_mesh(group, 2)
        replica, stage_index = group.rank // 2, pipe_group.rank
        part = split_module(_blocks(seed, device=group.device), 2)[stage_index]
        stage = PipelineStage(part, stage_index, 2, group.device)
        pipe = PipelineSchedule(stage, pipe_group, 3, "1f1b", F.cross_entropy, dp_group=dp_group)
        opt = OPTS["sgd"](list(stage.parameters()))
        rows = np.array_split(np.arange(11), 2)[replica]  # 6 and 5 rows
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = pipe.step(X[rows] if stage_index == 0 else None, Y[rows] if stage_index == 1 else None,
                             scale=len(rows) / 11)
            opt.step()
            if stage_index == 1:  # the batch's loss: the replicas' weighted losses summed
                losses.append(dp_group.all_reduce(loss.reshape(1), "sum").item())
        return [p.numpy() for p in stage.parameters()], losses

    results = run_spmd(train, 4, timeout=60)
    assert_close(results[1][1], want_losses, rtol=1e-5, atol=1e-7, what="losses")
    for replica in (0, 1):
        got = results[2 * replica][0] + results[2 * replica + 1][0]
        for i, (g, w) in enumerate(zip(got, want_params)):
            assert_close(g, w, rtol=1e-5, atol=1e-6, what=f"replica {replica} parameter {i}")


def test_split_module_balances_parameters_or_cuts_where_told():
    with wgpar.rng_stream(0):
        blocks = [nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 2)]
    parts = split_module(nn.Sequential(*blocks), 2)
    # 72 + 144 | 272 + 34 parameters beats 72 | 450 and 488 | 34: the heaviest part as light as possible
    assert [list(p.children()) for p in parts] == [blocks[:4], blocks[4:]]
    # a tie: the activation stays with the layer before it
    assert [len(p) for p in split_module([blocks[0], blocks[1], nn.Linear(8, 8)], 2)] == [2, 1]
    assert [len(p) for p in split_module(blocks, 3, boundaries=[1, 5])] == [1, 4, 1]
    assert split_module(blocks, 1)[0][5] is blocks[5]  # the blocks themselves: no copies
    with pytest.raises(ValueError, match=r"boundaries must be 2 increasing block indices in 1..5"):
        split_module(blocks, 3, boundaries=[3, 3])
    with pytest.raises(ValueError, match="6 blocks cannot fill 7 stages"):
        split_module(blocks, 7)
    with pytest.raises(TypeError, match="not a Linear"):
        split_module(blocks[0], 2)


def test_pipeline_schedule_checks_its_stages_and_that_ranks_agree(rng):
    def bad_stage(group):
        stage = PipelineStage(nn.Linear(3, 3, device=group.device), 1 - group.rank, 2, group.device)
        PipelineSchedule(stage, group, 2, "1f1b", F.mse_loss)

    with pytest.raises(RankError, match=r"rank 0 holds stage\(s\) \[1\] but the schedule runs stage\(s\) \[0\]"):
        run_spmd(bad_stage, 2, timeout=20)

    def disagree(group):
        stage = PipelineStage(nn.Linear(3, 3, device=group.device), group.rank, 2, group.device)
        pipe = PipelineSchedule(stage, group, 2, "1f1b" if group.rank else "gpipe", F.mse_loss)
        x = wgpar.tensor(rng.standard_normal((4, 3)).astype(np.float32), device=group.device)
        pipe.step(x, x)

    with pytest.raises(RankError, match=r"rank \d's schedule differs from rank\(s\) \[\d\]'s"):
        run_spmd(disagree, 2, timeout=20)
