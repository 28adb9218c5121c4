"""Training throughput (samples/s) of a compute-bound MLP on 1 device and with DataParallel on N.

Each step: forward, softmax cross entropy, backward, SGD; DataParallel adds the bucketed gradient
all-reduce (overlapped with backward). Target on 2 GPUs: at least 1.7x the 1-device throughput.
Also reports how many gradient buckets started their transfer while backward was still running.

    python benchmarks/bench_data_parallel.py --width 4096 --layers 4 --batch 4096 --steps 5 --devices 2

With ``--backend mpi`` (under mpiexec, one process per device) every process trains its replica with
DistributedDataParallel on its share of the batch; rank 0's process then times one device and
DataParallel on thread ranks over the same devices while the others wait, for a side-by-side table.
Target: processes at least as fast as threads (each process records its kernels under its own GIL).

    mpiexec -n 2 python benchmarks/bench_data_parallel.py --backend mpi --width 4096 --layers 4 --batch 4096
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report, _spmd  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.distributed import (  # noqa: E402
    DataParallel,
    DistributedDataParallel,
    MultiAdapterContext,
    split_sizes,
)
from wgpar.nn import functional as F  # noqa: E402


def mlp(width: int, layers: int, classes: int, device) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width, device=device), nn.ReLU()]
    mods.append(nn.Linear(width, classes, device=device))
    return nn.Sequential(*mods)


def single_device_step_time(args, X: np.ndarray, Y: np.ndarray) -> float:
    """Seconds per training step of the same model on device 0 alone, on the batch ``X``."""
    dev = wgpar.device(0)
    wgpar.manual_seed(0)
    model = mlp(args.width, args.layers, args.classes, dev)
    opt = optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(wgpar.tensor(X, device=dev)), Y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    wgpar.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    wgpar.synchronize(dev)
    return (time.perf_counter() - t0) / args.steps


def step_vs_broadcast(ctx: MultiAdapterContext, dp: DataParallel, opts) -> tuple[float, float]:
    """Seconds for every replica's optimizer step, and for broadcasting all parameters from rank 0."""
    def timed(fn) -> float:
        ctx.run(fn)
        t0 = time.perf_counter()
        ctx.run(fn)
        return time.perf_counter() - t0

    def opt_step(r: int) -> None:
        opts[r].step()
        ctx.devices[r].synchronize()

    def broadcast(r: int) -> None:
        with wgpar.no_grad():
            for p in dp.replicas[r].parameters():
                ctx.comm(r).broadcast(p, src=0)
        ctx.devices[r].synchronize()

    return timed(opt_step), timed(broadcast)


def threads_step_time(args, X: np.ndarray, Y: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """Seconds per DataParallel step on ``n`` thread ranks (each step ends with the loss all-reduce), and the
    losses of the warm-up steps and the timed ones."""
    ctx = MultiAdapterContext(n, timeout=600)
    wgpar.manual_seed(0)
    dp = DataParallel(mlp(args.width, args.layers, args.classes, ctx.devices[0]), ctx, bucket_cap_mb=args.bucket_mb)
    opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))
    losses = [dp.train_step(X, Y, F.cross_entropy, opts) for _ in range(args.warmup)]
    wgpar.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        losses.append(dp.train_step(X, Y, F.cross_entropy, opts))
    wgpar.synchronize()
    t = (time.perf_counter() - t0) / args.steps
    losses = np.array([v.item() for v in losses], np.float32)
    del dp, opts
    ctx.close()
    return t, losses


def processes_step_time(group, args, X: np.ndarray, Y: np.ndarray) -> tuple[float, np.ndarray, dict]:
    """Seconds per DistributedDataParallel step on this job's processes (the slowest rank's), the losses of the
    warm-up step and the timed ones, and what this process moved through the host in one more step."""
    r = group.rank
    bounds = np.cumsum([0, *split_sizes(args.batch, group.world_size)])
    x, y = X[bounds[r]:bounds[r + 1]], Y[bounds[r]:bounds[r + 1]]
    wgpar.manual_seed(0)
    ddp = DistributedDataParallel(mlp(args.width, args.layers, args.classes, group.device), group,
                                  bucket_cap_mb=args.bucket_mb, op="sum")
    step = _spmd.ddp_step(group, ddp, optim.SGD(ddp.parameters(), lr=1e-3), x, y, len(x) / args.batch)
    losses = []
    t = max(_spmd.every_rank(lambda g: _spmd.timed(g, lambda: losses.append(step()), args.steps,
                                                               warmup=args.warmup), group))
    timed_losses = np.array([v.item() for v in losses], np.float32)
    group.reset_traffic()
    step()
    return t, timed_losses, group.traffic()


def main_mpi(args, X: np.ndarray, Y: np.ndarray) -> None:
    group = _spmd.init_mpi()
    n = group.world_size
    t_proc, losses, moved = processes_step_time(group, args, X, Y)
    where = _spmd.provenance(group)

    def threads() -> tuple[float, float, np.ndarray]:  # one device, and thread ranks on the same devices
        t1 = single_device_step_time(args, X, Y)
        wgpar.empty_cache()
        return (t1, *threads_step_time(args, X, Y, n))

    measured = _spmd.on_rank0(group, threads)
    if group.rank != 0:
        return
    t1, t_thr, thr_losses = measured
    params = (args.layers - 1) * (args.width + 1) * args.width + (args.width + 1) * args.classes  # mlp's
    rows = [["1", "-", f"{t1 * 1e3:.1f}", f"{args.batch / t1:.0f}", "1.00"],
            [str(n), "thread ranks (DataParallel)", f"{t_thr * 1e3:.1f}", f"{args.batch / t_thr:.0f}",
             f"{t1 / t_thr:.2f}"],
            [str(n), "MPI processes (DistributedDataParallel)", f"{t_proc * 1e3:.1f}", f"{args.batch / t_proc:.0f}",
             f"{t1 / t_proc:.2f}"]]
    table = _report.markdown_table(["devices", "ranks", "ms / step", "samples / s", "speed-up"], rows)
    name = group.device.adapter_name
    body = (f"### DataParallel throughput, threads vs MPI processes: {name}\n\n{where}\n\n"
            f"MLP {args.layers} x {args.width} wide ({params} parameters), batch {args.batch}, SGD, buckets of "
            f"{args.bucket_mb:g} MiB; every step all-reduces its loss, launched after the forward as in "
            f"DataParallel. Per step each process moved {moved['d2h_bytes'] / 2**20:.1f} MiB device -> host and "
            f"{moved['h2d_bytes'] / 2**20:.1f} MiB host -> device. Processes / threads time: {t_proc / t_thr:.2f} "
            f"(target <= 1.0). Losses of the {len(losses)} steps, processes against threads: "
            f"{_spmd.same_bits(losses, thr_losses)}.\n\n{table}\n")
    print(body)
    _report.finish(args, f"data_parallel_mpi:{_report.slug(name)}", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps first (the transfer pools grow to a step's needs in the first ones)")
    ap.add_argument("--devices", type=int, default=2)
    _spmd.add_backend_flag(ap)
    ap.add_argument("--bucket-mb", type=float, default=25)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)
    if args.backend == "mpi":
        main_mpi(args, X, Y)
        return

    t1 = single_device_step_time(args, X, Y)
    share = args.batch // args.devices
    t1_share = single_device_step_time(args, X[:share], Y[:share])  # one rank's compute: the ideal step
    wgpar.empty_cache()

    ctx = MultiAdapterContext(args.devices, timeout=600)
    wgpar.manual_seed(0)
    dp = DataParallel(mlp(args.width, args.layers, args.classes, ctx.devices[0]), ctx, bucket_cap_mb=args.bucket_mb)
    opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))

    def dp_step_time() -> float:
        for _ in range(args.warmup):
            dp.train_step(X, Y, F.cross_entropy, opts)
        wgpar.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            dp.train_step(X, Y, F.cross_entropy, opts)  # returns before its GPU work is done
        wgpar.synchronize()
        return (time.perf_counter() - t0) / args.steps

    tn = dp_step_time()
    overlapped = dp.sync.launched_in_backward
    for d in dp.ranks:  # every bucket waits until backward is issued: what overlap buys
        d.sync.overlap = False
    tn_serial = dp_step_time()
    for d in dp.ranks:
        d.sync.overlap = True
    ctx.run(lambda r: ctx.comm(r).reset_traffic())
    dp.train_step(X, Y, F.cross_entropy, opts)
    moved = ctx.run(lambda r: ctx.comm(r).traffic())[0]
    t_opt, t_bcast = step_vs_broadcast(ctx, dp, opts)

    buckets = len(dp.sync.bucket_sizes())
    params = sum(p.numel() for p in dp.module.parameters())

    devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    rows = [["1", "-", f"{t1 * 1e3:.1f}", f"{args.batch / t1:.0f}", "1.00"],
            [f"1 (batch {share}: one rank's share)", "-", f"{t1_share * 1e3:.1f}", f"{share / t1_share:.0f}",
             f"{t1 / t1_share:.2f} (ideal)"],
            [str(args.devices), "overlapped with backward", f"{tn * 1e3:.1f}", f"{args.batch / tn:.0f}",
             f"{t1 / tn:.2f}"],
            [str(args.devices), "after backward", f"{tn_serial * 1e3:.1f}", f"{args.batch / tn_serial:.0f}",
             f"{t1 / tn_serial:.2f}"]]
    table = _report.markdown_table(["devices", "bucket all-reduce", "ms / step", "samples / s", "speed-up"], rows)
    body = (f"### DataParallel training throughput: {ctx.devices[0].adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n"
            f"MLP {args.layers} x {args.width} wide ({params} parameters, {params * 4 / 2**20:.0f} MiB of "
            f"gradients all-reduced per step), batch {args.batch}, SGD. Gradient buckets: {buckets}; "
            f"{overlapped} of them started their transfer while backward was still running. Per step each "
            f"rank moved {moved['d2h_bytes'] / 2**20:.1f} MiB device -> host and {moved['h2d_bytes'] / 2**20:.1f} "
            f"MiB host -> device in {moved['collectives']} collectives.\n\n{table}\n\n"
            f"Keeping replicas identical: every replica steps its own optimizer, {t_opt * 1e3:.1f} ms per "
            f"step (all ranks at once); stepping rank 0 and broadcasting the parameters instead would add "
            f"{t_bcast * 1e3:.1f} ms per step.\n")
    print(body)
    _report.finish(args, f"data_parallel:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
