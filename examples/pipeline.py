"""Pipeline-parallel training of a deep MLP on scikit-learn's digits over several adapters (or logical devices).

    python examples/pipeline.py --devices 2 --schedule 1f1b --microbatches 4 --epochs 5

The MLP's layers are cut into stages balanced by parameter count, stage s on its rank's device
(interleaved: stages_per_rank stages per rank). Each batch is split into micro-batches that flow
through the stages as the schedule says; activations go forward and their gradients back through
the host. The example prints the schedule's timeline (its model: F = 1, B = 2 time units), trains
with a progress bar, then measures the bubble (every action synchronised with its device) next to
the schedule's, and prints per-device memory. On lavapipe the devices run one after another, so
the measured bubble says little there; on several GPUs it is the real one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_mlp import load_digits  # noqa: E402

import wgpar  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.distributed import MultiAdapterContext, PipelineExecutor  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402


def deep_mlp(layers: int, width: int, device) -> list[nn.Module]:
    blocks: list[nn.Module] = [nn.Linear(64, width, device=device), nn.ReLU()]
    for _ in range(layers - 2):
        blocks += [nn.Linear(width, width, device=device), nn.ReLU()]
    return blocks + [nn.Linear(width, 10, device=device)]


@wgpar.no_grad()
def accuracy(pipe: PipelineExecutor, x: np.ndarray, y: np.ndarray) -> float:
    pipe.train(False)
    h = wgpar.tensor(x, device=pipe.stages[0].device)
    for stage in pipe.stages:  # on the driver thread, stage after stage
        h = stage.module(h.to(stage.device))
    pipe.train(True)
    return float((h.argmax(dim=1).numpy() == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=None,
                    help="pipeline ranks (default: all adapters, or 2 logical devices on a single adapter)")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved", "zb"], default="1f1b")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--stages-per-rank", type=int, default=2, help="for --schedule interleaved")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.devices or max(2, len(wgpar.adapter_names()))
    ctx = MultiAdapterContext(n)
    wgpar.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_digits(args.seed)
    pipe = PipelineExecutor(deep_mlp(args.layers, args.width, ctx.devices[0]), ctx, args.microbatches,
                            args.schedule, F.cross_entropy, stages_per_rank=args.stages_per_rank, seed=args.seed)
    plan = pipe.schedule
    print(plan.timeline())
    print(f"peak micro-batches held per stage: {plan.peak_activations()}")
    for st in pipe.stages:
        print(f"stage {st.stage_index} on rank {plan.rank_of(st.stage_index)} ({st.device}): "
              f"{sum(p.numel() for p in st.parameters())} parameters, "
              f"{', '.join(type(m).__name__ for m in st.module.children())}")

    opts = pipe.optimizers(lambda ps: optim.Adam(ps, lr=args.lr))
    rng = np.random.default_rng(args.seed)
    batches = [b for b in range(0, len(xtr), args.batch_size) if len(xtr) - b >= args.microbatches]
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=args.epochs * len(batches), unit="step", leave=False) if tqdm else None
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(xtr))
        total = None
        for start in batches:
            idx = order[start:start + args.batch_size]
            loss = pipe.train_step(xtr[idx], ytr[idx], opts)
            total = loss if total is None else total + loss  # on the device: no readback per step
            if bar:
                bar.update(1)
        msg = (f"epoch {epoch:3d}  loss {total.item() / len(batches):.4f}  "
               f"test accuracy {accuracy(pipe, xte, yte) * 100:.2f}%")
        bar.write(msg) if bar else print(msg)
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t0
    print(f"{plan.name} on {n} devices: {args.epochs * len(batches) / elapsed:.1f} steps/s, "
          f"test accuracy {accuracy(pipe, xte, yte) * 100:.2f}%")

    for r in pipe.ranks:  # synchronise after every action, so that its time includes the device's work
        r.profile = True
    bubbles = []
    for start in batches[:5]:
        idx = order[start:start + args.batch_size]
        pipe.train_step(xtr[idx], ytr[idx], opts)
        bubbles.append(pipe.measured_bubble())
    print(f"bubble: measured {np.median(bubbles):.1%} (median of {len(bubbles)} steps), schedule's model "
          f"{plan.bubble_fraction():.1%}")
    for r, d in enumerate(ctx.devices):
        s = wgpar.memory_stats(d)
        print(f"rank {r} memory: allocated={s['allocated_bytes']} peak={s['peak_allocated_bytes']} "
              f"reserved={s['reserved_bytes']}")
    ctx.close()


if __name__ == "__main__":
    main()
