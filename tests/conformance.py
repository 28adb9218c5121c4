"""The ProcessGroup conformance checks: per-rank programs that any backend must pass.

Each check is ``check(group, seed)``, run on every rank of a group (threads
with ``run_spmd``, or processes under mpiexec). Every rank generates every
rank's inputs from ``(seed, rank)``, so each can compute the expected result
in float64 with NumPy and assert on its own output. A failed assertion on one
rank makes every rank raise (the backend's failure handling), so the harness
only has to propagate the exception.
"""

from __future__ import annotations

import numpy as np

import wgpar
from wgpar.distributed import CollectiveError, split_sizes

SIZES = (1, 7, 1000, 2**18 + 3)
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def _data(seed: int, rank: int, shape, kind: str = "f") -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if kind == "i":
        return rng.integers(-50, 50, shape).astype(np.int32)
    if kind == "b":
        return rng.random(shape) < 0.5
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)  # products of a few stay well scaled


def _close(got, want, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def _tensor(a: np.ndarray, group, dtype=None):
    return wgpar.tensor(a, device=group.device, dtype=dtype)


def check_all_reduce(group, seed):
    """Every op and size, sync and async, float32; results identical on every rank."""
    world = group.world_size
    works = []
    for n in SIZES:
        for op, ref in REDUCE.items():
            data = [_data(seed + n, r, (n,)) for r in range(world)]
            t = _tensor(data[group.rank], group)
            asynchronous = (n + len(op)) % 2 == 0
            res = group.all_reduce(t, op, async_op=asynchronous)
            works.append((res, t, ref(np.stack(data).astype(np.float64), axis=0), f"{op} n={n}"))
    for res, t, want, what in works:
        if not isinstance(res, wgpar.Tensor):
            assert res.wait() is t
        _close(t.numpy(), want, what, rtol=1e-5)


def check_all_reduce_dtypes_and_views(group, seed):
    """int32, bool, float16 of odd length (6 bytes), a strided view, a 0-d tensor, an empty one."""
    world, r = group.world_size, group.rank
    ints = [_data(seed, k, (9,), "i") for k in range(world)]
    t = _tensor(ints[r], group)
    group.all_reduce(t, "max")
    np.testing.assert_array_equal(t.numpy(), np.max(ints, axis=0))
    t = _tensor(ints[r], group)
    group.all_reduce(t, "sum")
    np.testing.assert_array_equal(t.numpy(), np.sum(ints, axis=0))
    bools = [_data(seed, k, (5,), "b") for k in range(world)]
    t = _tensor(bools[r], group)
    group.all_reduce(t, "max")
    np.testing.assert_array_equal(t.numpy(), np.any(bools, axis=0))
    if group.device.has_f16:
        halves = [_data(seed, k, (3,)).astype(np.float16) for k in range(world)]
        t = _tensor(halves[r], group, dtype="float16")
        group.all_reduce(t, "sum")
        _close(t.numpy(), np.sum(np.stack(halves).astype(np.float64), axis=0), "float16 x3", rtol=2e-3)
    base = [_data(seed, k, (6, 5)) for k in range(world)]
    t = _tensor(base[r], group)
    group.all_reduce(t[:, 1:4].T, "sum")  # a strided view: the rest of t stays as it was
    got = t.numpy()
    _close(got[:, 1:4], np.sum(np.stack(base), axis=0)[:, 1:4], "strided view")
    np.testing.assert_array_equal(got[:, [0, 4]], base[r][:, [0, 4]])
    t = _tensor(np.float32(r + 1), group)
    group.all_reduce(t, "sum")
    assert t.item() == world * (world + 1) / 2
    assert group.all_reduce(wgpar.zeros(0, device=group.device)).numel() == 0


def _fold(parts: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction every backend computes: in rank order, float16 accumulated in float32 (the exact bits)."""
    fn = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    acc = parts[0].astype(np.float32 if parts[0].dtype == np.float16 else parts[0].dtype)
    for p in parts[1:]:  # (float16 + float16 into float32: each addend converted first)
        fn(acc, p, out=acc, casting="unsafe")
    if op == "mean":
        np.divide(acc, len(parts), out=acc)
    return acc.astype(parts[0].dtype)


# Element counts around the chunks of a pipelined collective (the MPI tests run with 64 KiB chunks:
# 16384 elements) and odd splits over the ranks; 1 element leaves some ranks an empty slice.
EXACT_SIZES = (1, 2, 3, 5, 16383, 16385, 3 * 16384 + 7)


def check_exact_reductions(group, seed):
    """All-reduce and reduce-scatter bit for bit equal to the rank-order reduction (and within float
    rounding of float64), for awkward sizes, int32, float32 and float16, every op."""
    world, r = group.world_size, group.rank
    cases = [("f", None, op) for op in REDUCE] + [("i", None, "sum"), ("i", None, "min"), ("i", None, "prod")]
    if group.device.has_f16:
        cases += [("f", "float16", "sum"), ("f", "float16", "mean"), ("f", "float16", "max")]
    for n in EXACT_SIZES:
        for kind, dtype, op in cases:
            data = [_data(seed + n, k, (n,), kind) for k in range(world)]
            if kind == "i" and op == "prod":
                data = [np.sign(d) + (d == 0) for d in data]  # +-1: no overflow
            if dtype == "float16":
                data = [d.astype(np.float16) for d in data]
            what = f"{op} {dtype or data[0].dtype} n={n}"
            t = _tensor(data[r], group, dtype)
            group.all_reduce(t, op)
            want = _fold(data, op)
            np.testing.assert_array_equal(t.numpy(), want, err_msg=f"all_reduce {what}: not the rank-order bits")
            exact = REDUCE[op](np.stack(data).astype(np.float64), axis=0)
            if kind == "i":
                np.testing.assert_array_equal(t.numpy(), exact, err_msg=what)
            else:
                _close(t.numpy(), exact, what, rtol=2e-3 if dtype else 1e-5)
            if op in ("sum", "max") and n > 1:
                part = group.reduce_scatter(_tensor(data[r], group, dtype), op)
                bounds = np.cumsum([0, *split_sizes(n, world)])
                np.testing.assert_array_equal(part.numpy(), want[bounds[r]:bounds[r + 1]],
                                              err_msg=f"reduce_scatter {what}")


def check_nan_propagates(group, seed):
    """A NaN on one rank makes the sum, max and min NaN at that position on every rank."""
    for op in ("sum", "max", "min"):
        a = _data(seed, group.rank, (4,))
        if group.rank == group.world_size - 1:
            a[2] = np.nan
        t = _tensor(a, group)
        group.all_reduce(t, op)
        got = t.numpy()
        assert np.isnan(got[2]) and np.isfinite(got[[0, 1, 3]]).all(), f"{op}: {got}"


def check_broadcast(group, seed):
    """From every source rank, sync and async, into contiguous and strided tensors."""
    world = group.world_size
    for src in range(world):
        data = [_data(seed + src, k, (7, 3)) for k in range(world)]
        t = _tensor(data[group.rank], group)
        w = group.broadcast(t, src, async_op=src % 2 == 1)
        if src % 2 == 1:
            assert w.wait() is t
        np.testing.assert_array_equal(t.numpy(), data[src])
        big = _tensor(np.zeros((3, 8), np.float32), group)
        view = big[:, 2:5]
        if group.rank == src:
            view.copy_(_tensor(data[src][:3], group))
        group.broadcast(view, src)
        got = big.numpy()
        np.testing.assert_array_equal(got[:, 2:5], data[src][:3])
        assert not got[:, [0, 1, 5, 6, 7]].any()


def check_all_gather(group, seed):
    """Ragged shapes (rank r sends r + 1 rows), and all_gather_into a flat buffer, sync and async."""
    world, r = group.world_size, group.rank
    data = [_data(seed, k, (k + 1, 3)) for k in range(world)]
    parts = group.all_gather(_tensor(data[r], group))
    assert len(parts) == world and all(p.device is group.device for p in parts)
    for k in range(world):
        np.testing.assert_array_equal(parts[k].numpy(), data[k])
    for n in (1, 5, 1001):
        flat = [_data(seed + n, k, (n,)) for k in range(world)]
        out = wgpar.empty(world * n, device=group.device)
        w = group.all_gather_into(out, _tensor(flat[r], group), async_op=True)
        assert w.wait() is out
        np.testing.assert_array_equal(out.numpy(), np.concatenate(flat))
    if group.device.has_f16:
        h = [_data(seed, k, (3,)).astype(np.float16) for k in range(world)]
        out = wgpar.empty(world * 3, dtype="float16", device=group.device)
        group.all_gather_into(out, _tensor(h[r], group, dtype="float16"))
        np.testing.assert_array_equal(out.numpy(), np.concatenate(h))


def check_reduce_scatter(group, seed):
    """Uneven rows (more ranks than rows too), and reduce_scatter_into, for sum and max."""
    world, r = group.world_size, group.rank
    for rows in (1, world + 1, 37):
        for op in ("sum", "max"):
            data = [_data(seed + rows, k, (rows, 2)) for k in range(world)]
            part = group.reduce_scatter(_tensor(data[r], group), op)
            bounds = np.cumsum([0, *split_sizes(rows, world)])
            want = REDUCE[op](np.stack(data).astype(np.float64), axis=0)[bounds[r]:bounds[r + 1]]
            assert part.shape == want.shape, (part.shape, want.shape)
            _close(part.numpy(), want, f"reduce_scatter {op} rows={rows}")
    n = 11
    data = [_data(seed, k, (world * n,)) for k in range(world)]
    out = wgpar.empty(n, device=group.device)
    group.reduce_scatter_into(out, _tensor(data[r], group), "sum", async_op=True).wait()
    _close(out.numpy(), np.sum(np.stack(data).astype(np.float64), axis=0)[r * n:(r + 1) * n], "reduce_scatter_into")


def check_send_recv(group, seed):
    """A ring in both directions (sends never wait for receivers), FIFO order per tag, tags kept apart,
    recv into a new tensor, and async handles."""
    world, r = group.world_size, group.rank
    nxt, prv = (r + 1) % world, (r - 1) % world
    for k in range(3):  # three messages on tag 0, one on tag 5, all sent before any receive
        group.send(_tensor(_data(seed + k, r, (4, k + 1)), group), nxt)
    group.send(_tensor(_data(seed + 99, r, (2,)), group), nxt, tag=5)
    late = group.recv(None, prv, tag=5, async_op=True)
    for k in range(3):
        got = group.recv(wgpar.empty(4, k + 1, device=group.device), prv)
        np.testing.assert_array_equal(got.numpy(), _data(seed + k, prv, (4, k + 1)))
    np.testing.assert_array_equal(late.wait().numpy(), _data(seed + 99, prv, (2,)))
    w = group.send(_tensor(_data(seed, r, (3,)), group), prv, async_op=True)
    got = group.recv(None, nxt)
    w.wait()
    np.testing.assert_array_equal(got.numpy(), _data(seed, nxt, (3,)))
    group.barrier()


def check_recv_shape_mismatch(group, seed):
    """A receiver whose tensor does not match the message raises naming both shapes."""
    if group.rank == 0:
        group.send(wgpar.zeros(4, 8, device=group.device), 1)
    elif group.rank == 1:
        try:
            group.recv(wgpar.empty(4, 9, device=group.device), 0)
        except CollectiveError as exc:
            assert "(4, 8)" in str(exc) and "(4, 9)" in str(exc), str(exc)
        else:
            raise AssertionError("recv into a tensor of the wrong shape did not raise")
    group.barrier()


def check_split(group, seed):
    """Sub-groups: pairs of ranks, their own collectives interleaved with the parent's, and None for
    ranks outside."""
    world, r = group.world_size, group.rank
    halves = [list(range(0, world, 2)), list(range(1, world, 2))]
    subs = [group.split(h) for h in halves]
    mine = subs[r % 2]
    assert subs[1 - r % 2] is None and mine is not None
    assert mine.world_size == len(halves[r % 2]) and mine.rank == halves[r % 2].index(r)
    t = _tensor(np.full(3, float(r), np.float32), group)
    w = mine.all_reduce(t, "sum", async_op=True)
    total = group.all_reduce(_tensor(np.full(2, float(r), np.float32), group), "sum")
    w.wait()
    np.testing.assert_array_equal(t.numpy(), np.full(3, float(sum(halves[r % 2]))))
    np.testing.assert_array_equal(total.numpy(), np.full(2, float(sum(range(world)))))
    if mine.world_size > 1:
        partner = (mine.rank + 1) % mine.world_size
        mine.send(_tensor(np.full(2, float(r), np.float32), group), partner)
        got = mine.recv(None, (mine.rank - 1) % mine.world_size)
        assert got.numpy()[0] == halves[r % 2][(mine.rank - 1) % mine.world_size]
    whole = group.split(list(reversed(range(world))))
    assert whole.rank == world - 1 - r
    group.barrier()


def check_async_overlap(group, seed):
    """Several collectives in flight at once, waited in reverse order, compute recorded meanwhile."""
    world, r = group.world_size, group.rank
    data = [[_data(seed + i, k, (1000 + i,)) for k in range(world)] for i in range(4)]
    ts = [_tensor(d[r], group) for d in data]
    works = [group.all_reduce(t, "sum", async_op=True, label=f"b{i}") for i, t in enumerate(ts)]
    y = (_tensor(_data(seed, r, (64, 64)), group) @ _tensor(_data(seed, r, (64, 64)), group)).sum()
    for w in reversed(works):
        w.wait()
    assert all(w.is_completed() for w in works)
    for i, t in enumerate(ts):
        _close(t.numpy(), np.sum(np.stack(data[i]).astype(np.float64), axis=0), f"in flight {i}")
    assert np.isfinite(y.item())


def check_disagreement_raises(group, seed):
    """Ranks that disagree on shape (same numel), dtype, op or src raise naming the ranks; the group
    stays usable (everyone stopped at the same collective)."""
    last = group.world_size - 1
    cases = [
        ("shape", lambda: group.all_reduce(wgpar.zeros(*((3, 2) if group.rank == last else (2, 3)),
                                                       device=group.device))),
        ("dtype", lambda: group.all_reduce(wgpar.zeros(4, dtype="int32" if group.rank == last else "float32",
                                                       device=group.device))),
        ("op", lambda: group.all_reduce(wgpar.zeros(4, device=group.device), "max" if group.rank == last else "sum")),
        ("src", lambda: group.broadcast(wgpar.zeros(4, device=group.device), 0 if group.rank == last else last)),
        ("dtype", lambda: group.broadcast(wgpar.zeros(4, dtype="int32" if group.rank == last else "float32",
                                                      device=group.device))),
    ]
    for field, call in cases:
        try:
            call()
        except CollectiveError as exc:
            msg = str(exc)
            assert f"disagree on {field}" in msg and f"[{last}]" in msg, msg
        else:
            raise AssertionError(f"ranks disagreeing on {field} did not raise")
    t = _tensor(np.ones(2, np.float32), group)
    group.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), [group.world_size] * 2)


ALL_CHECKS = [check_all_reduce, check_all_reduce_dtypes_and_views, check_exact_reductions, check_nan_propagates,
              check_broadcast, check_all_gather, check_reduce_scatter, check_send_recv, check_recv_shape_mismatch,
              check_split, check_async_overlap, check_disagreement_raises]
