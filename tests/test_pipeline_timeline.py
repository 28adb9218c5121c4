"""The measured pipeline timeline: each action of a profiled step as a profiler range named as in the schedule,
on its rank, drawn next to the schedule's model."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
from wgpar.distributed.pipeline import timeline
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice

M = 4


@pytest.fixture(scope="module")
def profiled():
    """One profiled 1F1B step of 4 micro-batches on 2 logical devices (after a warm-up step)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8 * M, 16)).astype(np.float32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        with wgpar.rng_stream(3):
            blocks = [nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 16)]
        pipe = PipelineExecutor(blocks, ctx, M, "1f1b", F.mse_loss, profile=True)
        pipe.step(X, X)
        with wgpar.profiler.profile() as prof:
            pipe.step(X, X)
        yield pipe.schedule, prof


def test_each_rank_ran_the_schedules_actions_in_order(profiled):
    schedule, prof = profiled
    runs = timeline.measured(prof, schedule)
    assert [[str(t.action) for t in rank] for rank in runs] == [[str(a) for a in acts] for acts in schedule.actions]
    wall = prof.results.wall / 1e9
    for rank in runs:
        for t in rank:
            assert 0 <= t.start <= t.end <= wall, t
        assert all(a.end <= b.start for a, b in zip(rank, rank[1:]))  # one rank runs one action at a time
    # The ranges are cheap host ranges of category "pipeline" on each rank's own thread.
    threads = {r.args["rank"]: {r.thread} for r in prof.ranges() if r.cat == "pipeline"}
    assert len(threads) == 2 and threads[0] != threads[1]


def test_the_model_uses_the_measured_costs(profiled):
    schedule, prof = profiled
    runs = timeline.measured(prof, schedule)
    costs = timeline.mean_costs(runs)
    assert set(costs) == {"F", "B"} and all(c > 0 for c in costs.values())
    model = timeline.modelled(schedule, runs)
    assert [[t.action for t in rank] for rank in model] == schedule.actions
    assert model[0][0].end - model[0][0].start == pytest.approx(costs["F"])


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_plot_writes_every_action(profiled, tmp_path, suffix):
    schedule, prof = profiled
    runs = timeline.measured(prof, schedule)
    path = timeline.plot(schedule, runs, tmp_path / f"t{suffix}")
    body = path.read_text()
    assert body.startswith("<!DOCTYPE html>" if suffix == ".html" else "<svg") and body.rstrip().endswith(
        "</html>" if suffix == ".html" else "</svg>")
    for acts in schedule.actions:
        for a in acts:
            # Twice each: the measured bar and the model's.
            assert body.count(f"<title>{a}: ") == 2, a
    assert "rank 1 run" in body and "rank 1 model" in body


def test_text_grid_rows(profiled):
    schedule, prof = profiled
    out = timeline.text(schedule, timeline.measured(prof, schedule))
    lines = out.splitlines()
    assert "bubble" in lines[0] and "measured" in lines[0]
    assert [ln.split("  ")[0] for ln in lines[2:]] == ["rank 0 run", "rank 0 model", "rank 1 run", "rank 1 model"]
    for r, acts in enumerate(schedule.actions):
        cells = [c for c in lines[2 + 2 * r].split()[3:] if c != "."]
        shown = [c for i, c in enumerate(cells) if i == 0 or c != cells[i - 1]]
        assert shown == [f"{a.kind}{a.mb}" for a in acts]  # every action, in order, at least one column each


def test_without_a_profile_there_is_nothing_to_draw(profiled):
    schedule, _ = profiled
    with wgpar.profiler.profile() as empty:
        pass
    with pytest.raises(ValueError, match="no pipeline actions"):
        timeline.measured(empty, schedule)
    with pytest.raises(ValueError, match="use a .html or .svg"):
        timeline.plot(schedule, [[]], "t.png")
