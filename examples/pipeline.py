"""Pipeline-parallel training of a deep MLP on scikit-learn's digits over several adapters (or logical devices).

    python examples/pipeline.py --devices 2 --schedule 1f1b --microbatches 4 --epochs 5

The MLP's layers are cut into stages balanced by parameter count, stage s on its rank's device
(interleaved: stages_per_rank stages per rank). Each batch is split into micro-batches that flow
through the stages as the schedule says; activations go forward and their gradients back through
the host. The example prints the schedule's timeline (its model: F = 1, B = 2 time units), trains
with a progress bar, then measures the bubble (every action synchronised with its device) next to
the schedule's, and prints per-device memory. With --timeline PATH it profiles one step and draws
each rank's actions as they ran above the schedule's model with the measured costs. On lavapipe
the devices run one after another, so the measured bubble says little there; on several GPUs it is
the real one.
"""

from __future__ import annotations

import itertools
import time

import common  # examples/common.py and train_mlp.py: a script's own directory is on sys.path
import numpy as np
from train_mlp import load_digits

import wgpar
from wgpar import nn, optim
from wgpar.distributed import MultiAdapterContext, PipelineExecutor
from wgpar.distributed.pipeline import timeline
from wgpar.nn import functional as F
from wgpar.utils.data import DataLoader, TensorDataset


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


def build_parser():
    ap = common.parser(__doc__)
    ap.add_argument("--devices", type=common.at_least(1), default=None,
                    help="pipeline ranks (default: all adapters, or 2 logical devices on a single adapter)")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved", "zb"], default="1f1b",
                    help="the pipeline schedule (zb: zero bubble, backward split into input and weight gradients)")
    ap.add_argument("--microbatches", type=common.at_least(1), default=4, help="micro-batches per batch")
    ap.add_argument("--stages-per-rank", type=common.at_least(1), default=2, help="for --schedule interleaved")
    ap.add_argument("--layers", type=common.at_least(2), default=8, help="Linear layers of the MLP")
    ap.add_argument("--width", type=common.at_least(1), default=128, help="hidden units per layer")
    ap.add_argument("--epochs", type=common.at_least(1), default=5, help="passes over the training set")
    ap.add_argument("--batch-size", type=common.at_least(1), default=64, help="samples per step")
    ap.add_argument("--lr", type=common.positive_float, default=2e-3, help="Adam's learning rate")
    ap.add_argument("--memory-plot", default=None, metavar="PATH",
                    help="record two training steps' memory by category and plot it (.html, .svg, or .png with "
                         "matplotlib): compare the activations in flight of --schedule gpipe and 1f1b")
    ap.add_argument("--timeline", default=None, metavar="PATH",
                    help="profile one step and draw each rank's actions as they ran above the schedule's model "
                         "(.html or .svg); the text grid is printed too")
    ap.add_argument("--seed", type=common.at_least(0), default=0,
                    help="seeds the weights, the train/test split and the shuffles")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.batch_size < args.microbatches:
        ap.error(f"--batch-size {args.batch_size} cannot be cut into --microbatches {args.microbatches}")
    if args.timeline and not args.timeline.lower().endswith((".html", ".htm", ".svg")):
        ap.error(f"--timeline {args.timeline}: use a .html or .svg path")  # before training, not after
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
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
    # Host batches: the executor cuts each into micro-batches and uploads them to the first stage's device.
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=args.batch_size, shuffle=True, generator=args.seed)
    steps = len(loader) - (0 < len(xtr) % args.batch_size < args.microbatches)  # less a last batch too small
    bar = common.progress(args.epochs * steps)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if bar:
            bar.set_description(f"epoch {epoch}/{args.epochs}")
        total = None
        for step, (xb, yb) in enumerate(loader, 1):
            if len(xb) < args.microbatches:  # a last batch too small to cut into micro-batches
                continue
            loss = pipe.train_step(xb, yb, opts)
            total = loss if total is None else total + loss  # on the device: no readback per step
            if bar:
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{total.item() / step:.4f}")
                bar.update(1)
        common.report(bar, f"epoch {epoch:3d}  loss {total.item() / steps:.4f}  "
                           f"test accuracy {accuracy(pipe, xte, yte) * 100:.2f}%")
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t0
    print(f"{plan.name} on {n} devices: {args.epochs * steps / elapsed:.1f} steps/s, "
          f"test accuracy {accuracy(pipe, xte, yte) * 100:.2f}%")

    if args.memory_plot:
        wgpar.memory.record_history()
        for xb, yb in itertools.islice(loader, 2):
            pipe.train_step(xb, yb, opts)
        wgpar.memory.record_history(enabled=False)
        path = wgpar.memory.plot(wgpar.memory.snapshot(), args.memory_plot,
                                 title=f"{plan.name}, {args.microbatches} micro-batches on {n} devices: memory")
        print(f"memory timeline: {path}")

    for r in pipe.ranks:  # synchronise after every action, so that its time includes the device's work
        r.profile = True
    bubbles = []
    for xb, yb in itertools.islice(loader, 5):
        pipe.train_step(xb, yb, opts)
        bubbles.append(pipe.measured_bubble())
    print(f"bubble: measured {np.median(bubbles):.1%} (median of {len(bubbles)} steps), schedule's model "
          f"{plan.bubble_fraction():.1%}")
    if args.timeline:
        xb, yb = next(iter(loader))
        with wgpar.profiler.profile() as prof:
            pipe.train_step(xb, yb, opts)
        runs = timeline.measured(prof, plan)
        print(timeline.text(plan, runs))
        path = timeline.plot(plan, runs, args.timeline,
                             title=f"{plan.name}, {args.microbatches} micro-batches on {n} devices: one step")
        print(f"pipeline timeline: {path}")
    for r, d in enumerate(ctx.devices):
        print(common.memory_line(f"rank {r}", d))
    ctx.close()


if __name__ == "__main__":
    main()
