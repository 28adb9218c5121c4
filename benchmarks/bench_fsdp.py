"""FSDP per strategy and device count, next to DataParallel on the same model.

Per configuration: ms per training step (forward, cross entropy, backward, AdamW), the peak of
allocated bytes on any device, and the bytes each rank moved through the host per step
(``group.traffic()``, sub-groups included); FULL_SHARD with prefetch off and on (what overlapping
the next unit's gather with compute buys), SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD (4+ devices),
offload, float16. Also the fixed cost of one host-staged collective (what the persistence
threshold rests on) and, with ``--largest``, the largest model each strategy trains (layers of
``--largest-width``, found by doubling then bisecting until a step runs out of memory).

Every rank builds the MLP block by block and shards each block as it is built, so no device ever
holds the whole model (DataParallel's ranks hold it whole, as they must).

    python benchmarks/bench_fsdp.py --no-write                                  # lavapipe, small
    python benchmarks/bench_fsdp.py --devices 2 --width 8192 --layers 16 --batch 4096 --steps 5 \\
        --largest --largest-width 8192 --memory-limit-mib 131072               # 2 H200s
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
from wgpar.distributed.fsdp import HostAdamW, MixedPrecisionPolicy, OffloadPolicy  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

MIB = 1 << 20


def build(group, width: int, layers: int, classes: int, config: dict) -> nn.Module:
    """This rank's MLP; under FSDP each block is sharded as soon as it exists."""
    blocks: list[nn.Module] = []
    for _ in range(layers):
        block = nn.Sequential(nn.Linear(width, width, device=group.device), nn.ReLU())
        blocks.append(fully_shard(block, group, **config["fsdp"]) if config["fsdp"] is not None else block)
    head = nn.Linear(width, classes, device=group.device)
    if config["fsdp"] is None:
        return DistributedDataParallel(nn.Sequential(*blocks, head), group, broadcast=False)
    model = nn.Sequential(*blocks, fully_shard(head, group, **config["fsdp"]))
    return fully_shard(model, group, **config["fsdp"])


def configs(n: int, f16: bool) -> list[dict]:
    out = [{"name": "DataParallel", "fsdp": None}]
    base = {"persist_threshold": 0}
    out.append({"name": "FULL_SHARD, prefetch off", "fsdp": {**base, "prefetch": 0}})
    out.append({"name": "FULL_SHARD, prefetch 1", "fsdp": {**base, "prefetch": 1}})
    out.append({"name": "SHARD_GRAD_OP", "fsdp": {**base, "strategy": "SHARD_GRAD_OP"}})
    out.append({"name": "NO_SHARD", "fsdp": {**base, "strategy": "NO_SHARD"}})
    if n >= 4 and n % 2 == 0:
        out.append({"name": f"HYBRID_SHARD ({n // 2} x 2)", "fsdp": {**base, "strategy": "HYBRID_SHARD"}})
    out.append({"name": "FULL_SHARD + offload", "fsdp": {**base, "offload_policy": OffloadPolicy()}, "host": True})
    if f16:
        mp = MixedPrecisionPolicy(param_dtype=wgpar.float16, reduce_dtype=wgpar.float32)
        out.append({"name": "FULL_SHARD + float16 gathers", "fsdp": {**base, "mp_policy": mp}})
    return out


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


def largest(ctx, args, config: dict) -> tuple[int, int]:
    """(layers, parameters) of the largest MLP of --largest-width with which one step fits."""
    X = np.random.default_rng(0).standard_normal((args.largest_batch, args.largest_width)).astype(np.float32)
    Y = np.zeros(args.largest_batch, np.int32)
    width = args.largest_width

    def fits(layers: int) -> bool:
        a = argparse.Namespace(**{**vars(args), "width": width, "layers": layers})
        try:
            run_config(ctx, a, config, X, Y, 1)
            return True
        except (RankError, wgpar.OutOfMemoryError) as exc:
            cause = exc.__cause__ if isinstance(exc, RankError) else exc
            if not isinstance(cause, (wgpar.OutOfMemoryError, wgpar.BindingLimitError)):
                raise
            return False
        finally:
            gc.collect()
            ctx.reset()
            for d in ctx.devices:
                wgpar.empty_cache(d)

    lo, hi = 0, 1
    while hi <= args.largest_max_layers and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, args.largest_max_layers + 1)
    while hi - lo > 1:
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
    ap.add_argument("--largest", action="store_true", help="find the largest model each strategy trains")
    ap.add_argument("--largest-width", type=int, default=128)
    ap.add_argument("--largest-batch", type=int, default=8)
    ap.add_argument("--largest-max-layers", type=int, default=64, help="stop the search there")
    ap.add_argument("--memory-limit-mib", type=float, default=None,
                    help="per-device limit for --largest (default: 8 MiB on a CPU adapter, none on a GPU)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    Y = rng.integers(0, args.classes, args.batch).astype(np.int32)
    params = args.layers * (args.width * args.width + args.width) + args.classes * (args.width + 1)
    sections = []
    dev0 = wgpar.device(0)
    for n in (int(v) for v in args.devices.split(",")):
        with MultiAdapterContext(n, timeout=600) as ctx:
            latency = collective_latency(ctx)
            results = [(c["name"], run_config(ctx, args, c, X, Y, args.steps)) for c in configs(n, args.f16)]
            dp_ms = results[0][1]["ms"]
            rows = [[name, f"{r['ms']:.1f}", f"{r['ms'] / dp_ms:.2f}", f"{r['peak'] / MIB:.2f}",
                     f"{r['d2h_bytes'] / MIB:.2f}", f"{r['h2d_bytes'] / MIB:.2f}", f"{r['collectives']:.0f}"]
                    for name, r in results]
            table = _report.markdown_table(["strategy", "ms / step", "vs DataParallel", "peak MiB / device",
                                            "d2h MiB / step", "h2d MiB / step", "collectives / step"], rows)
            text = (f"#### {n} devices\n\nOne host-staged collective (all_gather_into, 1 KiB per rank): "
                    f"{latency:.2f} ms.\n\n{table}\n")
            if args.largest:
                cpu = "cpu" in (dev0.adapter_type or "").lower()
                limit_mib = args.memory_limit_mib if args.memory_limit_mib is not None else (8 if cpu else None)
                if limit_mib:
                    for d in ctx.devices:
                        wgpar.set_memory_limit(int(limit_mib * MIB) + wgpar.memory_reserved(d), d)
                try:
                    big = []
                    for c in configs(n, False):
                        layers, total = largest(ctx, args, c)
                        sharded = c["fsdp"] is not None and c["fsdp"].get("strategy") != "NO_SHARD"
                        per_device = total / (n // 2 if "HYBRID" in c["name"] else n) if sharded else total
                        big.append([c["name"], str(layers), f"{total / 1e6:.1f} M", f"{per_device / 1e6:.1f} M"])
                        print(c["name"], big[-1], flush=True)
                finally:
                    for d in ctx.devices:
                        wgpar.set_memory_limit(None, d)
                limit = f"a memory limit of {limit_mib:g} MiB per device" if limit_mib else "the devices' memory"
                text += (f"\nLargest model each trains (layers of {args.largest_width} x {args.largest_width}, "
                         f"AdamW, batch {args.largest_batch}, {limit}):\n\n" + _report.markdown_table(
                             ["strategy", "layers", "parameters", "parameters / device"], big) + "\n")
            sections.append(text)
            print(text, flush=True)
    devs = _report.device_line(dev0)
    body = (f"### FSDP: {dev0.adapter_name}\n\nDevices: {devs}. Date: {_report.today()}. "
            f"Command: `{_report.command_line()}`\n\nMLP {args.layers} x {args.width} wide ({params / 1e6:.2f} M "
            f"parameters, {params * 4 / MIB:.1f} MiB), batch {args.batch}, AdamW; each Linear a unit, every unit "
            f"sharded (persist_threshold=0). Bytes are one rank's, through the host, per step.\n\n"
            + "\n".join(sections))
    if not args.no_write:
        _report.write_section(f"fsdp:{_report.slug(dev0.adapter_name)}", body)


if __name__ == "__main__":
    main()
