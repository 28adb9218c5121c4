"""Data-parallel training of the digits MLP over several adapters (or logical devices on one).

    python examples/data_parallel.py --devices 2 --epochs 15            # DataParallel, one process
    python examples/data_parallel.py --devices 2 --backend threads      # the per-rank program, thread ranks
    mpiexec -n 2 python examples/data_parallel.py --backend mpi         # the same program, one process per rank

Every rank holds a replica; each batch is split across ranks, gradients are
all-reduced (AllReduceSync, bucketed and overlapped with backward) and every
replica steps its own optimizer with the same gradient.

Without --backend a single controller drives the ranks (DataParallel): a
DataLoader hands it host batches, which it splits, each rank thread uploading
its share. With --backend every rank runs the same per-rank program
(DistributedDataParallel) on thread ranks or MPI processes, and reads its share
of each batch through a DistributedSampler and its own DataLoader, which uploads
the next batches to the rank's device in the background. Both see the same
samples in every step (one seed, one permutation per epoch), but for the
per-rank program's last batch of an epoch, which repeats a sample where the
data does not divide among the ranks (torch's rule): so their losses are close,
not equal. Threads and MPI give the same bits.

Then it trains the same model on one device with the same seed, for
comparison, and prints both times, the speed-up and per-device memory.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import common  # examples/common.py and train_mlp.py: a script's own directory is on sys.path
import numpy as np
from train_mlp import accuracy, load_digits, make_model, train

import wgpar
from wgpar.distributed import DataParallel, DistributedDataParallel, MultiAdapterContext, init_process_group, run_spmd
from wgpar.nn import functional as F
from wgpar.utils.data import DataLoader, DistributedSampler, TensorDataset


def _describe(device) -> SimpleNamespace:
    """What the summary needs of a device (picklable: MPI ranks send it to rank 0)."""
    return SimpleNamespace(adapter_name=device.adapter_name, adapter_type=device.adapter_type,
                           logical=device.logical)


def train_rank(group, args) -> dict:
    """One rank's program: its replica, its share of every batch. Rank 0 reports."""
    lead = group.rank == 0
    with wgpar.rng_stream(args.seed):  # this rank's own generator: thread ranks build at once
        model = make_model(group.device)
    ddp = DistributedDataParallel(model, group)  # gradients averaged: every rank's batches are equal in size
    opt = wgpar.optim.Adam(ddp.parameters(), lr=args.lr)
    xtr, ytr, xte, yte = load_digits(args.seed)
    data = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(data, group=group, seed=args.seed)  # the permutation of DataLoader(generator=seed)
    loader = DataLoader(data, batch_size=max(1, args.batch_size // group.world_size), sampler=sampler,
                        device=group.device)
    bar = common.progress(args.epochs * len(loader), lead)
    seconds = []
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch - 1)
        if bar:
            bar.set_description(f"epoch {epoch}/{args.epochs}")
        losses = []
        for step, (xb, yb) in enumerate(loader, 1):
            opt.zero_grad()
            loss = F.cross_entropy(ddp(xb), yb)
            loss.backward()  # returns with the gradients averaged over the ranks: the whole batch's gradient
            opt.step()
            losses.append(group.all_reduce(loss.detach().reshape(1), "mean", async_op=True, label="loss"))
            if bar:
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{losses[-1].wait().item():.4f}")
                bar.update(1)
        mean_loss = float(np.mean([w.wait().item() for w in losses]))
        seconds.append(time.perf_counter() - t0)
        if lead:
            acc = accuracy(ddp.module, xte, yte, group.device)
            common.report(bar, f"epoch {epoch:3d}  loss {mean_loss:.6f}  test accuracy {acc * 100:.2f}%")
    if bar:
        bar.close()
    s = wgpar.memory_stats(group.device)
    return {"accuracy": accuracy(ddp.module, xte, yte, group.device), "seconds": seconds,
            "device": str(group.device), "describe": _describe(group.device),
            "memory": {k: s[k] for k in ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes")}}


def compare_with_one_device(args, device, parallel_seconds: list[float], n: int, devices: list) -> None:
    """Train on one device with the same seed, then print both times, the speed-up, and why it is what it is."""
    print(f"\nfor comparison, on one device: the same model, seed and batches on {device} ...", flush=True)
    _, hist = train(device, args.epochs, args.batch_size, args.lr, args.seed)
    single_seconds = [h[3] for h in hist]
    print(f"single device: test accuracy {hist[-1][2] * 100:.2f}% in {sum(single_seconds):.1f} s")
    # The first epoch builds every shader (once per device), so compare the epochs after it when there are any.
    skip = 1 if args.epochs > 1 else 0
    par, one = sum(parallel_seconds[skip:]), sum(single_seconds[skip:])
    which = f"epochs 2-{args.epochs}" if skip else "the one epoch"
    print(f"speed-up on {n} devices: {one / par:.2f}x ({which}: {par:.2f} s on {n} devices, {one:.2f} s on one)")
    why = common.why_no_speedup(devices)
    if why:
        print(f"  {why}")
    elif one / par < 1:
        print("  this model is small: the gradient all-reduce through the host costs more than the compute it "
              "splits; try a larger --batch-size")


def main_spmd(args) -> None:
    n = args.devices or (None if args.backend == "mpi" else max(2, len(wgpar.adapter_names())))
    results = run_spmd(train_rank, n, backend=args.backend, args=(args,))
    if args.backend == "mpi" and init_process_group().rank != 0:
        return  # every process has the results; one prints them
    for r, res in enumerate(results):
        m = res["memory"]
        print(f"rank {r} on {res['device']}: allocated {common.mib(m['allocated_bytes'])}, "
              f"peak {common.mib(m['peak_allocated_bytes'])}, reserved {common.mib(m['reserved_bytes'])}")
    seconds = results[0]["seconds"]
    kind = {"threads": "thread", "mpi": "MPI"}[args.backend]
    print(f"data parallel on {len(results)} {kind} ranks: test accuracy {results[0]['accuracy'] * 100:.2f}% "
          f"in {sum(seconds):.1f} s")
    if not args.no_baseline:
        compare_with_one_device(args, wgpar.device(0), seconds, len(results), [r["describe"] for r in results])


def main_single_controller(args) -> None:
    n = args.devices or max(2, len(wgpar.adapter_names()))
    ctx = MultiAdapterContext(n)
    for r, d in enumerate(ctx.devices):
        print(f"rank {r}: {d}")

    wgpar.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits(args.seed)
    dp = DataParallel(make_model(ctx.devices[0]), ctx)
    opts = dp.optimizers(lambda ps: wgpar.optim.Adam(ps, lr=args.lr))
    # Host batches: DataParallel splits each one and every rank thread uploads its own share.
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=args.batch_size, shuffle=True, generator=args.seed)
    bar = common.progress(args.epochs * len(loader))
    seconds = []
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        if bar:
            bar.set_description(f"epoch {epoch}/{args.epochs}")
        losses = []
        for step, (xb, yb) in enumerate(loader, 1):
            losses.append(dp.train_step(xb, yb, F.cross_entropy, opts))
            if bar:
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{losses[-1].item():.4f}")
                bar.update(1)
        mean_loss = float(np.mean([loss.item() for loss in losses]))
        seconds.append(time.perf_counter() - t0)
        acc = accuracy(dp.module, xte, yte, ctx.devices[0])
        common.report(bar, f"epoch {epoch:3d}  loss {mean_loss:.6f}  test accuracy {acc * 100:.2f}%")
    if bar:
        bar.close()
    acc = accuracy(dp.module, xte, yte, ctx.devices[0])
    print(f"data parallel on {n} devices: test accuracy {acc * 100:.2f}% in {sum(seconds):.1f} s")
    for r, d in enumerate(ctx.devices):
        print(common.memory_line(f"rank {r}", d))
    if not args.no_baseline:
        compare_with_one_device(args, ctx.devices[0], seconds, n, ctx.devices)
    ctx.close()


def build_parser():
    ap = common.parser(__doc__)
    ap.add_argument("--devices", type=common.at_least(1), default=None,
                    help="number of ranks (default: all adapters, or 2 logical devices on a single adapter; "
                         "under MPI: the number of processes)")
    ap.add_argument("--backend", choices=("threads", "mpi"), default=None,
                    help="run the per-rank program on thread ranks or MPI processes (default: DataParallel, "
                         "a single controller over thread ranks)")
    ap.add_argument("--epochs", type=common.at_least(1), default=15, help="passes over the training set")
    ap.add_argument("--batch-size", type=common.at_least(1), default=64,
                    help="samples per step, over all ranks (the per-rank program gives each rank "
                         "batch-size // ranks)")
    ap.add_argument("--lr", type=common.positive_float, default=3e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=common.at_least(0), default=0,
                    help="seeds the weights, the train/test split and the shuffles")
    ap.add_argument("--no-baseline", action="store_true", help="skip the single-device comparison run")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.devices is not None and args.batch_size < args.devices:
        ap.error(f"--batch-size {args.batch_size} cannot feed --devices {args.devices}: every rank needs a sample")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.backend is None:
        main_single_controller(args)
    else:
        main_spmd(args)


if __name__ == "__main__":
    main()
