"""Train a byte-level GPT on the source code of Python's standard library, on one adapter or several.

    python examples/train_gpt.py                                  # tiny preset, one device (~1 min on lavapipe)
    python examples/train_gpt.py --preset small --amp              # float16 autocast + GradScaler
    python examples/train_gpt.py --parallel dp --devices 2         # DistributedDataParallel over 2 ranks
    python examples/train_gpt.py --parallel tp --devices 2         # heads and MLP split over 2 ranks
    python examples/train_gpt.py --parallel fsdp --devices 2       # every block one FSDP unit
    python examples/train_gpt.py --parallel pipeline --devices 2   # one stage per rank, 1F1B
    python examples/train_gpt.py --data corpus.txt --steps 2000 --ckpt-every 500
    python examples/train_gpt.py --resume                          # continue from out-gpt/ exactly

Tokens are bytes (vocabulary 256), read from every ``*.py`` file of the standard library (the
directory ``sysconfig`` names, so every machine has it; ``--data FILE`` takes any text), split 90 / 10
into training and validation. Steps sample random windows, accumulate gradients over
``--grad-accum`` micro-batches, clip them, and step AdamW under a linear warm-up + cosine schedule.
The bar shows the loss, tokens/s and peak device memory; the validation loss is printed every
``--eval-every`` steps next to the unigram baseline (the loss of predicting each byte from its
frequency alone); a sample of generated text closes the run. Checkpoints (one safetensors file per
rank that holds a shard, one otherwise) resume exactly: same data, same schedule, same weights.

Each ``--parallel`` strategy builds a ``Run`` on the same model, optimizer and schedule; dp, fsdp and
pipeline hand the whole step (split, accumulation, AMP, clipping) to the library's single-controller
driver (wgpar/distributed/single_controller/).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import common  # examples/common.py: a script's own directory is on sys.path
import numpy as np
from common import Run, evaluating, get_batch, load_checkpoint, load_corpus, save_checkpoint, unigram_loss

import wgpar
from wgpar import distributed as dist
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.models import GPT, GPTConfig, preset
from wgpar.models.gpt import decay_groups, lm_loss, sample, untie
from wgpar.optim import lr_scheduler

# Per preset: micro-batch, steps, peak lr, warm-up steps, eval period, eval batches.
DEFAULTS = {
    "tiny": dict(batch_size=4, steps=120, lr=3e-3, warmup=10, eval_every=60, eval_iters=4),
    "small": dict(batch_size=32, steps=2000, lr=1e-3, warmup=100, eval_every=250, eval_iters=20),
    "gpt2": dict(batch_size=8, steps=5000, lr=6e-4, warmup=200, eval_every=500, eval_iters=20),
}


def step_batch(data: np.ndarray, args, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Training step ``step``'s batch (its ``--grad-accum`` micro-batches one after another): a function of
    (seed, step) alone, so a resumed run sees exactly the data an uninterrupted one would."""
    rng = np.random.default_rng([args.seed, step])
    micro = [get_batch(data, args.batch_size, args.block_size, rng) for _ in range(args.grad_accum)]
    return np.concatenate([x for x, _ in micro]), np.concatenate([y for _, y in micro])


# -- the strategies: each builds a Run on the same model, optimizer and schedule ----------------------------
def build_model(cfg: GPTConfig, args, device) -> GPT:
    wgpar.manual_seed(args.seed)  # every rank's copy starts from the same weights
    return GPT(cfg, device=device)


def make_optimizer(params, args) -> optim.AdamW:
    """AdamW (decay on matrices and embeddings only, betas 0.9 / 0.95)."""
    return optim.AdamW(decay_groups(params, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))


def make_schedule(opt, args) -> lr_scheduler.LRScheduler:
    """Linear warm-up, then cosine to min_lr."""
    warm = max(1, min(args.warmup, args.steps - 1))
    return lr_scheduler.SequentialLR(opt, [
        lr_scheduler.LinearLR(opt, start_factor=1.0 / warm, total_iters=warm),
        lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - warm), eta_min=args.min_lr)], milestones=[warm])


def _stepped(step: Callable, scheds: list) -> Callable:
    def train(x, y):
        loss = step(x, y)
        for s in scheds:
            s.step()
        return loss
    return train


def single_or_tp(cfg: GPTConfig, args) -> Run:
    """One device, or Megatron tensor parallelism (--parallel tp: each block's heads and MLP split over the
    ranks, the rest replicated, every rank on the whole batch): the loop a user writes, clipping over the
    model's group (sharded layers' squares summed over the ranks, replicated ones counted once)."""
    ctx = dist.MultiAdapterContext(args.devices) if args.parallel == "tp" else None
    devices = ctx.devices if ctx else [wgpar.device(args.device)]
    models = [build_model(cfg, args, d) for d in devices]
    scaler, replicated = GradScaler(enabled=args.amp), [[] for _ in devices]
    if ctx:
        hd = cfg.n_embd // cfg.n_head
        col, row = dist.ColwiseParallel, dist.RowwiseParallel
        plan = {"blocks.*.attn.qkv": col(unit=hd, chunks=3), "blocks.*.attn.out_proj": row(unit=hd),
                "blocks.*.mlp.fc1": col(), "blocks.*.mlp.fc2": row()}

        def setup(r: int) -> None:
            dist.broadcast_module(models[r], ctx.comm(r))  # the replicated layers: rank 0's
            dist.parallelize_module(models[r], ctx.comm(r), plan, src_rank=None)
            mods = list(models[r].modules())
            split = {id(p) for m in mods if isinstance(m, dist.ColumnParallelLinear) for p in m.parameters()}
            split |= {id(m.weight) for m in mods if isinstance(m, dist.RowParallelLinear)}  # its bias: replicated
            replicated[r] = [p for p in models[r].parameters() if id(p) not in split]
        ctx.run(setup)
    opts = [make_optimizer(m.parameters(), args) for m in models]

    def work(r: int, x, y):
        opts[r].zero_grad()
        total = None
        for rows in np.array_split(np.arange(len(x)), args.grad_accum):
            with wgpar.autocast(enabled=args.amp):
                loss = models[r](x[rows], y[rows]) * (len(rows) / len(x))
            scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        scaler.unscale_(opts[r])
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(models[r].parameters(), args.grad_clip, group=ctx.comm(r) if ctx else None,
                                     replicated=replicated[r])
        scaler.step(opts[r])
        return total

    def step(x, y):
        loss = ctx.run(work, [x] * ctx.world_size, [y] * ctx.world_size)[0] if ctx else work(0, x, y)
        scaler.update()
        return loss

    def on_ranks(fn):  # a tensor-parallel forward needs every rank
        return (lambda *a: ctx.run(lambda r: fn(models[r], *a))[0]) if ctx else (lambda *a: fn(models[0], *a))

    scheds = [make_schedule(o, args) for o in opts]
    return Run(_stepped(step, scheds), on_ranks(lambda m, x, y: _evaluate(m, x, y, args)),
               on_ranks(_sample), models, opts, scheds, scaler, devices, ctx, sharded=ctx is not None)


def data_or_fully_sharded(cfg: GPTConfig, args) -> Run:
    """DataParallel (every rank a replica on its share of each micro-batch, gradients summed during the last
    micro-batch's backward) or FSDP (each block one unit whose parameters, gradients and AdamW state every
    rank holds 1/N of, gathered around its use): the library's driver does the whole step."""
    ctx = dist.MultiAdapterContext(args.devices)
    model = build_model(cfg, args, ctx.devices[0])
    if args.parallel == "dp":
        wrapper = dist.DataParallel(model, ctx)
        models = wrapper.replicas
    else:
        wrapper = dist.FSDP(model, ctx, auto_wrap=lambda m, name: name.count(".") == 1 and name.startswith("blocks"))
        models = wrapper.modules
    opts = wrapper.optimizers(lambda ps: make_optimizer(ps, args))
    scaler = GradScaler(enabled=args.amp)
    scheds = [make_schedule(o, args) for o in opts]
    step = partial(wrapper.train_step, loss_fn=lm_loss, optimizers=opts, accumulate=args.grad_accum, scaler=scaler,
                   autocast=args.amp, max_norm=args.grad_clip or None)
    if args.parallel == "dp":
        return Run(_stepped(step, scheds), lambda x, y: _evaluate(models[0], x, y, args),
                   lambda p, k, s: _sample(models[0], p, k, s), models, opts, scheds, scaler, ctx.devices, ctx)
    # Every rank must run a sharded forward (each gather needs them all): the same input on each.
    return Run(_stepped(step, scheds), lambda x, y: ctx.run(lambda r: _evaluate(models[r], x, y, args))[0],
               lambda p, k, s: ctx.run(lambda r: _sample(models[r], p, k, s))[0], models, opts, scheds, scaler,
               ctx.devices, ctx, sharded=True)


def pipeline(cfg: GPTConfig, args) -> Run:
    """Pipeline parallelism (PipelineExecutor): one stage per rank, balanced by parameter count, micro-batches
    streamed by ``--schedule``. The last stage holds its own copy of the tied embedding; the two copies'
    gradients are summed after backward, so they stay equal, and clipping counts them once."""
    ctx = dist.MultiAdapterContext(args.devices)
    if ctx.world_size < 2:
        raise SystemExit("--parallel pipeline needs --devices 2 or more")
    blocks = build_model(cfg, args, ctx.devices[0]).pipeline_blocks()
    tied = [blocks[0].wte.weight, untie(blocks[-1])]
    ex = dist.PipelineExecutor(blocks, ctx, args.microbatches, args.schedule, lm_loss, seed=args.seed,
                               copies=tied[1:])
    ends = [0, ctx.world_size - 1]
    pair = dict(zip(ends, ctx.run(lambda r: ctx.comm(r).split(ends))))

    def sum_tied(r: int) -> None:
        if r in pair:
            pair[r].all_reduce(tied[ends.index(r)].grad, "sum", label="tied embedding")

    opts = ex.optimizers(lambda ps: make_optimizer(ps, args))
    scaler = GradScaler(enabled=args.amp)
    scheds = [make_schedule(o, args) for o in opts]
    step = partial(ex.train_step, optimizers=opts, accumulate=args.grad_accum, scaler=scaler, autocast=args.amp,
                   max_norm=args.grad_clip or None, after_backward=sum_tied)

    def forward(x):  # the stages in turn on the driver thread (evaluation, sampling)
        for st in ex.stages:
            x = st.module(x if isinstance(x, np.ndarray) else x.to(st.device))
        return x

    def evaluate(x, y):
        with evaluating(ex.modules, args.amp):
            return float(lm_loss(forward(x), y).item())

    def generate(prompt, k, seed):
        with evaluating(ex.modules, False):
            return sample(forward, prompt[None, :], k, cfg.block_size, 0.8, 40, np.random.default_rng(seed))

    def on_resume(step: int) -> None:  # per-micro-batch random streams continue where the run was
        for pipe in ex.ranks:
            pipe.steps = step * args.grad_accum

    return Run(_stepped(step, scheds), evaluate, generate, ex.modules, opts, scheds, scaler, ctx.devices, ctx,
               sharded=True, on_resume=on_resume)


STRATEGIES = {"single": single_or_tp, "tp": single_or_tp, "dp": data_or_fully_sharded,
              "fsdp": data_or_fully_sharded, "pipeline": pipeline}


def _evaluate(model, x, y, args) -> float:
    with evaluating([model], args.amp):
        return float(model(x, y).item())


def _sample(model: GPT, prompt: np.ndarray, n: int, seed: int) -> np.ndarray:
    return model.generate(prompt[None, :], n, temperature=0.8, top_k=40, rng=np.random.default_rng(seed))


# -- the run --------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = common.parser(__doc__)
    flag = ap.add_argument
    flag("--preset", choices=sorted(DEFAULTS), default="tiny")
    flag("--data", help="a text file to train on (default: the standard library's sources)")
    flag("--max-bytes", type=int, default=0, help="use at most this many bytes of the corpus (0: all)")
    for name, kind, what in [("steps", int, "optimizer steps"), ("batch-size", int, "sequences per micro-batch"),
                             ("lr", float, "peak learning rate"), ("warmup", int, "linear warm-up steps"),
                             ("eval-every", int, "steps between validation losses"),
                             ("eval-iters", int, "validation batches per evaluation"),
                             ("block-size", int, "context length"), ("n-layer", int, "blocks"),
                             ("n-head", int, "attention heads"), ("n-embd", int, "model width")]:
        flag(f"--{name}", type=kind, help=f"{what} (default: the preset's)")
    flag("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    flag("--dropout", type=float, default=None)
    flag("--min-lr", type=float, help="final learning rate of the cosine (default lr / 10)")
    flag("--weight-decay", type=float, default=0.1)
    flag("--grad-clip", type=float, default=1.0, help="clip the gradient norm (0: off)")
    flag("--parallel", choices=sorted(STRATEGIES), default="single")
    flag("--devices", type=int, default=2, help="ranks for dp / tp / fsdp / pipeline")
    flag("--microbatches", type=int, help="pipeline micro-batches per micro-batch (default: --devices)")
    flag("--schedule", choices=["gpipe", "1f1b", "zb"], default="1f1b", help="pipeline schedule")
    flag("--device", type=int, default=0, help="device index for --parallel single")
    flag("--amp", action="store_true", help="float16 autocast with dynamic loss scaling")
    flag("--log-every", type=int, default=10, help="steps between loss readbacks for the bar")
    flag("--ckpt-every", type=int, default=0, help="steps between checkpoints (0: only at the end)")
    flag("--out", type=Path, default=Path("out-gpt"), help="checkpoint directory")
    flag("--no-save", action="store_true", help="write no checkpoint at the end")
    flag("--resume", action="store_true", help="continue from the checkpoint in --out")
    flag("--sample-tokens", type=int, default=200, help="bytes to generate at the end (0: none)")
    flag("--seed", type=int, default=0)
    flag("--no-progress", action="store_true", help="no tqdm bar")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.block_size = args.block_size or preset(args.preset).block_size
    args.min_lr = args.lr / 10 if args.min_lr is None else args.min_lr
    args.microbatches = args.microbatches or args.devices
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the training; returns what it measured (losses by step, validation losses, baseline, sample)."""
    args = parse_args(argv)
    cfg = preset(args.preset, block_size=args.block_size, dropout=args.dropout, n_layer=args.n_layer,
                 n_head=args.n_head, n_embd=args.n_embd)
    data = load_corpus(args.data, args.max_bytes)
    if len(data) < 20 * (args.block_size + 1):
        raise SystemExit(f"the corpus has {len(data)} bytes: too few for windows of {args.block_size + 1}")
    cut = int(0.9 * len(data))
    train, val = data[:cut], data[cut:]
    baseline = unigram_loss(train, val)
    run = STRATEGIES[args.parallel](cfg, args)
    log = print if args.no_progress else (lambda msg: common.report(bar, msg))
    start = load_checkpoint(run, args.out, cfg, args) if args.resume else 0
    run.on_resume(start)
    if args.resume:
        print(f"resumed from {args.out.resolve()} at step {start} of {args.steps}")
    tokens_per_step = args.batch_size * args.block_size * args.grad_accum
    print(f"GPT {args.preset}: {cfg.num_params() / 1e6:.2f}M parameters, {cfg.n_layer} layers, {cfg.n_head} heads, "
          f"{cfg.n_embd} wide, context {cfg.block_size}; --parallel {args.parallel} on "
          f"{', '.join(str(d) for d in run.devices)}{'; amp float16' if args.amp else ''}")
    print(f"data: {len(data) / 1e6:.1f} MB ({'stdlib sources' if not args.data else args.data}), "
          f"{tokens_per_step} tokens per step; unigram baseline {baseline:.3f} nats/byte")
    val_rng = np.random.default_rng([args.seed, 1 << 30])  # the same validation windows at every evaluation
    val_batches = [get_batch(val, args.batch_size, args.block_size, val_rng) for _ in range(args.eval_iters)]
    result: dict = {"losses": {}, "val": {}, "baseline": baseline, "start": start}

    def evaluate(step: int) -> float:
        v = float(np.mean([run.evaluate(x, y) for x, y in val_batches]))
        result["val"][step] = v
        log(f"step {step}: val loss {v:.4f} (unigram baseline {baseline:.4f})")
        return v

    bar = common.progress(args.steps, not args.no_progress, initial=start)
    pending: list[tuple[int, wgpar.Tensor]] = []
    t_last, n_last = time.perf_counter(), start
    try:
        for step in range(start, args.steps):
            pending.append((step + 1, run.train(*step_batch(train, args, step))))
            done = step + 1
            if done % args.log_every == 0 or done == args.steps:
                for s, read in pending:  # the readbacks wait only for work already submitted
                    result["losses"][s] = float(read.item())
                pending.clear()
                now = time.perf_counter()
                rate = (done - n_last) * tokens_per_step / max(now - t_last, 1e-9)
                t_last, n_last = now, done
                peak = max(wgpar.memory_stats(d)["peak_allocated_bytes"] for d in run.devices)
                stats = {"loss": f"{result['losses'][done]:.4f}", "tok/s": f"{rate:.0f}", "mem": f"{peak >> 20}MiB"}
                if bar:
                    bar.set_postfix(stats, refresh=False)
                else:
                    log(f"step {done}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
            if bar:
                bar.update(1)
            if args.eval_every and done % args.eval_every == 0 and done != args.steps:
                evaluate(done)
            if args.ckpt_every and done % args.ckpt_every == 0 and done != args.steps:
                save_checkpoint(run, args.out, done, cfg, args)
        if bar:
            bar.close()
        final = evaluate(args.steps)
        if not args.no_save:
            save_checkpoint(run, args.out, args.steps, cfg, args)
            print(f"checkpoint written to {args.out.resolve()} (--resume continues from it, --no-save skips it)")
        verdict = "below" if final < baseline else "NOT below"
        print(f"final val loss {final:.4f} nats/byte, {verdict} the unigram baseline {baseline:.4f} "
              f"({baseline - final:+.3f})")
        if args.sample_tokens:
            out = run.generate(val[:16], args.sample_tokens, args.seed)
            result["sample"] = bytes(out[0].astype(np.uint8)).decode("utf-8", errors="replace")
            print("sample:\n" + result["sample"])
        for d in run.devices:
            print(common.memory_line(str(d), d))
    finally:
        if run.ctx:
            run.ctx.close()
    result["final_val"] = result["val"][args.steps]
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
