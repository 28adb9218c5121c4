"""The ProcessGroup conformance suite on thread ranks (2, 3 and 4 logical devices), and what only a
recoverable backend can show: failures, timeouts and reset."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import wgpar
from wgpar.distributed import (
    CollectiveError,
    CollectiveTimeoutError,
    MultiAdapterContext,
    ProcessGroup,
    RankError,
    Work,
    run_spmd,
    split_sizes,
)
from wgpar.distributed.backends import hostreduce

from . import conformance
from .helpers import assert_close

pytestmark = pytest.mark.multidevice


@pytest.fixture(scope="module", params=[2, 3, 4], ids=["2dev", "3dev", "4dev"])
def ctx(request):
    c = MultiAdapterContext(request.param, timeout=30)
    yield c
    c.close()


@pytest.mark.parametrize("check", conformance.ALL_CHECKS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_conformance(ctx, rng, check):
    seed = int(rng.integers(1 << 30))
    ctx.run(lambda r: check(ctx.comm(r), seed))
    assert ctx.group.broken is None


def test_every_rank_is_a_process_group(ctx):
    groups = [ctx.comm(r) for r in range(ctx.world_size)]
    assert all(isinstance(g, ProcessGroup) for g in groups)
    assert [g.rank for g in groups] == list(range(ctx.world_size))
    assert [g.device for g in groups] == ctx.devices


def test_run_spmd_gives_each_rank_its_group():
    out = run_spmd(lambda g, k: (g.rank, g.world_size, g.device.index, k), 3, args=(7,), timeout=30)
    assert [o[:2] for o in out] == [(0, 3), (1, 3), (2, 3)] and {o[3] for o in out} == {7}
    with pytest.raises(ValueError, match="unknown backend 'nccl'"):
        run_spmd(lambda g: None, 2, backend="nccl")


def test_split_sizes_never_drops():
    assert split_sizes(10, 4) == [3, 3, 2, 2]
    assert split_sizes(3, 4) == [1, 1, 1, 0]
    assert sum(split_sizes(2**20 + 3, 7)) == 2**20 + 3


def test_bad_arguments_raise_at_the_call(ctx):
    def f(r):
        g = ctx.comm(r)
        other = ctx.devices[(r + 1) % ctx.world_size]
        with pytest.raises(ValueError, match="this rank owns"):
            g.all_reduce(wgpar.ones(2, device=other))
        with pytest.raises(ValueError, match="op must be one of"):
            g.all_reduce(wgpar.ones(2, device=g.device), "xor")
        with pytest.raises(TypeError, match="'mean' needs a float"):
            g.all_reduce(wgpar.ones(2, dtype="int32", device=g.device), "mean")
        with pytest.raises(ValueError, match="peer rank 99 out of range"):
            g.broadcast(wgpar.ones(2, device=g.device), 99)
        with pytest.raises(ValueError, match="cannot send to itself"):
            g.send(wgpar.ones(2, device=g.device), r)
        with pytest.raises(ValueError, match="cannot hold"):
            g.all_gather_into(wgpar.empty(5, device=g.device), wgpar.ones(2, device=g.device))
        with pytest.raises(ValueError, match="distinct ranks"):
            g.split([0, 0])
        return True

    assert all(ctx.run(f))
    assert ctx.group.broken is None


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf")])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive"):
        MultiAdapterContext(2, timeout=timeout)


def test_kind_mismatch_names_both_kinds_and_ranks_and_reset_recovers():
    with MultiAdapterContext(3, timeout=20) as ctx:
        def f(r):
            label = "layers.4" if r == 2 else "layers.3"
            ctx.comm(r).all_gather_into(wgpar.empty(6, device=ctx.devices[r]), wgpar.ones(2, device=ctx.devices[r]),
                                        label=label)

        with pytest.raises(RankError) as info:
            ctx.run(f)
        msg = str(info.value)
        assert "all_gather_into[layers.4]" in msg and "all_gather_into[layers.3]" in msg and "rank 2" in msg
        ctx.reset()
        out = ctx.run(lambda r: ctx.comm(r).all_reduce(wgpar.ones(3, device=ctx.devices[r])).numpy())
        assert_close(out[1], [3, 3, 3])


def test_rank_raising_makes_every_rank_raise_fast():
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
        out = ctx.run(lambda r: ctx.comm(r).all_reduce(wgpar.full((2,), float(r), device=ctx.devices[r])).numpy())
        assert_close(out[0], [3.0, 3.0])


def test_recv_without_a_sender_times_out_and_names_the_source():
    with MultiAdapterContext(2, timeout=1.0) as ctx:
        def f(r):
            if r == 1:
                ctx.comm(r).recv(None, 0, tag=3)

        with pytest.raises(RankError, match=r"no message from rank 0 \(tag 3\)"):
            ctx.run(f)
        ctx.reset()
        ctx.run(lambda r: ctx.comm(r).barrier())


def test_failure_inside_the_host_reduction_leaves_every_buffer_usable(monkeypatch):
    """A MemoryError while reducing (others may still read our mappings): the buffers are abandoned,
    not unmapped; after reset they are settled and reused, and nothing is left in use."""
    real = hostreduce.reduce_into
    state = {"armed": True}

    def flaky(parts, targets, op, is_bool=False):
        if state["armed"] and threading.current_thread().name == "wgpar-comm1":
            state["armed"] = False
            raise MemoryError("injected host allocation failure")
        return real(parts, targets, op, is_bool)

    monkeypatch.setattr("wgpar.distributed.backends.threads.reduce_into", flaky)
    with MultiAdapterContext(2, timeout=20) as ctx:
        def f(r):
            g = ctx.comm(r)
            works = [g.all_reduce(wgpar.full((3000,), float(r + i), device=g.device), async_op=True, label=f"b{i}")
                     for i in range(4)]
            return [w.wait().numpy()[0] for w in works]

        with pytest.raises(RankError, match="MemoryError: injected host allocation failure"):
            ctx.run(f)
        pools = [ctx.comm(r)._pool for r in range(2)]
        assert sum(p.num_abandoned for p in pools) > 0  # the failed reduction's buffers
        ctx.reset()
        for _ in range(3):
            assert all(p.num_abandoned == 0 and p.num_idle == p.num_created for p in pools), "a buffer was lost"
            assert ctx.run(f) == [[1.0, 3.0, 5.0, 7.0]] * 2
        assert all(p.num_idle == p.num_created <= 8 for p in pools)


def test_work_wait_timeout_and_late_completion():
    with MultiAdapterContext(2, timeout=20) as ctx:
        late = threading.Event()

        def f(r):
            g = ctx.comm(r)
            if r == 1:
                late.wait(10)
            w = g.all_reduce(wgpar.ones(3, device=g.device), async_op=True)
            if r == 0:
                with pytest.raises(CollectiveTimeoutError, match="not complete after 0.2 s"):
                    w.wait(0.2)
                assert not w.is_completed()
                late.set()
            return w.wait().numpy()

        out = ctx.run(f)
        assert_close(out[0], [2, 2, 2])
    assert isinstance(Work.completed("x", 5), Work) and Work.completed("x", 5).wait() == 5


def test_traffic_counts_the_bytes_each_rank_moves(ctx):
    """all_reduce of n float32: 4n bytes down and 4n up per rank; all_gather_into: 4n down, 4n*world up."""
    n, w = 1000, ctx.world_size

    def f(r):
        g = ctx.comm(r)
        g.reset_traffic()
        g.all_reduce(wgpar.ones(n, device=g.device))
        after_reduce = g.traffic()
        g.all_gather_into(wgpar.empty(n * w, device=g.device), wgpar.ones(n, device=g.device))
        return after_reduce, g.traffic()

    for ar, both in ctx.run(f):
        assert ar == {"d2h_bytes": 4 * n, "h2d_bytes": 4 * n, "collectives": 1}
        assert both == {"d2h_bytes": 8 * n, "h2d_bytes": 4 * n + 4 * n * w, "collectives": 2}


@pytest.mark.parametrize("method", ["reduce_scatter_into", "all_gather_into"])
def test_an_async_collective_does_not_keep_its_input_alive(method):
    """The input is copied when the collective is called: dropping it frees its memory at once, while the
    collective still waits for another rank (FSDP drops a unit's full gradients right after the call)."""
    def f(group):
        d = group.device
        n = 4096 * group.world_size
        if group.rank == 1:
            time.sleep(0.3)  # rank 0's collective waits in the rendezvous meanwhile
        inp = wgpar.ones(n if method == "reduce_scatter_into" else 4096, device=d)
        out = wgpar.empty(4096 if method == "reduce_scatter_into" else n, device=d)
        work = getattr(group, method)(out, inp, async_op=True)
        before = wgpar.memory_allocated(d)
        nbytes = inp.nbytes
        del inp
        dropped = before - wgpar.memory_allocated(d)
        pending = not work.is_completed()
        work.wait()
        return dropped == nbytes, pending

    results = run_spmd(f, 2, timeout=30)
    assert results[0] == (True, True)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 15, 16, 17, 1023, hostreduce.MIN_BLOCK, hostreduce.MIN_BLOCK + 1,
                               3 * hostreduce.MIN_BLOCK + 5, 9 * hostreduce.MIN_BLOCK - 1, hostreduce.BLOCK + 3])
@pytest.mark.parametrize("workers", [0, 1, 3, 8])
def test_blocks_cover_every_element_once(n, workers):
    """The host pool's split of a job (the MPI backend's steps split every copy and reduction this way):
    contiguous, in order, nothing dropped or repeated, at most ``block`` items, starts aligned; sizes
    smaller than the worker count and single elements give one block."""
    block = 4 * hostreduce.MIN_BLOCK
    got = hostreduce.blocks(n, block, workers)
    assert [a for a, _ in got] == sorted({a for a, _ in got})
    assert sum(b - a for a, b in got) == n and (not got or (got[0][0] == 0 and got[-1][1] == n))
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(got, got[1:]))
    assert all(b - a <= block and a % 16 == 0 for a, b in got)
    if n <= hostreduce.MIN_BLOCK:
        assert len(got) == (1 if n else 0)
    if workers > 1:  # a large job spreads over the pool, in blocks of at least MIN_BLOCK
        assert len(got) >= min(workers, n // hostreduce.MIN_BLOCK, -(-n // block))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("n", [1, 3, 1000, 70_001])
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_reduce_and_copy_tasks_match_one_call_bit_for_bit(dtype, n, op):
    """Tasks of awkward sizes, run in any order, give the bits of one reduction over the whole arrays
    (each element's ranks are folded in the same order whatever the split), into every target (float16
    ones share one cast of each block); copy tasks divide for mean."""
    if op == "mean" and dtype == np.int32:
        pytest.skip("mean needs floats")
    rng = np.random.default_rng(n)
    parts = [rng.uniform(-1, 1, n).astype(dtype) if dtype != np.int32 else rng.integers(-99, 99, n, dtype=dtype)
             for _ in range(3)]
    want = conformance._fold(parts, op)
    acc_dtype = np.float32 if dtype == np.float16 else dtype
    out, acc = np.zeros(n, dtype), np.zeros(n, acc_dtype)
    tasks = hostreduce.reduce_tasks(parts, [out], op, block=4096, acc=acc, workers=5)
    hostreduce.finish_tasks(hostreduce.submit_tasks(tasks[::-1]))
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(acc.astype(dtype), want)
    outs = [np.zeros(n, dtype) for _ in range(3)]
    hostreduce.run_tasks(hostreduce.reduce_tasks(parts, outs, op, block=4096, workers=5)[::-1])
    for o in outs:
        np.testing.assert_array_equal(o, want)
    copied = np.zeros(n, dtype)
    hostreduce.run_tasks(hostreduce.copy_tasks(copied, acc, divide=2.0 if dtype != np.int32 else None, workers=5))
    np.testing.assert_array_equal(copied, (acc / 2).astype(dtype) if dtype != np.int32 else want)


def test_float16_conversions_give_numpys_bits():
    """The host reductions' float16 conversions against NumPy's casts, bit for bit: every float16 value up;
    down, every float16 value and its float32 neighbours, the halfway points between float16 values and
    their neighbours (ties to even), the subnormal and overflow boundaries, NaN payloads (one that
    would shift out keeps a bit), both signs, and random bit patterns."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    up = np.empty(len(every), np.float32)
    hostreduce.f16_to_f32(every, up, np.empty(len(every), np.uint32), np.empty(len(every), np.bool_))
    np.testing.assert_array_equal(up.view(np.uint32), every.astype(np.float32).view(np.uint32))

    exact = every.astype(np.float32).view(np.uint32).astype(np.int64)
    near = [exact + d for d in range(-3, 4)] + [exact + (1 << 12) + d for d in range(-2, 3)]  # halfway: bit 12
    ranges = [np.arange(0x33000000 - 8, 0x38800000 + 8, 61), np.arange(0x477fe000, 0x47800000 + 8),
              np.arange(0x7f800000, 0x80000000, 4099), np.arange(0x7f800000, 0x7f802001)]
    rand = np.random.default_rng(0).integers(0, 1 << 32, 1 << 20, dtype=np.int64)
    bits = np.concatenate(near + ranges + [rand]) % (1 << 32)
    bits = np.concatenate([bits, bits | (1 << 31)]).astype(np.uint32)
    x = bits.view(np.float32)
    down = np.empty(len(x), np.float16)
    hostreduce.f32_to_f16(x, down, *(np.empty(len(x), np.uint32) for _ in range(2)), np.empty(len(x), np.bool_))
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    bad = np.nonzero(down.view(np.uint16) != want.view(np.uint16))[0]
    assert not len(bad), [(hex(bits[i]), hex(down.view(np.uint16)[i]), hex(want.view(np.uint16)[i])) for i in bad[:5]]


def test_finish_tasks_waits_for_every_task_then_raises_the_first_error():
    done = []

    def slow():
        time.sleep(0.2)
        done.append(1)

    def bad():
        raise MemoryError("injected")

    with pytest.raises(MemoryError, match="injected"):
        hostreduce.finish_tasks(hostreduce.submit_tasks([bad, slow, slow]))
    assert done == [1, 1]  # nobody still writes into buffers the caller gives back


@pytest.mark.parametrize("count", [0, 1, 3, 8, 9, 24, 25])
def test_bundle_runs_every_task_once_in_at_most_n_tasks(count):
    ran = []
    tasks = [lambda k=k: ran.append(k) for k in range(count)]
    bundled = hostreduce.bundle(tasks, 8)
    assert len(bundled) == min(count, 8)
    hostreduce.run_tasks(bundled)
    assert sorted(ran) == list(range(count))
