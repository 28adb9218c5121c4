"""What the memory timeline costs per allocation: a malloc + free pair of one cached block (no GPU work,
the allocator's path alone) and a tensor made and dropped (``Tensor.empty``: Storage, Block and the
allocator), with no history recorded and while ``wgpar.memory.record_history`` records.

The settings take turns; the best of each is reported (neighbours on a shared host only add time).

    python benchmarks/bench_memory_history.py --n 20000 --repeat 7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wgpar  # noqa: E402
from wgpar import memory  # noqa: E402


def pairs(alloc, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        alloc.free(alloc.malloc(1024))
    return (time.perf_counter() - t0) / n


def tensors(dev, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        wgpar.Tensor.empty((256,), wgpar.float32, dev)
    return (time.perf_counter() - t0) / n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="allocations per measurement")
    ap.add_argument("--repeat", type=int, default=7, help="turns per setting (best reported)")
    args = ap.parse_args(argv)
    dev = wgpar.device(0)
    best: dict[tuple[str, bool], float] = {}
    for _ in range(args.repeat):
        for on in (False, True):
            if on:
                memory.record_history()
            for name, fn in (("malloc+free", lambda: pairs(dev.allocator, args.n)),
                             ("Tensor.empty + drop", lambda: tensors(dev, args.n))):
                t = fn()
                best[name, on] = min(best.get((name, on), t), t)
            if on:
                memory.record_history(enabled=False)
    for name in ("malloc+free", "Tensor.empty + drop"):
        off, on = best[name, False], best[name, True]
        print(f"{name:20s} off {off * 1e6:6.2f} us   recording {on * 1e6:6.2f} us   (+{(on - off) * 1e6:.2f} us)")


if __name__ == "__main__":
    main()
