"""Thread ranks draw random numbers as processes would: each rank has its own generator, so
``wgpar.manual_seed(s)`` in a rank gives it the stream a process seeded with s gets (the driver's
stream after ``manual_seed(s)``), whatever the other ranks and the driver do."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.distributed import MultiAdapterContext, run_spmd
from wgpar.nn import functional as F

pytestmark = pytest.mark.multidevice


def _draws(device) -> dict[str, np.ndarray]:
    """Layer initialisation, rand and a dropout mask, in that order."""
    lin = nn.Linear(9, 5, device=device)
    return {"weight": lin.weight.numpy(), "bias": lin.bias.numpy(), "rand": wgpar.rand(3, 7, device=device).numpy(),
            "dropout": F.dropout(wgpar.ones(6, 11, device=device), 0.5).numpy()}


def _check_same(got: dict, want: dict, what: str) -> None:
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w, err_msg=f"{what}: {k}")


def test_ranks_seeded_alike_draw_the_stream_of_a_process_seeded_alike(rng):
    seed = int(rng.integers(1 << 30))
    wgpar.manual_seed(seed)
    want = _draws(0)

    def rank(group):
        wgpar.manual_seed(seed)
        group.barrier()  # every rank has seeded before any draws: a shared generator would interleave
        return _draws(group.device)

    for run in range(2):
        for r, got in enumerate(run_spmd(rank, 3, timeout=60)):
            _check_same(got, want, f"run {run}, rank {r}")


def test_ranks_seeded_apart_draw_their_own_streams(rng):
    base = int(rng.integers(1 << 30))
    want = []
    for r in range(3):
        wgpar.manual_seed(base + r)
        want.append(_draws(0))

    def rank(group):
        wgpar.manual_seed(base + group.rank)
        group.barrier()
        return _draws(group.device)

    for r, got in enumerate(run_spmd(rank, 3, timeout=60)):
        _check_same(got, want[r], f"rank {r}")
    assert not np.array_equal(want[0]["dropout"], want[1]["dropout"])


def test_ranks_leave_the_driver_stream_alone(rng):
    seed = int(rng.integers(1 << 30))
    wgpar.manual_seed(seed)
    want = [wgpar.rand(5).numpy() for _ in range(2)]
    wgpar.manual_seed(seed)
    first = wgpar.rand(5).numpy()

    def rank(group):
        wgpar.manual_seed(group.rank)
        return _draws(group.device)

    run_spmd(rank, 2, timeout=60)
    np.testing.assert_array_equal(first, want[0])
    np.testing.assert_array_equal(wgpar.rand(5).numpy(), want[1])


def test_unseeded_ranks_start_from_the_driver_seed_and_keep_their_stream_across_runs(rng):
    """As torch.manual_seed seeds every device's generator: after the driver seeds s, each rank that has not
    seeded itself draws s's stream from its start, on across ``run`` calls, independently of the others."""
    seed = int(rng.integers(1 << 30))
    wgpar.manual_seed(seed)
    first, second = _draws(0), _draws(0)
    with MultiAdapterContext(2, timeout=60) as ctx:
        ctx.run(lambda r: None)  # the rank threads exist before the driver seeds
        wgpar.manual_seed(seed)
        wgpar.rand(4)  # the driver's draws do not move the ranks' streams
        for want in (first, second):
            for r, got in enumerate(ctx.run(lambda r: _draws(ctx.devices[r]))):
                _check_same(got, want, f"rank {r}")
