"""Matmul throughput: wgpar's kernels next to NumPy float32 and (with CUDA) PyTorch, in one run.

For each shape M x K x N it times ``a @ b`` through wgpar (float32, and
float16 where the adapter has shader-f16) for each requested kernel variant,
NumPy float32 on the host, and PyTorch on CUDA when importable: FP32 with
TF32 off (the reference), FP32 with TF32 on, and FP16. Times include waiting
for the GPU. Every wgpar result is checked against a float64 product.

    python benchmarks/bench_matmul.py --sizes 256 512 1024 2048 --repeat 3
    python benchmarks/bench_matmul.py --sizes 2048 4096 8192 --shapes 4096x4096x16384 --variants auto general
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402

mm = sys.modules["wgpar.ops.matmul"]  # the module (wgpar.ops.matmul is the function)




def parse_shape(s: str) -> tuple[int, int, int]:
    parts = [int(x) for x in re.split(r"[x,]", s)]
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"shape {s!r} should be MxKxN")
    return parts[0], parts[1], parts[2]




def gflops(M: int, K: int, N: int, sec: float) -> float:
    return 2.0 * M * N * K / sec / 1e9


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def put(x: np.ndarray, transposed: bool, dev, dtype: str) -> wgpar.Tensor:
    """x on the device, stored row-major, or as the transposed view of a row-major x.T."""
    if transposed:
        return wgpar.tensor(np.ascontiguousarray(x.T), device=dev, dtype=dtype).T
    return wgpar.tensor(x, device=dev, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[256, 512, 1024], help="square sizes N (N x N @ N x N)")
    ap.add_argument("--shapes", type=parse_shape, nargs="*", default=[], help="extra shapes MxKxN")
    ap.add_argument("--repeat", type=int, default=3, help="matmuls per timed batch")
    ap.add_argument("--min-time", type=float, default=0.0, help="repeat batches until this many seconds")
    ap.add_argument("--variants", nargs="+", default=["auto"],
                    help=f"wgpar kernels: auto, general, {', '.join(mm.TILINGS)}")
    ap.add_argument("--tilings", nargs="*", default=[],
                    help="extra fast-kernel tilings to time, BMxBNxBKxTMxTN[u] (e.g. 128x128x8x8x8u)")
    ap.add_argument("--layouts", nargs="+", default=["nn"], choices=["nn", "nt", "tn", "tt"],
                    help="operand storage: n = row-major, t = transposed view of a row-major array "
                         "(nt is nn.Linear's x @ W.T)")
    ap.add_argument("--general-max", type=int, default=1 << 30,
                    help="time the (slow) general kernel only up to this many rows/cols")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    ap.add_argument("--numpy-max", type=int, default=2048, help="skip NumPy above this many rows/cols")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)

    defaults = dict(mm.TILINGS)
    extras = {t.name: t for t in map(mm.Tiling.parse, args.tilings)}
    variants = list(args.variants) + [n for n in extras if n not in args.variants]
    torch, _ = _report.torch_or_none(cuda_only=True)
    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    if torch is not None:
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    shapes = [(n, n, n) for n in args.sizes] + list(args.shapes)
    dtypes = [d for d in args.dtypes if d == "float32" or dev.has_f16]
    rng = np.random.default_rng(0)
    rows = []
    for M, K, N in shapes:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        ref: dict[str, float] = {}
        if torch is not None:
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            want = (ta.double() @ tb.double()).cpu().numpy()
            sync = torch.cuda.synchronize
            for label, tf32, dt in (("torch fp32", False, torch.float32), ("torch tf32", True, torch.float32),
                                    ("torch fp16", False, torch.float16)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                x, y = ta.to(dt), tb.to(dt)
                ref[label] = gflops(M, K, N, _report.timed(lambda x=x, y=y: x @ y, sync, args.repeat, args.min_time))
            torch.backends.cuda.matmul.allow_tf32 = False
            del ta, tb, x, y
            torch.cuda.empty_cache()
        else:
            want = a.astype(np.float64) @ b.astype(np.float64) if max(M, N, K) <= args.numpy_max else None
        if max(M, N, K) <= args.numpy_max:
            sec = _report.timed(lambda a=a, b=b: a @ b, lambda: None, args.repeat, args.min_time)
            ref["numpy fp32"] = gflops(M, K, N, sec)
        for dname in dtypes:
            for layout in args.layouts:
                wa = put(a, layout[0] == "t", dev, dname)
                wb = put(b, layout[1] == "t", dev, dname)
                for variant in variants:
                    if variant == "general" and max(M, N, K) > args.general_max:
                        continue
                    mm.TILINGS = {**defaults, **extras} if variant in extras else defaults  # auto sees the defaults
                    with mm.force_variant(None if variant == "auto" else variant):
                        chosen = mm.plan(wa.reshape(1, M, K), wb.reshape(1, K, N)).variant
                        sec = _report.timed(lambda wa=wa, wb=wb: wa @ wb, lambda: wgpar.synchronize(dev),
                                        args.repeat, args.min_time)
                        got = (wa @ wb).numpy()
                        err = rel_err(np.asarray(got, np.float64), want) if want is not None else float("nan")
                    g = gflops(M, K, N, sec)
                    base = ref.get("torch fp32")
                    pct = f"{100 * g / base:.0f}%" if base else "-"
                    print(f"{M}x{K}x{N} {dname:8s} {layout} {variant:>12s} -> {chosen:12s} {g:9.1f} GFLOP/s  "
                          f"{pct:>5s} of torch fp32   max rel err {err:.1e}")
                    rows.append([f"{M}x{K}x{N}", dname, layout,
                                 f"{variant} ({chosen})" if variant == "auto" else variant, f"{g:.0f}", pct,
                                 f"{err:.1e}"] +
                                [f"{ref[k]:.0f}" if k in ref else "-"
                                 for k in ("numpy fp32", "torch fp32", "torch tf32", "torch fp16")])
                del wa, wb
        print("  reference GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in ref.items()))
    table = _report.markdown_table(
        ["M x K x N", "dtype", "layout", "wgpar kernel", "wgpar GFLOP/s", "of torch fp32", "max rel err", "NumPy fp32",
         "torch fp32 (TF32 off)", "torch TF32", "torch fp16"], rows)
    print(table)
    slug = _report.slug(dev.adapter_name)
    tver = f"; torch {torch.__version__} on {torch.cuda.get_device_name(0)}" if torch is not None else ""
    body = (f"## Matmul GFLOP/s ({dev.adapter_name})\n\n"
            f"- device: {_report.device_line(dev)}{tver}\n- date: {_report.today()}\n"
            f"- command: `{_report.command_line()}`\n"
            f"- what: `a @ b` (layout n: row-major operand, t: transposed view), {args.repeat} back-to-back "
            f"calls then a wait for the "
            f"GPU; GFLOP/s = 2MNK / time. Error: max |wgpar - float64| / max |float64|.\n\n{table}\n")
    _report.finish(args, f"matmul:{slug}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
