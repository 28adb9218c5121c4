"""Conv2d forward and forward + backward: wgpar (im2col + matmul, col2im) against PyTorch, per shape.

Shapes are ResNet-50-like layers (a 7x7 stride-2 stem, 3x3 and 1x1 convolutions, a depthwise 3x3);
``--small`` divides batch and spatial sizes by 4 so it runs on lavapipe. A timing is the mean of
``--steps`` calls after a warm-up, ended by one wait for the device; GFLOP/s counts 2 * N * O *
oh * ow * C/G * kh * kw per forward and twice that for backward (input and weight gradients). The
reference is PyTorch on CUDA (TF32 off) when available, else on the CPU; the outputs and gradients
of the first call are compared.

    python benchmarks/bench_conv.py --small
    python benchmarks/bench_conv.py              # full sizes, on a GPU
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

# name, (N, C, H, W), (O, kernel, stride, padding, groups)
SHAPES = [
    ("stem 7x7/2", (32, 3, 224, 224), (64, 7, 2, 3, 1)),
    ("3x3 64", (32, 64, 56, 56), (64, 3, 1, 1, 1)),
    ("3x3 128", (32, 128, 28, 28), (128, 3, 1, 1, 1)),
    ("3x3 256", (32, 256, 14, 14), (256, 3, 1, 1, 1)),
    ("1x1 256->64", (32, 256, 56, 56), (64, 1, 1, 0, 1)),
    ("depthwise 3x3 256", (32, 256, 28, 28), (256, 3, 1, 1, 256)),
]






def measure(conv, tensors, gy, no_grad, sync, steps: int, warmup: int) -> tuple[float, float]:
    """Seconds per forward (under ``no_grad``) and per forward + backward of ``conv(*tensors)``."""

    def fwd():
        with no_grad():
            conv(*tensors)

    def fwd_bwd():
        for t in tensors:
            t.grad = None
        conv(*tensors).backward(gy)

    return _report.timed(fwd, sync, steps, warmup=warmup), _report.timed(fwd_bwd, sync, steps, warmup=warmup)


def _rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="batch and spatial sizes / 4 (lavapipe)")
    ap.add_argument("--steps", type=int, default=5, help="timed calls per measurement")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    ap.add_argument("--no-torch", action="store_true", help="wgpar alone")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)
    torch, tdev = (None, None) if args.no_torch else _report.torch_or_none()
    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    tname = None
    if torch is not None:
        tname = (f"torch {torch.__version__} FP32 (TF32 off) on {torch.cuda.get_device_name(0)}" if tdev == "cuda"
                 else f"torch {torch.__version__} FP32 on the CPU")
        print(f"reference: {tname}")
    rng = np.random.default_rng(0)
    rows = []
    for name, (n, c, h, w), (o, k, s, p, g) in SHAPES:
        if args.small:
            n, h, w = max(n // 4, 1), max(h // 4, k), max(w // 4, k)
        x = rng.standard_normal((n, c, h, w), dtype=np.float32)
        wt = (rng.standard_normal((o, c // g, k, k), dtype=np.float32) / np.sqrt(c // g * k * k)).astype(np.float32)
        b = rng.standard_normal(o, dtype=np.float32)
        ours = [wgpar.tensor(a, device=dev, requires_grad=True) for a in (x, wt, b)]
        conv = functools.partial(lambda x, w, b, s, p, g: F.conv2d(x, w, b, s, p, 1, g), s=s, p=p, g=g)
        y = conv(*ours)
        gy = wgpar.tensor(rng.standard_normal(y.shape, dtype=np.float32), device=dev)
        y.backward(gy)
        oh, ow = y.shape[2:]
        flops = 2.0 * n * o * oh * ow * (c // g) * k * k
        wf, wfb = measure(conv, ours, gy, wgpar.no_grad, lambda: wgpar.synchronize(dev), args.steps, args.warmup)
        tf = tfb = None
        check = "-"
        if torch is not None:
            theirs = [torch.tensor(a, device=tdev, requires_grad=True) for a in (x, wt, b)]
            tconv = functools.partial(lambda x, w, b, s, p, g: torch.nn.functional.conv2d(x, w, b, s, p, 1, g),
                                      s=s, p=p, g=g)
            tgy = torch.tensor(gy.numpy(), device=tdev)
            ty = tconv(*theirs)
            ty.backward(tgy)
            pairs = [(y, ty)] + [(a.grad, t.grad) for a, t in zip(ours, theirs)]
            check = f"{max(_rel_diff(a.numpy(), t.detach().cpu().numpy()) for a, t in pairs):.0e}"
            tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
            tf, tfb = measure(tconv, theirs, tgy, torch.no_grad, tsync, args.steps, args.warmup)
        shape = f"{n}x{c}x{h}x{w} -> {o}, k{k} s{s} p{p}" + (f" g{g}" if g > 1 else "")
        row = [name, shape, f"{wf * 1e3:.2f}", f"{flops / wf / 1e9:.1f}", f"{wfb * 1e3:.2f}",
               f"{3 * flops / wfb / 1e9:.1f}", f"{tf * 1e3:.2f}" if tf else "-", f"{tfb * 1e3:.2f}" if tfb else "-",
               f"{wfb / tfb:.2f}x" if tfb else "-", check]
        rows.append(row)
        print("  ".join(row))
    ref = "torch CUDA" if tdev == "cuda" else "torch CPU" if tdev else "torch"
    table = _report.markdown_table(
        ["layer", "shape", "fwd ms", "fwd GFLOP/s", "fwd+bwd ms", "fwd+bwd GFLOP/s", f"{ref} fwd ms",
         f"{ref} fwd+bwd ms", "fwd+bwd ratio", "max rel. diff"], rows)
    print(table)
    key = f"conv:{_report.slug(dev.adapter_name)}{':small' if args.small else ''}"
    body = (f"## Conv2d, im2col + matmul ({dev.adapter_name}{', small sizes' if args.small else ''})\n\n"
            f"- device: {_report.device_line(dev)}" + (f"; reference: {tname}" if tname else "") + "\n"
            f"- date: {_report.today()}\n- command: `{_report.command_line()}`\n"
            f"- what: conv2d with bias, float32; fwd under no_grad, fwd+bwd with input, weight and bias "
            f"gradients; mean of {args.steps} calls after {args.warmup}, one wait for the device at the end. "
            f"GFLOP/s: 2 N O oh ow C/G kh kw per forward, three times that for fwd+bwd. max rel. diff: "
            f"largest difference from the reference over output and gradients, relative to the largest "
            f"value.\n\n{table}\n")
    _report.finish(args, key, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
