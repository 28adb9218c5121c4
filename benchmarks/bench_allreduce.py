"""All-reduce time and bandwidth across devices, next to a copy-only floor measured in the same run.

The floor moves the same bytes the same way on every rank at once (device -> mapped staging buffer
-> host copy into a mapped upload buffer -> device) with no exchange and no reduction; the
all-reduce adds the two rendezvous and the host reduction (each rank reduces its slice, reading every
rank's mapped readback in place and writing every rank's upload buffer). Target: all-reduce at most 1.5x the floor.
Bandwidth is bytes reduced per second (the tensor's size divided by the time).

    python benchmarks/bench_allreduce.py --devices 2 --sizes-mb 1 4 16 64 256 1024 --repeat 3

With ``--backend mpi`` (under mpiexec, one process per device) it times the MPI backend's all-reduce
across the processes, next to the threaded backend on the same devices (run by rank 0's process while
the others wait), MPI's own Allreduce of host arrays of the same size over the same processes, and,
when the processes span several hosts, MPI's Allreduce among the host leaders next to the time the
backend's leaders spent in their MPI step. Targets: processes within 1.3x of threads inside one host;
the leaders' step within 1.2x of MPI's Allreduce among the leaders.

    mpiexec -n 2 python benchmarks/bench_allreduce.py --backend mpi --sizes-mb 1 4 16 64 256 1024
    WGPAR_MPI_RANKS_PER_HOST=2 mpiexec -n 4 python benchmarks/bench_allreduce.py --backend mpi  # two "hosts"
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar.distributed import MultiAdapterContext  # noqa: E402
from wgpar.distributed.backends.hostreduce import copy_into  # noqa: E402
from wgpar.runtime.config import CONFIG  # noqa: E402
from wgpar.runtime.transfer import StagingBuffer, UploadBuffer  # noqa: E402


def timed(ctx: MultiAdapterContext, fn, repeat: int) -> float:
    """Median seconds of ``fn(rank)`` run on every rank at once, the GPUs drained at the end."""
    def work(r):
        fn(r)
        ctx.devices[r].synchronize()

    ctx.run(work)  # warm-up: staging buffers and pipelines
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ctx.run(work)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(ctx: MultiAdapterContext, mb: float, repeat: int) -> list[str]:
    """One table row: all-reduce and floor of ``mb`` MiB of float32 per rank."""
    n = int(mb * 2**20) // 4
    tensors = [wgpar.tensor(np.full(n, r + 1, np.float32), device=d) for r, d in enumerate(ctx.devices)]
    comms = [ctx.comm(r) for r in range(ctx.world_size)]
    nbytes = n * 4
    t_ar = timed(ctx, lambda r: comms[r].all_reduce(tensors[r], "sum"), repeat)
    downs = [StagingBuffer(d, nbytes, "floor") for d in ctx.devices]
    ups = [UploadBuffer(d, nbytes, "floor") for d in ctx.devices]

    def floor(r: int) -> None:  # the same copies, without the exchange and the reduction
        buf = tensors[r]._storage.buffer
        downs[r].start(buf, 0, nbytes)
        src = np.frombuffer(downs[r].view(600), np.float32)
        copy_into(np.frombuffer(ups[r].view(600), np.float32), src)
        del src
        downs[r].release()
        ups[r].commit(buf, 0, nbytes)

    t_floor = timed(ctx, floor, repeat)
    row = [f"{nbytes / 2**20:g}", f"{t_ar * 1e3:.2f}", f"{nbytes / t_ar / 1e9:.2f}",
           f"{t_floor * 1e3:.2f}", f"{nbytes / t_floor / 1e9:.2f}", f"{t_ar / t_floor:.2f}"]
    print(" | ".join(row), flush=True)
    return row


def timed_mpi(group, fn, repeat: int, gpu: bool = True) -> float:
    """Median seconds of ``fn()`` run by every process at once (the GPU drained when ``gpu``), as rank 0
    sees it."""
    from mpi4py import MPI

    def run() -> None:
        fn()
        if gpu:
            group.device.synchronize()

    run()  # warm-up
    times = []
    for _ in range(repeat):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        run()
        MPI.COMM_WORLD.Barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_mpi(group, mb: float, repeat: int) -> list[str]:
    """One row: the MPI backend's all-reduce, the threaded backend's on the same devices (rank 0's
    process), and MPI's own Allreduce of host arrays; across hosts, also the leaders' MPI step."""
    from mpi4py import MPI

    n = int(mb * 2**20) // 4
    nbytes = n * 4
    world = group.world_size
    t = wgpar.tensor(np.full(n, group.rank + 1, np.float32), device=group.device)
    t_proc = timed_mpi(group, lambda: group.all_reduce(t, "sum"), repeat)
    host = np.full(n, 1, np.float32)
    t_mpi = timed_mpi(group, lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, host, MPI.SUM), repeat, gpu=False)
    row = [f"{nbytes / 2**20:g}", f"{t_proc * 1e3:.2f}", f"{nbytes / t_proc / 1e9:.2f}"]
    t_thr = float("nan")
    if group.rank == 0:  # the threaded backend on the same devices, in this process; the others wait
        ctx = MultiAdapterContext(world, timeout=600)
        ts = [wgpar.tensor(np.full(n, r + 1, np.float32), device=d) for r, d in enumerate(ctx.devices)]
        t_thr = timed(ctx, lambda r: ctx.comm(r).all_reduce(ts[r], "sum"), repeat)
        del ts
        ctx.close()
        wgpar.empty_cache()
    group.barrier()  # polls with sleeps: the waiting processes leave the cores to rank 0's threads
    row += [f"{t_thr * 1e3:.2f}", f"{nbytes / t_thr / 1e9:.2f}", f"{t_proc / t_thr:.2f}",
            f"{t_mpi * 1e3:.2f}", f"{nbytes / t_mpi / 1e9:.2f}"]
    if group.num_hosts > 1:  # the leaders' step inside the all-reduce vs MPI's Allreduce among the leaders
        leaders = group.leaders
        t_lead = 0.0
        if leaders != MPI.COMM_NULL:
            leaders.Allreduce(MPI.IN_PLACE, host, MPI.SUM)
            leaders.Barrier()
            t0 = time.perf_counter()
            for _ in range(repeat):
                leaders.Allreduce(MPI.IN_PLACE, host, MPI.SUM)
            t_lead = (time.perf_counter() - t0) / repeat
        group.inter_host_seconds = 0.0
        for _ in range(repeat):
            group.all_reduce(t, "sum")
        group.device.synchronize()
        # The leader that arrives last at each step waits least for the others: its time is the transfer's.
        step = leaders.allreduce(group.inter_host_seconds, op=MPI.MIN) / repeat if leaders != MPI.COMM_NULL else 0
        step = MPI.COMM_WORLD.bcast(step, root=0)
        t_lead = MPI.COMM_WORLD.allreduce(t_lead, op=MPI.MAX)
        row += [f"{t_lead * 1e3:.2f}", f"{step * 1e3:.2f}", f"{step / t_lead:.2f}"]
    if group.rank == 0:
        print(" | ".join(row), flush=True)
    return row


def main_mpi(args) -> None:
    from wgpar.distributed import init_process_group

    group = init_process_group("mpi", timeout=600)
    devs = group.gather_objects(_report.device_line(group.device))
    rows = []
    for mb in args.sizes_mb:
        rows.append(measure_mpi(group, mb, args.repeat))
        wgpar.empty_cache()
    if group.rank != 0:
        return
    header = ["MiB", "processes ms", "processes GB/s", "threads ms", "threads GB/s",
              "processes / threads (target <= 1.3)", "MPI Allreduce (host) ms", "MPI Allreduce GB/s"]
    hosts = ""
    if group.num_hosts > 1:
        header += ["MPI Allreduce among leaders ms", "leaders' step in the all-reduce ms", "ratio (target <= 1.2)"]
        hosts = f" on {group.num_hosts} hosts" + (" (simulated: WGPAR_MPI_RANKS_PER_HOST)" if CONFIG.mpi_ranks_per_host
                                                  else "")
    table = _report.markdown_table(header, rows)
    name = group.device.adapter_name
    cmd = _report.mpi_command_line(group.world_size)
    body = (f"### All-reduce on {group.world_size} MPI processes{hosts}: {name}\n\n"
            f"Devices: {', '.join(devs)}. Date: {_report.today()}. Command: `{cmd}`\n\n"
            f"Chunks of {group.chunk // 2**20} MiB. The threaded backend ran on the same devices in rank 0's "
            f"process; MPI Allreduce sums host arrays of the same size (no GPU copies).\n\n{table}\n")
    print(body)
    _report.finish(args, f"allreduce_mpi:{_report.slug(name)}:{group.num_hosts}-host", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--backend", choices=("threads", "mpi"), default="threads")
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    if args.backend == "mpi":
        main_mpi(args)
        return
    ctx = MultiAdapterContext(args.devices, timeout=600)
    devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    print(f"devices: {devs}")
    rows = []
    for mb in args.sizes_mb:
        rows.append(measure(ctx, mb, args.repeat))
        wgpar.empty_cache()  # the last size's buffers go back before the next, larger one
    table = _report.markdown_table(
        ["MiB", "all-reduce ms", "all-reduce GB/s", "floor ms", "floor GB/s", "ratio (target <= 1.5)"], rows)
    body = (f"### All-reduce on {ctx.world_size} devices: {ctx.devices[0].adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n{table}\n")
    print(body)
    _report.finish(args, f"allreduce:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
