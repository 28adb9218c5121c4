"""The MPI backend's shared-memory reduction against a memcpy of the same bytes, in one run.

Every process all-reduces a host array through the backend's one-host path (``host_all_reduce``:
copy into shared memory, reduce, copy out, no device copies), then every process copies the same
bytes between two host arrays on its host pool at once (the same workers: the issue's reference).
The ratio reduction / memcpy (the median of the interleaved pairs' ratios) is the figure to compare
across machines (target: at least 0.7).
With ``--profile`` it also prints the phases of one reduction (rank 0's view).

    mpiexec -n 2 python benchmarks/bench_shm_reduce.py --sizes-mb 16 64 256
    mpiexec -n 2 python benchmarks/bench_shm_reduce.py --dtype float16 --profile
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
from wgpar.distributed.backends.hostreduce import copy_into  # noqa: E402
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


def measure(group, mb: float, dtype: str, repeat: int, profile: bool) -> tuple[list[str], dict[str, float]]:
    """One table row for ``mb`` MiB, and the reduction's phases (when ``profile``)."""
    nbytes = int(mb * 2**20) // 4 * 4
    data = np.ones(nbytes // np.dtype(dtype).itemsize, dtype)
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    reds, copies = timed_pair([lambda: group.host_all_reduce(data, "sum"),
                               lambda: copy_into(dst, src, block=4 << 20)], repeat)
    t_red, t_copy = statistics.median(reds), statistics.median(copies)
    ratio = statistics.median(c / r for r, c in zip(reds, copies))  # of each interleaved pair
    row = [f"{mb:g}", f"{t_red * 1e3:.2f}", f"{nbytes / t_red / 1e9:.2f}", f"{t_copy * 1e3:.2f}",
           f"{nbytes / t_copy / 1e9:.2f}", f"{ratio:.2f}"]
    return row, phases(lambda: group.host_all_reduce(data, "sum"), repeat) if profile else {}


def main() -> None:
    from wgpar.distributed import init_process_group

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[16, 64, 256])
    ap.add_argument("--dtype", choices=("float32", "float16", "int32"), default="float32")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--profile", action="store_true", help="print the phases of one reduction")
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
    if group.rank == 0:
        table = _report.markdown_table(["MiB", "reduction ms", "reduction GB/s", "memcpy ms", "memcpy GB/s",
                                        "reduction / memcpy (target >= 0.7)"], rows)
        print(f"\n{group.world_size} processes, {host_threads()} host workers each, {args.dtype}, chunks of "
              f"{group.chunk // 2**20} MiB. Command: `{_report.mpi_command_line(group.world_size)}`\n\n{table}")


if __name__ == "__main__":
    main()
