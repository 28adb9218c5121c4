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
from benchmarks import _report  # noqa: E402
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
    """relu(x @ W.T + b) with zero-filled parameters: built on the device in one kernel each (no host
    initialisation, which would dominate building a model of billions of parameters); a step's time does
    not depend on the values."""

    def __init__(self, n_in: int, n_out: int, device, relu: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(wgpar.zeros(n_out, n_in, device=device))
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


def run_config(ctx, args, config: dict, X, Y, steps: int) -> dict:
    n = ctx.world_size
    models = ctx.run(lambda r: build(ctx.comm(r), args.width, args.layers, args.classes, config))
    make = HostAdamW if config.get("host") else optim.AdamW
    opts = [make(m.parameters(), lr=1e-4) for m in models]
    rows = len(X) // n

    def step(r: int, k: int) -> None:
        for _ in range(k):
            opts[r].zero_grad()
            F.cross_entropy(models[r](wgpar.tensor(X[r * rows:(r + 1) * rows], device=ctx.devices[r])),
                            Y[r * rows:(r + 1) * rows]).backward()
            opts[r].step()
        ctx.devices[r].synchronize()

    ctx.run(step, [1] * n)  # warm-up: kernels built, buffers cached
    for d in ctx.devices:
        wgpar.reset_peak_memory_stats(d)
    for m in models:
        for pg in _groups_of(m):
            pg.reset_traffic()
        for g in getattr(m, "fsdp_groups", list)():
            g.offload_traffic.update(h2d_bytes=0, d2h_bytes=0)
    t0 = time.perf_counter()
    ctx.run(step, [steps] * n)
    dt = (time.perf_counter() - t0) / steps
    traffic = {"d2h_bytes": 0, "h2d_bytes": 0, "collectives": 0}
    for pg in _groups_of(models[0]):
        for k, v in pg.traffic().items():
            traffic[k] += v
    for g in getattr(models[0], "fsdp_groups", list)():  # offload's uploads of shards, readbacks of gradients
        for k, v in g.offload_traffic.items():
            traffic[k] += v
    peak = max(wgpar.memory_stats(d)["peak_allocated_bytes"] for d in ctx.devices)
    models.clear()  # the closure above holds these lists: empty them so the memory goes
    opts.clear()
    gc.collect()
    for d in ctx.devices:
        wgpar.empty_cache(d)
    return {"ms": dt * 1e3, "peak": peak, **{k: v / steps for k, v in traffic.items()}}


def collective_latency(ctx) -> float:
    """ms for one all_gather_into of 1 KiB per rank: the fixed cost of any host-staged collective."""
    def f(r: int) -> float:
        g = ctx.comm(r)
        x = wgpar.ones(256, device=g.device)
        out = wgpar.empty(256 * g.world_size, device=g.device)
        for _ in range(3):
            g.all_gather_into(out, x)
        t0 = time.perf_counter()
        for _ in range(20):
            g.all_gather_into(out, x)
        return (time.perf_counter() - t0) / 20 * 1e3
    return max(ctx.run(f))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="2", help="comma-separated device counts, e.g. 2,4")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
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
    _report.add_report_flags(ap)
    args = ap.parse_args()
    only = set(args.strategies.split(",")) if args.strategies else None
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)
    params = args.layers * (args.width * args.width + args.width) + args.classes * (args.width + 1)
    sections = []
    dev0 = wgpar.device(0)
    for n in (int(v) for v in args.devices.split(",")):
        with MultiAdapterContext(n, timeout=600) as ctx:
            text = f"#### {n} devices\n\n"
            if not args.largest_only:
                latency = collective_latency(ctx)
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
            f"Command: `{_report.command_line()}`\n\nMLP {args.layers} x {args.width} wide ({params / 1e6:.2f} M "
            f"parameters, {params * 4 / MIB:.1f} MiB), batch {args.batch}, AdamW; each Linear a unit, every unit "
            f"sharded (persist_threshold=0). Bytes are one rank's, through the host, per step.\n\n"
            + "\n".join(sections))
    _report.finish(args, f"fsdp:{_report.slug(dev0.adapter_name)}", body)


if __name__ == "__main__":
    main()
