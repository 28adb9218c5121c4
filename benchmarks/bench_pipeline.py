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

With ``--backend mpi`` (under mpiexec, one process per device) every process runs its rank's
PipelineSchedule of each schedule (what PipelineExecutor hands each rank's thread) and, for the last
row, DistributedDataParallel; rank 0's process then runs PipelineExecutor, DataParallel and one device
on thread ranks over the same devices while the others wait, and writes one table: step time, speed-up,
measured bubble and host bytes of threads and processes side by side, and their losses compared bit
for bit. Target: processes at least as fast as threads.

    mpiexec -n 2 python benchmarks/bench_pipeline.py --backend mpi --no-write                # lavapipe, small
    mpirun --bind-to none -n 2 python benchmarks/bench_pipeline.py --backend mpi --width 4096 --layers 8 \\
        --batch 8192 --microbatches 8                                                     # Open MPI, 2 GPUs

``--block scale`` swaps each Linear block for a per-feature scale that costs next to nothing, so a step is
its transfers (2 MiB per message at ``--width 2048 --batch 1024 --microbatches 4``); with
``MPIR_CVAR_CH4_CMA_ENABLE=0`` MPICH runs without its single-copy path, as under ptrace_scope restrictions.
"""

from __future__ import annotations

import argparse
import gc
import sys
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
    PipelineExecutor,
    PipelineSchedule,
    PipelineStage,
    split_module,
    split_sizes,
)
from wgpar.distributed.pipeline import build  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")


class Scale(nn.Module):
    """``x * w`` with a weight per feature: a stage that costs next to nothing, so the step is its transfers."""

    def __init__(self, width: int, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(wgpar.full((width,), 1.001, device=device))

    def forward(self, x):
        return x * self.weight


def blocks(width: int, layers: int, classes: int, device, block: str = "linear") -> list[nn.Module]:
    """The MLP: ``layers - 1`` blocks of ``block`` (linear: Linear + ReLU; scale: Scale + ReLU) and a Linear
    head. Every rank builds them all from seed 0."""
    wgpar.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        body = nn.Linear(width, width, device=device) if block == "linear" else Scale(width, device)
        mods += [body, nn.ReLU()]
    return mods + [nn.Linear(width, classes, device=device)]




def single_device(args, X, Y) -> float:
    dev = wgpar.device(0)
    model = nn.Sequential(*blocks(args.width, args.layers, args.classes, dev, args.block))
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
    pipe = PipelineExecutor(blocks(args.width, args.layers, args.classes, ctx.devices[0], args.block), ctx, m, schedule,
                            F.cross_entropy, stages_per_rank=2)
    opts = pipe.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))
    losses = []

    def step() -> None:
        losses.append(pipe.train_step(X, Y, opts))

    t = _report.timed(step, lambda: ctx.run(lambda r: ctx.devices[r].synchronize()), args.steps)
    timed_losses = np.array([v.item() for v in losses], np.float32)  # the warm-up step's and the timed ones
    moved = traffic_per_step(ctx, step)
    for r in pipe.ranks:
        r.profile = True
    bubbles = []
    for _ in range(args.profile_steps):
        step()
        bubbles.append(pipe.measured_bubble())
    p = ctx.world_size
    row = {"schedule": pipe.schedule.name, "m": m, "t": t, "moved": moved, "bubble": float(np.median(bubbles)),
           "model": pipe.schedule.bubble_fraction(), "textbook": (p - 1) / (m + p - 1), "losses": timed_losses}
    return row


def data_parallel_row(args, ctx, X, Y) -> tuple[float, int, np.ndarray]:
    dp = DataParallel(nn.Sequential(*blocks(args.width, args.layers, args.classes, ctx.devices[0], args.block)), ctx)
    opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=1e-3))
    losses = []

    def step() -> None:
        losses.append(dp.train_step(X, Y, F.cross_entropy, opts))

    t = _report.timed(step, lambda: ctx.run(lambda r: ctx.devices[r].synchronize()), args.steps)
    return t, traffic_per_step(ctx, step), np.array([v.item() for v in losses[:args.steps + 1]], np.float32)


def rank_pipeline(group, args, schedule: str, m: int, X, Y) -> dict:
    """What PipelineExecutor runs on each rank, as one rank's program: the rank's stages of the same blocks
    (every rank builds them all from seed 0 and keeps its own), PipelineSchedule, SGD; timed like
    ``pipeline_row``. Returns this rank's time, traffic, busy and step seconds per profiled step, and losses."""
    sched = build(schedule, group.world_size, m, stages_per_rank=2)
    parts = split_module(blocks(args.width, args.layers, args.classes, group.device, args.block), sched.num_stages)
    pipe = PipelineSchedule([PipelineStage(parts[s], s, sched.num_stages, group.device)
                             for s in sched.stages_of(group.rank)], group, m, sched, F.cross_entropy)
    del parts  # the other ranks' blocks
    opt = optim.SGD(list(pipe.parameters()), lr=1e-3)
    losses = []

    def step() -> None:
        opt.zero_grad()
        loss = pipe.step(X if pipe.has_first else None, Y if pipe.has_last else None)
        opt.step()
        if loss is not None:
            losses.append(loss)

    t = _spmd.timed(group, step, args.steps)
    timed_losses = np.array([v.item() for v in losses], np.float32)
    group.reset_traffic()
    step()
    traffic = group.traffic()
    pipe.profile = True
    profiled = []
    for _ in range(args.profile_steps):
        step()
        profiled.append((sum(a.end - a.start for a in pipe.last_trace), pipe.last_step_seconds))
    return {"schedule": sched.name, "model": sched.bubble_fraction(), "t": t, "profiled": profiled,
            "moved": traffic["d2h_bytes"] + traffic["h2d_bytes"], "losses": timed_losses}


def rank_data_parallel(group, args, X, Y) -> dict:
    """DistributedDataParallel on this rank's rows, the step DataParallel.train_step runs on each rank."""
    bounds = np.cumsum([0, *split_sizes(len(X), group.world_size)])
    x, y = X[bounds[group.rank]:bounds[group.rank + 1]], Y[bounds[group.rank]:bounds[group.rank + 1]]
    model = nn.Sequential(*blocks(args.width, args.layers, args.classes, group.device, args.block))
    ddp = DistributedDataParallel(model, group, op="sum")
    step = _spmd.ddp_step(group, ddp, optim.SGD(ddp.parameters(), lr=1e-3), x, y, len(x) / len(X))
    losses = []
    t = _spmd.timed(group, lambda: losses.append(step()), args.steps)
    group.reset_traffic()
    step()
    traffic = group.traffic()
    return {"t": t, "moved": traffic["d2h_bytes"] + traffic["h2d_bytes"],
            "losses": np.array([v.item() for v in losses], np.float32)}


def on_every_rank(fn, group) -> list:
    """``fn(group)`` on every process; every rank's result. Each rank's memory goes before the next run."""
    def run(g):
        out = fn(g)
        gc.collect()
        wgpar.empty_cache(g.device)
        return out
    return _spmd.every_rank(run, group)


def measure_threads(args, X, Y, devices: int) -> tuple[float, list[dict], tuple[float, int, np.ndarray], str]:
    """One device, every schedule and micro-batch count with PipelineExecutor, and DataParallel, on thread
    ranks: (one device's step time, the pipeline rows, DataParallel's time, traffic and losses, the devices)."""
    t1 = single_device(args, X, Y)
    wgpar.empty_cache()
    with MultiAdapterContext(devices, timeout=_spmd.TIMEOUT) as ctx:
        rows = []
        for schedule in args.schedules.split(","):
            for m in (int(v) for v in args.microbatches.split(",")):
                rows.append(pipeline_row(args, ctx, schedule, m, X, Y))
                wgpar.empty_cache()  # the last model's cached blocks
                r = rows[-1]
                print(f"{r['schedule']:>22} m={m:<3} {r['t'] * 1e3:9.1f} ms/step  {t1 / r['t']:.2f}x  bubble "
                      f"{r['bubble']:.1%} (model {r['model']:.1%})  {r['moved'] / 2**20:.1f} MiB moved", flush=True)
        dp = data_parallel_row(args, ctx, X, Y)
        devs = ", ".join(_report.device_line(d) for d in ctx.devices)
    wgpar.empty_cache()
    return t1, rows, dp, devs


def section_suffix(args) -> str:
    """Scale blocks get BENCHMARKS.md sections of their own."""
    return "" if args.block == "linear" else f"_{args.block}"


def model_line(args, p: int) -> str:
    per_block = (args.width + 1) * args.width if args.block == "linear" else args.width
    params = (args.layers - 1) * per_block + (args.width + 1) * args.classes
    kind = "MLP" if args.block == "linear" else "Elementwise-scale blocks (transfer-bound)"
    return (f"{kind} {args.layers} x {args.width} wide ({params} parameters), batch {args.batch}, SGD, {p} pipeline "
            f"ranks (interleaved: 2 stages per rank).")


def main_mpi(args, X, Y) -> None:
    """Every schedule and DataParallel on this job's processes, then on as many thread ranks in rank 0's
    process."""
    group = _spmd.init_mpi()
    p = group.world_size
    if args.devices is not None and args.devices != p:
        raise SystemExit(f"bench_pipeline --backend mpi: --devices {args.devices}, but mpiexec started {p} processes "
                         "(one per device; leave --devices out)")
    procs = []
    for schedule in args.schedules.split(","):
        for m in (int(v) for v in args.microbatches.split(",")):
            res = on_every_rank(lambda g, s=schedule, m=m: rank_pipeline(g, args, s, m, X, Y), group)
            bubbles = [1 - sum(r["profiled"][k][0] for r in res) / (p * max(r["profiled"][k][1] for r in res))
                       for k in range(args.profile_steps)]  # PipelineExecutor.measured_bubble's, per step
            procs.append({"schedule": res[0]["schedule"], "m": m, "t": max(r["t"] for r in res),
                          "moved": sum(r["moved"] for r in res), "model": res[0]["model"],
                          "bubble": float(np.median(bubbles)) if bubbles else float("nan"),
                          "losses": next(r["losses"] for r in res if len(r["losses"]))})
    res = on_every_rank(lambda g: rank_data_parallel(g, args, X, Y), group)
    dp_proc = {"t": max(r["t"] for r in res), "moved": sum(r["moved"] for r in res), "losses": res[0]["losses"]}
    where = _spmd.provenance(group)
    measured = _spmd.on_rank0(group, lambda: measure_threads(args, X, Y, p))
    if group.rank != 0:
        return
    t1, thrs, (t_dp, moved_dp, dp_losses), _ = measured

    def mib(n: int) -> str:
        return f"{n / 2**20:.1f}"

    rows = [["1 device", "-", f"{t1 * 1e3:.1f}", "-", "-", "1.00", "-", "-", "0", "-"]]
    for pr, th in zip(procs, thrs):
        rows.append([pr["schedule"], str(pr["m"]), f"{th['t'] * 1e3:.1f}", f"{pr['t'] * 1e3:.1f}",
                     f"{pr['t'] / th['t']:.2f}", f"{t1 / th['t']:.2f} / {t1 / pr['t']:.2f}",
                     f"{th['bubble']:.1%} / {pr['bubble']:.1%}", f"{pr['model']:.1%}",
                     mib(pr["moved"]) if mib(pr["moved"]) == mib(th["moved"]) else f"{mib(pr['moved'])} / "
                     f"{mib(th['moved'])}", _spmd.same_bits(pr["losses"], th["losses"])])
    rows.append([f"DataParallel x{p}", "-", f"{t_dp * 1e3:.1f}", f"{dp_proc['t'] * 1e3:.1f}",
                 f"{dp_proc['t'] / t_dp:.2f}", f"{t1 / t_dp:.2f} / {t1 / dp_proc['t']:.2f}", "-", "-",
                 mib(dp_proc["moved"]) if mib(dp_proc["moved"]) == mib(moved_dp) else
                 f"{mib(dp_proc['moved'])} / {mib(moved_dp)}", _spmd.same_bits(dp_proc["losses"], dp_losses)])
    table = _report.markdown_table(["schedule", "micro-batches", "threads ms / step", "processes ms / step",
                                    "processes / threads", "speed-up, threads / processes",
                                    "bubble measured, threads / processes", "schedule model",
                                    "MiB through host / step", "losses, processes vs threads"], rows)
    name = group.device.adapter_name
    body = (f"### Pipeline parallelism, threads vs MPI processes: {name}\n\n{where}\n\n{model_line(args, p)} "
            f"Processes: each rank's PipelineSchedule (DataParallel's row: DistributedDataParallel); then, in rank "
            f"0's process, PipelineExecutor and DataParallel on thread ranks over the same devices. Speed-up "
            f"against one device on the whole batch; bubble measured over {args.profile_steps} steps with every "
            f"action synchronised with its device (median). Host traffic: every rank's bytes in one step, summed "
            f"(processes first where they differ). Losses: the warm-up step's and the {args.steps} timed ones. "
            f"Target: processes / threads <= 1.0.\n\n{table}\n")
    print(body)
    _report.finish(args, f"pipeline_mpi{section_suffix(args)}:{_report.slug(name)}", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--block", choices=("linear", "scale"), default="linear",
                    help="scale: elementwise blocks that cost next to nothing, so the step measures the transfers")
    ap.add_argument("--microbatches", default="4,8", help="comma-separated micro-batch counts")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3, help="steps with per-action synchronisation")
    ap.add_argument("--devices", type=int, default=None, help="default 2; with --backend mpi, the processes")
    _spmd.add_backend_flag(ap)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)
    if args.backend == "mpi":
        main_mpi(args, X, Y)
        return
    args.devices = args.devices or 2
    t1, rows, (t_dp, moved_dp, _), devs = measure_threads(args, X, Y, args.devices)
    dev0 = wgpar.device(0)

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
    body = (f"### Pipeline parallelism: {dev0.adapter_name}\n\n"
            f"Devices: {devs}. Date: {_report.today()}. Command: `{_report.command_line()}`\n\n"
            f"{model_line(args, args.devices)} Speed-up against one device on the whole batch. Bubble measured "
            f"over {args.profile_steps} steps with every action synchronised with its device (median); the schedule "
            f"model counts F = 1, B = 2 (I = W = 1) time units and free transfers. "
            f"Host traffic: every rank's device -> host plus host -> device bytes in one step, summed.\n\n{table}\n")
    print(body)
    _report.finish(args, f"pipeline{section_suffix(args)}:{_report.slug(dev0.adapter_name)}", body)


if __name__ == "__main__":
    main()
