"""Attention sweep: wgpar's fused kernels (forward, forward + backward) per shape and per tile
configuration against torch's FP32 scaled_dot_product_attention, with outputs and gradients checked
against torch (CUDA, TF32 off) or a float64 NumPy reference (small shapes, no torch).

    python benchmarks/bench_attention.py                       # the default shapes, default tiles
    python benchmarks/bench_attention.py --shapes 8x12x1024x64 --configs "fwd=128x16;fwd=64x32,cv=2,unroll=0"
    python benchmarks/bench_attention.py --dtype float16        # float16 q, k, v against torch FP32 (and FP16)

Each timing is the median of 5 means over enough steps for about --seconds of work, after a warm-up, with the
device synchronised before and after (wgpar.synchronize, torch.cuda.synchronize). With --dtype
float16 wgpar's inputs and gradients are float16; the reference and torch's baseline stay FP32 on the
float16-rounded inputs (the issue's bar), and torch's float16 SDPA (tensor cores) is timed beside them.
Writes the rows as JSON with --json, and as the BENCHMARKS.md section "attention-<dtype>:<device>"
(--md / --no-write as every benchmark script).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402
from wgpar.ops import attention as A  # noqa: E402

DEFAULT_SHAPES = "8x12x128x64,8x12x512x64,8x12x1024x64,4x12x2048x64,8x12x1024x128,4x8x2048x128"


def _config(text: str) -> dict:
    """'fwd=64x32,dq=32x32,cv=2,unroll=0' -> force_tiles keywords ('' is the default choice)."""
    out: dict = {}
    for item in filter(None, text.split(",")):
        key, val = item.split("=")
        out[key] = int(val) if key == "cv" else bool(int(val)) if key == "unroll" else val
    return out


def _timed(fn, sync, seconds: float, rounds: int = 5) -> float:
    """Seconds per call: the median of ``rounds`` means over a number of calls (3 to 50) chosen from one
    timed call to take about ``seconds``."""
    one = max(_report.timed(fn, sync), 1e-6)
    return _report.timed(fn, sync, int(min(50, max(3, seconds / one))), warmup=0, rounds=rounds)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _reference(torch, arrs, causal):
    """(out, dq, dk, dv) in float32 from torch on CUDA, or float64 NumPy without torch."""
    if torch is not None and torch.cuda.is_available():
        tq, tk, tv = (torch.from_numpy(a).cuda().requires_grad_() for a in arrs[:3])
        y = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        y.backward(torch.from_numpy(arrs[3]).cuda())
        return [t.detach().cpu().numpy() for t in (y, tq.grad, tk.grad, tv.grad)]
    from tests.helpers import np_sdpa

    y, grads = np_sdpa(*arrs, causal=causal)
    return [y, *grads]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="B x H x T x D, comma-separated")
    ap.add_argument("--causal", default="1,0", help="1 (causal), 0 or both")
    ap.add_argument("--configs", default="", help="tile configurations separated by ';' (see _config)")
    ap.add_argument("--seconds", type=float, default=0.3, help="timed work per measurement")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="wgpar's q, k, v")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--json", default="")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)
    torch = None
    if not args.no_torch:
        try:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except ImportError:
            torch = None
    cuda = torch is not None and torch.cuda.is_available()
    dev = wgpar.device(0)
    print(f"device: {dev.adapter_name} ({dev.backend}, {dev.adapter_type}); torch: "
          f"{torch.cuda.get_device_name() if cuda else '-'}", flush=True)
    wsync = lambda: wgpar.synchronize(dev)  # noqa: E731
    rows = []
    for shape in args.shapes.split(","):
        b, h, t, d = (int(x) for x in shape.split("x"))
        rng = np.random.default_rng(0)
        # float16 runs see the same values as their float32 reference: rounded to float16 first.
        arrs = [rng.standard_normal((b, h, t, d)).astype(args.dtype).astype(np.float32) for _ in range(4)]
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
            ref = None if args.no_check else _reference(torch, arrs, causal)
            t_ref = {}
            if cuda:
                tq, tk, tv = (torch.from_numpy(a).cuda().requires_grad_() for a in arrs[:3])
                tg = torch.from_numpy(arrs[3]).cuda()

                def t_fwd(tq=tq, tk=tk, tv=tv, causal=causal):
                    with torch.no_grad():
                        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

                def t_both(tq=tq, tk=tk, tv=tv, tg=tg, causal=causal):
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tg)

                t_ref = {"fwd": _timed(t_fwd, torch.cuda.synchronize, args.seconds),
                         "fwd+bwd": _timed(t_both, torch.cuda.synchronize, args.seconds)}
                if args.dtype == "float16":
                    half = [x.detach().half().requires_grad_() for x in (tq, tk, tv)] + [tg.half()]
                    sync = torch.cuda.synchronize
                    t_ref |= {"torch_f16_fwd": _timed(lambda half=half: t_fwd(*half[:3]), sync, args.seconds),
                              "torch_f16_fwd+bwd": _timed(lambda half=half: t_both(*half), sync, args.seconds)}
            q, k, v = (wgpar.tensor(a, device=dev, dtype=args.dtype, requires_grad=True) for a in arrs[:3])
            g = wgpar.tensor(arrs[3], device=dev, dtype=args.dtype)
            for cfg_text in args.configs.split(";") if args.configs else [""]:
                cfg = _config(cfg_text)
                row = {"shape": shape, "causal": causal, "dtype": args.dtype, "config": cfg_text or "default"}
                try:
                    with A.force_tiles(**cfg), A.force_path("fused"):
                        row["tiles"] = {kind: A.pick(kind, dev, d, *((t, t))).name for kind in A.KINDS}
                        if ref is not None:
                            for x in (q, k, v):
                                x.grad = None
                            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            y.backward(g)
                            got = [x.numpy().astype(np.float32) for x in (y, q.grad, k.grad, v.grad)]
                            row["max_rel_err"] = max(_rel(a, w) for a, w in zip(got, ref))

                        def w_fwd(q=q, k=k, v=v, causal=causal):
                            with wgpar.no_grad():
                                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                        def w_both(q=q, k=k, v=v, g=g, causal=causal):
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

                        for name, fn, mult in (("fwd", w_fwd, 1.0), ("fwd+bwd", w_both, 3.5)):
                            w = _timed(fn, wsync, args.seconds)
                            row[name] = {"ms": w * 1e3, "tflops": flops * mult / w / 1e12}
                            if name in t_ref:
                                row[name] |= {"torch_ms": t_ref[name] * 1e3, "ratio": w / t_ref[name]}
                            if f"torch_f16_{name}" in t_ref:
                                row[name]["torch_f16_ms"] = t_ref[f"torch_f16_{name}"] * 1e3
                except Exception as exc:  # a configuration that does not fit this device: report, go on
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    torch_name = f"torch {torch.__version__} on {torch.cuda.get_device_name()}, TF32 off" if cuda else "no torch (CUDA)"
    _report.finish(args, f"attention-{args.dtype}:{_report.slug(dev.adapter_name)}",
                   markdown(rows, _report.device_line(dev), torch_name, _report.today(), _report.command_line()))
    return 0


def _ms(part: dict | None, key: str) -> str:
    return f"{part[key]:.3f}" if part and key in part else "-"


def markdown(rows: list[dict], device: str, torch_name: str, date: str, command: str) -> str:
    """The rows as a BENCHMARKS.md section: wgpar's ms per call next to torch SDPA FP32 (and FP16)."""
    dtype = rows[0]["dtype"] if rows else "float32"
    header = ["B x H x T x D", "causal", "tiles (fwd / dq / dkv)", "max rel err", "wgpar fwd ms", "torch FP32 fwd ms",
              "fwd ratio", "wgpar fwd+bwd ms", "torch FP32 fwd+bwd ms", "fwd+bwd ratio"]
    half = any("torch_f16_ms" in r.get("fwd", {}) for r in rows)
    if half:
        header += ["torch FP16 fwd ms", "torch FP16 fwd+bwd ms"]
    table = []
    for r in rows:
        fwd, both = r.get("fwd"), r.get("fwd+bwd")
        tiles = " / ".join(r["tiles"].values()) if "tiles" in r else r.get("error", "-")
        if r["config"] != "default":
            tiles = f"{r['config']}: {tiles}"
        line = [r["shape"], "yes" if r["causal"] else "no", tiles,
                f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else "-",
                _ms(fwd, "ms"), _ms(fwd, "torch_ms"), f"{fwd['ratio']:.2f}x" if fwd and "ratio" in fwd else "-",
                _ms(both, "ms"), _ms(both, "torch_ms"), f"{both['ratio']:.2f}x" if both and "ratio" in both else "-"]
        if half:
            line += [_ms(fwd, "torch_f16_ms"), _ms(both, "torch_f16_ms")]
        table.append(line)
    ref = ("torch FP32 on the float16-rounded inputs" if dtype == "float16" else "torch FP32 (TF32 off)") + \
        (" or float64 NumPy without torch")
    return "\n".join([
        f"## Attention, {dtype} (bench_attention, {device.split(' (')[0]})", "",
        f"- device: {device}; {torch_name}",
        f"- date: {date}",
        f"- command: `{command}`",
        f"- what: wgpar's scaled_dot_product_attention with {dtype} q, k, v and output gradient, the fused path "
        "forced (a shape it cannot run reports an error); ms per call (the median of 5 means, each over enough "
        "calls for --seconds and closed by a device sync); ratios against torch SDPA FP32 (issue 23's targets: forward "
        f"<= 2x, forward + backward <= 2.5x); max rel err of the output and gradients against {ref}.", "",
        _report.markdown_table(header, table)])


if __name__ == "__main__":
    sys.exit(main())
