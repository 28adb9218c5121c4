"""Host transfer phases on one device: where a readback or an upload spends its time.

Times, for each size: the GPU copy into a MAP_READ staging buffer plus the map (wait only),
reading the mapped bytes into host memory, and queue.write_buffer of the same bytes followed
by a synchronize. These bound what any host-staged collective can reach.

    python benchmarks/bench_transfer.py --sizes-mb 16 256 --repeat 3
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
from wgpar.runtime.transfer import StagingBuffer, wait_promise  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[4, 16])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    dev = wgpar.device(0)
    print(f"device: {_report.device_line(dev)}")
    print("MiB | copy+map ms | read_mapped ms | write_buffer+sync ms | GB/s down | GB/s up")
    for mb in args.sizes_mb:
        n = int(mb * 2**20) // 4
        t = wgpar.tensor(np.ones(n, np.float32), device=dev)
        st = StagingBuffer(dev, t.nbytes)
        host = np.ones(n, np.float32)
        tm, tr, tw = [], [], []
        for _ in range(args.repeat + 1):
            dev.synchronize()
            t0 = time.perf_counter()
            dev.copy(t._storage.buffer, 0, st.buffer, 0, t.nbytes)
            dev.flush()
            promise = st.buffer.map_async(1, 0, st.capacity)
            wait_promise(promise, 600, "map")
            t1 = time.perf_counter()
            data = st.buffer.read_mapped(0, t.nbytes, copy=True)
            t2 = time.perf_counter()
            st.buffer.unmap()
            dev.upload(t._storage.buffer, 0, memoryview(host).cast("B"))
            dev.synchronize()
            t3 = time.perf_counter()
            tm.append(t1 - t0)
            tr.append(t2 - t1)
            tw.append(t3 - t2)
            del data
        m, r, w = (statistics.median(x[1:]) for x in (tm, tr, tw))
        gb = n * 4 / 1e9
        print(f"{mb:g} | {m * 1e3:.2f} | {r * 1e3:.2f} | {w * 1e3:.2f} | {gb / (m + r):.2f} | {gb / w:.2f}", flush=True)


if __name__ == "__main__":
    main()
