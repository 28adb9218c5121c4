"""The differentiable collectives: forward values and gradients against NumPy float64, on 2 and 3 ranks.

Each rank builds every rank's inputs from ``(seed, rank)``, so it can compute the expected values itself.
Two objectives: for all_reduce / all_gather / reduce_scatter every rank has its own loss and the
objective is their sum; for Megatron's pair and gather/scatter the loss is replicated (computed
identically on every rank).
"""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar.distributed import MultiAdapterContext, split_sizes
from wgpar.distributed import functional as dfn

from .helpers import assert_close

pytestmark = pytest.mark.multidevice


@pytest.fixture(scope="module", params=[2, 3], ids=["2dev", "3dev"])
def _ctx(request):
    c = MultiAdapterContext(request.param, timeout=60)
    yield c
    c.close()


@pytest.fixture
def ctx(_ctx):
    yield _ctx
    if _ctx.group.broken:  # a failed test must not fail the next ones
        _ctx.reset()


def _arr(seed: int, rank: int, shape) -> np.ndarray:
    return np.random.default_rng([seed, rank]).standard_normal(shape).astype(np.float32)


def _leaf(a: np.ndarray, group) -> wgpar.Tensor:
    return wgpar.tensor(a, device=group.device).requires_grad_()


def _run(ctx, check, seed):
    ctx.run(lambda r: check(ctx.comm(r), seed))


def _check_all_reduce(group, seed):
    world, r = group.world_size, group.rank
    xs = [_arr(seed, q, (4, 5)) for q in range(world)]
    ws = [_arr(seed + 1, q, (4, 5)) for q in range(world)]
    for op, scale in (("sum", 1.0), ("mean", 1.0 / world)):
        x = _leaf(xs[r], group)
        y = dfn.all_reduce(x, group, op)
        assert_close(y.numpy(), scale * np.sum(xs, axis=0, dtype=np.float64), what=f"all_reduce {op}")
        (y * wgpar.tensor(ws[r], device=group.device)).sum().backward()
        # d(sum_q sum(w_q * y))/dx_r = scale * sum_q w_q
        assert_close(x.grad.numpy(), scale * np.sum(ws, axis=0, dtype=np.float64), what=f"all_reduce {op} grad")


def _check_all_gather_and_reduce_scatter(group, seed):
    world, r = group.world_size, group.rank
    rows = [2 + q for q in range(world)]  # ragged along dim 0
    xs = [_arr(seed, q, (rows[q], 3)) for q in range(world)]
    total = sum(rows)
    ws = [_arr(seed + 1, q, (total, 3)) for q in range(world)]
    x = _leaf(xs[r], group)
    y = dfn.all_gather(x, group, dim=0)
    assert_close(y.numpy(), np.concatenate(xs), what="all_gather")
    (y * wgpar.tensor(ws[r], device=group.device)).sum().backward()
    lo = sum(rows[:r])
    assert_close(x.grad.numpy(), np.sum(ws, axis=0, dtype=np.float64)[lo:lo + rows[r]], what="all_gather grad")

    n = 2 * world + 1  # uneven parts along dim 1
    xs = [_arr(seed + 2, q, (3, n)) for q in range(world)]
    parts = split_sizes(n, world)
    ws = [_arr(seed + 3, q, (3, parts[q])) for q in range(world)]
    x = _leaf(xs[r], group)
    y = dfn.reduce_scatter(x, group, dim=1)
    lo = sum(parts[:r])
    assert_close(y.numpy(), np.sum(xs, axis=0, dtype=np.float64)[:, lo:lo + parts[r]], what="reduce_scatter")
    (y * wgpar.tensor(ws[r], device=group.device)).sum().backward()
    assert_close(x.grad.numpy(), np.concatenate(ws, axis=1), what="reduce_scatter grad")


def _check_megatron_pair(group, seed):
    """out = g(f(x) * a_r) = sum_r x * a_r with a replicated loss sum(w * out): grad x = w * sum_r a_r.
    f's forward is a view of x (no copy); g's backward passes the gradient through unchanged."""
    world, r = group.world_size, group.rank
    x_np, w_np = _arr(seed, 99, (3, 4)), _arr(seed, 98, (3, 4))
    a = [_arr(seed + 1, q, (3, 4)) for q in range(world)]
    x = _leaf(x_np, group)
    fx = dfn.copy_to_parallel_region(x, group)
    assert fx._storage is x._storage and fx.requires_grad
    out = dfn.reduce_from_parallel_region(fx * wgpar.tensor(a[r], device=group.device), group)
    assert_close(out.numpy(), x_np.astype(np.float64) * np.sum(a, axis=0, dtype=np.float64), what="g forward")
    (out * wgpar.tensor(w_np, device=group.device)).sum().backward()
    assert_close(x.grad.numpy(), w_np * np.sum(a, axis=0, dtype=np.float64), what="f backward")


def _check_gather_and_scatter_regions(group, seed):
    """scatter (explicit and default sizes) -> scale by a_r -> gather, replicated loss."""
    world, r = group.world_size, group.rank
    n = 3 * world + 2
    x_np, w_np = _arr(seed, 99, (2, n)), _arr(seed, 98, (2, n))
    for sizes in (None, [n - 2 * (world - 1)] + [2] * (world - 1)):
        parts = sizes or split_sizes(n, world)
        a = [float(q + 2) for q in range(world)]
        x = _leaf(x_np, group)
        part = dfn.scatter_to_parallel_region(x, group, -1, sizes)
        lo = sum(parts[:r])
        assert_close(part.numpy(), x_np[:, lo:lo + parts[r]], what=f"scatter {sizes}")
        out = dfn.gather_from_parallel_region(part * a[r], group, dim=-1)
        scale = np.concatenate([np.full(p, a[q]) for q, p in enumerate(parts)])
        assert_close(out.numpy(), x_np * scale, what=f"gather {sizes}")
        (out * wgpar.tensor(w_np, device=group.device)).sum().backward()
        assert_close(x.grad.numpy(), w_np * scale, what=f"scatter/gather grad {sizes}")
    with pytest.raises(ValueError, match=r"sizes \[1\] do not split dim 1"):
        dfn.scatter_to_parallel_region(wgpar.zeros(2, n, device=group.device), group, -1, [1])


CHECKS = [_check_all_reduce, _check_all_gather_and_reduce_scatter, _check_megatron_pair,
          _check_gather_and_scatter_regions]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__.removeprefix("_check_"))
def test_differentiable_collectives(ctx, rng, check):
    _run(ctx, check, int(rng.integers(1 << 30)))
    assert ctx.group.broken is None
