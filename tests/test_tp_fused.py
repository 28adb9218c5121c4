"""parallelize_module on a fused q|k|v projection: the natural plan splits each of q, k and v by heads (as the
single-device block needs), and a plan that contradicts the block's layout is refused, naming chunks= / unit=."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.distributed import CausalSelfAttention, ColwiseParallel, RowwiseParallel, parallelize_module, run_spmd

from .helpers import assert_close

pytestmark = pytest.mark.multidevice


@pytest.mark.parametrize("world,heads,hd", [(2, 2, 4), (2, 3, 4), (3, 4, 2)])
def test_natural_plan_on_causal_self_attention_matches_one_device(rng, world, heads, hd):
    d = heads * hd
    seed = int(rng.integers(1 << 30))
    x = rng.standard_normal((2, 5, d)).astype(np.float32)
    w = rng.standard_normal((2, 5, d)).astype(np.float32)
    with wgpar.rng_stream(seed):
        ref = CausalSelfAttention(d, heads)
    X = wgpar.tensor(x, requires_grad=True)
    y = ref(X)
    (y * wgpar.tensor(w)).sum().backward()
    want_y, want_gx = y.numpy(), X.grad.numpy()

    def run(group):
        with wgpar.rng_stream(seed):
            m = CausalSelfAttention(d, heads, device=group.device)
        parallelize_module(m, group, {"qkv": ColwiseParallel(), "out_proj": RowwiseParallel()})
        xs = wgpar.tensor(x, device=group.device, requires_grad=True)
        out = m(xs)
        (out * wgpar.tensor(w, device=group.device)).sum().backward()
        return out.numpy(), xs.grad.numpy()

    for r, (got_y, got_gx) in enumerate(run_spmd(run, world, timeout=30)):
        assert_close(got_y, want_y, rtol=1e-5, atol=1e-5, what=f"rank {r} output")
        assert_close(got_gx, want_gx, rtol=1e-5, atol=1e-5, what=f"rank {r} input grad")


@pytest.mark.parametrize("plan,match", [
    ({"qkv": ColwiseParallel(chunks=1), "out_proj": RowwiseParallel()}, "chunks=3"),
    ({"qkv": ColwiseParallel(unit=1, chunks=3), "out_proj": RowwiseParallel()}, "unit="),
    ({"qkv": ColwiseParallel(), "out_proj": RowwiseParallel(unit=3)}, "unit="),
    ({"qkv": RowwiseParallel(), "out_proj": RowwiseParallel()}, "ColwiseParallel\\(unit=4, chunks=3\\)"),
])
def test_a_plan_against_the_fused_layout_is_refused(plan, match):
    def run(group):
        m = CausalSelfAttention(8, 2, device=group.device)
        with pytest.raises(ValueError, match=match):
            parallelize_module(m, group, plan, src_rank=None)

    run_spmd(run, 2, timeout=30)
