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

Each ``--parallel`` strategy is one function below that builds a ``Trainer`` (the step, the
evaluation, sampling and checkpoint state) on top of the same model, optimizer and schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import wgpar
from wgpar import nn, optim
from wgpar.amp import GradScaler
from wgpar.distributed import fully_shard
from wgpar.models import GPT, GPTConfig, preset
from wgpar.models.gpt import decay_groups, lm_loss, sample, untie
from wgpar.optim import lr_scheduler

# Per preset: micro-batch, steps, peak lr, warm-up steps, eval period, eval batches.
DEFAULTS = {
    "tiny": dict(batch_size=4, steps=120, lr=3e-3, warmup=10, eval_every=60, eval_iters=4),
    "small": dict(batch_size=32, steps=2000, lr=1e-3, warmup=100, eval_every=250, eval_iters=20),
    "gpt2": dict(batch_size=8, steps=5000, lr=6e-4, warmup=200, eval_every=500, eval_iters=20),
}


# -- data --------------------------------------------------------------------------------------------
def stdlib_sources() -> list[Path]:
    """Every .py file of this Python's standard library (third-party packages excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))


def load_corpus(path: str | None, max_bytes: int = 0) -> np.ndarray:
    """The corpus as bytes (uint8): ``path``, or the standard library's sources joined; at most
    ``max_bytes`` (0: all)."""
    if path:
        data = Path(path).read_bytes()
    else:
        chunks, total = [], 0
        for f in stdlib_sources():
            chunks.append(f.read_bytes())
            total += len(chunks[-1])
            if max_bytes and total >= max_bytes:
                break
        data = b"\n".join(chunks)
    if max_bytes:
        data = data[:max_bytes]
    return np.frombuffer(data, dtype=np.uint8)


def unigram_loss(train: np.ndarray, val: np.ndarray) -> float:
    """Cross-entropy (nats per byte) of ``val`` under ``train``'s byte frequencies (add-one smoothed):
    what a model that ignores context reaches."""
    counts = np.bincount(train, minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-np.mean(logp[val]))


def get_batch(data: np.ndarray, batch: int, block: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` random windows of ``block`` bytes and the same windows shifted by one (the targets)."""
    starts = rng.integers(0, len(data) - block - 1, size=batch)
    x = np.stack([data[s:s + block] for s in starts]).astype(np.int32)
    y = np.stack([data[s + 1:s + 1 + block] for s in starts]).astype(np.int32)
    return x, y


def step_batches(data: np.ndarray, args, step: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The micro-batches of training step ``step``: a function of (seed, step) alone, so a resumed run
    sees exactly the data an uninterrupted one would."""
    rng = np.random.default_rng([args.seed, step])
    return [get_batch(data, args.batch_size, args.block_size, rng) for _ in range(args.grad_accum)]


# -- what every strategy builds -------------------------------------------------------------------------
@dataclass
class Replica:
    """One rank's model (as trained: possibly wrapped, parallelized, or its pipeline stage), optimizer and
    schedule."""

    model: nn.Module
    net: nn.Module
    opt: optim.Optimizer
    sched: lr_scheduler.LRScheduler

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "sched": self.sched.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
        self.sched.load_state_dict(state["sched"])


def make_replica(model: nn.Module, args, net: nn.Module | None = None) -> Replica:
    """AdamW (decay on matrices and embeddings only, betas 0.9 / 0.95) and warm-up + cosine to min_lr."""
    opt = optim.AdamW(decay_groups(model.parameters(), args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    warm = max(1, min(args.warmup, args.steps - 1))
    sched = lr_scheduler.SequentialLR(opt, [
        lr_scheduler.LinearLR(opt, start_factor=1.0 / warm, total_iters=warm),
        lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - warm), eta_min=args.min_lr),
    ], milestones=[warm])
    return Replica(model, net if net is not None else model, opt, sched)


def build_model(cfg: GPTConfig, args, device) -> GPT:
    wgpar.manual_seed(args.seed)  # every rank's copy starts from the same weights
    return GPT(cfg, device=device)


@dataclass
class Trainer:
    """A strategy's handles: ``step(micro_batches)`` trains one step and returns a function that reads its
    mean loss back (called only when the bar is updated, so steps do not wait for the GPU);
    ``evaluate(x, y)`` a validation loss; ``generate``; the checkpoint shards (``sharded``: one per rank,
    else rank 0's alone) and the devices used."""

    step: Callable[[list], Callable[[], float]]
    evaluate: Callable[[np.ndarray, np.ndarray], float]
    generate: Callable[[np.ndarray, int, int], np.ndarray]
    replicas: list[Replica]
    scaler: GradScaler
    devices: list
    sharded: bool = False
    close: Callable[[], None] = field(default=lambda: None)
    on_resume: Callable[[int], None] = field(default=lambda step: None)


def finish_step(rep: Replica, scaler: GradScaler, args, group=None, summed: set[int] | None = None,
                counted: set[int] | None = None, clip: Callable[[], object] | None = None) -> None:
    """Unscale (AMP), clip, step (skipped on inf / NaN), advance the schedule. With a ``group`` whose
    ranks hold different parameters (tensor or pipeline parallelism), the ranks clip by the norm of the
    whole model: ``summed`` parameters' squares are summed over the ranks, ``counted``
    ones (replicated) are counted once, others (a copy another rank counts) only scaled; ``clip``, if given,
    replaces that clipping (FSDP clips over the shards itself)."""
    scaler.unscale_(rep.opt)  # ranks holding different parts of the model agree on skipping (GradScaler)
    if args.grad_clip > 0:
        params = list(rep.net.parameters())
        if clip is not None:  # the strategy's own (FSDP: the norm over every rank's shards)
            clip()
        elif group is None:
            nn.utils.clip_grad_norm_(params, args.grad_clip)
        else:
            clip_distributed(params, summed or set(), counted or set(), args.grad_clip, group)
    scaler.step(rep.opt)
    rep.sched.step()


@wgpar.no_grad()
def clip_distributed(params, summed: set[int], counted: set[int], max_norm: float, group) -> None:
    """clip_grad_norm_ over a model spread across ranks: one 4-byte all-reduce of the summed squares, so
    every rank scales by the same factor as one device holding the whole model would."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    dev = grads[0].device
    local_sq = wgpar.zeros(1, device=dev)
    once_sq = wgpar.zeros(1, device=dev)
    for p in params:
        if p.grad is not None and (id(p) in summed or id(p) in counted):
            sq = (p.grad * p.grad).sum().reshape(1)
            if id(p) in summed:
                local_sq = local_sq + sq
            else:
                once_sq = once_sq + sq
    group.all_reduce(local_sq, "sum", label="clip")
    coef = wgpar.clamp(max_norm / ((local_sq + once_sq).sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def _micro_step(net: nn.Module, x, y, scaler: GradScaler, args, n_micro: int):
    with wgpar.autocast(enabled=args.amp):
        loss = net(x, y)
    scaler.scale(loss * (1.0 / n_micro)).backward()
    return loss.detach()


# -- strategies ----------------------------------------------------------------------------------------
def single(cfg: GPTConfig, args) -> Trainer:
    """One device."""
    dev = wgpar.device(args.device)
    rep = make_replica(build_model(cfg, args, dev), args)
    scaler = GradScaler(enabled=args.amp)

    def step(micro):
        rep.opt.zero_grad()
        total = None
        for x, y in micro:
            loss = _micro_step(rep.model, x, y, scaler, args, len(micro))
            total = loss if total is None else total + loss
        finish_step(rep, scaler, args)
        scaler.update()
        return lambda: total.item() / len(micro)

    return Trainer(step, lambda x, y: _evaluate(rep.model, x, y, args), lambda p, n, s: _sample(rep.model, p, n, s),
                   [rep], scaler, [dev])


def _ranks_share_the_batch(ctx, args) -> None:
    if args.batch_size % ctx.world_size:
        raise SystemExit(f"--parallel {args.parallel}: --batch-size {args.batch_size} must divide by the "
                         f"{ctx.world_size} ranks")


def _split_batch_step(ctx, reps: list[Replica], scaler: GradScaler, args, finish: Callable[[int, Replica], None]):
    """The step of the strategies that split every micro-batch over the ranks (dp, fsdp): each rank accumulates
    its share without communicating (no_sync) until the last micro-batch, whose backward reduces the
    gradients; then ``finish(rank, replica)`` clips and steps."""
    n = ctx.world_size
    share = args.batch_size // n

    def work(r: int, micro):
        rep = reps[r]
        rep.opt.zero_grad()
        total = None
        for i, (x, y) in enumerate(micro):
            sync = rep.net.no_sync() if i < len(micro) - 1 else contextlib.nullcontext()
            with sync:
                loss = _micro_step(rep.net, x, y, scaler, args, len(micro))
            total = loss if total is None else total + loss
        finish(r, rep)
        return total

    def step(micro):
        per_rank = [[(x[r * share:(r + 1) * share], y[r * share:(r + 1) * share]) for x, y in micro]
                    for r in range(n)]
        totals = ctx.run(work, per_rank)
        scaler.update()
        return lambda: sum(t.item() for t in totals) / (len(micro) * n)  # equal shares: the batch mean

    return step


def data_parallel(cfg: GPTConfig, args) -> Trainer:
    """DistributedDataParallel: every rank a replica on its share of each micro-batch; gradients averaged
    by the bucketed all-reduce during the last micro-batch's backward (the others accumulate locally)."""
    ctx = wgpar.distributed.MultiAdapterContext(args.devices)
    _ranks_share_the_batch(ctx, args)
    models = [build_model(cfg, args, d) for d in ctx.devices]
    reps = ctx.run(lambda r: make_replica(models[r], args, wgpar.distributed.DistributedDataParallel(
        models[r], ctx.comm(r), op="mean")))
    scaler = GradScaler(enabled=args.amp)
    step = _split_batch_step(ctx, reps, scaler, args, lambda r, rep: finish_step(rep, scaler, args))
    return Trainer(step, lambda x, y: _evaluate(reps[0].model, x, y, args),
                   lambda p, k, s: _sample(reps[0].model, p, k, s), reps, scaler, ctx.devices, close=ctx.close)


def tensor_parallel(cfg: GPTConfig, args) -> Trainer:
    """Megatron tensor parallelism: each block's heads and MLP split over the ranks (one all-reduce after
    attention and one after the MLP, forward and backward); embeddings, LayerNorms and the tied output
    layer replicated; every rank sees the whole batch. Checkpoints are sharded (one file per rank)."""
    from wgpar.distributed import ColwiseParallel, RowwiseParallel, broadcast_module, parallelize_module
    from wgpar.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    ctx = wgpar.distributed.MultiAdapterContext(args.devices)
    hd = cfg.n_embd // cfg.n_head
    plan = {"blocks.*.attn.qkv": ColwiseParallel(unit=hd, chunks=3), "blocks.*.attn.out_proj": RowwiseParallel(unit=hd),
            "blocks.*.mlp.fc1": ColwiseParallel(), "blocks.*.mlp.fc2": RowwiseParallel()}
    models = [build_model(cfg, args, d) for d in ctx.devices]

    def setup(r: int):
        group = ctx.comm(r)
        broadcast_module(models[r], group)  # the replicated layers: rank 0's, whatever each rank built
        parallelize_module(models[r], group, plan, src_rank=None)
        sharded = set()
        for m in models[r].modules():
            if isinstance(m, ColumnParallelLinear):
                sharded |= {id(p) for p in m.parameters()}
            elif isinstance(m, RowParallelLinear):
                sharded.add(id(m.weight))  # its bias is replicated
        replicated = {id(p) for p in models[r].parameters()} - sharded
        return make_replica(models[r], args), sharded, replicated

    built = ctx.run(setup)
    reps = [b[0] for b in built]
    scaler = GradScaler(enabled=args.amp)

    def work(r: int, micro):
        rep = reps[r]
        rep.opt.zero_grad()
        total = None
        for x, y in micro:
            loss = _micro_step(rep.model, x, y, scaler, args, len(micro))
            total = loss if total is None else total + loss
        finish_step(rep, scaler, args, ctx.comm(r), built[r][1], built[r][2])
        return total

    def step(micro):
        totals = ctx.run(work, [micro] * ctx.world_size)
        scaler.update()
        return lambda: totals[0].item() / len(micro)  # every rank computed the same loss

    def evaluate(x, y):
        return ctx.run(lambda r: _evaluate(reps[r].model, x, y, args))[0]

    def generate(prompt, n, seed):
        return ctx.run(lambda r: _sample(reps[r].model, prompt, n, seed))[0]

    return Trainer(step, evaluate, generate, reps, scaler, ctx.devices, sharded=True, close=ctx.close)


def pipeline(cfg: GPTConfig, args) -> Trainer:
    """Pipeline parallelism: the GPT cut into one stage per rank (embeddings, blocks, final norm and output
    layer, balanced by parameter count), micro-batches streamed through them by ``--schedule``. The output
    layer on the last stage holds its own copy of the tied embedding; the two copies' gradients are summed
    after each step, so they stay equal. Checkpoints are sharded (one file per stage)."""
    from wgpar.distributed import PipelineSchedule, PipelineStage, split_module

    ctx = wgpar.distributed.MultiAdapterContext(args.devices)
    n = ctx.world_size
    if n < 2:
        raise SystemExit("--parallel pipeline needs --devices 2 or more")
    if args.batch_size < args.microbatches:
        raise SystemExit(f"--parallel pipeline: --batch-size {args.batch_size} cannot make {args.microbatches} "
                         "micro-batches")
    # Every rank builds the same GPT (same seed) on its device and keeps its own stage; the rest is freed.
    parts = [split_module(build_model(cfg, args, d).pipeline_blocks(), n)[r] for r, d in enumerate(ctx.devices)]

    def setup(r: int):
        group, part = ctx.comm(r), parts[r]
        tied_group = group.split([0, n - 1])
        tied = part[0].wte.weight if r == 0 else untie(part[-1]) if r == n - 1 else None
        pipe = PipelineSchedule(PipelineStage(part, r, n, ctx.devices[r]), group, args.microbatches, args.schedule,
                                lm_loss, seed=args.seed)
        summed = {id(p) for p in part.parameters()} - ({id(tied)} if r == n - 1 else set())
        return make_replica(part, args), pipe, tied_group, tied, summed

    built = ctx.run(setup)
    reps = [b[0] for b in built]
    scaler = GradScaler(enabled=args.amp)

    def work(r: int, micro):
        rep, pipe, tied_group, tied, summed = built[r]
        rep.opt.zero_grad()
        scale = scaler.get_scale() if args.amp else 1.0
        total = None
        for x, y in micro:  # the loss scale rides on the step's scale: the pipeline runs its own backward
            with wgpar.autocast(enabled=args.amp):
                loss = pipe.step(x if pipe.has_first else None, y if pipe.has_last else None,
                                 scale=scale / len(micro))
            if loss is not None:
                total = loss if total is None else total + loss
        if tied_group is not None:
            tied_group.all_reduce(tied.grad, "sum", label="tied embedding")
        finish_step(rep, scaler, args, ctx.comm(r), summed)
        return total, scale

    def step(micro):
        results = ctx.run(work, [micro] * n)
        scaler.update()
        total, scale = results[n - 1]
        return lambda: total.item() / scale  # the last stage holds the batch's mean loss (times the scale)

    def forward(x):  # the stages in turn on the driver thread (evaluation, sampling)
        h = x
        for r, rep in enumerate(reps):
            h = rep.model(h if r == 0 else h.to(ctx.devices[r]))
        return h

    @wgpar.no_grad()
    def evaluate(x, y):
        for rep in reps:
            rep.model.eval()
        try:
            with wgpar.autocast(enabled=args.amp):
                return float(lm_loss(forward(x), y).item())
        finally:
            for rep in reps:
                rep.model.train()

    def generate(prompt, k, seed):
        for rep in reps:
            rep.model.eval()
        try:
            return sample(forward, prompt[None, :], k, cfg.block_size, 0.8, 40, np.random.default_rng(seed))
        finally:
            for rep in reps:
                rep.model.train()

    def on_resume(step: int) -> None:
        for b in built:  # per-micro-batch random streams continue where the checkpointed run was
            b[1].steps = step * args.grad_accum

    return Trainer(step, evaluate, generate, reps, scaler, ctx.devices, sharded=True, close=ctx.close,
                   on_resume=on_resume)


def fully_sharded(cfg: GPTConfig, args) -> Trainer:
    """FSDP (FULL_SHARD): each block is one unit whose parameters, gradients and AdamW state every rank
    holds 1/N of; a block's weights are gathered right before it runs (forward, then again in backward)
    and freed right after; gradients are reduce-scattered into the shards. The embeddings and the final
    LayerNorm (the root's parameters) form one more unit."""
    ctx = wgpar.distributed.MultiAdapterContext(args.devices)
    _ranks_share_the_batch(ctx, args)
    models = [build_model(cfg, args, d) for d in ctx.devices]

    def setup(r: int) -> Replica:
        model, group = models[r], ctx.comm(r)
        for block in model.blocks:
            fully_shard(block, group)
        fully_shard(model, group)
        return make_replica(model, args)  # over model.parameters(): this rank's shards

    reps = ctx.run(setup)
    scaler = GradScaler(enabled=args.amp)
    # The shards differ per rank: agree on skipping, and clip by the whole model's norm.
    step = _split_batch_step(ctx, reps, scaler, args, lambda r, rep: finish_step(
        rep, scaler, args, ctx.comm(r), clip=lambda: rep.model.clip_grad_norm_(args.grad_clip)))

    # Every rank must run a sharded forward (each gather needs them all): the same input on each.
    def evaluate(x, y):
        return ctx.run(lambda r: _evaluate(reps[r].model, x, y, args))[0]

    def generate(prompt, k, seed):  # identical weights, logits and seeded draws: every rank samples alike
        return ctx.run(lambda r: _sample(reps[r].model, prompt, k, seed))[0]

    return Trainer(step, evaluate, generate, reps, scaler, ctx.devices, sharded=True, close=ctx.close)


STRATEGIES: dict[str, Callable[[GPTConfig, argparse.Namespace], Trainer]] = {
    "single": single,
    "dp": data_parallel,
    "tp": tensor_parallel,
    "fsdp": fully_sharded,
    "pipeline": pipeline,
}


@wgpar.no_grad()
def _evaluate(model: GPT, x: np.ndarray, y: np.ndarray, args) -> float:
    model.eval()
    try:
        with wgpar.autocast(enabled=args.amp):
            return float(model(x, y).item())
    finally:
        model.train()


def _sample(model: GPT, prompt: np.ndarray, n: int, seed: int) -> np.ndarray:
    return model.generate(prompt[None, :], n, temperature=0.8, top_k=40, rng=np.random.default_rng(seed))


# -- checkpoints -----------------------------------------------------------------------------------------
def _ckpt_path(out: Path, rank: int) -> Path:
    return out / f"ckpt-rank{rank}.safetensors"


def save_checkpoint(trainer: Trainer, out: Path, step: int, cfg: GPTConfig, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    reps = trainer.replicas if trainer.sharded else trainer.replicas[:1]
    meta = {"step": step, "config": asdict(cfg), "parallel": args.parallel, "world_size": len(trainer.replicas),
            "scaler": trainer.scaler.state_dict(), "seed": args.seed}
    for r, rep in enumerate(reps):
        wgpar.save({"meta": meta, **rep.state_dict()}, _ckpt_path(out, r))


def load_checkpoint(trainer: Trainer, out: Path, cfg: GPTConfig, args) -> int:
    """Restore every replica from ``out``; returns the step to continue from."""
    first = _ckpt_path(out, 0)
    if not first.exists():
        raise SystemExit(f"--resume: no checkpoint at {first}")
    states = []
    for r, rep in enumerate(trainer.replicas):
        path = _ckpt_path(out, r) if trainer.sharded else first
        if not path.exists():
            raise SystemExit(f"--resume: {path} is missing (a sharded checkpoint needs one file per rank)")
        states.append(wgpar.load(path, device=rep.model.device))
    meta = states[0]["meta"]
    if meta["config"] != asdict(cfg):
        raise SystemExit(f"--resume: the checkpoint's model {meta['config']} differs from this run's {asdict(cfg)}")
    if trainer.sharded and (meta["parallel"] != args.parallel or meta["world_size"] != len(trainer.replicas)):
        raise SystemExit(f"--resume: the checkpoint holds {meta['world_size']} {meta['parallel']} shards; run with "
                         f"--parallel {meta['parallel']} --devices {meta['world_size']}")
    for rep, state in zip(trainer.replicas, states):
        rep.load_state_dict(state)
    trainer.scaler.load_state_dict(meta["scaler"])
    return int(meta["step"])


# -- the run --------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(DEFAULTS), default="tiny")
    ap.add_argument("--data", help="a text file to train on (default: the standard library's sources)")
    ap.add_argument("--max-bytes", type=int, default=0, help="use at most this many bytes of the corpus (0: all)")
    ap.add_argument("--steps", type=int, help="optimizer steps (preset default)")
    ap.add_argument("--batch-size", type=int, help="sequences per micro-batch (preset default)")
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--block-size", type=int, help="context length (default: the preset's)")
    ap.add_argument("--n-layer", type=int, help="blocks (default: the preset's)")
    ap.add_argument("--n-head", type=int, help="attention heads (default: the preset's)")
    ap.add_argument("--n-embd", type=int, help="model width (default: the preset's)")
    ap.add_argument("--dropout", type=float, default=None)
    ap.add_argument("--lr", type=float, help="peak learning rate (preset default)")
    ap.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default lr / 10)")
    ap.add_argument("--warmup", type=int, help="linear warm-up steps (preset default)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm (0: off)")
    ap.add_argument("--parallel", choices=sorted(STRATEGIES), default="single")
    ap.add_argument("--devices", type=int, default=2, help="ranks for dp / tp / pipeline")
    ap.add_argument("--microbatches", type=int, help="pipeline micro-batches per micro-batch (default: --devices)")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "zb"], default="1f1b", help="pipeline schedule")
    ap.add_argument("--device", type=int, default=0, help="device index for --parallel single")
    ap.add_argument("--amp", action="store_true", help="float16 autocast with dynamic loss scaling")
    ap.add_argument("--eval-every", type=int, help="steps between validation losses (preset default)")
    ap.add_argument("--eval-iters", type=int, help="validation batches per evaluation (preset default)")
    ap.add_argument("--log-every", type=int, default=10, help="steps between loss readbacks for the bar")
    ap.add_argument("--ckpt-every", type=int, default=0, help="steps between checkpoints (0: only at the end)")
    ap.add_argument("--out", type=Path, default=Path("out-gpt"),
                    help="checkpoint directory, relative to the current directory (default: out-gpt/)")
    ap.add_argument("--no-save", action="store_true", help="write no checkpoint at the end")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    ap.add_argument("--sample-tokens", type=int, default=200, help="bytes to generate at the end (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = ap.parse_args(argv)
    for k, v in DEFAULTS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.block_size = args.block_size or preset(args.preset).block_size
    args.min_lr = args.lr / 10 if args.min_lr is None else args.min_lr
    args.microbatches = args.microbatches or args.devices
    return args


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def _peak_mib(devices) -> float:
    return max(wgpar.memory_stats(d)["peak_allocated_bytes"] for d in devices) / 2**20


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
    trainer = STRATEGIES[args.parallel](cfg, args)
    log = print if args.no_progress else (lambda *a: bar.write(" ".join(map(str, a))) if bar else print(*a))
    start = load_checkpoint(trainer, args.out, cfg, args) if args.resume else 0
    trainer.on_resume(start)
    if args.resume:
        print(f"resumed from {args.out.resolve()} at step {start} of {args.steps}")
    tokens_per_step = args.batch_size * args.block_size * args.grad_accum
    print(f"GPT {args.preset}: {cfg.num_params() / 1e6:.2f}M parameters, {cfg.n_layer} layers, {cfg.n_head} heads, "
          f"{cfg.n_embd} wide, context {cfg.block_size}; --parallel {args.parallel} on "
          f"{', '.join(str(d) for d in trainer.devices)}{'; amp float16' if args.amp else ''}")
    print(f"data: {len(data) / 1e6:.1f} MB ({'stdlib sources' if not args.data else args.data}), "
          f"{tokens_per_step} tokens per step; unigram baseline {baseline:.3f} nats/byte")
    val_rng = np.random.default_rng([args.seed, 1 << 30])  # the same validation windows at every evaluation
    val_batches = [get_batch(val, args.batch_size, args.block_size, val_rng) for _ in range(args.eval_iters)]
    result: dict = {"losses": {}, "val": {}, "baseline": baseline, "start": start}

    def evaluate(step: int) -> float:
        v = float(np.mean([trainer.evaluate(x, y) for x, y in val_batches]))
        result["val"][step] = v
        log(f"step {step}: val loss {v:.4f} (unigram baseline {baseline:.4f})")
        return v

    bar = _progress(args.steps, start, not args.no_progress)
    pending: list[tuple[int, Callable[[], float]]] = []
    t_last, n_last = time.perf_counter(), start
    try:
        for step in range(start, args.steps):
            pending.append((step + 1, trainer.step(step_batches(train, args, step))))
            done = step + 1
            if done % args.log_every == 0 or done == args.steps:
                for s, read in pending:  # the readbacks wait only for work already submitted
                    result["losses"][s] = float(read())
                pending.clear()
                now = time.perf_counter()
                rate = (done - n_last) * tokens_per_step / max(now - t_last, 1e-9)
                t_last, n_last = now, done
                stats = {"loss": f"{result['losses'][done]:.4f}", "tok/s": f"{rate:.0f}",
                         "mem": f"{_peak_mib(trainer.devices):.0f}MiB"}
                if bar:
                    bar.set_postfix(stats, refresh=False)
                else:
                    log(f"step {done}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
            if bar:
                bar.update(1)
            if args.eval_every and done % args.eval_every == 0 and done != args.steps:
                evaluate(done)
            if args.ckpt_every and done % args.ckpt_every == 0 and done != args.steps:
                save_checkpoint(trainer, args.out, done, cfg, args)
        if bar:
            bar.close()
        final = evaluate(args.steps)
        if not args.no_save:
            save_checkpoint(trainer, args.out, args.steps, cfg, args)
            print(f"checkpoint written to {args.out.resolve()} (--resume continues from it, --no-save skips it)")
        verdict = "below" if final < baseline else "NOT below"
        print(f"final val loss {final:.4f} nats/byte, {verdict} the unigram baseline {baseline:.4f} "
              f"({baseline - final:+.3f})")
        if args.sample_tokens:
            prompt = val[:16]
            out = trainer.generate(prompt, args.sample_tokens, args.seed)
            result["sample"] = bytes(out[0].astype(np.uint8)).decode("utf-8", errors="replace")
            print("sample:\n" + result["sample"])
        for d in trainer.devices:
            s = wgpar.memory_stats(d)
            print(f"{d}: peak {s['peak_allocated_bytes'] / 2**20:.1f} MiB allocated, "
                  f"{s['reserved_bytes'] / 2**20:.1f} MiB reserved")
    finally:
        trainer.close()
    result["final_val"] = result["val"][args.steps]
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
