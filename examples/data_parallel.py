"""Data-parallel training of the digits MLP over several adapters (or logical devices on one).

    python examples/data_parallel.py --devices 2 --epochs 15            # DataParallel, one process
    python examples/data_parallel.py --devices 2 --backend threads      # the per-rank program, thread ranks
    mpiexec -n 2 python examples/data_parallel.py --backend mpi         # the same program, one process per rank

Every rank holds a replica; each batch is split across ranks, gradients are
all-reduced (AllReduceSync, bucketed and overlapped with backward) and every
replica steps its own optimizer with the same gradient. Without ``--backend``
a single controller drives the ranks (DataParallel); with it, every rank runs
the same per-rank program (DistributedDataParallel) on thread ranks or on MPI
processes. All three give the same losses and accuracy. At the end it trains
the same model on one device with the same seed and shows both accuracies,
and prints per-device memory_stats.
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
from wgpar.distributed import (  # noqa: E402
    DataParallel,
    DistributedDataParallel,
    MultiAdapterContext,
    init_process_group,
    run_spmd,
    split_sizes,
)
from wgpar.nn import functional as F  # noqa: E402


def _progress(total: int, show: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", leave=False) if show else None


def _report(bar, msg: str) -> None:
    bar.write(msg) if bar else print(msg, flush=True)


def train_rank(group, args) -> dict:
    """One rank's program: its replica, its share of every batch. Rank 0 reports."""
    lead = group.rank == 0
    with wgpar.rng_stream(args.seed):  # this rank's own generator: thread ranks build at once
        model = make_model(group.device)
    ddp = DistributedDataParallel(model, group, op="sum")  # each rank's loss is weighted by its share
    opt = wgpar.optim.Adam(ddp.parameters(), lr=args.lr)
    xtr, ytr, xte, yte = load_digits(args.seed)
    rng = np.random.default_rng(args.seed)  # the same batches on every rank
    steps = args.epochs * -(-len(xtr) // args.batch_size)
    bar = _progress(steps, lead)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(xtr))
        losses = []
        for start in range(0, len(xtr), args.batch_size):
            idx = order[start:start + args.batch_size]
            bounds = np.cumsum([0, *split_sizes(len(idx), group.world_size)])
            mine = idx[bounds[group.rank]:bounds[group.rank + 1]]
            share = len(mine) / len(idx)
            opt.zero_grad()
            loss = F.cross_entropy(ddp(wgpar.tensor(xtr[mine], device=group.device)),
                                   wgpar.tensor(ytr[mine], device=group.device)) * share
            loss.backward()  # returns with the gradients summed over ranks: the whole batch's gradient
            opt.step()
            losses.append(group.all_reduce(loss.detach().reshape(1), "sum", async_op=True, label="loss"))
            if bar:
                bar.update(1)
        mean_loss = float(np.mean([w.wait().item() for w in losses]))
        if lead:
            acc = accuracy(ddp.module, xte, yte, group.device)
            _report(bar, f"epoch {epoch:3d}  loss {mean_loss:.6f}  test accuracy {acc * 100:.2f}%")
    if bar:
        bar.close()
    s = wgpar.memory_stats(group.device)
    return {"accuracy": accuracy(ddp.module, xte, yte, group.device), "seconds": time.perf_counter() - t0,
            "device": str(group.device), "memory": {k: s[k] for k in ("allocated_bytes", "peak_allocated_bytes",
                                                                      "reserved_bytes")}}


def main_spmd(args) -> None:
    n = args.devices or (None if args.backend == "mpi" else max(2, len(wgpar.adapter_names())))
    results = run_spmd(train_rank, n, backend=args.backend, args=(args,))
    if args.backend == "mpi" and init_process_group().rank != 0:
        return  # every process has the results; one prints them
    for r, res in enumerate(results):
        m = res["memory"]
        print(f"rank {r} on {res['device']}: allocated={m['allocated_bytes']} peak={m['peak_allocated_bytes']} "
              f"reserved={m['reserved_bytes']}")
    print(f"data parallel on {len(results)} {args.backend} ranks: test accuracy {results[0]['accuracy'] * 100:.2f}% "
          f"in {results[0]['seconds']:.1f} s")
    if not args.no_baseline:
        _, hist = train(wgpar.device(0), args.epochs, args.batch_size, args.lr, args.seed, progress=False)
        print(f"single device, same seed:  test accuracy {hist[-1][2] * 100:.2f}%")


def main_single_controller(args) -> None:
    n = args.devices or max(2, len(wgpar.adapter_names()))
    ctx = MultiAdapterContext(n)
    for r, d in enumerate(ctx.devices):
        print(f"rank {r}: {d}")

    wgpar.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits(args.seed)
    dp = DataParallel(make_model(ctx.devices[0]), ctx)
    opts = dp.optimizers(lambda ps: wgpar.optim.Adam(ps, lr=args.lr))
    rng = np.random.default_rng(args.seed)
    steps = args.epochs * -(-len(xtr) // args.batch_size)
    bar = _progress(steps, True)
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
        _report(bar, f"epoch {epoch:3d}  loss {mean_loss:.6f}  test accuracy {acc * 100:.2f}%")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=None,
                    help="number of ranks (default: all adapters, or 2 logical devices on a single adapter; "
                         "under MPI: the number of processes)")
    ap.add_argument("--backend", choices=("threads", "mpi"), default=None,
                    help="run the per-rank program on thread ranks or MPI processes (default: DataParallel, "
                         "a single controller over thread ranks)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the single-device comparison run")
    args = ap.parse_args()
    if args.backend is None:
        main_single_controller(args)
    else:
        main_spmd(args)


if __name__ == "__main__":
    main()
