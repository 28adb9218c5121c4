"""FSDP per strategy and device count, next to DataParallel on the same model.

Per configuration: ms per training step (forward, cross entropy, backward, AdamW), the peak of
allocated bytes on any device, and the bytes each rank moved through the host per step
(``group.traffic()``, sub-groups included); FULL_SHARD with prefetch off and on (what overlapping
the next unit's gather with compute buys), SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD (4+ devices),
offload, float16. Also the fixed cost of one host-staged collective (what the persistence
threshold rests on) and, with ``--largest``, the largest model each strategy trains (layers of
``--largest-width``: memory_estimate predicts the count, trials around it bisect to 5%).

Every rank builds the MLP block by block and shards each block as it is built, so no device ever
holds the whole model (DataParallel's ranks hold it whole, as they must).

    python benchmarks/bench_fsdp.py --no-write                                  # lavapipe, small
    python benchmarks/bench_fsdp.py --devices 2 --width 8192 --layers 16 --batch 4096 --steps 5 --f16  # 2 H200s
    python benchmarks/bench_fsdp.py --devices 2 --largest-only --strategies full --largest-width 8192 \\
        --largest-batch 64 --memory-limit-mib 131072 --largest-max-layers 4096 --no-write

With ``--backend mpi`` (under mpiexec, one process per device) every process runs its rank of each
strategy (the same per-rank program, ``rank_config``); rank 0's process then runs them on thread ranks
over the same devices while the others wait, and writes one table: threads and processes side by side,
the losses of every rank and step compared bit for bit, and one small collective's fixed cost on each.
Target: processes at least as fast as threads. ``--largest`` stays on threads (a process that runs out
of memory ends an MPI job); the device count is the number of processes.

    mpiexec -n 2 python benchmarks/bench_fsdp.py --backend mpi --no-write                    # lavapipe, small
    mpirun --bind-to none -n 2 python benchmarks/bench_fsdp.py --backend mpi --width 8192 --layers 8 \\
        --batch 4096 --steps 4 --f16                                                      # Open MPI, 2 GPUs
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report, _spmd  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.distributed import (  # noqa: E402
    DistributedDataParallel,
    MultiAdapterContext,
    RankError,
    fully_shard,
)
from wgpar.distributed.fsdp import (  # noqa: E402
    HostAdamW,
    MixedPrecisionPolicy,
    OffloadedShard,
    OffloadPolicy,
    memory_estimate,
)
from wgpar.distributed.fsdp.param import freed_tensor  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

MIB = 1 << 20


class Dense(nn.Module):
    """relu(x @ W.T + b), W filled with 1 / n_in and b with 0: built on the device in one kernel each (no host
    initialisation, which would dominate building a model of billions of parameters); a step's time does
    not depend on the values, and every weight gets a gradient from the second step on (the losses that
    processes and threads must agree on exercise every parameter)."""

    def __init__(self, n_in: int, n_out: int, device, relu: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(wgpar.full((n_out, n_in), 1.0 / n_in, device=device))
        self.bias = nn.Parameter(wgpar.zeros(n_out, device=device))
        self.relu = relu

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        return F.relu(y) if self.relu else y


def build(group, width: int, layers: int, classes: int, config: dict) -> nn.Module:
    """This rank's MLP; under FSDP each block is sharded as soon as it exists."""
    blocks: list[nn.Module] = []
    for _ in range(layers):
        block = Dense(width, width, group.device)
        blocks.append(fully_shard(block, group, **config["fsdp"]) if config["fsdp"] is not None else block)
    head = Dense(width, classes, group.device, relu=False)
    if config["fsdp"] is None:
        return DistributedDataParallel(nn.Sequential(*blocks, head), group, broadcast=False)
    model = nn.Sequential(*blocks, fully_shard(head, group, **config["fsdp"]))
    return fully_shard(model, group, **config["fsdp"])


def configs(n: int, f16: bool, only: set[str] | None = None) -> list[dict]:
    base = {"persist_threshold": 0}
    mp = MixedPrecisionPolicy(param_dtype=wgpar.float16, reduce_dtype=wgpar.float32)
    out = [{"key": "dp", "name": "DataParallel", "fsdp": None},
           {"key": "full0", "name": "FULL_SHARD, prefetch off", "fsdp": {**base, "prefetch": 0}},
           {"key": "full", "name": "FULL_SHARD, prefetch 1", "fsdp": {**base, "prefetch": 1}},
           {"key": "sgo", "name": "SHARD_GRAD_OP", "fsdp": {**base, "strategy": "SHARD_GRAD_OP"}},
           {"key": "no", "name": "NO_SHARD", "fsdp": {**base, "strategy": "NO_SHARD"}}]
    if n >= 4 and n % 2 == 0:
        out.append({"key": "hybrid", "name": f"HYBRID_SHARD (shards of {n // 2}, 2 replicas)",
                    "fsdp": {**base, "strategy": "HYBRID_SHARD"}, "shard": n // 2})
    out.append({"key": "offload", "name": "FULL_SHARD + offload", "fsdp": {**base, "offload_policy": OffloadPolicy()},
                "host": True})
    if f16:
        out.append({"key": "f16", "name": "FULL_SHARD + float16 gathers", "fsdp": {**base, "mp_policy": mp}})
    return [c for c in out if only is None or c["key"] in only]


def _groups_of(model) -> list:
    """Every ProcessGroup a rank's model talks over (sub-groups count their own traffic)."""
    if not hasattr(model, "fsdp_groups"):
        return [model.group]
    seen: dict[int, object] = {}
    for g in model.fsdp_groups():
        for pg in (g.comms.dp, g.comms.shard, g.comms.replicate):
            if pg is not None:
                seen[id(pg)] = pg
    return list(seen.values())


def rank_config(group, args, config: dict, X, Y, steps: int) -> dict:
    """One rank's side of a configuration: build, ``args.warmup`` warm-up steps, ``steps`` timed steps on this
    rank's rows; its time, peak memory, traffic per step and the losses of every step. Its memory goes afterwards."""
    out = _rank_config(group, args, config, X, Y, steps)
    gc.collect()  # the model's hooks and the optimizer hold cycles
    wgpar.empty_cache(group.device)
    return out


def _rank_config(group, args, config: dict, X, Y, steps: int) -> dict:
    n, r = group.world_size, group.rank
    model = build(group, args.width, args.layers, args.classes, config)
    opt = (HostAdamW if config.get("host") else optim.AdamW)(model.parameters(), lr=1e-4)
    rows = len(X) // n
    x, y = X[r * rows:(r + 1) * rows], Y[r * rows:(r + 1) * rows]
    losses = []

    def step() -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(wgpar.tensor(x, device=group.device)), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    groups = _groups_of(model)
    units = getattr(model, "fsdp_groups", list)()

    def reset() -> None:
        wgpar.reset_peak_memory_stats(group.device)
        for pg in groups:
            pg.reset_traffic()
        for g in units:
            g.offload_traffic.update(h2d_bytes=0, d2h_bytes=0)

    dt = _spmd.timed(group, step, steps, warmup=args.warmup, start=reset)  # warm-up: kernels built, buffers cached
    traffic = {"d2h_bytes": 0, "h2d_bytes": 0, "collectives": 0}
    for pg in groups:
        for k, v in pg.traffic().items():
            traffic[k] += v
    for g in units:  # offload's uploads of shards, readbacks of gradients
        for k, v in g.offload_traffic.items():
            traffic[k] += v
    return {"ms": dt * 1e3, "peak": wgpar.memory_stats(group.device)["peak_allocated_bytes"],
            "losses": np.array([v.item() for v in losses], np.float32), **{k: v / steps for k, v in traffic.items()}}


def _warmups(args) -> str:
    return "warm-up step" if args.warmup == 1 else f"{args.warmup} warm-up steps"


def run_config(ranks, args, config: dict, X, Y, steps: int) -> dict:
    """A configuration on every rank (``ranks``: a MultiAdapterContext or this process's MPI group): the
    slowest rank's step time, the largest peak, rank 0's traffic, every rank's losses (rank by step)."""
    res = _spmd.every_rank(lambda g: rank_config(g, args, config, X, Y, steps), ranks)
    return {**res[0], "ms": max(v["ms"] for v in res), "peak": max(v["peak"] for v in res),
            "losses": np.stack([v["losses"] for v in res])}


def collective_latency(group) -> float:
    """ms for one all_gather_into of 1 KiB per rank: the fixed cost of any host-staged collective."""
    x = wgpar.ones(256, device=group.device)
    out = wgpar.empty(256 * group.world_size, device=group.device)
    for _ in range(3):
        group.all_gather_into(out, x)
    group.barrier(label="timing")
    t0 = time.perf_counter()
    for _ in range(20):
        group.all_gather_into(out, x)
    return (time.perf_counter() - t0) / 20 * 1e3


def host_adamw_ms(numel: int, device) -> float:
    """ms for one HostAdamW step over ``numel`` offloaded parameters (one unit: one fused update)."""
    flat = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    shard = OffloadedShard(flat, 0, (numel,), device)
    shard.set_host_grad(np.ones(numel, np.float32), 0)
    opt = HostAdamW([shard], lr=1e-4)
    opt.step()
    t0 = time.perf_counter()
    for _ in range(5):
        opt.step()
    return (time.perf_counter() - t0) / 5 * 1e3


class _Shapes(nn.Module):
    """The MLP's parameter shapes without memory (for memory_estimate's prediction)."""

    def __init__(self, width: int, layers: int, classes: int, device) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[_ShapeDense(width, width, device) for _ in range(layers)])
        self.head = _ShapeDense(width, classes, device)


class _ShapeDense(nn.Module):
    def __init__(self, n_in: int, n_out: int, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(freed_tensor((n_out, n_in), wgpar.float32, device))
        self.bias = nn.Parameter(freed_tensor((n_out,), wgpar.float32, device))


def predicted_layers(ctx, args, config: dict, limit: int) -> int:
    """The most layers memory_estimate says fit under ``limit`` bytes (with room for bucket rounding)."""
    n, width = ctx.world_size, args.largest_width
    strategy = (config["fsdp"] or {}).get("strategy", "FULL_SHARD")
    act = 4 * width * 4 * (-(-args.largest_batch // n))  # per layer: saved input, output, relu, gradient

    def need(layers: int) -> float:
        shapes = _Shapes(width, layers, args.classes, ctx.devices[0])
        est = memory_estimate(shapes, n, strategy, auto_wrap={_ShapeDense}, persist_threshold=0,
                              offload=bool(config.get("host")), prefetch=config["fsdp"].get("prefetch", 1)
                              if config["fsdp"] else 1)
        model = est.data_parallel * 1.25 if config["fsdp"] is None else est.total  # DP adds its gradient buckets
        return (model + act * layers) * 1.25

    lo, hi = 0, 1
    while need(hi) <= limit and hi < args.largest_max_layers:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= limit else (lo, mid)
    return max(1, lo)


def largest(ctx, args, config: dict, start: int) -> tuple[int, int]:
    """(layers, parameters) of the largest MLP of --largest-width with which one step fits: trials around
    ``start`` (memory_estimate's prediction), widening until one fits and one fails, then bisecting to 5%."""
    X = np.random.default_rng(0).standard_normal((args.largest_batch, args.largest_width)).astype(np.float32)
    Y = np.zeros(args.largest_batch, np.int32)
    width = args.largest_width

    def fits(layers: int) -> bool:
        a = argparse.Namespace(**{**vars(args), "width": width, "layers": layers})
        why = ""
        try:
            run_config(ctx, a, config, X, Y, 1)
            ok = True
        except (RankError, wgpar.OutOfMemoryError) as exc:
            cause = exc.__cause__ if isinstance(exc, RankError) else exc
            if not isinstance(cause, (wgpar.OutOfMemoryError, wgpar.BindingLimitError)):
                raise
            ok = False
            why = f" ({cause})"
        gc.collect()
        ctx.reset()
        for d in ctx.devices:
            wgpar.empty_cache(d)
        print(f"  {config['name']}: {layers} layers {'fit' if ok else 'do not fit'}{why}", flush=True)
        return ok

    cap = args.largest_max_layers
    if fits(start):
        lo, hi = start, min(cap + 1, max(start + 1, start * 5 // 4))
        while hi <= cap and fits(hi):
            lo, hi = hi, min(cap + 1, hi * 3 // 2 + 1)
    else:
        lo, hi = 0, start
        probe = start * 3 // 4
        while probe >= 1 and not fits(probe):
            hi, probe = probe, probe * 2 // 3
        lo = max(probe, 0)
    while hi - lo > max(1, lo // 20):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, lo * (width * width + width) + args.classes * (width + 1)


def model_line(args) -> str:
    params = args.layers * (args.width * args.width + args.width) + args.classes * (args.width + 1)
    return (f"MLP {args.layers} x {args.width} wide ({params / 1e6:.2f} M parameters, {params * 4 / MIB:.1f} MiB), "
            f"batch {args.batch}, AdamW; each Linear a unit, every unit sharded (persist_threshold=0).")


def main_mpi(args, X, Y, only: set[str] | None) -> None:
    """Every configuration on this job's processes, then on as many thread ranks in rank 0's process."""
    group = _spmd.init_mpi()
    n = group.world_size
    if args.devices is not None and args.devices != str(n):
        raise SystemExit(f"bench_fsdp --backend mpi: --devices {args.devices}, but mpiexec started {n} processes "
                         "(one per device; leave --devices out)")
    if args.largest or args.largest_only:
        raise SystemExit("bench_fsdp: --largest needs --backend threads (a process that runs out of memory ends "
                         "an MPI job)")
    cfgs = configs(n, args.f16, only)

    def measure(ranks) -> tuple[float, list[dict]]:
        latency = max(_spmd.every_rank(collective_latency, ranks))
        return latency, [run_config(ranks, args, c, X, Y, args.steps) for c in cfgs]

    lat_proc, procs = measure(group)
    where = _spmd.provenance(group)

    def threads() -> tuple[float, list[dict]]:
        with MultiAdapterContext(n, timeout=_spmd.TIMEOUT) as ctx:
            return measure(ctx)

    measured = _spmd.on_rank0(group, threads)
    if group.rank != 0:
        return
    lat_thr, thrs = measured

    def both(p: float, t: float, fmt: str) -> str:  # one figure where processes and threads agree
        return fmt.format(p) if fmt.format(p) == fmt.format(t) else f"{fmt.format(p)} / {fmt.format(t)}"

    rows = [[c["name"], f"{t['ms']:.1f}", f"{p['ms']:.1f}", f"{p['ms'] / t['ms']:.2f}",
             both(p["peak"] / MIB, t["peak"] / MIB, "{:.2f}"),
             both(p["d2h_bytes"] / MIB, t["d2h_bytes"] / MIB, "{:.2f}"),
             both(p["h2d_bytes"] / MIB, t["h2d_bytes"] / MIB, "{:.2f}"),
             both(p["collectives"], t["collectives"], "{:.0f}"), _spmd.same_bits(p["losses"], t["losses"])]
            for c, p, t in zip(cfgs, procs, thrs)]
    table = _report.markdown_table(["strategy", "threads ms / step", "processes ms / step", "processes / threads",
                                    "peak MiB / device", "d2h MiB / step", "h2d MiB / step", "collectives / step",
                                    "losses, processes vs threads"], rows)
    name = group.device.adapter_name
    body = (f"### FSDP, threads vs MPI processes: {name}\n\n{where}\n\n{model_line(args)} {n} ranks: MPI "
            f"processes, then thread ranks on the same devices in rank 0's process. Bytes are one rank's, through "
            f"the host, per step; where processes and threads differ, the processes' figure comes first. Losses: "
            f"every rank's, of the {_warmups(args)} and the {args.steps} timed ones. One host-staged collective "
            f"(all_gather_into, 1 KiB per rank): {lat_proc:.2f} ms on processes, {lat_thr:.2f} ms on threads. "
            f"Target: processes / threads <= 1.0.\n\n{table}\n")
    print(body)
    _report.finish(args, f"fsdp_mpi:{_report.slug(name)}", body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default=None,
                    help="comma-separated device counts, e.g. 2,4 (default 2; with --backend mpi, the processes)")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps first: kernels built, staging and upload buffers made (on 2 processes "
                         "at 537 M parameters one step left DataParallel's row 1.08-1.16x threads, three 1.06-1.07x)")
    ap.add_argument("--f16", action="store_true", help="also FULL_SHARD with float16 gathers and compute")
    ap.add_argument("--strategies", default=None,
                    help="only these (comma-separated): dp, full0, full, sgo, no, hybrid, offload, f16")
    ap.add_argument("--largest", action="store_true", help="find the largest model each strategy trains")
    ap.add_argument("--largest-only", action="store_true", help="skip the step-time table")
    ap.add_argument("--largest-width", type=int, default=128)
    ap.add_argument("--largest-batch", type=int, default=8)
    ap.add_argument("--largest-max-layers", type=int, default=256, help="stop the search there")
    ap.add_argument("--largest-start", type=int, default=8,
                    help="first trial without a memory limit (with one, memory_estimate predicts it)")
    ap.add_argument("--memory-limit-mib", type=float, default=None,
                    help="per-device limit for --largest (default: 8 MiB on a CPU adapter, none on a GPU)")
    _spmd.add_backend_flag(ap)
    _report.add_report_flags(ap)
    args = ap.parse_args()
    only = set(args.strategies.split(",")) if args.strategies else None
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)
    if args.backend == "mpi":
        main_mpi(args, X, Y, only)
        return
    params = args.layers * (args.width * args.width + args.width) + args.classes * (args.width + 1)
    sections = []
    dev0 = wgpar.device(0)
    for n in (int(v) for v in (args.devices or "2").split(",")):
        with MultiAdapterContext(n, timeout=600) as ctx:
            text = f"#### {n} devices\n\n"
            if not args.largest_only:
                latency = max(_spmd.every_rank(collective_latency, ctx))
                results = [(c["name"], run_config(ctx, args, c, X, Y, args.steps)) for c in configs(n, args.f16, only)]
                dp_ms = next((r["ms"] for name, r in results if name == "DataParallel"), None)
                rows = [[name, f"{r['ms']:.1f}", f"{r['ms'] / dp_ms:.2f}" if dp_ms else "-", f"{r['peak'] / MIB:.2f}",
                         f"{r['d2h_bytes'] / MIB:.2f}", f"{r['h2d_bytes'] / MIB:.2f}", f"{r['collectives']:.0f}"]
                        for name, r in results]
                table = _report.markdown_table(["strategy", "ms / step", "vs DataParallel", "peak MiB / device",
                                                "d2h MiB / step", "h2d MiB / step", "collectives / step"], rows)
                host_ms = host_adamw_ms(-(-params // n), ctx.devices[0])
                text += (f"One host-staged collective (all_gather_into, 1 KiB per rank): {latency:.2f} ms. HostAdamW "
                         f"(offload) over one rank's {params / n / 1e6:.2f} M parameters: {host_ms:.2f} ms per step "
                         f"({params / n * 16 / host_ms / 1e6:.2f} GB/s of parameters, gradients and moments)."
                         f"\n\n{table}\n")
            if args.largest or args.largest_only:
                cpu = "cpu" in (dev0.adapter_type or "").lower()
                limit_mib = args.memory_limit_mib if args.memory_limit_mib is not None else (8 if cpu else None)
                if limit_mib:
                    for d in ctx.devices:
                        wgpar.set_memory_limit(int(limit_mib * MIB) + wgpar.memory_reserved(d), d)
                try:
                    big = []
                    for c in configs(n, False, only):
                        start = (predicted_layers(ctx, args, c, int(limit_mib * MIB)) if limit_mib
                                 else args.largest_start)
                        layers, total = largest(ctx, args, c, start)
                        sharded = c["fsdp"] is not None and c["fsdp"].get("strategy") != "NO_SHARD"
                        per_device = total / c.get("shard", n) if sharded else total
                        big.append([c["name"], str(start), str(layers), f"{total / 1e6:.1f} M",
                                    f"{per_device / 1e6:.1f} M"])
                finally:
                    for d in ctx.devices:
                        wgpar.set_memory_limit(None, d)
                limit = f"a memory limit of {limit_mib:g} MiB per device" if limit_mib else "the devices' memory"
                text += (f"\nLargest model each trains (layers of {args.largest_width} x {args.largest_width}, "
                         f"AdamW, batch {args.largest_batch}, {limit}; predicted: memory_estimate's layers):\n\n"
                         + _report.markdown_table(["strategy", "predicted", "layers", "parameters",
                                                   "parameters / device"], big) + "\n")
            sections.append(text)
            print(text, flush=True)
    devs = _report.device_line(dev0)
    body = (f"### FSDP: {dev0.adapter_name}\n\nDevices: {devs}. Date: {_report.today()}. "
            f"Command: `{_report.command_line()}`\n\n{model_line(args)} Bytes are one rank's, through the host, "
            f"per step.\n\n" + "\n".join(sections))
    _report.finish(args, f"fsdp:{_report.slug(dev0.adapter_name)}", body)


if __name__ == "__main__":
    main()
