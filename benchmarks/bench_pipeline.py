"""Pipeline-parallel training throughput per schedule and micro-batch count, against one device and DataParallel.

Each step: forward, softmax cross entropy, backward, SGD, on an MLP of ``--layers`` x ``--width``.
For every schedule (GPipe, 1F1B, interleaved 1F1B with 2 stages per rank, ZB-H1) and micro-batch
count it reports the step time, throughput and speed-up over one device on the whole batch, the
bubble measured with every action synchronised with its device (a few separate steps), next to
the textbook (p - 1) / (m + p - 1) and the schedule's own model, and the bytes each step moved
through the host (``group.traffic()``, summed over ranks). The same model under DataParallel on
the same devices closes the table. Target on 2 GPUs (issue 11): 2-stage 1F1B at least 1.7x one GPU
on the full size, ahead of DataParallel.

    python benchmarks/bench_pipeline.py --devices 2 --width 4096 --layers 8 --batch 8192 --microbatches 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.distributed import DataParallel, MultiAdapterContext, PipelineExecutor  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


def blocks(width: int, layers: int, classes: int, device) -> list[nn.Module]:
    wgpar.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width, device=device), nn.ReLU()]
    return mods + [nn.Linear(width, classes, device=device)]




def single_device(args, X, Y) -> float:
    dev = wgpar.device(0)
    model = nn.Sequential(*blocks(args.width, args.layers, args.classes, dev))
    opt = optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(wgpar.tensor(X, device=dev)), Y).backward()
        opt.step()

    return _report.timed(step, lambda: wgpar.synchronize(dev), args.steps)


def traffic_per_step(ctx, step) -> int:
    """Bytes every rank moved through the host in one step (device -> host plus host -> device), summed."""
    ctx.run(lambda r: ctx.comm(r).reset_traffic())
    step()
    return sum(t["d2h_bytes"] + t["h2d_bytes"] for t in ctx.run(lambda r: ctx.comm(r).traffic()))


def pipeline_row(args, ctx, schedule: str, m: int, X, Y) -> dict:
    pipe = PipelineExecutor(blocks(args.width, args.layers, args.classes, ctx.devices[0]), ctx, m, schedule,
                            F.cross_entropy, stages_per_rank=2)
    opts = pipe.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))

    def step() -> None:
        pipe.train_step(X, Y, opts)

    t = _report.timed(step, lambda: ctx.run(lambda r: ctx.devices[r].synchronize()), args.steps)
    moved = traffic_per_step(ctx, step)
    for r in pipe.ranks:
        r.profile = True
    bubbles = []
    for _ in range(args.profile_steps):
        step()
        bubbles.append(pipe.measured_bubble())
    p = ctx.world_size
    row = {"schedule": pipe.schedule.name, "m": m, "t": t, "moved": moved, "bubble": float(np.median(bubbles)),
           "model": pipe.schedule.bubble_fraction(), "textbook": (p - 1) / (m + p - 1)}
    return row


def data_parallel_row(args, ctx, X, Y) -> tuple[float, int]:
    dp = DataParallel(nn.Sequential(*blocks(args.width, args.layers, args.classes, ctx.devices[0])), ctx)
    opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))

    def step() -> None:
        dp.train_step(X, Y, F.cross_entropy, opts)

    t = _report.timed(step, lambda: ctx.run(lambda r: ctx.devices[r].synchronize()), args.steps)
    return t, traffic_per_step(ctx, step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--microbatches", default="4,8", help="comma-separated micro-batch counts")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3, help="steps with per-action synchronisation")
    ap.add_argument("--devices", type=int, default=2)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)

    t1 = single_device(args, X, Y)
    wgpar.empty_cache()
    ctx = MultiAdapterContext(args.devices, timeout=600)
    rows = []
    for schedule in args.schedules.split(","):
        for m in (int(v) for v in args.microbatches.split(",")):
            rows.append(pipeline_row(args, ctx, schedule, m, X, Y))
            wgpar.empty_cache()  # the last model's cached blocks
            r = rows[-1]
            print(f"{r['schedule']:>22} m={m:<3} {r['t'] * 1e3:9.1f} ms/step  {t1 / r['t']:.2f}x  bubble "
                  f"{r['bubble']:.1%} (model {r['model']:.1%})  {r['moved'] / 2**20:.1f} MiB moved", flush=True)
    t_dp, moved_dp = data_parallel_row(args, ctx, X, Y)

    def mib(n: int) -> str:
        return f"{n / 2**20:.1f}"

    table_rows = [["1 device", "-", f"{t1 * 1e3:.1f}", f"{args.batch / t1:.0f}", "1.00", "-", "-", "-", "0"]]
    for r in rows:
        table_rows.append([r["schedule"], str(r["m"]), f"{r['t'] * 1e3:.1f}", f"{args.batch / r['t']:.0f}",
                           f"{t1 / r['t']:.2f}", f"{r['bubble']:.1%}", f"{r['textbook']:.1%}", f"{r['model']:.1%}",
                           mib(r["moved"])])
    table_rows.append([f"DataParallel x{args.devices}", "-", f"{t_dp * 1e3:.1f}", f"{args.batch / t_dp:.0f}",
                       f"{t1 / t_dp:.2f}", "-", "-", "-", mib(moved_dp)])
    table = _report.markdown_table(["schedule", "micro-batches", "ms / step", "samples / s", "speed-up",
                                    "bubble measured", "(p-1)/(m+p-1)", "schedule model",
                                    "MiB through host / step"], table_rows)
    params = sum(p.numel() for p in nn.Sequential(*blocks(args.width, args.layers, args.classes, 0)).parameters())
    devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    body = (f"### Pipeline parallelism: {ctx.devices[0].adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n"
            f"MLP {args.layers} x {args.width} wide ({params} parameters), batch {args.batch}, SGD, "
            f"{args.devices} pipeline ranks (interleaved: 2 stages per rank). Speed-up against one device on the "
            f"whole batch. Bubble measured over {args.profile_steps} steps with every action synchronised with its "
            f"device (median); the schedule model counts F = 1, B = 2 (I = W = 1) time units and free transfers. "
            f"Host traffic: every rank's device -> host plus host -> device bytes in one step, summed.\n\n{table}\n")
    print(body)
    _report.finish(args, f"pipeline:{_report.slug(ctx.devices[0].adapter_name)}", body)
    ctx.close()


if __name__ == "__main__":
    main()
