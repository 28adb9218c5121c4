"""One training step of an MLP: wgpar against PyTorch eager on the same device, in one run.

The model is ``--layers`` Linear layers ``--width`` wide with ReLU between them
(the last layer gives ``--width`` class logits), softmax cross entropy, AdamW.
A step is zero_grad, forward, loss, backward, optimizer step; ms/step is the
wall time of ``--steps`` steps after a warm-up, ended by one wait for the GPU.
Two variants: the batch uploaded once and reused every step ("resident"), and
a fresh batch uploaded from host memory every step ("upload"). The reference
is PyTorch eager on CUDA in FP32 with TF32 off when torch with CUDA is
importable (target, issue #5: wgpar within 1.5x), else PyTorch on the CPU when
importable, else wgpar alone. Both models start from the same weights; the
losses of the first steps are printed side by side as a check.

    python benchmarks/bench_train.py
    python benchmarks/bench_train.py --width 4096 --layers 4 --batch 4096 --steps 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402
from wgpar import nn, optim  # noqa: E402
from wgpar.nn import functional as F  # noqa: E402

TARGET = 1.5




def mlp(width: int, layers: int, device) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width, device=device), nn.ReLU()]
    mods.append(nn.Linear(width, width, device=device))
    return nn.Sequential(*mods)


def torch_mlp(torch, model: nn.Module, device: str):
    """The same architecture in torch, with wgpar's initial weights."""
    mods = []
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        t = torch.nn.Linear(lin.in_features, lin.out_features)
        with torch.no_grad():
            t.weight.copy_(torch.from_numpy(lin.weight.numpy()))
            t.bias.copy_(torch.from_numpy(lin.bias.numpy()))
        mods.append(t)
        if i < len(linears) - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).to(device)




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256, help="hidden width (and number of classes)")
    ap.add_argument("--layers", type=int, default=4, help="Linear layers")
    ap.add_argument("--batch", type=int, default=256, help="samples per step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    ap.add_argument("--no-torch", action="store_true", help="wgpar alone")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)

    torch, tdev = (None, None) if args.no_torch else _report.torch_or_none()
    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    tname = None
    if torch is not None:
        tname = (f"torch {torch.__version__} eager FP32 (TF32 off) on {torch.cuda.get_device_name(0)}"
                 if tdev == "cuda" else f"torch {torch.__version__} eager FP32 on the CPU")
        print(f"reference: {tname}")
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((args.batch, args.width), dtype=np.float32),
                rng.integers(0, args.width, size=args.batch).astype(np.int64)) for _ in range(2)]

    wgpar.manual_seed(0)
    model = mlp(args.width, args.layers, dev)
    n_params = sum(p.numel() for p in model.parameters())
    tmodel = torch_mlp(torch, model, tdev) if torch is not None else None
    opt = optim.AdamW(model.parameters(), lr=args.lr)
    X0, Y0 = wgpar.tensor(batches[0][0], device=dev), wgpar.tensor(batches[0][1], device=dev)
    losses: dict[str, list[float]] = {"wgpar": []}

    def w_step(x, y, keep: bool = False) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if keep:
            losses["wgpar"].append(float(loss.numpy()))

    for _ in range(3):  # also the first of the warm-up: pipelines built, allocator cache filled
        w_step(X0, Y0, keep=True)
    fresh = [0]

    def w_upload() -> None:
        x, y = batches[fresh[0] % 2]
        fresh[0] += 1
        w_step(wgpar.tensor(x, device=dev), wgpar.tensor(y, device=dev))

    wsync = lambda: wgpar.synchronize(dev)  # noqa: E731
    results = {"resident": {"wgpar": _report.timed(lambda: w_step(X0, Y0), wsync, args.steps, warmup=args.warmup)},
               "upload": {"wgpar": _report.timed(w_upload, wsync, args.steps, warmup=args.warmup)}}

    if torch is not None:
        topt = torch.optim.AdamW(tmodel.parameters(), lr=args.lr)
        tX0 = torch.from_numpy(batches[0][0]).to(tdev)
        tY0 = torch.from_numpy(batches[0][1]).to(tdev)
        losses["torch"] = []

        def t_step(x, y, keep: bool = False) -> None:
            topt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(tmodel(x), y)
            loss.backward()
            topt.step()
            if keep:
                losses["torch"].append(float(loss.item()))

        for _ in range(3):
            t_step(tX0, tY0, keep=True)
        tfresh = [0]

        def t_upload() -> None:
            x, y = batches[tfresh[0] % 2]
            tfresh[0] += 1
            t_step(torch.from_numpy(x).to(tdev), torch.from_numpy(y).to(tdev))

        tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
        results["resident"]["torch"] = _report.timed(lambda: t_step(tX0, tY0), tsync, args.steps, warmup=args.warmup)
        results["upload"]["torch"] = _report.timed(t_upload, tsync, args.steps, warmup=args.warmup)

    print("first 3 losses (same weights and batch): " +
          "; ".join(f"{k} " + ", ".join(f"{v:.5f}" for v in vals) for k, vals in losses.items()))
    if "torch" in losses:
        diff = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses["wgpar"], losses["torch"]))
        print(f"largest relative loss difference: {diff:.1e}")
        if diff > 1e-2:
            print("WARNING: wgpar and torch losses disagree")
    rows = []
    for variant, r in results.items():
        w = r["wgpar"] * 1e3
        t = r.get("torch")
        ratio = w / (t * 1e3) if t else None
        met = "-" if ratio is None or tdev != "cuda" else ("yes" if ratio <= TARGET else "NO")
        rows.append([variant, f"{w:.1f}", f"{args.batch / r['wgpar']:.0f}", f"{t * 1e3:.1f}" if t else "-",
                     f"{ratio:.2f}x" if ratio else "-", met])
        print(f"{variant:9s}: wgpar {w:8.1f} ms/step" +
              (f"   torch {t * 1e3:8.1f} ms/step   ratio {ratio:.2f}x" if t else ""))
    ref = "torch CUDA FP32 (TF32 off)" if tdev == "cuda" else "torch CPU" if tdev else "torch"
    table = _report.markdown_table(
        ["batch", "wgpar ms/step", "wgpar samples/s", f"{ref} ms/step", "ratio", "<= 1.5x (GPU)"], rows)
    print(table)
    slug = _report.slug(dev.adapter_name)
    body = (f"## MLP training step vs PyTorch eager ({dev.adapter_name})\n\n"
            f"- device: {_report.device_line(dev)}" + (f"; reference: {tname}" if tname else "") + "\n"
            f"- date: {_report.today()}\n- command: `{_report.command_line()}`\n"
            f"- what: {args.layers} Linear layers {args.width} wide with ReLU between ({n_params} parameters), "
            f"batch {args.batch}, softmax cross entropy over {args.width} classes, AdamW; a step is "
            f"zero_grad + forward + loss + backward + step; {args.steps} steps after {args.warmup} warm-up "
            f"steps, one wait for the device at the end. resident: the batch uploaded once and reused; "
            f"upload: a batch copied from host memory every step. Same initial weights; first losses: "
            + "; ".join(f"{k} " + ", ".join(f"{v:.4f}" for v in vals) for k, vals in losses.items())
            + f". Target (issue #5): within {TARGET}x of PyTorch eager CUDA FP32, TF32 off.\n\n{table}\n")
    _report.finish(args, f"train:{slug}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
