"""Threaded collectives against NumPy, with more ranks than elements, and fault injection."""

from __future__ import annotations

import time

import numpy as np
import pytest

import wgpar
from wgpar.parallel import CollectiveError, CollectiveTimeoutError, MultiAdapterContext, RankError, split_sizes

from .helpers import assert_close

pytestmark = pytest.mark.multidevice


@pytest.fixture(scope="module", params=[2, 4], ids=["2dev", "4dev"])
def ctx(request):
    c = MultiAdapterContext(request.param, timeout=30)
    yield c
    c.close()


def _inputs(ctx, rng, shape):
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(ctx.world_size)]


@pytest.mark.parametrize("n", [1, 7, 1000, 2**20 + 3])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_all_reduce(ctx, rng, n, op):
    data = _inputs(ctx, rng, (n,))

    def f(r, a):
        t = wgpar.tensor(a, device=ctx.devices[r])
        ctx.comm(r).all_reduce(t, op)
        return t.numpy()

    out = ctx.run(f, data)
    stack = np.stack([d.astype(np.float64) for d in data])
    want = {"sum": stack.sum(0), "mean": stack.mean(0), "max": stack.max(0), "min": stack.min(0)}[op]
    for r in range(ctx.world_size):
        assert_close(out[r], want, rtol=1e-5, atol=1e-5, what=f"rank {r}")


def test_all_reduce_of_a_strided_view_and_int(ctx, rng):
    base = [rng.standard_normal((6, 5)).astype(np.float32) for _ in range(ctx.world_size)]
    ints = [rng.integers(-50, 50, 9) for _ in range(ctx.world_size)]

    def f(r, a, i):
        t = wgpar.tensor(a, device=ctx.devices[r])
        view = t[:, 1:4].T
        ctx.comm(r).all_reduce(view, "sum")
        ti = wgpar.tensor(i, device=ctx.devices[r])
        ctx.comm(r).all_reduce(ti, "max")
        return t.numpy(), ti.numpy()

    out = ctx.run(f, base, ints)
    want = sum(b.astype(np.float64) for b in base)
    for r in range(ctx.world_size):
        got_t, got_i = out[r]
        assert_close(got_t[:, 1:4], want[:, 1:4], rtol=1e-5, atol=1e-5)
        assert_close(got_t[:, [0, 4]], base[r][:, [0, 4]])
        np.testing.assert_array_equal(got_i, np.max(ints, axis=0))


@pytest.mark.parametrize("n", [1, 7, 1000, 2**20 + 3])
def test_broadcast_all_gather_reduce_scatter(ctx, rng, n):
    data = _inputs(ctx, rng, (n,))
    src = ctx.world_size - 1

    def f(r, a):
        comm = ctx.comm(r)
        b = wgpar.tensor(a, device=ctx.devices[r])
        comm.broadcast(b, src=src)
        g = comm.all_gather(wgpar.tensor(a[: r + 1], device=ctx.devices[r]))
        rs = comm.reduce_scatter(wgpar.tensor(a, device=ctx.devices[r]))
        assert all(t.device is ctx.devices[r] for t in g) and rs.device is ctx.devices[r]
        return b.numpy(), [t.numpy() for t in g], rs.numpy()

    out = ctx.run(f, data)
    total = sum(d.astype(np.float64) for d in data)
    bounds = np.cumsum([0, *split_sizes(n, ctx.world_size)])
    for r in range(ctx.world_size):
        b, g, rs = out[r]
        np.testing.assert_array_equal(b, data[src])
        for k in range(ctx.world_size):
            np.testing.assert_array_equal(g[k], data[k][: k + 1])
        assert_close(rs, total[bounds[r]:bounds[r + 1]], rtol=1e-5, atol=1e-5)


def test_more_ranks_than_elements(ctx, rng):
    data = _inputs(ctx, rng, (1,))
    out = ctx.run(lambda r, a: ctx.comm(r).reduce_scatter(wgpar.tensor(a, device=ctx.devices[r])).numpy(), data)
    sizes = [o.shape[0] for o in out]
    assert sizes == split_sizes(1, ctx.world_size) and sum(sizes) == 1
    assert_close(out[0], sum(d.astype(np.float64) for d in data), rtol=1e-6)


def test_split_sizes_never_drops():
    assert split_sizes(10, 4) == [3, 3, 2, 2]
    assert split_sizes(3, 4) == [1, 1, 1, 0]
    assert sum(split_sizes(2**20 + 3, 7)) == 2**20 + 3


def test_barrier_and_mismatched_shapes(ctx):
    assert ctx.run(lambda r: ctx.comm(r).barrier() or r) == list(range(ctx.world_size))

    def f(r):
        ctx.comm(r).all_reduce(wgpar.zeros(r + 1, device=ctx.devices[r]))

    with pytest.raises(RankError, match="different shapes"):
        ctx.run(f)
    ctx.reset()


def test_rank_raising_makes_every_rank_raise(rng):
    with MultiAdapterContext(3, timeout=20) as ctx:
        seen = {}

        def f(r):
            try:
                if r == 1:
                    raise ValueError("injected failure in forward")
                ctx.comm(r).all_reduce(wgpar.ones(5, device=ctx.devices[r]))
            except CollectiveError as exc:
                seen[r] = str(exc)
                raise

        t0 = time.monotonic()
        with pytest.raises(RankError, match="rank 1 raised ValueError: injected failure"):
            ctx.run(f)
        assert time.monotonic() - t0 < 10, "ranks waited for the timeout instead of the abort"
        assert set(seen) == {0, 2} and all("rank 1 failed" in s for s in seen.values())
        ctx.reset()
        out = ctx.run(lambda r: ctx.comm(r).all_reduce(wgpar.ones(3, device=ctx.devices[r])).numpy())
        assert_close(out[2], [3, 3, 3])


def test_rank_skipping_a_collective_times_out_everywhere():
    with MultiAdapterContext(3, timeout=1.5) as ctx:
        errors = {}

        def f(r):
            if r == 2:
                return "skipped"
            try:
                ctx.comm(r).all_reduce(wgpar.ones(4, device=ctx.devices[r]))
            except CollectiveTimeoutError as exc:
                errors[r] = str(exc)
                raise

        t0 = time.monotonic()
        with pytest.raises(RankError, match=r"rank\(s\) \[2\] did not arrive"):
            ctx.run(f)
        assert time.monotonic() - t0 < 10
        assert set(errors) <= {0, 1} and errors
        assert all("#0" in e and "[2]" in e for e in errors.values())
        ctx.reset()
        # devices and group are usable again
        out = ctx.run(lambda r: (ctx.comm(r).all_reduce(wgpar.full((2,), float(r), device=ctx.devices[r]))).numpy())
        assert_close(out[0], [3.0, 3.0])


def test_wrong_device_and_bad_op(ctx):
    def f(r):
        ctx.comm(r).all_reduce(wgpar.ones(2, device=ctx.devices[(r + 1) % ctx.world_size]))

    with pytest.raises(RankError, match="this rank owns"):
        ctx.run(f)
    ctx.reset()
    with pytest.raises(RankError, match="op must be"):
        ctx.run(lambda r: ctx.comm(r).all_reduce(wgpar.ones(2, device=ctx.devices[r]), "prod"))
    ctx.reset()
