"""All-reduce time and bandwidth across devices, next to a copy-only floor measured in the same run.

The floor moves the same bytes the same way on every rank at once (device -> mapped staging buffer
-> host copy into a mapped upload buffer -> device) with no exchange and no reduction; the
all-reduce adds the two rendezvous and the host reduction (each rank reduces its slice, reading every
rank's mapped readback in place and writing every rank's upload buffer). Target: all-reduce at most 1.5x the floor.
Bandwidth is bytes reduced per second (the tensor's size divided by the time).

    python benchmarks/bench_allreduce.py --devices 2 --sizes-mb 1 4 16 64 256 1024 --repeat 3
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()
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
    if not args.no_write:
        _report.write_section(f"allreduce:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
