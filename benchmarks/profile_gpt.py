"""Where a GPT training step spends its time: wgpar.profiler around bench_gpt's step, per kernel family.

Times ``--steps`` steps without the profiler, then the same steps inside ``wgpar.profiler.profile()``,
``--rounds`` times (the profiler's cost is the median ratio of the two), and writes the per-kernel
picture: each kernel family's GPU time per step and its share, achieved GFLOP/s where the kernel
reports FLOPs, the host time spent recording dispatches, and the GPU's idle time (the step's wall
time minus the GPU time of its kernels). ``--trace PATH`` also writes the Chrome / Perfetto trace of the profiled steps.

    python benchmarks/profile_gpt.py --preset tiny --batch 4 --steps 2 --no-write         # lavapipe
    python benchmarks/profile_gpt.py --preset gpt2 --batch 8 --steps 3 --trace gpt2.json   # one GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import bench_gpt  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.amp import GradScaler  # noqa: E402
from wgpar.models import GPT, preset  # noqa: E402


def _step_fn(model: GPT, batches, amp: bool = False):
    """bench_gpt's step: AdamW, gradient clipping; with ``amp`` float16 autocast and a GradScaler."""
    opt = optim.AdamW(model.optimizer_groups(0.1), lr=1e-4, betas=(0.9, 0.95))
    scaler = GradScaler(enabled=amp)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        with wgpar.autocast(enabled=amp):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    return step




def family_rows(kernels, steps: int, step_s: float) -> tuple[list[list[str]], float, float]:
    """Per kernel family: dispatches, GPU ms and share per step, GFLOP/s; and the step's GPU and host totals."""
    fam: dict[str, list[float]] = {}
    host = 0.0
    for k in kernels:
        row = fam.setdefault(k.family, [0, 0.0, 0.0, 0.0])  # count, gpu ns, flops, flops' gpu ns
        row[0] += 1
        host += k.host_dur
        if k.gpu_dur is not None:
            row[1] += k.gpu_dur
            if k.flops:
                row[2] += k.flops
                row[3] += k.gpu_dur
    gpu = sum(r[1] for r in fam.values())
    rows = []
    for name, (n, g, fl, flg) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        rows.append([name, f"{n / steps:.0f}", f"{g / steps / 1e6:.2f}", f"{100 * g / gpu:.1f}%" if gpu else "-",
                     f"{fl / flg:.1f}" if fl and flg else "-"])
    return rows, gpu / steps / 1e9, host / steps / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["tiny", "small", "gpt2"], default="tiny")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--context", type=int, help="tokens per sequence (default: the preset's block size)")
    ap.add_argument("--steps", type=int, default=3, help="steps timed, then profiled")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--rows", type=int, default=25, help="rows of the per-kernel table")
    ap.add_argument("--trace", type=Path, help="write the profiled steps' Chrome trace here")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of plain then profiled steps (medians kept)")
    ap.add_argument("--timing", choices=["kernels", "exact"], default="kernels",
                    help="the profiler's GPU timing (profile(timing=...))")
    ap.add_argument("--amp", action="store_true", help="float16 autocast + GradScaler, as bench_gpt --amp")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)
    cfg = preset(args.preset, block_size=args.context)
    dev = wgpar.device(0)
    wgpar.manual_seed(0)
    model = GPT(cfg, device=dev)
    step = _step_fn(model, bench_gpt._batches(cfg, args.batch, cfg.block_size, 4), args.amp)
    for i in range(args.warmup):
        step(i)
    def run() -> float:
        return _report.timed(lambda: [step(i) for i in range(args.steps)], lambda: wgpar.synchronize(dev),
                             warmup=0) / args.steps

    plains, profileds = [], []
    for _ in range(args.rounds):  # alternate, a fresh profile each round: the cost of a user's first one too
        plains.append(run())
        with wgpar.profiler.profile(timing=args.timing) as prof:
            profileds.append(run())
    plain, profiled = statistics.median(plains), statistics.median(profileds)
    overhead = statistics.median(b / a - 1 for a, b in zip(plains, profileds))
    rounds = ", ".join(f"{1e3 * a:.1f} / {1e3 * b:.1f}" for a, b in zip(plains, profileds))
    kernels = prof.kernels()
    rows, gpu_s, host_s = family_rows(kernels, args.steps, profileds[-1])
    idle = max(profileds[-1] - gpu_s, 0.0)
    tokens = args.batch * cfg.block_size
    summary = (f"step {plain * 1e3:.1f} ms without the profiler, {profiled * 1e3:.1f} ms with it "
               f"({100 * overhead:+.1f}%, timing={args.timing!r}; median of {args.rounds} rounds, plain / profiled "
               f"ms per round: {rounds}); in the last profile, per step: {len(kernels) / args.steps:.0f} dispatches, "
               f"GPU busy {gpu_s * 1e3:.1f} ms, GPU idle {idle * 1e3:.1f} ms ({100 * idle / profileds[-1]:.0f}%), "
               f"host recording {host_s * 1e3:.1f} ms ({host_s / max(len(kernels) / args.steps, 1) * 1e6:.1f} us "
               f"per dispatch); {tokens / plain:.0f} tokens/s")
    print(f"device: {_report.device_line(dev)}")
    print(f"GPT {args.preset}, batch {args.batch} x context {cfg.block_size}: {summary}")
    family = _report.markdown_table(["kernel family", "dispatches / step", "GPU ms / step", "share of GPU time",
                                     "GFLOP/s"], rows)
    print(family)
    table = prof.key_averages().table(sort_by="gpu_time_total", row_limit=args.rows)
    print(table)
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"wrote {args.trace}")
    amp = ", amp float16" if args.amp else ""
    key = f"profile-gpt:{_report.slug(dev.adapter_name)}:{args.preset}{':amp' if args.amp else ''}"
    body = (f"## Where the GPT step's time goes ({args.preset}{amp}, {dev.adapter_name})\n\n"
            f"- device: {_report.device_line(dev)}\n- date: {_report.today()}\n"
            f"- command: `{_report.command_line()}`\n- what: {summary}.\n\n{family}\n\n"
            f"Top kernels by GPU time (wgpar.profiler's key_averages over {args.steps} steps):\n\n"
            f"```\n{table}\n```\n")
    _report.finish(args, key, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
