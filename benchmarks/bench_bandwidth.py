"""Memory-bound kernels against the device-to-device copy bandwidth, in one run.

For each size it times, on float32 tensors of that many MiB, a raw wgpu
``copy_buffer_to_buffer`` (the reference: the bandwidth the device reaches
moving bytes through WebGPU) and wgpar's memory-bound kernels: a binary op,
a unary op, an op with a scalar, a bias add ([N, C] + [C]), softmax over the
last dim of [rows, 4096], sums over either dim, full sum and mean, and the
contiguous copy of a transposed view. GB/s counts bytes read plus bytes
written (a copy of S bytes moves 2S); the target (issue #5) is 70% of the copy
bandwidth from 64 MiB up. Each op runs ``--iters`` times back to back after
a warm-up, then one ``wgpar.synchronize``, repeated until ``--min-time``.
NumPy (here) or PyTorch on CUDA (when importable) run the same ops alongside.

    python benchmarks/bench_bandwidth.py --sizes-mb 4 16
    python benchmarks/bench_bandwidth.py --sizes-mb 64 256
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

COLS = 4096  # row length of the 2-D cases (softmax over [rows, 4096], bias of 4096)
TARGET = 0.70






def _np_softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def cases(lib, x, y, x2, b, rows: int) -> list[tuple[str, str, int, object]]:
    """(name, shape text, bytes moved, callable) for one library's tensors of S bytes."""
    S = x.numel() * 4 if lib != "numpy" else x.nbytes
    n = S // 4
    if lib == "numpy":
        return [
            ("x + y", f"[{n}]", 3 * S, lambda: x + y),
            ("x.relu()", f"[{n}]", 2 * S, lambda: np.maximum(x, 0)),
            ("x * 2.0", f"[{n}]", 2 * S, lambda: x * np.float32(2.0)),
            ("bias: x + b", f"[{rows}, {COLS}] + [{COLS}]", 2 * S + 4 * COLS, lambda: x2 + b),
            ("softmax(dim=-1)", f"[{rows}, {COLS}]", 2 * S, lambda: _np_softmax(x2)),
            ("sum(dim=-1)", f"[{rows}, {COLS}]", S + 4 * rows, lambda: x2.sum(-1)),
            ("sum(dim=0)", f"[{rows}, {COLS}]", S + 4 * COLS, lambda: x2.sum(0)),
            ("sum()", f"[{n}]", S, lambda: x.sum()),
            ("mean()", f"[{n}]", S, lambda: x.mean()),
            ("x.T.contiguous()", f"[{COLS}, {rows}]", 2 * S, lambda: np.ascontiguousarray(x2.T)),
        ]
    sm = (lambda: x2.softmax(-1)) if lib == "wgpar" else (lambda: lib.softmax(x2, -1))
    return [
        ("x + y", f"[{n}]", 3 * S, lambda: x + y),
        ("x.relu()", f"[{n}]", 2 * S, lambda: x.relu()),
        ("x * 2.0", f"[{n}]", 2 * S, lambda: x * 2.0),
        ("bias: x + b", f"[{rows}, {COLS}] + [{COLS}]", 2 * S + 4 * COLS, lambda: x2 + b),
        ("softmax(dim=-1)", f"[{rows}, {COLS}]", 2 * S, sm),
        ("sum(dim=-1)", f"[{rows}, {COLS}]", S + 4 * rows, lambda: x2.sum(-1)),
        ("sum(dim=0)", f"[{rows}, {COLS}]", S + 4 * COLS, lambda: x2.sum(0)),
        ("sum()", f"[{n}]", S, lambda: x.sum()),
        ("mean()", f"[{n}]", S, lambda: x.mean()),
        ("x.T.contiguous()", f"[{COLS}, {rows}]", 2 * S, lambda: x2.T.contiguous()),
    ]


def check(got, want, what: str, rtol: float = 1e-5) -> None:
    got = np.asarray(got, np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    if not err <= rtol:
        raise AssertionError(f"{what}: wgpar differs from float64 by {err:.2e} (relative)")


def verify(x, y, x2, b, a, c, a2, bb) -> None:
    """wgpar's results against float64 (one size): a benchmark of wrong kernels is worth nothing."""
    r, r2 = a.astype(np.float64), a2.astype(np.float64)
    check((x + y).numpy(), r + c, "x + y")
    check(x.relu().numpy(), np.maximum(r, 0), "relu")
    check((x * 2.0).numpy(), r * 2, "x * 2")
    check((x2 + b).numpy(), r2 + bb, "bias add")
    e = np.exp(r2 - r2.max(-1, keepdims=True))
    check(x2.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), "softmax")
    check(x2.sum(-1).numpy(), r2.sum(-1), "sum(dim=-1)")
    check(x2.sum(0).numpy(), r2.sum(0), "sum(dim=0)")
    check(x.sum().numpy(), r.sum(), "sum()", 1e-4)
    check(x.mean().numpy(), r.mean(), "mean()", 1e-4)
    check(x2.T.contiguous().numpy(), r2.T, "transpose copy")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[4, 16], help="tensor sizes in MiB (float32)")
    ap.add_argument("--iters", type=int, default=10, help="calls per timed batch (one synchronize per batch)")
    ap.add_argument("--min-time", type=float, default=0.25, help="seconds of timed batches per op and size")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check of wgpar's results")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)

    torch, _ = _report.torch_or_none(cuda_only=True)
    time_op = functools.partial(_report.timed, warmup=2)  # seconds per call, after two untimed calls
    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    if torch is not None:
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    ref = "torch" if torch is not None else "numpy"
    wsync = lambda: wgpar.synchronize(dev)  # noqa: E731
    rng = np.random.default_rng(0)
    rows_out = []
    for mb in args.sizes_mb:
        S = mb << 20
        n, rows = S // 4, S // 4 // COLS
        if S > dev.max_binding:
            print(f"{mb} MiB: skipped, above this device's largest binding ({dev.max_binding} bytes)")
            continue
        a = rng.standard_normal(n, dtype=np.float32)
        c = rng.standard_normal(n, dtype=np.float32)
        bb = rng.standard_normal(COLS, dtype=np.float32)
        x, y, b = wgpar.tensor(a, device=dev), wgpar.tensor(c, device=dev), wgpar.tensor(bb, device=dev)
        x2 = x.reshape(rows, COLS)
        if not args.no_check and mb == min(args.sizes_mb):
            verify(x, y, x2, b, a, c, a.reshape(rows, COLS), bb)
            print(f"{mb} MiB: wgpar results match float64")
        dst = wgpar.empty((n,), device=dev)
        copy = lambda src=x, dst=dst, S=S: dev.copy(src._storage.buffer, 0, dst._storage.buffer, 0, S)  # noqa: E731
        copy_s = time_op(copy, wsync, args.iters, args.min_time)
        copy_gbs = 2 * S / copy_s / 1e9
        print(f"{mb} MiB: wgpu copy_buffer_to_buffer {copy_gbs:8.1f} GB/s")
        theirs: dict[str, float] = {}
        their_copy = None
        if torch is not None:
            tx, ty = torch.from_numpy(a).cuda(), torch.from_numpy(c).cuda()
            tb, tdst = torch.from_numpy(bb).cuda(), torch.empty_like(tx)
            their_copy = 2 * S / time_op(lambda d=tdst, s=tx: d.copy_(s), torch.cuda.synchronize, args.iters,
                                         args.min_time) / 1e9
            for name, _, nbytes, fn in cases(torch, tx, ty, tx.view(rows, COLS), tb, rows):
                theirs[name] = nbytes / time_op(fn, torch.cuda.synchronize, args.iters, args.min_time) / 1e9
            del tx, ty, tb, tdst
            torch.cuda.empty_cache()
        else:
            a2 = a.reshape(rows, COLS)
            their_copy = 2 * S / time_op(lambda a=a: a.copy(), lambda: None, 1, min(args.min_time, 0.1)) / 1e9
            for name, _, nbytes, fn in cases("numpy", a, c, a2, bb, rows):
                theirs[name] = nbytes / time_op(fn, lambda: None, 1, min(args.min_time, 0.1)) / 1e9
        rows_out.append([f"{mb}", "wgpu copy_buffer_to_buffer", f"[{n}]", f"{2 * S / 1e6:.0f}", f"{copy_gbs:.1f}",
                         "100%", "-", f"{their_copy:.1f}", "100%"])
        for name, shape, nbytes, fn in cases("wgpar", x, y, x2, b, rows):
            gbs = nbytes / time_op(fn, wsync, args.iters, args.min_time) / 1e9
            pct = gbs / copy_gbs
            t = theirs.get(name)
            tpct = f"{100 * t / their_copy:.0f}%" if t is not None and their_copy else "-"
            print(f"{mb} MiB: {name:18s} {shape:24s} wgpar {gbs:8.1f} GB/s = {100 * pct:5.1f}% of copy   "
                  f"{ref} {t if t is not None else float('nan'):8.1f} GB/s")
            met = "yes" if pct >= TARGET else "NO" if mb >= 64 else "no"
            rows_out.append([f"{mb}", name, shape, f"{nbytes / 1e6:.0f}", f"{gbs:.1f}", f"{100 * pct:.0f}%",
                             met if mb >= 64 else f"({met})",
                             f"{t:.1f}" if t is not None else "-", tpct])
        del x, y, b, x2, dst
    reflabel = "torch CUDA" if torch is not None else "NumPy (host)"
    header = ["MiB", "op", "shape", "MB moved", "wgpar GB/s", "of wgpu copy", ">= 70% (from 64 MiB)",
              f"{reflabel} GB/s", f"{reflabel} of its copy"]
    table = _report.markdown_table(header, rows_out)
    print(table)
    slug = _report.slug(dev.adapter_name)
    tver = f"; torch {torch.__version__} on {torch.cuda.get_device_name(0)}" if torch is not None else ""
    body = (f"## Memory-bound kernels vs device copy bandwidth ({dev.adapter_name})\n\n"
            f"- device: {_report.device_line(dev)}{tver}\n- date: {_report.today()}\n"
            f"- command: `{_report.command_line()}`\n"
            f"- what: float32; GB/s = (bytes read + bytes written) / time; {args.iters} calls back to back then "
            f"one synchronize, batches repeated for at least {args.min_time} s after a warm-up. Reference: "
            f"`copy_buffer_to_buffer` of the same size through wgpu in the same run (and `{reflabel}`'s own "
            f"copy for its column). Target (issue #5): 70% of the copy bandwidth from 64 MiB up; smaller sizes "
            f"show it in parentheses.\n\n{table}\n")
    _report.finish(args, f"bandwidth:{slug}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
