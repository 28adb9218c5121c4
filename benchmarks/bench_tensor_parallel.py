"""Tensor vs data parallelism for a transformer MLP block: step time and the bytes each moves through the host.

The block is fc1 (d_model -> hidden), GELU, fc2 (hidden -> d_model); a step is forward, MSE loss,
backward and SGD on a batch resident on the devices (uploaded once: this measures compute and
communication, not input uploads). As inside a network, backward also computes the gradient of the
block's input. Rows:

- 1 device: the whole block.
- 1 device, hidden / N: the block with each TP rank's share of the hidden units: TP's compute alone,
  so TP minus this row is what its all-reduces cost.
- tensor parallel on N: ParallelMLP; every rank runs the whole batch on its slice of the hidden units;
  one all-reduce of the [batch, d_model] output in forward and one of the input gradient in backward,
  each on the critical path.
- data parallel on N: DistributedDataParallel; every rank runs batch / N rows through the whole block;
  the gradients (all parameters) are all-reduced in buckets while backward runs.

Host traffic is what each rank's ProcessGroup counted (``traffic()``) over the timed steps.

    python benchmarks/bench_tensor_parallel.py --devices 2            # full size: 4096 -> 16384 -> 4096, batch 8192
    python benchmarks/bench_tensor_parallel.py --d-model 64 --hidden 256 --batch 128 --no-write   # lavapipe
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar import optim  # noqa: E402
from wgpar.distributed import MLP, DistributedDataParallel, MultiAdapterContext, ParallelMLP  # noqa: E402
from wgpar.distributed.tensor_parallel import shard_sizes  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

MIB = 2**20


def _inputs(X: np.ndarray, Y: np.ndarray, device):
    """The batch on ``device``; the input requires grad, as a block's input inside a network does."""
    return wgpar.tensor(X, device=device).requires_grad_(), wgpar.tensor(Y, device=device)


def _stepper(model, x, y, lr: float, after_backward=None):
    opt = optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if after_backward is not None:
            after_backward()
        opt.step()

    return step


def _time(step, steps: int, device, group=None) -> tuple[float, dict[str, float]]:
    """Seconds per step after one warm-up step, and the group's traffic per step (all ranks start together)."""
    step()
    device.synchronize()
    if group is not None:
        group.barrier()
        group.reset_traffic()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    device.synchronize()
    traffic = group.traffic() if group is not None else {}
    if group is not None:
        group.barrier()  # the slowest rank sets the step time
    seconds = (time.perf_counter() - t0) / steps
    return seconds, {k: v / steps for k, v in traffic.items()}


def single_device(args, X: np.ndarray, Y: np.ndarray, hidden: int) -> float:
    dev = wgpar.device(0)
    wgpar.manual_seed(0)
    model = MLP(args.d_model, hidden, device=dev)
    seconds, _ = _time(_stepper(model, *_inputs(X, Y, dev), args.lr), args.steps, dev)
    del model
    wgpar.empty_cache()
    return seconds


def tensor_parallel(ctx: MultiAdapterContext, args, X: np.ndarray, Y: np.ndarray):
    def rank(r: int):
        group = ctx.comm(r)
        wgpar.manual_seed(r)
        model = ParallelMLP(args.d_model, args.hidden, group)
        return _time(_stepper(model, *_inputs(X, Y, group.device), args.lr), args.steps, group.device, group)

    return ctx.run(rank)


def data_parallel(ctx: MultiAdapterContext, args, X: np.ndarray, Y: np.ndarray):
    rows = np.cumsum([0, *shard_sizes(args.batch, ctx.world_size)])

    def rank(r: int):
        group = ctx.comm(r)
        wgpar.manual_seed(0)
        ddp = DistributedDataParallel(MLP(args.d_model, args.hidden, device=group.device), group,
                                      bucket_cap_mb=args.bucket_mb)
        lo, hi = int(rows[r]), int(rows[r + 1])
        return _time(_stepper(ddp, *_inputs(X[lo:hi], Y[lo:hi], group.device), args.lr, ddp.finish), args.steps,
                     group.device, group)

    return ctx.run(rank)


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.4g}"


def _row(name: str, devices: int, seconds: float, t1: float, traffic: dict[str, float] | None) -> list[str]:
    t = traffic or {}
    return [name, str(devices), f"{seconds * 1e3:.1f}", f"{t1 / seconds:.2f}",
            _mib(t["d2h_bytes"]) if t else "-", _mib(t["h2d_bytes"]) if t else "-",
            f"{t['collectives']:.0f}" if t else "-"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=25, help="DataParallel's gradient bucket size")
    ap.add_argument("--lr", type=float, default=1e-4)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    n = args.devices
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.d_model)).astype(np.float32)
    Y = rng.standard_normal((args.batch, args.d_model)).astype(np.float32)

    t1 = single_device(args, X, Y, args.hidden)
    t_share = single_device(args, X, Y, shard_sizes(args.hidden, n)[0])
    ctx = MultiAdapterContext(n, timeout=600)
    tp = tensor_parallel(ctx, args, X, Y)
    wgpar.empty_cache()
    dp = data_parallel(ctx, args, X, Y)
    t_tp, t_dp = max(s for s, _ in tp), max(s for s, _ in dp)
    traffic_tp, traffic_dp = tp[0][1], dp[0][1]
    params = 2 * args.d_model * args.hidden + args.hidden + args.d_model
    act = args.batch * args.d_model * 4

    rows = [_row("single device", 1, t1, t1, None),
            _row(f"single device, hidden / {n} (TP's compute alone)", 1, t_share, t1, None),
            _row("tensor parallel", n, t_tp, t1, traffic_tp),
            _row("data parallel", n, t_dp, t1, traffic_dp)]
    table = _report.markdown_table(["strategy", "devices", "ms / step", "speed-up", "device -> host MiB / rank",
                                    "host -> device MiB / rank", "collectives / rank"], rows)
    best = min((t1, "one device"), (t_tp, "tensor parallel"), (t_dp, "data parallel"))
    devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    body = (f"### Tensor vs data parallelism, MLP block {args.d_model} -> {args.hidden} -> {args.d_model}: "
            f"{ctx.devices[0].adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n"
            f"Batch {args.batch} (resident on the devices), MSE loss, SGD; {params} parameters "
            f"({_mib(params * 4)} MiB); per step and rank, host traffic as counted by ProcessGroup.traffic(). "
            f"Tensor parallel: two all-reduces of a [batch, d_model] activation ({_mib(act)} MiB each) on the "
            f"critical path; data parallel: the gradients ({_mib(params * 4)} MiB) in {args.bucket_mb:g} MiB "
            f"buckets, overlapped with backward.\n\n{table}\n\n"
            f"Fastest: {best[1]} ({best[0] * 1e3:.1f} ms / step). Tensor parallel minus its compute alone: "
            f"{(t_tp - t_share) * 1e3:.1f} ms / step (its all-reduces, where devices run concurrently; lavapipe "
            "runs them one after another, which adds the other ranks' compute).\n")
    print(body)
    _report.finish(args, f"tensor_parallel:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
