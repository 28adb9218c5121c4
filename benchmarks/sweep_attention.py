"""Sweep the register-tiled attention variants (ops/attention.py's RT_VARIANTS) at GPT-2's shape: forward and
forward + backward of each, next to torch's FP32 scaled_dot_product_attention (CUDA, TF32 off) when there,
then the best variant per pass and the RT_DEFAULTS line that makes the best tiles the default.

    python benchmarks/sweep_attention.py                    # GPU: 8x12x1024x64 and 8x12x1024x128, causal
    python benchmarks/sweep_attention.py --small            # smoke test (lavapipe): tiny shapes, head dims halved
    python benchmarks/sweep_attention.py --variants d64-base,d64-diag --samples 9

Each variant of head dim D runs at the shapes of head dim D (``--small``: D / 2, so lavapipe's 32 KiB of
workgroup memory holds the tiles; TK capped to the adapter's subgroup width). A timing is the median of
``--samples`` samples, each a batch of calls (about ``--sample-ms`` of work) closed by a device sync, after a
warm-up that also builds the pipelines. Outputs and gradients are checked against torch (CUDA) or, for
``--small``, a float64 NumPy reference. ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from benchmarks.bench_attention import _reference, _rel  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402
from wgpar.ops import attention as A  # noqa: E402

GPU_SHAPES = "8x12x1024x64,8x12x1024x128"
SMALL_SHAPES = "1x2x96x32,1x2x80x64"


def _median_time(fn, sync, samples: int, sample_s: float) -> float:
    """Median seconds per call over ``samples`` batches of calls, each closed by ``sync``."""
    fn()
    sync()
    one = max(_report.timed(fn, sync, 1, warmup=0), 1e-6)
    per = int(min(100, max(1, sample_s / one)))
    return statistics.median(_report.timed(fn, sync, per, warmup=0) for _ in range(samples))


def _variants(names: str, vd: int) -> list[str]:
    if names:
        return [n for n in names.split(",") if n]
    return [n for n in A.RT_VARIANTS if n.startswith(f"d{vd}-")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny shapes, head dims halved (a lavapipe smoke test)")
    ap.add_argument("--shapes", default="", help=f"B x H x T x D, comma-separated (default {GPU_SHAPES})")
    ap.add_argument("--variants", default="", help="RT_VARIANTS names, comma-separated (default: all of the head dim)")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--sample-ms", type=float, default=25.0)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    torch, where = (None, None) if args.no_torch else _report.torch_or_none(cuda_only=True)
    cuda = where == "cuda"
    dev = wgpar.device(0)
    lanes = A.subgroup_lanes(dev)
    print(f"device: {dev.adapter_name} ({dev.backend}, {dev.adapter_type}), subgroup lanes {lanes}; torch: "
          f"{torch.cuda.get_device_name() if cuda else '-'}", flush=True)
    if lanes < 4:
        print("this adapter has no subgroups: the register-tiled variants cannot run")
        return 1
    wsync = lambda: wgpar.synchronize(dev)  # noqa: E731
    samples, sample_s = args.samples, args.sample_ms / 1e3
    if args.small:
        samples, sample_s = min(samples, 3), min(sample_s, 0.005)
    rows, best = [], {}
    causal = bool(args.causal)
    for shape in (args.shapes or (SMALL_SHAPES if args.small else GPU_SHAPES)).split(","):
        b, h, t, d = (int(x) for x in shape.split("x"))
        vd = 2 * d if args.small else d
        rng = np.random.default_rng(0)
        arrs = [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]
        flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
        check = not args.no_check and (cuda or args.small)
        ref = _reference(torch if cuda else None, arrs, causal) if check else None
        t_ref = {}
        if cuda:
            tq, tk, tv = (torch.from_numpy(a).cuda().requires_grad_() for a in arrs[:3])
            tg = torch.from_numpy(arrs[3]).cuda()

            def t_fwd(tq=tq, tk=tk, tv=tv):
                with torch.no_grad():
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

            def t_both(tq=tq, tk=tk, tv=tv, tg=tg):
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tg)

            t_ref = {"fwd": _median_time(t_fwd, torch.cuda.synchronize, samples, sample_s),
                     "fwd+bwd": _median_time(t_both, torch.cuda.synchronize, samples, sample_s)}
        q, k, v = (wgpar.tensor(a, device=dev, requires_grad=True) for a in arrs[:3])
        g = wgpar.tensor(arrs[3], device=dev)

        def w_fwd(q=q, k=k, v=v):
            with wgpar.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def w_both(q=q, k=k, v=v, g=g):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

        print(f"\n{shape} {'causal' if causal else 'full'}: {flops / 1e9:.1f} GFLOP forward" +
              (f"; torch SDPA FP32 forward {t_ref['fwd'] * 1e3:.3f} ms, forward+backward "
               f"{t_ref['fwd+bwd'] * 1e3:.3f} ms" if t_ref else ""), flush=True)
        print(f"{'variant':<12} {'fwd tile':<12} {'dq tile':<12} {'dkv tile':<12} {'fwd ms':>8} {'TFLOP/s':>7} "
              f"{'xtorch':>6} {'f+b ms':>8} {'xtorch':>6} {'max rel':>8}")
        for name in ["default", *_variants(args.variants, vd)]:
            row = {"shape": shape, "causal": causal, "variant": name}
            try:
                ctx = A.force_tiles() if name == "default" else A.variant(name, lanes if lanes < 32 else None)
                with ctx, A.force_path("fused"):
                    row["tiles"] = {kind: A.pick(kind, dev, d, t, t).name for kind in A.KINDS}
                    if ref is not None:
                        for x in (q, k, v):
                            x.grad = None
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        y.backward(g)
                        got = [y.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]
                        row["max_rel_err"] = max(_rel(a, w) for a, w in zip(got, ref))
                    for pas, fn in (("fwd", w_fwd), ("fwd+bwd", w_both)):
                        row[pas] = _median_time(fn, wsync, samples, sample_s) * 1e3
                        if pas in t_ref:
                            row[pas + "_x_torch"] = row[pas] / 1e3 / t_ref[pas]
            except Exception as exc:  # a variant that does not fit this device: report, go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            rows.append(row)
            if "error" in row:
                print(f"{name:<12} error: {row['error']}", flush=True)
                continue
            tl = row["tiles"]
            print(f"{name:<12} {tl['fwd']:<12} {tl['dq']:<12} {tl['dkv']:<12} {row['fwd']:8.3f} "
                  f"{flops / row['fwd'] / 1e9:7.2f} {row.get('fwd_x_torch', float('nan')):6.2f} "
                  f"{row['fwd+bwd']:8.3f} {row.get('fwd+bwd_x_torch', float('nan')):6.2f} "
                  f"{row.get('max_rel_err', float('nan')):8.1e}", flush=True)
            if name != "default" and row.get("max_rel_err", 0.0) < 1e-3:
                for pas in ("fwd", "fwd+bwd"):
                    if (shape, pas) not in best or row[pas] < best[shape, pas][pas]:
                        best[shape, pas] = row
    print()
    for shape in dict.fromkeys(s for s, _ in best):
        bf, bb = best[shape, "fwd"], best[shape, "fwd+bwd"]
        d = int(shape.split("x")[3])
        print(f"{shape}: best forward {bf['variant']} ({bf['fwd']:.3f} ms), best forward+backward "
              f"{bb['variant']} ({bb['fwd+bwd']:.3f} ms)")
        # The forward from the best forward, the gradient kernels from the best forward + backward (the
        # backward's time is forward + backward less forward, and the forward tile does not change it).
        line = {"fwd": bf["tiles"]["fwd"], "dq": bb["tiles"]["dq"], "dkv": bb["tiles"]["dkv"]}
        key = A._device_kind(dev)
        print(f"  RT_DEFAULTS line: ({key!r}, {2 * d if args.small else d}): {json.dumps(line)},")
    print(f"\nsweep took {time.perf_counter() - t_start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
