"""GPT training throughput: wgpar against PyTorch eager running the same model in the same run.

A step is zero_grad, forward + cross-entropy loss, backward, gradient clipping (norm 1) and AdamW on a
batch of ``--batch`` x ``--context`` byte tokens (a fresh random batch per step, uploaded from host
memory as training does). tokens/s counts the tokens of the timed steps over their wall time, ended
by one wait for the GPU; peak memory is the device's peak allocation during them. Both models start
from the same weights; the first losses are printed side by side as a check. The reference is
PyTorch eager on CUDA in FP32 with TF32 off (``--amp``: torch.autocast float16 + GradScaler next to
wgpar's autocast + GradScaler) when torch with CUDA is importable, else PyTorch on the CPU, else
wgpar alone. ``--parallel dp|tp|fsdp|pipeline --devices N`` times examples/train_gpt.py's strategy instead (wgpar
only; the one-device row of the same size is the baseline).

A second table times the fused attention kernels alone (forward, forward + backward) at the model's
[batch, heads, context, head_dim] against torch's FP32 scaled_dot_product_attention.

    python benchmarks/bench_gpt.py --preset tiny --batch 4 --steps 3 --no-write          # lavapipe
    python benchmarks/bench_gpt.py --preset gpt2 --batch 8 --steps 10                     # one GPU, FP32
    python benchmarks/bench_gpt.py --preset gpt2 --batch 8 --steps 10 --amp               # one GPU, float16
    python benchmarks/bench_gpt.py --preset gpt2 --batch 16 --steps 10 --parallel dp --devices 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np  # noqa: E402
import train_gpt  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.amp import GradScaler  # noqa: E402
from wgpar.models import GPT, preset  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402
from wgpar.ops import attention as A  # noqa: E402

MIB = 2**20
TARGET_MODEL, TARGET_ATTENTION = 1.5, 2.0




def torch_gpt(torch, model: GPT, device: str):
    """The same architecture in torch (nanoGPT's layout), with ``model``'s weights."""
    tnn, tF = torch.nn, torch.nn.functional
    cfg = model.cfg

    class Attn(tnn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = tnn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
            self.out_proj = tnn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (a.view(b, t, cfg.n_head, -1).transpose(1, 2) for a in self.qkv(x).split(d, dim=2))
            y = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = tnn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
            self.fc2 = tnn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

        def forward(self, x):
            return self.fc2(tF.gelu(self.fc1(x), approximate="tanh"))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = tnn.LayerNorm(cfg.n_embd), Attn()
            self.ln_2, self.mlp = tnn.LayerNorm(cfg.n_embd), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = tnn.Embedding(cfg.block_size, cfg.n_embd)
            self.blocks = tnn.ModuleList([Block() for _ in range(cfg.n_layer)])
            self.ln_f = tnn.LayerNorm(cfg.n_embd)
            self.lm_head = tnn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    tm = TorchGPT()
    state = {k: torch.from_numpy(v.numpy()) for k, v in model.state_dict().items()}
    missing, unexpected = tm.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return tm.to(device)


def _batches(cfg, batch: int, ctx: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [train_gpt.get_batch(rng.integers(0, cfg.vocab_size, batch * ctx * 4).astype(np.uint8), batch, ctx, rng)
            for _ in range(n)]


def _wgpar_single(model: GPT, args, batches):
    """(seconds per step, peak bytes, first losses) for wgpar on one device."""
    dev = model.wte.weight.device
    opt = optim.AdamW(model.optimizer_groups(0.1), lr=1e-4, betas=(0.9, 0.95))
    scaler = GradScaler(enabled=args.amp)
    losses = []

    def step(i: int, keep: bool = False):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        with wgpar.autocast(enabled=args.amp):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if keep:
            losses.append(loss.item())

    for i in range(2):
        step(i, keep=True)
    for i in range(args.warmup):
        step(i)
    wgpar.synchronize(dev)
    wgpar.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    wgpar.synchronize(dev)
    sec = (time.perf_counter() - t0) / args.steps
    peak = wgpar.memory_stats(dev)["peak_allocated_bytes"]
    return sec, peak, losses


def _torch_single(torch, tdev, tm, args, batches):
    decay = [p for p in tm.parameters() if p.dim() >= 2]
    rest = [p for p in tm.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler(tdev, enabled=args.amp)
    losses = []

    def step(i: int, keep: bool = False):
        x, y = batches[i % len(batches)]
        x, y = torch.from_numpy(x).long().to(tdev), torch.from_numpy(y).long().to(tdev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(tdev, dtype=torch.float16, enabled=args.amp):
            loss = tm(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if keep:
            losses.append(float(loss.item()))

    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    for i in range(2):
        step(i, keep=True)
    for i in range(args.warmup):
        step(i)
    sync()
    if tdev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    sync()
    sec = (time.perf_counter() - t0) / args.steps
    peak = torch.cuda.max_memory_allocated() if tdev == "cuda" else None
    return sec, peak, losses


def _wgpar_parallel(cfg, args, batches):
    """(seconds per step, peak bytes over the devices) for examples/train_gpt.py's --parallel strategy."""
    targs = train_gpt.parse_args(["--preset", args.preset, "--parallel", args.parallel, "--devices", str(args.devices),
                                  "--batch-size", str(args.batch), "--block-size", str(args.context),
                                  "--steps", str(args.steps + args.warmup + 2), "--no-progress"]
                                 + (["--amp"] if args.amp else []))
    trainer = train_gpt.STRATEGIES[args.parallel](cfg, targs)
    try:
        reads = [trainer.step([batches[i % len(batches)]]) for i in range(args.warmup + 2)]
        reads[-1]()
        for d in trainer.devices:
            wgpar.synchronize(d)
            wgpar.reset_peak_memory_stats(d)
        t0 = time.perf_counter()
        reads = [trainer.step([batches[i % len(batches)]]) for i in range(args.steps)]
        reads[-1]()  # the last step's loss: every rank has finished
        for d in trainer.devices:
            wgpar.synchronize(d)
        sec = (time.perf_counter() - t0) / args.steps
        peak = max(wgpar.memory_stats(d)["peak_allocated_bytes"] for d in trainer.devices)
    finally:
        trainer.close()
    return sec, peak


def _attention_rows(torch, tdev, cfg, args) -> list[list[str]]:
    b, h, t = args.batch, cfg.n_head, args.context
    d = cfg.n_embd // cfg.n_head
    dev = wgpar.device(args.device)
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]
    q, k, v = (wgpar.tensor(a, device=dev, requires_grad=True) for a in arrs[:3])
    g = wgpar.tensor(arrs[3], device=dev)
    flops_fwd = 4 * b * h * t * t * d / 2  # causal: half the score matrix
    rows = []

    def w_fwd():
        with A.force_path("fused"), wgpar.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def w_both():
        with A.force_path("fused"):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    t_ref = {}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a).to(tdev).requires_grad_() for a in arrs[:3])
        tg = torch.from_numpy(arrs[3]).to(tdev)
        tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

        def t_fwd():
            with torch.no_grad():
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

        def t_both():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

        t_ref = {"forward": _report.timed(t_fwd, tsync, args.steps, 0.3, warmup=max(1, args.warmup)),
                 "forward + backward": _report.timed(t_both, tsync, args.steps, 0.3, warmup=max(1, args.warmup))}
    wsync = lambda: wgpar.synchronize(dev)  # noqa: E731
    for name, fn, mult in (("forward", w_fwd, 1.0), ("forward + backward", w_both, 3.5)):
        w = _report.timed(fn, wsync, args.steps, 0.3, warmup=max(1, args.warmup))  # >= 0.3 s: many calls
        tr = t_ref.get(name)
        ratio = w / tr if tr else None
        met = "-" if ratio is None or tdev != "cuda" else ("yes" if ratio <= TARGET_ATTENTION else "NO")
        rows.append([f"{b}x{h}x{t}x{d}", name, f"{w * 1e3:.2f}", f"{flops_fwd * mult / w / 1e12:.2f}",
                     f"{tr * 1e3:.2f}" if tr else "-", f"{ratio:.2f}x" if ratio else "-", met])
        print(f"attention {name:18s}: wgpar {w * 1e3:8.2f} ms" + (f"   torch {tr * 1e3:8.2f} ms   {ratio:.2f}x"
                                                                   if tr else ""))
    return rows




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(train_gpt.DEFAULTS), default="tiny")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--context", type=int, help="tokens per sequence (default: the preset's block size)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--amp", action="store_true", help="float16 autocast + GradScaler on both sides")
    ap.add_argument("--parallel", choices=["single", "dp", "tp", "fsdp", "pipeline"], default="single")
    ap.add_argument("--devices", type=int, default=2, help="ranks for dp / tp")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index (single)")
    ap.add_argument("--no-torch", action="store_true", help="wgpar alone")
    ap.add_argument("--no-attention", action="store_true", help="skip the attention-kernel table")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)
    cfg = preset(args.preset, block_size=args.context)
    args.context = cfg.block_size
    torch, tdev = (None, None) if (args.no_torch or args.parallel != "single") else _report.torch_or_none()
    dev = wgpar.device(args.device)
    tname = None
    if torch is not None:
        what = "AMP float16" if args.amp else "FP32 (TF32 off)"
        tname = (f"torch {torch.__version__} eager {what} on {torch.cuda.get_device_name(0)}" if tdev == "cuda"
                 else f"torch {torch.__version__} eager {what} on the CPU")
    print(f"device: {_report.device_line(dev)}" + (f"; reference: {tname}" if tname else ""))
    tokens = args.batch * args.context
    print(f"GPT {args.preset}: {cfg.num_params() / 1e6:.2f}M parameters, batch {args.batch} x context {args.context} "
          f"= {tokens} tokens per step, {cfg.flops_per_token() * tokens / 1e12:.3f} TFLOP per step"
          + (f", --parallel {args.parallel} on {args.devices} devices" if args.parallel != "single" else ""))
    batches = _batches(cfg, args.batch, args.context, 4)
    rows, losses = [], {}
    if args.parallel == "single":
        wgpar.manual_seed(0)
        model = GPT(cfg, device=dev)
        tmodel = torch_gpt(torch, model, tdev) if torch is not None else None  # the same initial weights
        sec, peak, losses["wgpar"] = _wgpar_single(model, args, batches)
        t = None
        if torch is not None:
            del model
            t, tpeak, losses["torch"] = _torch_single(torch, tdev, tmodel, args, batches)
        ratio = sec / t if t else None
        met = "-" if ratio is None or tdev != "cuda" else ("yes" if ratio <= TARGET_MODEL else "NO")
        rows.append([args.preset, "amp float16" if args.amp else "float32", f"{args.batch}x{args.context}",
                     f"{tokens / sec:.0f}", f"{sec * 1e3:.1f}", f"{peak / MIB:.0f}",
                     f"{tokens / t:.0f}" if t else "-", f"{t * 1e3:.1f}" if t else "-",
                     f"{tpeak / MIB:.0f}" if t and tpeak else "-", f"{ratio:.2f}x" if ratio else "-", met])
        print(f"wgpar: {tokens / sec:.0f} tokens/s ({sec * 1e3:.1f} ms/step), peak {peak / MIB:.0f} MiB"
              + (f"; torch: {tokens / t:.0f} tokens/s ({t * 1e3:.1f} ms/step); wgpar takes {ratio:.2f}x" if t else ""))
        print("first 2 losses (same weights and batches): " +
              "; ".join(f"{k} " + ", ".join(f"{v:.5f}" for v in vals) for k, vals in losses.items()))
        if "torch" in losses:
            diff = max(abs(a - b) / abs(b) for a, b in zip(losses["wgpar"], losses["torch"]))
            print(f"largest relative loss difference: {diff:.1e}" + ("  WARNING: they disagree" if diff > 1e-2 else ""))
    else:
        sec, peak = _wgpar_parallel(cfg, args, batches)
        rows.append([args.preset, f"{args.parallel} on {args.devices}" + (", amp" if args.amp else ""),
                     f"{args.batch}x{args.context}", f"{tokens / sec:.0f}", f"{sec * 1e3:.1f}", f"{peak / MIB:.0f}",
                     "-", "-", "-", "-", "-"])
        print(f"wgpar {args.parallel} on {args.devices}: {tokens / sec:.0f} tokens/s ({sec * 1e3:.1f} ms/step), "
              f"peak {peak / MIB:.0f} MiB per device")
    ref = "torch CUDA" if tdev == "cuda" else "torch CPU" if tdev else "torch"
    table = _report.markdown_table(
        ["preset", "precision / strategy", "batch x context", "wgpar tok/s", "wgpar ms/step", "wgpar peak MiB",
         f"{ref} tok/s", f"{ref} ms/step", f"{ref} peak MiB", "wgpar time / torch", f"<= {TARGET_MODEL}x (GPU)"], rows)
    print(table)
    att_table = ""
    if not args.no_attention and args.parallel == "single":
        att_rows = _attention_rows(None if torch is None else torch, tdev, cfg, args)
        att_table = _report.markdown_table(
            ["B x H x T x D (causal)", "pass", "wgpar fused ms", "wgpar TFLOP/s", "torch SDPA FP32 ms", "ratio",
             f"<= {TARGET_ATTENTION}x (GPU)"], att_rows)
        print(att_table)
    slug = _report.slug(dev.adapter_name)
    key = f"gpt:{slug}:{args.preset}:{args.parallel}{':amp' if args.amp else ''}"
    ref_line = f"; reference: {tname}" if tname else ""
    body = (f"## GPT training ({args.preset}, {args.parallel}{', amp' if args.amp else ''}) vs PyTorch eager "
            f"({dev.adapter_name})\n\n- device: {_report.device_line(dev)}{ref_line}"
            + f"\n- date: {_report.today()}\n- command: `{_report.command_line()}`\n"
            f"- what: {cfg.num_params() / 1e6:.2f}M-parameter GPT ({cfg.n_layer} layers, {cfg.n_head} heads, "
            f"{cfg.n_embd} wide, byte vocabulary), batch {args.batch} x context {args.context}; a step is "
            "zero_grad + forward + loss + backward + clip + AdamW with a fresh batch uploaded; "
            f"{args.steps} timed steps after {args.warmup} warm-up steps. First losses: "
            + "; ".join(f"{k} " + ", ".join(f"{v:.4f}" for v in vals) for k, vals in losses.items())
            + f". Targets (issue 14): within {TARGET_MODEL}x of PyTorch eager FP32 per step, fused attention "
              f"within {TARGET_ATTENTION}x of torch's FP32 SDPA.\n\n{table}\n"
            + (f"\n{att_table}\n" if att_table else ""))
    _report.finish(args, key, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
