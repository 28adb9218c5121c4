"""FSDP: train an MLP whose training state is several times one device's memory limit.

    python examples/fsdp.py --devices 4 --strategy FULL_SHARD
    python examples/fsdp.py --devices 4 --offload --layers 64     # the parameters alone exceed the limit
    python examples/fsdp.py --devices 2 --width 8192 --layers 48 --memory-limit-mib 0   # a real GPU, no limit

Every rank builds the model block by block and shards each block (fully_shard) as soon as it
exists, so the whole model is never on one device; each device gets a memory limit
(wgpar.set_memory_limit) that DataParallel's full replica, gradients and AdamW moments would
exceed. The task is synthetic (labels from a fixed random linear teacher), so the loss falls. At
the end a per-device table shows what FSDP used against what DataParallel would need.
"""

from __future__ import annotations

import time

import common  # examples/common.py: a script's own directory is on sys.path
import numpy as np

import wgpar
from wgpar import nn, optim
from wgpar.distributed import MultiAdapterContext, fully_shard
from wgpar.distributed.fsdp import HostAdamW, OffloadPolicy, memory_estimate
from wgpar.nn import functional as F
from wgpar.utils.data import DataLoader, DistributedSampler, TensorDataset

MIB = common.MIB


class Block(nn.Module):
    """x + gelu(x @ W.T + b): residual, so a deep stack still trains."""

    def __init__(self, width: int, device) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width, device=device)

    def forward(self, x):
        return x + F.gelu(self.linear(x))


def build_block(width: int, layers: int, seed: int, device) -> nn.Module:
    """One block, the same values on every rank (a local generator: ranks build in parallel)."""
    block = Block(width, device)
    g = np.random.default_rng(seed)
    bound = 1 / np.sqrt(width * layers)  # the residual stream's variance stays O(1) in depth
    block.load_state_dict({"linear.weight": g.uniform(-bound, bound, (width, width)).astype(np.float32),
                           "linear.bias": g.uniform(-bound, bound, width).astype(np.float32)})
    return block


def build(group, args) -> nn.Module:
    """This rank's model: each block sharded as soon as it is built (peak: one block unsharded)."""
    kw = dict(strategy=args.strategy, persist_threshold=0, prefetch=args.prefetch,
              offload_policy=OffloadPolicy() if args.offload else None)
    blocks = []
    for i in range(args.layers):
        block = build_block(args.width, args.layers, 1000 + i, group.device)
        blocks.append(fully_shard(block, group, **kw))
    head = nn.Linear(args.width, args.classes, device=group.device)
    g = np.random.default_rng(7)
    head.load_state_dict({"weight": (g.standard_normal((args.classes, args.width)) * 0.02).astype(np.float32),
                          "bias": np.zeros(args.classes, np.float32)})
    model = nn.Sequential(*blocks, fully_shard(head, group, **kw))
    return fully_shard(model, group, **kw)


def build_parser():
    ap = common.parser(__doc__)
    ap.add_argument("--devices", type=common.at_least(1), default=4, help="ranks (logical devices on one adapter)")
    ap.add_argument("--strategy", default="FULL_SHARD",
                    choices=["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"],
                    help="what each rank keeps (HYBRID_SHARD: shard within groups, replicate across them)")
    ap.add_argument("--width", type=common.at_least(1), default=128, help="features of every block")
    ap.add_argument("--layers", type=common.at_least(1), default=16, help="residual blocks")
    ap.add_argument("--classes", type=common.at_least(2), default=10, help="output classes of the synthetic task")
    ap.add_argument("--batch", type=common.at_least(1), default=32,
                    help="samples per step over all ranks (each rank gets batch // devices)")
    ap.add_argument("--steps", type=common.at_least(1), default=30, help="training steps")
    ap.add_argument("--lr", type=common.positive_float, default=3e-3, help="AdamW's learning rate")
    ap.add_argument("--prefetch", type=common.at_least(0), default=1,
                    help="units whose gather starts ahead of the one computing")
    ap.add_argument("--offload", action="store_true", help="shards and AdamW state in host memory")
    ap.add_argument("--memory-plot", default=None, metavar="PATH",
                    help="record the last two steps' memory by category and plot it (.html, .svg, or .png "
                         "with matplotlib): shards, each unit gathered for its forward and backward, gradients")
    ap.add_argument("--memory-limit-mib", type=float, default=None,
                    help="per-device limit (default: what FSDP needs plus a margin; 0: none)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.batch < args.devices:
        ap.error(f"--batch {args.batch} cannot feed --devices {args.devices}: every rank needs a sample")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)

    ctx = MultiAdapterContext(args.devices, timeout=600)
    n = args.devices
    block_params = args.width * args.width + args.width
    params = args.layers * block_params + args.classes * (args.width + 1)
    # The estimate needs the layout only: a model of the same shapes, never trained, on a spare device.
    spare = wgpar.devices(n + 1)[n]  # one more than the context's
    shapes = nn.Sequential(*[Block(args.width, spare) for _ in range(args.layers)],
                           nn.Linear(args.width, args.classes, device=spare))
    est = memory_estimate(shapes, n, args.strategy, persist_threshold=0, prefetch=args.prefetch,
                          offload=args.offload, optimizer="adamw")
    del shapes
    wgpar.empty_cache(spare)
    activations = 8 * (-(-args.batch // n)) * args.width * 4 * args.layers  # saved per layer, with slack
    if args.memory_limit_mib is None:
        limit = int((est.total + activations + 2 * block_params * 4) * 1.3)
    else:
        limit = int(args.memory_limit_mib * MIB) or None
    if limit:
        for d in ctx.devices:
            wgpar.set_memory_limit(limit + wgpar.memory_reserved(d), d)
    print(f"{n} ranks, {args.strategy}{' + offload' if args.offload else ''}, model {params / 1e6:.2f} M "
          f"parameters ({params * 4 / MIB:.1f} MiB)")
    if limit:
        print(f"memory limit per device {limit / MIB:.1f} MiB: the parameters are {params * 4 / limit:.1f}x it, "
              f"DataParallel's parameters + gradients + AdamW moments {est.data_parallel / limit:.1f}x it")

    models = ctx.run(lambda r: build(ctx.comm(r), args))
    make_opt = HostAdamW if args.offload else optim.AdamW
    opts = [make_opt(m.parameters(), lr=args.lr) for m in models]
    for d in ctx.devices:
        wgpar.reset_peak_memory_stats(d)

    # The task: labels from a fixed random linear teacher. Each rank reads its share of every batch
    # (DistributedSampler) through its own DataLoader, which uploads the next batches to its device in
    # the background.
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((args.width, args.classes)).astype(np.float32)
    per_rank = args.batch // n
    x = rng.standard_normal((args.steps * per_rank * n, args.width)).astype(np.float32)
    data = TensorDataset(x, (x @ teacher).argmax(1).astype(np.int32))
    loaders = [iter(DataLoader(data, batch_size=per_rank, sampler=DistributedSampler(data, n, r, shuffle=False),
                               device=ctx.devices[r])) for r in range(n)]

    def step(r: int, xb, yb) -> float:
        opts[r].zero_grad()
        loss = F.cross_entropy(models[r](xb), yb)
        loss.backward()  # gradients averaged over the ranks: every rank's share is the same size
        opts[r].step()
        return ctx.comm(r).all_reduce(loss.detach().reshape(1), "mean").item()

    bar = common.progress(args.steps)
    t0 = time.perf_counter()
    first = last = None
    for i in range(args.steps):
        if args.memory_plot and i == max(0, args.steps - 2):
            wgpar.memory.record_history()
        batches = [next(it) for it in loaders]
        last = ctx.run(step, [b[0] for b in batches], [b[1] for b in batches])[0]
        first = last if first is None else first
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{last:.4f}")
        elif i % 10 == 0:
            print(f"step {i:4d}  loss {last:.4f}")
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t0
    print(f"loss {first:.4f} -> {last:.4f} in {args.steps} steps, {elapsed / args.steps * 1e3:.0f} ms per step")
    if args.memory_plot:
        wgpar.memory.record_history(enabled=False)
        path = wgpar.memory.plot(wgpar.memory.snapshot(), args.memory_plot,
                                 title=f"FSDP {args.strategy} on {n} ranks: memory by category, last steps")
        print(f"memory timeline: {path}")

    print("\nper device, MiB      allocated  peak allocated  reserved  limit  | DataParallel would need")
    for r, d in enumerate(ctx.devices):
        s = wgpar.memory_stats(d)
        lim = f"{limit / MIB:6.1f}" if limit else "     -"
        print(f"rank {r} ({d.index})        {s['allocated_bytes'] / MIB:9.2f}  {s['peak_allocated_bytes'] / MIB:14.2f}"
              f"  {s['reserved_bytes'] / MIB:8.2f}  {lim}  | {est.data_parallel / MIB:.2f} + activations")
    print(f"estimate: {est}")
    for d in ctx.devices:
        wgpar.set_memory_limit(None, d)
    ctx.close()


if __name__ == "__main__":
    main()
