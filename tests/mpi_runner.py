"""Programs that tests/test_mpi.py runs under mpiexec, one process per rank:

    mpiexec -n 3 python -m mpi4py tests/mpi_runner.py conformance SEED OUT.npz
    WGPAR_MPI_RANKS_PER_HOST=2 mpiexec -n 4 python -m mpi4py tests/mpi_runner.py hosts SEED JITTER
    mpiexec -n 3 python -m mpi4py tests/mpi_runner.py fault MODE TIMEOUT TOKEN
    mpiexec -n 2 python -m mpi4py tests/mpi_runner.py p2p MODE TIMEOUT TOKEN
    mpiexec -n 2 python -m mpi4py tests/mpi_runner.py p2p_progress BUSY FLOATS

``conformance`` runs every check of tests/conformance.py (and a few the MPI backend adds), then
trains a small model with DistributedDataParallel; rank 0 writes what every rank returned to OUT.
``hosts`` runs the pipelined all-reduce across simulated hosts (``check_hosts_pipelined``) with each
rank's steps delayed at random by up to JITTER s; rank 0 prints each rank's host, hosts and ranks per host.
``fault`` makes rank 1 misbehave (MODE: raise, return, sysexit, skip, stall, stall_late, stall_host) while the
others are in an all-reduce (or, MODE nosend, wait for a message from it); each other rank prints
``RAISED`` and its error, and the job must end non-zero. ``p2p`` (p2p_program) is a recv never matched
or a send never received, which must also end the job non-zero, naming the message. ``p2p_progress``
(p2p_progress_program) times a recv whose sender's communication thread is busy elsewhere.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from tests import conformance  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.distributed import (  # noqa: E402
    MLP,
    CollectiveError,
    DistributedDataParallel,
    ParallelMLP,
    PipelineSchedule,
    PipelineStage,
    fully_shard,
    run_spmd,
    split_module,
)
from wgpar.nn import functional as F  # noqa: E402

DDP_STEPS = 10
DDP_BATCH = 36  # divides by 2 and 3: equal shares, so averaged gradients equal the full batch's


def ddp_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((DDP_STEPS, DDP_BATCH, 7)).astype(np.float32),
            rng.integers(0, 5, (DDP_STEPS, DDP_BATCH)).astype(np.int32))


def ddp_model(seed: int, device) -> nn.Module:
    """The model with weights drawn from ``seed`` (NumPy's generator: wgpar.manual_seed is one generator
    per process, shared by thread ranks, so it would give thread ranks racing draws)."""
    model = nn.Sequential(nn.Linear(7, 19, device=device), nn.Tanh(), nn.Linear(19, 5, device=device))
    rng = np.random.default_rng(seed)
    model.load_state_dict({k: rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)
                           for k, v in model.state_dict().items()})
    return model


def ddp_optimizer(params):
    return optim.Adam(params, lr=0.02, eps=1e-4)


def train_ddp(group, seed: int) -> dict[str, np.ndarray]:
    """10 steps of DistributedDataParallel on this rank's share of each batch: losses (the batch's mean,
    all-reduced) and the final parameters. The same function runs on thread ranks in the test."""
    X, Y = ddp_data(seed)
    model = ddp_model(seed + group.rank, group.device)  # other weights per rank: the broadcast must fix them
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.0005)  # several buckets
    opt = ddp_optimizer(ddp.parameters())
    n = DDP_BATCH // group.world_size
    lo, hi = group.rank * n, (group.rank + 1) * n
    losses = []
    for k in range(DDP_STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(ddp(wgpar.tensor(X[k, lo:hi], device=group.device)), Y[k, lo:hi])
        loss.backward()
        opt.step()
        losses.append(group.all_reduce(loss.detach().reshape(1), "mean", label="loss").numpy()[0])
    out = {f"param.{k}": v.numpy() for k, v in ddp.module.state_dict().items()}
    out["losses"] = np.array(losses, np.float32)
    return out


def train_strategies(group, seed: int) -> dict[str, np.ndarray]:
    """Tensor parallelism (an MLP split over every rank, 3 SGD steps), a pipeline (one stage per
    rank, 1F1B, 3 micro-batches, 3 SGD steps) and FSDP (3 AdamW steps), written against the
    ProcessGroup only: the test runs this on thread ranks too and wants the same bits."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    with wgpar.rng_stream(seed):  # this thread's own generator (thread ranks build at once)
        dense = MLP(7, 13, device=group.device)
    tp = ParallelMLP.from_dense(dense, group)
    opt = optim.SGD(tp.parameters(), lr=0.1)
    X, W = rng.standard_normal((3, 5, 7)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
    for k in range(3):
        opt.zero_grad()
        loss = (tp(wgpar.tensor(X[k], device=group.device)) * wgpar.tensor(W, device=group.device)).sum()
        loss.backward()
        opt.step()
        out[f"tp.loss{k}"] = loss.numpy()
    out.update({f"tp.{k}": v.numpy() for k, v in tp.state_dict().items()})

    widths = (5, 16, 12, 9, 4)
    with wgpar.rng_stream(seed + 1):
        blocks = [m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b, device=group.device), nn.Tanh())]
    part = split_module(blocks[:-1], group.world_size)[group.rank]
    stage = PipelineStage(part, group.rank, group.world_size, group.device)
    pipe = PipelineSchedule(stage, group, 3, "1f1b", F.cross_entropy)
    opt = optim.SGD(list(stage.parameters()), lr=0.1)
    X, Y = rng.standard_normal((10, 5)).astype(np.float32), rng.integers(0, 4, 10).astype(np.int32)
    last = group.rank == group.world_size - 1
    for k in range(3):
        opt.zero_grad()
        loss = pipe.step(X if group.rank == 0 else None, Y if last else None)
        opt.step()
        if last:
            out[f"pipe.loss{k}"] = loss.numpy()
    out.update({f"pipe.{i}": p.numpy() for i, p in enumerate(stage.parameters())})

    # FSDP: every Linear a unit (sharded even when tiny), the root too; 3 AdamW steps on this rank's rows.
    with wgpar.rng_stream(seed + 2):
        model = nn.Sequential(nn.Linear(6, 11, device=group.device), nn.GELU(), nn.Linear(11, 5, device=group.device))
    for unit in (model[0], model[2]):
        fully_shard(unit, group, persist_threshold=0)
    fully_shard(model, group, persist_threshold=0)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    X = rng.standard_normal((3, 4 * group.world_size, 6)).astype(np.float32)
    Y = rng.integers(0, 5, (3, 4 * group.world_size))
    for k in range(3):
        opt.zero_grad()
        rows = slice(4 * group.rank, 4 * group.rank + 4)
        loss = F.cross_entropy(model(wgpar.tensor(X[k, rows], device=group.device)), Y[k, rows].astype(np.int32))
        loss.backward()
        opt.step()
        out[f"fsdp.loss{k}"] = loss.numpy()
    out.update({f"fsdp.{i}": p.numpy() for i, p in enumerate(model.parameters())})  # this rank's shards
    return out


def check_backend_basics(group, seed):
    """The MPI group's view: a process per rank, its device, traffic counts, tag range, reset."""
    assert group.backend == "mpi" and os.getpid() not in (None, 0)
    n, w = 1000, group.world_size
    group.reset_traffic()
    group.all_reduce(wgpar.ones(n, device=group.device))
    assert group.traffic() == {"d2h_bytes": 4 * n, "h2d_bytes": 4 * n, "collectives": 1}, group.traffic()
    group.all_gather_into(wgpar.empty(n * w, device=group.device), wgpar.ones(n, device=group.device))
    assert group.traffic() == {"d2h_bytes": 8 * n, "h2d_bytes": 4 * n + 4 * n * w, "collectives": 2}
    try:
        group.send(wgpar.ones(1, device=group.device), (group.rank + 1) % w, tag=-1)
    except ValueError as exc:
        assert "MPI tags run from 0" in str(exc), str(exc)
    else:
        raise AssertionError("a negative tag did not raise")
    group.reset()  # a healthy group: nothing to forget
    pids = group.gather_objects(os.getpid())
    assert len(set(pids)) == w, pids
    group.barrier()


def check_large_pipelined(group, seed):
    """Tensors of many chunks (the tests run with 64 KiB chunks): all-reduce, all-gather, broadcast and
    send/recv of about 1.2 MiB each, float16 too."""
    world, r = group.world_size, group.rank
    n = 300_001
    data = [np.random.default_rng([seed, k]).uniform(-1, 1, n).astype(np.float32) for k in range(world)]
    t = wgpar.tensor(data[r], device=group.device)
    group.all_reduce(t, "sum")
    np.testing.assert_allclose(t.numpy(), np.sum(np.stack(data).astype(np.float64), axis=0), rtol=1e-5, atol=1e-5)
    b = wgpar.tensor(data[r], device=group.device)
    group.broadcast(b, world - 1)
    np.testing.assert_array_equal(b.numpy(), data[world - 1])
    out = wgpar.empty(world * n, device=group.device)
    group.all_gather_into(out, wgpar.tensor(data[r], device=group.device))
    np.testing.assert_array_equal(out.numpy(), np.concatenate(data))
    if group.device.has_f16:
        h = [d.astype(np.float16) for d in data]
        t = wgpar.tensor(h[r], device=group.device, dtype="float16")
        group.all_reduce(t, "mean")
        want = np.mean(np.stack(h).astype(np.float64), axis=0)
        np.testing.assert_allclose(t.numpy().astype(np.float64), want, rtol=2e-3, atol=2e-3)
    group.send(wgpar.tensor(data[r], device=group.device), (r + 1) % world)
    got = group.recv(None, (r - 1) % world)
    np.testing.assert_array_equal(got.numpy(), data[(r - 1) % world])


def check_host_all_reduce(group, seed):
    """The shared-memory (and leaders') reduction of host arrays: bit for bit the rank-order reduction, at
    sizes around the chunks and the ranks' slices, float32, int32 and float16."""
    world, r = group.world_size, group.rank
    for n in conformance.EXACT_SIZES:
        for kind, dtype, op in (("f", np.float32, "sum"), ("f", np.float32, "mean"), ("f", np.float32, "max"),
                                ("i", np.int32, "sum"), ("f", np.float16, "sum"), ("f", np.float16, "mean")):
            data = [conformance._data(seed + n, k, (n,), kind).astype(dtype) for k in range(world)]
            got = group.host_all_reduce(data[r].copy(), op)
            np.testing.assert_array_equal(got, conformance._fold(data, op), err_msg=f"{op} {np.dtype(dtype)} n={n}")


def check_pipelined_steps(group, seed):
    """The one-host pipeline (reduce chunk i and copy chunk i - 1 out in one step, chunk i + 2 copied in
    while waiting at the barrier that ends it, through three sets of input slots) at awkward sizes (the
    tests run with 64 KiB chunks: 16384 elements): one element, fewer elements than ranks, one chunk and
    one more element, a chunk boundary, many chunks with a short last one (the input sets wrap around,
    slices that do not divide by the ranks); bit for bit the rank-order reduction, for all_reduce
    (tensors and host arrays) and reduce_scatter_into (each rank's range crossing chunks), float32 and
    float16 (its result slot holds float16), int32."""
    world, r = group.world_size, group.rank
    E = 16384
    for n in (1, world - 1 or 1, E - 1, E + 1, 2 * E, 5 * E - 3):
        for dtype, op in ((np.float32, "sum"), (np.float32, "mean"), (np.float16, "sum"), (np.float16, "mean"),
                          (np.int32, "max")):
            kind = "i" if dtype == np.int32 else "f"
            data = [conformance._data(seed + n, k, (n,), kind).astype(dtype) for k in range(world)]
            want = conformance._fold(data, op)
            np.testing.assert_array_equal(group.host_all_reduce(data[r].copy(), op), want,
                                          err_msg=f"host {n} {np.dtype(dtype)} {op}")
            if dtype == np.float16 and not group.device.has_f16:
                continue
            t = wgpar.tensor(data[r], device=group.device, dtype=np.dtype(dtype).name)
            group.all_reduce(t, op)
            np.testing.assert_array_equal(t.numpy(), want, err_msg=f"all_reduce {n} {np.dtype(dtype)} {op}")
        m = n + 3  # each rank's range of a reduce_scatter: chunk boundaries fall inside the ranges
        data = [conformance._data(seed + m, k, (world * m,), "f") for k in range(world)]
        out = wgpar.empty(m, device=group.device)
        group.reduce_scatter_into(out, wgpar.tensor(data[r], device=group.device), "sum")
        np.testing.assert_array_equal(out.numpy(), conformance._fold(data, "sum")[r * m:(r + 1) * m], err_msg=f"rs {m}")


def check_mailbox_and_mpi_in_order(group, seed):
    """Messages of one sender and tag arrive in order whichever way each went: inside a host, one that fits a
    free mailbox slot (64 KiB under these tests' chunks, 4 per sender) goes through shared memory, a larger
    one, or one sent while the sender's 4 slots are full, as MPI messages. Rank 0 sends rank 1 (and rank 1
    rank 0) nine messages before the receiver takes any: small and large alternating, so the slots fill
    up and later small ones fall back to MPI; every slot is free again afterwards."""
    if group.world_size < 2 or group.rank > 1:  # the same barriers as ranks 0 and 1
        group.barrier()
        group.barrier()
        return
    peer = 1 - group.rank
    sizes = [16, 40_000, 16, 16, 3, 16, 40_000, 16, 0]
    rng = np.random.default_rng(seed + group.rank)
    sent = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    works = [group.send(wgpar.tensor(x, device=group.device), peer, tag=2, async_op=True) for x in sent]
    for w in works:
        w.wait()
    group.barrier()  # every message is on its way before anyone receives
    theirs = np.random.default_rng(seed + peer)
    for n in sizes:
        want = theirs.standard_normal(n).astype(np.float32)
        got = group.recv(None, peer, tag=2).numpy()
        assert got.shape == want.shape and np.array_equal(got, want), (n, got.shape)
    group.barrier()
    if group._mail is not None and peer in group._host_members:
        assert group._mail.full(group._host_members.index(peer)) == []


def hosts_fold(parts: list[np.ndarray], op: str, hosts) -> np.ndarray:
    """What the MPI backend computes across hosts: each host's ranks in rank order, then the hosts in order
    (float16 accumulated in float32; mean divides once, at the end). With one host, or with one rank on
    every host but the first, this is the rank-order reduction of thread ranks."""
    fn = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    acc_dt = np.float32 if parts[0].dtype == np.float16 else parts[0].dtype
    partial = []
    for h in sorted(set(hosts)):
        mine = [p for p, hh in zip(parts, hosts) if hh == h]
        acc = mine[0].astype(acc_dt)
        for p in mine[1:]:
            fn(acc, p, out=acc, casting="unsafe")
        partial.append(acc)
    acc = partial[0]
    for p in partial[1:]:
        fn(acc, p, out=acc)
    if op == "mean":
        np.divide(acc, len(parts), out=acc)
    return acc.astype(parts[0].dtype)


def check_hosts_pipelined(group, seed):
    """The all-reduce across (simulated) hosts, pipelined (the leaders' step of chunk i in flight while the
    host reduces chunk i + 1 and copies chunk i - 1 out, three result slots in turn), at awkward sizes under
    the tests' 64 KiB chunks (16384 elements): one element, fewer than the ranks, a chunk and one more, many
    chunks with a short last one (the slots wrap around more than once), slices that do not divide by a
    host's ranks; sum, mean, max, float32, float16 (accumulated in float32), int32; tensors, host arrays and
    reduce_scatter_into (ranges crossing chunks); all_gather_into and broadcast (the leaders' exchange
    pipelined the same way) of several chunks. Bit for bit the host-then-leaders fold (``hosts_fold``),
    which for max and int32 is the rank-order one of thread ranks. Fresh data for every chunk, so a chunk
    read from the wrong slot shows."""
    world, r = group.world_size, group.rank
    E = 16384
    for n in (1, world - 1 or 1, E + 1, 7 * E - 5):
        for dtype, op in ((np.float32, "sum"), (np.float32, "mean"), (np.float32, "max"), (np.float16, "sum"),
                          (np.float16, "mean"), (np.int32, "sum")):
            kind = "i" if dtype == np.int32 else "f"
            data = [conformance._data(seed + n, k, (n,), kind).astype(dtype) for k in range(world)]
            want = hosts_fold(data, op, group.hosts)
            if op == "max" or dtype == np.int32:  # exact in any order: the rank-order fold too
                np.testing.assert_array_equal(want, conformance._fold(data, op))
            what = f"{n} {np.dtype(dtype)} {op} on {group.num_hosts} hosts"
            np.testing.assert_array_equal(group.host_all_reduce(data[r].copy(), op), want, err_msg=f"host {what}")
            if dtype == np.float16 and not group.device.has_f16:
                continue
            t = wgpar.tensor(data[r], device=group.device, dtype=np.dtype(dtype).name)
            group.all_reduce(t, op)
            np.testing.assert_array_equal(t.numpy(), want, err_msg=f"all_reduce {what}")
        m = n + 3  # each rank's range: chunk boundaries fall inside the ranges
        data = [conformance._data(seed + m, k, (world * m,), "f") for k in range(world)]
        out = wgpar.empty(m, device=group.device)
        group.reduce_scatter_into(out, wgpar.tensor(data[r], device=group.device), "sum")
        np.testing.assert_array_equal(out.numpy(), hosts_fold(data, "sum", group.hosts)[r * m:(r + 1) * m],
                                      err_msg=f"reduce_scatter {m}")
    for n in (1, 5, E + 1, 3 * E - 7):  # the gathers: pipelined the same way (bytes through the result slots)
        data = [conformance._data(seed + n, k, (n,), "f") for k in range(world)]
        out = wgpar.empty(world * n, device=group.device)
        group.all_gather_into(out, wgpar.tensor(data[r], device=group.device))
        np.testing.assert_array_equal(out.numpy(), np.concatenate(data), err_msg=f"all_gather {n}")
        b = wgpar.tensor(data[r], device=group.device)
        group.broadcast(b, world - 1)  # from the last host
        np.testing.assert_array_equal(b.numpy(), data[world - 1], err_msg=f"broadcast {n}")
    if group.num_hosts > 1 and group.local_rank == 0:
        assert group.inter_host_flight_seconds > 0, "the leaders' step never ran"


MPI_CHECKS = [check_backend_basics, check_large_pipelined, check_host_all_reduce, check_pipelined_steps,
              check_mailbox_and_mpi_in_order]


def conformance_program(group, seed: int) -> dict:
    done = []
    for check in conformance.ALL_CHECKS + MPI_CHECKS:
        t0 = time.perf_counter()
        check(group, seed)
        done.append(f"{check.__name__} {time.perf_counter() - t0:.2f}s")
        assert group.broken is None, group.broken
    out = train_ddp(group, seed)
    out.update(train_strategies(group, seed))
    pool = group._pool  # every leased staging and upload buffer came back (sends: once received)
    deadline = time.monotonic() + 10
    while pool.num_idle != pool.num_created and time.monotonic() < deadline:
        group.barrier()
    assert pool.num_idle == pool.num_created and pool.num_abandoned == 0, (pool.num_idle, pool.num_created)
    out["checks"] = np.array(done)
    out["host"] = np.array([group.hosts[group.rank], group.num_hosts])
    return out


def hosts_program(group, seed: int, jitter: float) -> dict:
    """``check_hosts_pipelined`` with every rank's host tasks delayed at random by up to ``jitter`` s per
    step (its own generator): ranks drift apart as far as the barriers let them, so a slot reused too
    early shows as wrong bits."""
    if jitter > 0:
        from wgpar.distributed.backends import mpi as _mpi

        real, rng = _mpi.submit_tasks, np.random.default_rng([seed, group.rank])

        def late(tasks):
            time.sleep(rng.uniform(0, jitter))
            return real(tasks)

        _mpi.submit_tasks = late
    check_hosts_pipelined(group, seed)
    return {"host": np.array([group.hosts[group.rank], group.num_hosts, group.local_size])}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write: mpiexec interleaves the ranks' output between writes
    sys.stdout.flush()


def fault_program(group, mode: str, token: str) -> None:
    # ``token`` only marks this job's processes in the process table.
    t = wgpar.ones(8, device=group.device)
    try:
        group.all_reduce(t)  # everyone is up
    except CollectiveError as exc:  # rank 1 may fail before a slow rank has left this one (a loaded machine)
        _say(f"RAISED rank {group.rank}: {type(exc).__name__}: {exc}")
        raise
    _say(f"UP {group.rank} {time.time():.3f}")
    if group.rank == 1:
        if mode == "raise":
            raise ValueError("injected failure on rank 1")
        if mode == "return":
            return None
        if mode == "sysexit":
            sys.exit(0)
        if mode in ("skip", "nosend"):
            time.sleep(600)
            return None
        if mode == "stall":  # stop inside the next all-reduce, past its header exchange (the pool never starts)
            from wgpar.distributed.backends import mpi as _mpi

            def stalled(tasks):
                time.sleep(600)

            _mpi.submit_tasks = stalled
        if mode == "stall_host":  # (one rank per host) stop at the fourth step of the next all-reduce (13 chunks)
            from wgpar.distributed.backends import mpi as _mpi

            real, calls = _mpi.submit_tasks, []

            def late(tasks):
                calls.append(len(tasks))
                if len(calls) == 4:
                    time.sleep(600)
                return real(tasks)

            _mpi.submit_tasks = late
        if mode == "stall_late":  # stop at the second step of the next all-reduce (13 chunks), past two barriers
            from wgpar.distributed.backends import mpi as _mpi

            real, calls = _mpi.submit_tasks, []

            def late(tasks):
                calls.append(len(tasks))
                if len(calls) == 4:  # chunk 1 and 2's copies in, step 0, then step 1
                    time.sleep(600)
                return real(tasks)

            _mpi.submit_tasks = late
    try:
        if mode == "nosend":  # rank 0 waits for a message rank 1 never sends
            group.recv(None, 1, tag=7)
        else:
            group.all_reduce(wgpar.ones(200_000, device=group.device) if mode in ("stall_late", "stall_host") else t)
    except CollectiveError as exc:
        _say(f"RAISED rank {group.rank}: {type(exc).__name__}: {exc}")
        raise
    return None


def p2p_program(group, mode: str, token: str) -> None:
    """Point-to-point mistakes on 2 ranks. MODE unmatched_recv: rank 0 waits for a message rank 1 never
    sends (rank 1 ends its program); unreceived_send / unreceived_large: rank 0 sends rank 1 8 floats /
    65536 floats (tag 5) that rank 1 never receives, and both end their programs."""
    t = wgpar.ones(8, device=group.device)
    group.all_reduce(t)  # everyone is up
    _say(f"UP {group.rank} {time.time():.3f}")
    try:
        if mode == "unmatched_recv" and group.rank == 0:
            group.recv(None, 1, tag=7)
        elif mode.startswith("unreceived") and group.rank == 0:
            n = 8 if mode == "unreceived_send" else 1 << 16
            group.send(wgpar.ones(n, device=group.device), 1, tag=5)
    except CollectiveError as exc:
        _say(f"RAISED rank {group.rank}: {type(exc).__name__}: {exc}")
        raise
    return None


def p2p_progress_program(group, busy: float, n: int) -> None:
    """Rank 0 sends rank 1 ``n`` floats, then keeps its communication thread busy for ``busy`` s in a wait that
    makes no MPI call (as a readback's map wait does); rank 1 prints how long its recv took. The message
    must move meanwhile: where MPI has no single-copy path it moves only while the sender calls MPI."""
    from wgpar.distributed.group import Work

    data = np.arange(n, dtype=np.float32)
    group.barrier()
    if group.rank == 0:
        group.send(wgpar.tensor(data, device=group.device), 1, tag=3)
        busy_work = Work("busy", busy + 60)
        group._progress.submit(busy_work, lambda: time.sleep(busy))
        busy_work.wait()
    else:
        t0 = time.perf_counter()
        got = group.recv(None, 0, tag=3)
        ms = (time.perf_counter() - t0) * 1e3
        if not np.array_equal(got.numpy(), data):
            raise AssertionError("rank 1 received other bytes than rank 0 sent")
        _say(f"RECEIVED in {ms:.1f} ms")
    group.barrier()


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "conformance":
        seed, path = int(sys.argv[2]), sys.argv[3]
        results = run_spmd(conformance_program, args=(seed,), backend="mpi", timeout=60)
        if results and wgpar.distributed.init_process_group().rank == 0:
            flat = {f"{r}.{k}": v for r, res in enumerate(results) for k, v in res.items()}
            np.savez(path, **flat)
    elif scenario == "hosts":
        seed, jitter = int(sys.argv[2]), float(sys.argv[3])
        results = run_spmd(hosts_program, args=(seed, jitter), backend="mpi", timeout=60)
        if wgpar.distributed.init_process_group().rank == 0:
            _say("HOSTS " + " ".join(",".join(map(str, res["host"].tolist())) for res in results))
    elif scenario == "fault":
        mode, timeout, token = sys.argv[2], float(sys.argv[3]), sys.argv[4]
        run_spmd(fault_program, args=(mode, token), backend="mpi", timeout=timeout)
    elif scenario == "p2p":
        mode, timeout, token = sys.argv[2], float(sys.argv[3]), sys.argv[4]
        run_spmd(p2p_program, args=(mode, token), backend="mpi", timeout=timeout)
    elif scenario == "p2p_progress":
        run_spmd(p2p_progress_program, args=(float(sys.argv[2]), int(sys.argv[3])), backend="mpi", timeout=60)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
