"""Data-parallel training of the digits MLP over several adapters (or logical devices on one).

    python examples/data_parallel.py --devices 2 --epochs 15

Every rank holds a replica; each batch is split across ranks, gradients are
all-reduced (AllReduceSync, bucketed and overlapped with backward) and every
replica steps its own optimizer with the same averaged gradient. At the end it
trains the same model on one device with the same seed and shows both
accuracies, and prints per-device memory_stats.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_mlp import accuracy, load_digits, make_model, train  # noqa: E402

import wgpar  # noqa: E402
from wgpar.distributed import DataParallel, MultiAdapterContext  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=None,
                    help="number of ranks (default: all adapters, or 2 logical devices on a single adapter)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the single-device comparison run")
    args = ap.parse_args()
    n = args.devices or max(2, len(wgpar.adapter_names()))
    ctx = MultiAdapterContext(n)
    for r, d in enumerate(ctx.devices):
        print(f"rank {r}: {d}")

    wgpar.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits(args.seed)
    dp = DataParallel(make_model(ctx.devices[0]), ctx)
    opts = dp.optimizers(lambda ps: wgpar.optim.Adam(ps, lr=args.lr))
    rng = np.random.default_rng(args.seed)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    steps = args.epochs * -(-len(xtr) // args.batch_size)
    bar = tqdm(total=steps, unit="step", leave=False) if tqdm else None
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(xtr))
        losses = []
        for start in range(0, len(xtr), args.batch_size):
            idx = order[start:start + args.batch_size]
            losses.append(dp.train_step(xtr[idx], ytr[idx], F.cross_entropy, opts))
            if bar:
                bar.update(1)
        mean_loss = float(np.mean([loss.item() for loss in losses]))
        acc = accuracy(dp.module, xte, yte, ctx.devices[0])
        msg = f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {acc * 100:.2f}%"
        bar.write(msg) if bar else print(msg)
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t0
    acc = accuracy(dp.module, xte, yte, ctx.devices[0])
    print(f"data parallel on {n} devices: test accuracy {acc * 100:.2f}% in {elapsed:.1f} s")
    if not args.no_baseline:
        _, hist = train(ctx.devices[0], args.epochs, args.batch_size, args.lr, args.seed, progress=False)
        print(f"single device, same seed:  test accuracy {hist[-1][2] * 100:.2f}%")
    for r, d in enumerate(ctx.devices):
        s = wgpar.memory_stats(d)
        print(f"rank {r} memory: allocated={s['allocated_bytes']} peak={s['peak_allocated_bytes']} "
              f"reserved={s['reserved_bytes']}")
    ctx.close()


if __name__ == "__main__":
    main()
