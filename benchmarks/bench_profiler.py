"""What the profiler costs per dispatch: a chain of small elementwise ops recorded with no profile, with
timestamp features left off the device (as before wgpar requested them), and inside a profile.

"record" is the host time to issue the chain (submits at the threshold included, no waiting);
"total" adds waiting for the GPU. Inside a profile each chain is its own profile, whose stop (the
timestamp readback) is reported apart. The settings take turns; the best of each is reported (the
median of the record times beside it), since neighbours on a shared host only ever add time.

    python benchmarks/bench_profiler.py --ops 1000 --repeat 7
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


def chain(dev, x, ops: int) -> tuple[float, float]:
    """(record, total) seconds for ``ops`` dispatches of ``x + 1``."""
    t0 = time.perf_counter()
    for _ in range(ops):
        x = x + 1.0
    t1 = time.perf_counter()
    dev.synchronize()
    return t1 - t0, time.perf_counter() - t0


def run_once(dev, x, ops: int, profiled: bool) -> tuple[float, float, float]:
    """(record, total, stop) seconds of one chain; stop is 0 without a profile."""
    if not profiled:
        return (*chain(dev, x, ops), 0.0)
    prof = wgpar.profiler.profile()
    prof.start()
    r, t = chain(dev, x, ops)
    s = time.perf_counter()
    prof.stop()
    stop = time.perf_counter() - s
    assert len(prof.kernels()) == ops and all(k.gpu_dur for k in prof.kernels())
    return r, t, stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=1000, help="dispatches per chain")
    ap.add_argument("--repeat", type=int, default=7, help="timed chains per setting (median reported)")
    args = ap.parse_args()
    dev = wgpar.device(0)
    print(f"device: {_report.device_line(dev)}; {args.ops} dispatches of x + 1 on 1024 floats, "
          f"best of {args.repeat}")
    _device = sys.modules["wgpar.runtime.device"]  # the module: wgpar.runtime.device is the function
    wanted = _device._WANTED_FEATURES
    _device._WANTED_FEATURES = tuple(f for f in wanted if not f.startswith("timestamp"))
    try:
        bare = _device.Device(dev._dev.adapter, index=dev.index)
    finally:
        _device._WANTED_FEATURES = wanted
    settings = [("off, device without timestamp features", bare, False),
                ("off (timestamp features requested)", dev, False), ("profiling", dev, True)]
    inputs = {id(d): wgpar.tensor(np.ones(1024, np.float32), device=d) for d in (bare, dev)}
    for _, d, p in settings:  # pipelines built, caches warm
        run_once(d, inputs[id(d)], args.ops, p)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in settings}
    for _ in range(args.repeat):  # interleaved, so a noisy neighbour hits every setting alike
        for name, d, p in settings:
            times[name].append(run_once(d, inputs[id(d)], args.ops, p))
    base = min(t[0] for t in times[settings[1][0]]), min(t[1] for t in times[settings[1][0]])
    for name, _, p in settings:
        rec, tot = min(t[0] for t in times[name]), min(t[1] for t in times[name])
        med = statistics.median(t[0] for t in times[name])
        extra = f", stop {statistics.median(t[2] for t in times[name]) * 1e3:.1f} ms" if p else ""
        print(f"{name:<40} record {rec / args.ops * 1e6:6.2f} us/dispatch ({(rec - base[0]) / args.ops * 1e6:+.2f}; "
              f"median {med / args.ops * 1e6:.2f}), total {tot / args.ops * 1e6:6.2f} us/dispatch "
              f"({(tot - base[1]) / args.ops * 1e6:+.2f}){extra}")


if __name__ == "__main__":
    main()
