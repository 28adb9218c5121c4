"""The GEMMs of a GPT-2 training step, one by one: wgpar's kernels next to torch FP32 on the same GPU.

A GPT-2 (d 768, 12 layers, byte vocabulary 256) step on batch 8 x 1024 tokens runs 147 matmuls: per
layer qkv 768->2304, attention out 768->768, MLP 768->3072->768, and the tied lm_head 768->256 once.
nn.Linear runs ``x @ W.T`` (layout nt); backward runs dX = g @ W (nn) and dW = g^T @ x (tn, K = 8192
tokens), as F.linear's node computes them. For each shape this times wgpar's automatic choice and any
forced ``--variants`` / ``--splits``,
torch FP32 (TF32 off) on the same operand layouts, and checks every wgpar result against torch float64.
The summary weighs each shape by how often the step runs it.

    python benchmarks/bench_gpt_gemms.py --no-write                      # lavapipe: --tokens 256 keeps it short
    python benchmarks/bench_gpt_gemms.py --variants auto tile64x128x16r8x8u --splits 1 2 4 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from benchmarks.bench_matmul import parse_shape, put  # noqa: E402

mm = sys.modules["wgpar.ops.matmul"]  # the module (wgpar.ops.matmul is the function)


def gpt_shapes(tokens: int, d: int, vocab: int) -> list[tuple[str, int, int, int, str, int]]:
    """(name, M, K, N, layout, dispatches per step) of every GEMM in a GPT-2 step."""
    rows = []
    for name, fin, fout, per_step in (("qkv", d, 3 * d, 12), ("attn out", d, d, 12), ("mlp fc", d, 4 * d, 12),
                                      ("mlp proj", 4 * d, d, 12), ("lm_head", d, vocab, 1)):
        rows += [(f"{name} fwd", tokens, fin, fout, "nt", per_step),
                 (f"{name} dX", tokens, fout, fin, "nn", per_step),
                 (f"{name} dW", fout, tokens, fin, "tn", per_step)]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="batch x sequence (M of fwd / dX, K of dW)")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--extra", type=parse_shape, nargs="*", default=[],
                    help="more shapes MxKxN (e.g. not multiples of the tile), run as nn and nt")
    ap.add_argument("--only", nargs="*", default=[], help="keep GPT shapes whose name contains one of these")
    ap.add_argument("--variants", nargs="+", default=["auto"], help=f"auto, general, {', '.join(mm.TILINGS)}")
    ap.add_argument("--tilings", nargs="*", default=[], help="extra tilings BMxBNxBKxTMxTN[u][d] to time")
    ap.add_argument("--splits", type=int, nargs="*", default=[], help="forced split-K factors to time")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--min-time", type=float, default=0.2)
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)

    torch, _ = _report.torch_or_none(cuda_only=True)
    dev = wgpar.device(0)
    print(f"device: {_report.device_line(dev)}")
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    defaults = mm.TILINGS  # never changed: auto rows plan with it, and it is put back after
    extras = {t.name: t for t in map(mm.Tiling.parse, args.tilings)}
    variants = list(args.variants) + [n for n in extras if n not in args.variants]
    try:
        return _run(args, torch, dev, variants, defaults, extras)
    finally:
        mm.TILINGS = defaults


def _run(args, torch, dev, variants: list[str], defaults: dict, extras: dict) -> int:
    """Time every shape: "auto" rows plan among the library's own tilings (``defaults``), forced variants
    may also name the ``--tilings`` extras (made candidates of auto, they would relabel its rows)."""
    shapes = [s for s in gpt_shapes(args.tokens, args.d, args.vocab)
              if not args.only or any(o in s[0] for o in args.only)]
    shapes += [(f"extra {lay}", M, K, N, lay, 0) for M, K, N in args.extra for lay in ("nn", "nt")]
    rng = np.random.default_rng(0)
    rows, summary = [], {"wgpar": 0.0, "torch": 0.0}
    for name, M, K, N, lay, per_step in shapes:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        flop = 2.0 * M * N * K
        t_torch, want = None, None
        if torch is not None:
            ta, tb = (torch.from_numpy(np.ascontiguousarray(x.T)).cuda().T if t == "t" else torch.from_numpy(x).cuda()
                      for x, t in zip((a, b), lay))
            want = (ta.double() @ tb.double()).cpu().numpy()
            t_torch = _report.timed(lambda ta=ta, tb=tb: ta @ tb, torch.cuda.synchronize, args.repeat, args.min_time)
            del ta, tb
        elif max(M, N, K) <= 2048:
            want = a.astype(np.float64) @ b
        wa, wb = put(a, lay[0] == "t", dev, "float32"), put(b, lay[1] == "t", dev, "float32")
        runs = [(v, None) for v in variants] + [(v, s) for v in variants if v != "general" for s in args.splits]
        best_auto = None
        for variant, split in runs:
            force = None if variant == "auto" else variant
            mm.TILINGS = defaults if force is None else {**defaults, **extras}
            with mm.force_variant(force) if split is None else mm.force_variant(force, split=split):
                p = mm.plan(wa.reshape(1, M, K), wb.reshape(1, K, N))
                chosen = p.variant + (f"/k{p.split}" if getattr(p, "split", 1) > 1 else "")
                sec = _report.timed(lambda wa=wa, wb=wb: wa @ wb, lambda: wgpar.synchronize(dev), args.repeat,
                                args.min_time)
                got = (wa @ wb).numpy().astype(np.float64)
            err = float(np.abs(got - want).max() / np.abs(want).max()) if want is not None else float("nan")
            tf = flop / sec / 1e12
            ratio = f"{100 * t_torch / sec:.0f}%" if t_torch else "-"
            label = variant + (f" k{split}" if split else "")
            print(f"{name:14s} {M}x{K}x{N} {lay} {label:>26s} -> {chosen:24s} {tf:6.2f} TFLOP/s {ratio:>5s} "
                  f"of torch ({flop / t_torch / 1e12 if t_torch else float('nan'):.2f})  err {err:.1e}", flush=True)
            if variant == "auto" and split is None:
                best_auto = sec
                rows.append([name, f"{M}x{K}x{N}", lay, chosen, f"{tf:.1f}",
                             f"{flop / t_torch / 1e12:.1f}" if t_torch else "-", ratio, f"{err:.1e}", str(per_step)])
        if best_auto is not None and t_torch:
            summary["wgpar"] += per_step * best_auto
            summary["torch"] += per_step * t_torch
        del wa, wb
    table = _report.markdown_table(["GEMM", "M x K x N", "layout", "wgpar kernel (auto)", "wgpar TFLOP/s",
                                    "torch FP32 TFLOP/s", "of torch", "max rel err vs torch fp64", "per step"], rows)
    print(table)
    line = ""
    if summary["torch"]:
        line = (f"Per step (each shape times its dispatches): wgpar {1e3 * summary['wgpar']:.1f} ms, torch FP32 "
                f"{1e3 * summary['torch']:.1f} ms ({100 * summary['torch'] / summary['wgpar']:.0f}%).")
        print(line)
    slug = _report.slug(dev.adapter_name)
    tver = f"; torch {torch.__version__}, TF32 off" if torch is not None else ""
    body = (f"## GPT-2 step GEMMs ({dev.adapter_name})\n\n- device: {_report.device_line(dev)}{tver}\n"
            f"- date: {_report.today()}\n- command: `{_report.command_line()}`\n"
            f"- what: each matmul of a GPT-2 step (batch 8 x 1024 tokens), float32, wgpar's automatic "
            f"choice; layout t = a transposed view, as nn.Linear and its backward pass them.\n\n"
            f"{table}\n\n{line}\n")
    _report.finish(args, f"gpt_gemms:{slug}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
