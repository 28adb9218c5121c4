"""The MPI backend's shared-memory reduction against a memcpy of the same bytes, in one run.

Every process all-reduces a host array through the backend's one-host path (``host_all_reduce``:
copy into shared memory, reduce, copy out, no device copies), then every process copies the same
bytes between two host arrays on its host pool at once (the same workers: the issue's reference).
The ratio reduction / memcpy (the median of the interleaved pairs' ratios) is the figure to compare
across machines (target: at least 0.7).

A third reference runs the reduction's own passes on private arrays, with no shared memory and no
barriers: each process copies the others' shares (n (L - 1) / L), reduces its slice (L parts of n / L,
into a result block and its target) and copies the others' results (n (L - 1) / L), the same blocks on
the same pool. passes / memcpy is the ceiling of this design on the machine (about 0.5 for 2
processes: twice a memcpy's passes over memory); reduction / passes is what shared memory and the
barriers cost on top. With ``--profile`` it also prints the phases of one reduction (rank 0's view).

    mpiexec -n 2 python benchmarks/bench_shm_reduce.py --sizes-mb 16 64 256 1024
    mpiexec -n 2 python benchmarks/bench_shm_reduce.py --dtype float16 --profile --no-write
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar.distributed import split_sizes  # noqa: E402
from wgpar.distributed.backends.hostreduce import bundle, copy_into, copy_tasks, reduce_tasks, run_tasks  # noqa: E402
from wgpar.distributed.backends.mpi import _BLOCK  # noqa: E402
from wgpar.runtime.transfer import host_threads  # noqa: E402

PHASES = ("header exchange", "copy into shared memory", "host barrier", "host step", "copy out of shared memory")


def timed_pair(fns, repeat: int) -> list[list[float]]:
    """Seconds of each of ``fns`` run by every process at once, as rank 0 sees it, ``repeat`` times in turn
    (interleaved, so that a busy moment of a shared machine hits both alike; one warm-up call each)."""
    from mpi4py import MPI

    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, times):
            MPI.COMM_WORLD.Barrier()
            t0 = time.perf_counter()
            fn()
            MPI.COMM_WORLD.Barrier()
            out.append(time.perf_counter() - t0)
    return times


def phases(fn, repeat: int) -> dict[str, float]:
    """Milliseconds per call of each profiled phase of ``fn()``."""
    out: dict[str, float] = {}
    with wgpar.profiler.profile() as prof:
        for _ in range(repeat):
            fn()
    for e in prof.ranges():
        if e.name in PHASES:
            out[e.name] = out.get(e.name, 0.0) + e.dur / 1e6 / repeat
    return out


def private_passes(data: np.ndarray, ranks: int, me: int):
    """The reduction's passes over ``data`` (this process is rank ``me`` of ``ranks`` on the host) on
    private arrays, no shared memory and no barriers: a function that runs them on the host pool."""
    n, W = len(data), host_threads()
    bounds = np.cumsum([0, *split_sizes(n, ranks)])
    s0, s1 = int(bounds[me]), int(bounds[me + 1])
    acc = np.float32 if data.dtype == np.float16 else data.dtype
    slot, others, target = np.zeros_like(data), [np.ones(s1 - s0, data.dtype) for _ in range(ranks - 1)], \
        np.zeros_like(data)
    result = np.zeros(n, acc if acc == data.dtype else data.dtype)
    out = result[s0:s1]
    parts = [data[s0:s1], *others]
    rest = ((0, s0), (s1, n))

    def run() -> None:
        run_tasks(bundle([t for a, b in rest for t in copy_tasks(slot[a:b], data[a:b], workers=W)], W))
        if acc == data.dtype:  # as the backend: accumulate in the result slot, then the target
            red = reduce_tasks(parts, [target[s0:s1]], "sum", block=_BLOCK, acc=out, workers=W)
        else:
            red = reduce_tasks(parts, [out, target[s0:s1]], "sum", block=_BLOCK, workers=W)
        run_tasks(bundle(red, W))
        run_tasks(bundle([t for a, b in rest for t in copy_tasks(target[a:b], result[a:b], workers=W)], W))

    return run


def measure(group, mb: float, dtype: str, repeat: int, profile: bool) -> tuple[list[str], dict[str, float]]:
    """One table row for ``mb`` MiB, and the reduction's phases (when ``profile``)."""
    nbytes = int(mb * 2**20) // 4 * 4
    data = np.ones(nbytes // np.dtype(dtype).itemsize, dtype)
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    passes = private_passes(data, group.local_size, group.local_rank)
    reds, copies, alone = timed_pair([lambda: group.host_all_reduce(data, "sum"),
                                      lambda: copy_into(dst, src, block=4 << 20), passes], repeat)
    t_red, t_copy, t_alone = statistics.median(reds), statistics.median(copies), statistics.median(alone)

    def ratio(xs, ys) -> float:  # the median of the interleaved runs' ratios
        return statistics.median(y / x for x, y in zip(xs, ys))

    row = [f"{mb:g}", f"{nbytes / t_red / 1e9:.2f}", f"{nbytes / t_copy / 1e9:.2f}", f"{nbytes / t_alone / 1e9:.2f}",
           f"{ratio(reds, copies):.2f}", f"{ratio(alone, copies):.2f}", f"{ratio(reds, alone):.2f}"]
    return row, phases(lambda: group.host_all_reduce(data, "sum"), repeat) if profile else {}


def main() -> None:
    from wgpar.distributed import init_process_group

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[16, 64, 256])
    ap.add_argument("--dtype", choices=("float32", "float16", "int32"), default="float32")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--profile", action="store_true", help="print the phases of one reduction")
    _report.add_report_flags(ap)
    args = ap.parse_args()
    group = init_process_group("mpi", timeout=600)
    rows = []
    for mb in args.sizes_mb:
        row, prof = measure(group, mb, args.dtype, args.repeat, args.profile)
        rows.append(row)
        if group.rank == 0:
            print(" | ".join(row), flush=True)
            if prof:
                print("    " + ", ".join(f"{k}: {v:.2f} ms" for k, v in prof.items()), flush=True)
    if group.rank != 0:
        return
    table = _report.markdown_table(["MiB", "reduction GB/s", "memcpy GB/s", "passes alone GB/s",
                                    "reduction / memcpy (target >= 0.7)", "passes / memcpy (ceiling)",
                                    "reduction / passes"], rows)
    name = group.device.adapter_name
    body = (f"### Shared-memory reduction vs memcpy, {group.world_size} MPI processes, {args.dtype}: {name}\n\n"
            f"{os.cpu_count()} CPUs, {host_threads()} host workers per process, chunks of "
            f"{group.chunk // 2**20} MiB. Date: {_report.today()}. Command: "
            f"`{_report.mpi_command_line(group.world_size)}`\n\nThe reduction is `host_all_reduce` (no device "
            f"copies); memcpy: every process copies the same bytes on its host pool at once; passes alone: the "
            f"reduction's copies and sums on private arrays, no shared memory or barriers. Ratios are medians of "
            f"the interleaved runs' ratios.\n\n{table}\n")
    print(body)
    _report.finish(args, f"shm_reduce:{_report.slug(name)}:{args.dtype}:{group.world_size}", body)


if __name__ == "__main__":
    main()
