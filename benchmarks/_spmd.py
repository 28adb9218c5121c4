"""Shared by the benchmarks with ``--backend mpi`` (bench_data_parallel, bench_fsdp, bench_pipeline).

Under mpiexec every process is one rank on its own device (``init_mpi``) and runs the strategy as a
per-rank program; ``on_rank0`` then measures the same on thread ranks over the same devices in rank 0's
process while the other processes wait, so one command gives processes next to threads, and rank 0
writes the report. ``every_rank`` runs a per-rank program and collects every rank's result on either
backend, so a program written against one rank's ProcessGroup is timed the same way on both.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import wgpar
from benchmarks import _report
from wgpar.distributed import MultiAdapterContext, ProcessGroup, init_process_group
from wgpar.nn import functional as F

# Seconds any collective may wait: the processes wait in one while rank 0 measures the thread ranks, which
# takes minutes at the full sizes.
TIMEOUT = 1800


def add_backend_flag(ap) -> None:
    """``--backend threads|mpi``, the same on every script that has it."""
    ap.add_argument("--backend", choices=("threads", "mpi"), default="threads",
                    help="mpi: under mpiexec, one process per device, next to thread ranks on the same devices")


def init_mpi() -> ProcessGroup:
    """This process's rank of the MPI job (its own device: local rank k uses device k)."""
    return init_process_group("mpi", timeout=TIMEOUT)


def every_rank(fn: Callable[[ProcessGroup], Any], ranks: MultiAdapterContext | ProcessGroup) -> list:
    """``fn(group)`` on every rank; every rank's result in rank order. ``ranks``: a MultiAdapterContext (thread
    ranks, run from here) or this process's MPI group (every process calls this; results travel pickled, so
    return numbers and NumPy arrays)."""
    if isinstance(ranks, MultiAdapterContext):
        return ranks.run(lambda r: fn(ranks.comm(r)))
    return ranks.gather_objects(fn(ranks), label="benchmark results")


def timed(group: ProcessGroup, step: Callable[[], Any], steps: int, warmup: int = 1,
          start: Callable[[], Any] | None = None) -> float:
    """This rank's seconds per ``step()``: ``warmup`` steps and its device drained, then, from a barrier of
    every rank, ``steps`` steps until its device is drained again. The step time is the slowest rank's.
    ``start()`` runs right after the barrier, before the clock starts (reset traffic counts there)."""
    for _ in range(warmup):
        step()
    group.device.synchronize()
    group.barrier(label="timing")
    if start is not None:
        start()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    group.device.synchronize()
    return (time.perf_counter() - t0) / steps


def ddp_step(group: ProcessGroup, ddp, opt, x, y, share: float) -> Callable[[], Any]:
    """One training step of DistributedDataParallel (``op="sum"``) on this rank's rows ``x``, ``y`` (``share``
    of the batch), as DataParallel.train_step runs it on each rank: the loss weighted by the share, the
    batch's mean loss all-reduced from right after the forward, backward, the optimizer step. The step
    returns the mean loss (a tensor of one element, the same on every rank)."""
    def step():
        opt.zero_grad()
        loss = F.cross_entropy(ddp(wgpar.tensor(x, device=group.device)), y) * share
        mean = group.all_reduce(loss.detach().reshape(1), "sum", async_op=True, label="loss")
        loss.backward()
        opt.step()
        return mean.wait()
    return step


def on_rank0(group: ProcessGroup, fn: Callable[[], Any]) -> Any:
    """``fn()`` in rank 0's process (the thread ranks' measurements, on the same devices: rank 0's is one of
    them) while the other processes wait; its result on rank 0, None elsewhere."""
    gc.collect()
    wgpar.empty_cache()  # what this process's own runs left cached
    out = fn() if group.rank == 0 else None
    wgpar.empty_cache()
    group.barrier(label="thread ranks measured")  # polls with sleeps: the waiting processes leave rank 0 the cores
    return out


def provenance(group: ProcessGroup) -> str:
    """"Devices: ... Date: ... Command: `mpiexec -n N python ...`" for a report (every process calls it)."""
    devs = group.gather_objects(_report.device_line(group.device), label="devices")
    return (f"Devices: {', '.join(devs)}. Date: {_report.today()}. "
            f"Command: `{_report.mpi_command_line(group.world_size)}`")


def same_bits(a, b) -> str:
    """"same bits", or how far apart two runs' losses are."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    if np.array_equal(a, b):
        return "same bits"
    return f"differ by up to {np.max(np.abs(a.astype(np.float64) - b)):.3g}"
