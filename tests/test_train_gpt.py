"""examples/train_gpt.py end to end on lavapipe: the loss falls; single device, DistributedDataParallel, tensor
and pipeline parallelism on 2 logical devices give the same loss curve; a resumed run continues exactly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import wgpar

ROOT = Path(__file__).resolve().parents[1]

# Small enough for seconds per run on lavapipe: the tiny preset, one block, 4 x 32 tokens per micro-batch.
COMMON = ["--preset", "tiny", "--n-layer", "1", "--batch-size", "4", "--block-size", "32", "--log-every", "1",
          "--eval-iters", "2", "--sample-tokens", "0", "--no-progress", "--lr", "3e-3", "--warmup", "3"]


@pytest.fixture(scope="module")
def gpt():
    spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = mod  # dataclasses look their module up while the class is made
    sys.path.insert(0, str(ROOT / "examples"))  # it imports common.py as the script does
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return mod


@pytest.fixture(scope="module")
def corpus(gpt, tmp_path_factory) -> str:
    """The first 300 kB of the standard library's sources, the example's own corpus in small."""
    path = tmp_path_factory.mktemp("corpus") / "stdlib.py.txt"
    path.write_bytes(gpt.load_corpus(None, 300_000).tobytes())
    return str(path)


def _run(gpt, corpus, out, *extra):
    return gpt.main(COMMON + ["--data", corpus, "--out", str(out), *extra])


def test_tiny_loss_falls_over_30_steps(gpt, corpus, tmp_path):
    r = _run(gpt, corpus, tmp_path, "--steps", "30", "--eval-every", "0", "--no-save")
    losses = np.array([r["losses"][s] for s in range(1, 31)])
    assert np.isfinite(losses).all()
    assert losses[-5:].mean() < losses[:5].mean() - 1.0, losses
    assert r["final_val"] < np.log(256) - 1.0  # from ~5.5 nats (uniform over bytes) towards the data


PARALLEL = ("dp", "tp", "fsdp", "pipeline")


def test_parallel_strategies_give_the_same_loss_curve(gpt, corpus, tmp_path):
    """20 steps with active clipping on 2 devices: DDP (batch split over the ranks), FSDP, TP (heads and MLP split,
    norm over the shards) and the pipeline (one stage per rank, 2 micro-batches, tied embedding gradients
    summed across the stages) follow the single-device curve."""
    args = ["--steps", "20", "--batch-size", "2", "--grad-clip", "0.5", "--eval-every", "0", "--no-save",
            "--devices", "2"]
    curves = {}
    for parallel in ("single", *PARALLEL):
        r = _run(gpt, corpus, tmp_path / parallel, *args, "--parallel", parallel)
        curves[parallel] = np.array([r["losses"][s] for s in range(1, 21)])
    for parallel in PARALLEL:
        np.testing.assert_allclose(curves[parallel], curves["single"], rtol=2e-4, err_msg=parallel)
    assert curves["single"][-1] < curves["single"][0]


def test_gradient_accumulation_equals_the_whole_batch(gpt, corpus, tmp_path):
    """2 accumulated micro-batches of 2 train like one batch of 4 (the same windows), also under DDP, whose
    first micro-batch accumulates without communicating (no_sync)."""
    args = ["--steps", "4", "--eval-every", "0", "--no-save", "--devices", "2"]
    whole = _run(gpt, corpus, tmp_path / "whole", *args, "--batch-size", "4")
    for parallel in ("single", "dp"):
        acc = _run(gpt, corpus, tmp_path / parallel, *args, "--batch-size", "2", "--grad-accum", "2",
                   "--parallel", parallel)
        np.testing.assert_allclose([acc["losses"][s] for s in range(1, 5)], [whole["losses"][s] for s in range(1, 5)],
                                   rtol=2e-5, err_msg=parallel)


@pytest.mark.parametrize("mode", [["--parallel", "single", "--amp"], ["--parallel", "tp", "--devices", "2"],
                                  ["--parallel", "pipeline", "--devices", "2"]],
                         ids=["single-amp", "tp-sharded", "pipeline-sharded"])
def test_resume_continues_exactly(gpt, corpus, tmp_path, mode):
    """Checkpoint at step 3 of 6, resume from it: steps 4-6 and the final weights equal the uninterrupted
    run's bit for bit (data, schedule, optimizer moments and the loss scale all come back)."""
    whole = _run(gpt, corpus, tmp_path, "--steps", "6", "--ckpt-every", "3", "--eval-every", "0", "--no-save", *mode)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == (["ckpt-rank0.safetensors"] if "single" in mode else
                     ["ckpt-rank0.safetensors", "ckpt-rank1.safetensors"])
    resumed = _run(gpt, corpus, tmp_path, "--steps", "6", "--resume", "--eval-every", "0", *mode)
    assert resumed["start"] == 3
    assert [resumed["losses"][s] for s in (4, 5, 6)] == [whole["losses"][s] for s in (4, 5, 6)]
    assert resumed["final_val"] == whole["final_val"]


def test_fsdp_shards_and_resumes(gpt, corpus, tmp_path):
    """--parallel fsdp: one checkpoint file per rank; resuming from step 2 of 4 gives steps 3-4 bit for bit."""
    args = ["--steps", "4", "--eval-every", "0", "--no-save", "--parallel", "fsdp", "--devices", "2"]
    whole = _run(gpt, corpus, tmp_path, *args, "--ckpt-every", "2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-rank0.safetensors", "ckpt-rank1.safetensors"]
    resumed = _run(gpt, corpus, tmp_path, *args, "--resume")
    assert resumed["start"] == 2
    assert [resumed["losses"][s] for s in (3, 4)] == [whole["losses"][s] for s in (3, 4)]


def test_unigram_baseline_and_batches(gpt):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, 1_000_000).astype(np.uint8)
    assert abs(gpt.unigram_loss(data, data) - np.log(4)) < 1e-3  # four equally likely bytes
    x, y = gpt.get_batch(data, 3, 8, rng)
    assert x.shape == y.shape == (3, 8) and x.dtype == np.int32
    assert all(np.array_equal(x[i, 1:], y[i, :-1]) for i in range(3))
    assert wgpar.models.GPT is gpt.GPT
