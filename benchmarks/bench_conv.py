"""Convolution and CNN layers, forward and forward + backward: wgpar against PyTorch, per shape; and a
ResNet-18 training step on CIFAR-10-shaped data (``--resnet``).

Layer rows are ResNet-like convolutions (a 7x7 stride-2 stem, 3x3 at stride 1 and 2, 5x5, dilation 2, 1x1,
grouped and depthwise 3x3) and the pooling and normalisation layers around them. ``--small`` divides batch
and spatial sizes by 4 so it runs on lavapipe. A timing is the mean of ``--steps`` calls after a warm-up,
ended by one wait for the device. GFLOP/s counts 2 N O oh ow C/G kh kw per convolution forward and three
times that for forward + backward. Peak memory: the most bytes allocated during a forward + backward above
what was allocated before it (wgpar.memory.max_memory_allocated, torch.cuda.max_memory_allocated). The
reference is PyTorch FP32 on CUDA (TF32 off); without CUDA, torch on the CPU only checks the results (the
largest difference of output and gradients, relative to the largest value) and is not timed.

    python benchmarks/bench_conv.py --small --steps 1 --no-write    # smoke test (lavapipe)
    python benchmarks/bench_conv.py                                  # full sizes, on a GPU
    python benchmarks/bench_conv.py --resnet                         # ResNet-18 step, batch 128, 32x32
    python benchmarks/bench_conv.py --amp                            # layers under float16 autocast
    python benchmarks/bench_conv.py --profile --no-torch             # GPU time of each layer's kernels
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import wgpar  # noqa: E402
from benchmarks import _report  # noqa: E402

# name, input (N, C, H, W), the layer from an nn namespace (wgpar.nn or torch.nn), conv (O, k, s, d, g) for FLOPs
LAYERS = [
    ("stem 7x7/2", (32, 3, 224, 224), lambda nn: nn.Conv2d(3, 64, 7, 2, 3), (64, 7, 2, 1, 1)),
    ("3x3 64", (32, 64, 56, 56), lambda nn: nn.Conv2d(64, 64, 3, 1, 1), (64, 3, 1, 1, 1)),
    ("3x3/2 64->128", (32, 64, 56, 56), lambda nn: nn.Conv2d(64, 128, 3, 2, 1), (128, 3, 2, 1, 1)),
    ("3x3 128", (32, 128, 28, 28), lambda nn: nn.Conv2d(128, 128, 3, 1, 1), (128, 3, 1, 1, 1)),
    ("3x3 256", (32, 256, 14, 14), lambda nn: nn.Conv2d(256, 256, 3, 1, 1), (256, 3, 1, 1, 1)),
    ("5x5 64", (32, 64, 28, 28), lambda nn: nn.Conv2d(64, 64, 5, 1, 2), (64, 5, 1, 1, 1)),
    ("3x3 dil2 128", (32, 128, 28, 28), lambda nn: nn.Conv2d(128, 128, 3, 1, 2, 2), (128, 3, 1, 2, 1)),
    ("1x1 256->64", (32, 256, 56, 56), lambda nn: nn.Conv2d(256, 64, 1), (64, 1, 1, 1, 1)),
    ("grouped 3x3 256 g32", (32, 256, 28, 28), lambda nn: nn.Conv2d(256, 256, 3, 1, 1, groups=32), (256, 3, 1, 1, 32)),
    ("depthwise 3x3 256", (32, 256, 28, 28), lambda nn: nn.Conv2d(256, 256, 3, 1, 1, groups=256),
     (256, 3, 1, 1, 256)),
    ("maxpool 3x3/2", (32, 64, 112, 112), lambda nn: nn.MaxPool2d(3, 2, 1), None),
    ("avgpool 2x2", (32, 256, 28, 28), lambda nn: nn.AvgPool2d(2), None),
    ("batchnorm2d 64", (32, 64, 56, 56), lambda nn: nn.BatchNorm2d(64), None),
    ("adaptive avgpool 1", (32, 512, 7, 7), lambda nn: nn.AdaptiveAvgPool2d(1), None),
]


class _Lib:
    """What a benchmark needs of wgpar or torch: tensors, no_grad, sync, peak memory."""

    def __init__(self, name: str, torch=None, tdev=None, dev=None) -> None:
        self.name, self.torch, self.tdev, self.dev = name, torch, tdev, dev
        self.nn = torch.nn if torch is not None else wgpar.nn
        self.F = torch.nn.functional if torch is not None else wgpar.nn.functional
        self.no_grad = torch.no_grad if torch is not None else wgpar.no_grad
        self.optim = torch.optim if torch is not None else wgpar.optim

    def tensor(self, a: np.ndarray, requires_grad: bool = False):
        if self.torch is not None:
            return self.torch.tensor(a, device=self.tdev, requires_grad=requires_grad)
        return wgpar.tensor(a, device=self.dev, requires_grad=requires_grad)

    def to(self, module):
        return module.to(self.tdev) if self.torch is not None else module.to(self.dev)

    def autocast(self, enabled: bool):
        """float16 autocast (torch's on its device), or nothing when not ``enabled``."""
        if self.torch is not None:
            return self.torch.autocast(self.tdev, dtype=self.torch.float16, enabled=enabled)
        return wgpar.autocast(enabled=enabled)

    def sync(self) -> None:
        if self.torch is None:
            wgpar.synchronize(self.dev)
        elif self.tdev == "cuda":
            self.torch.cuda.synchronize()

    def allocated(self) -> int:
        if self.torch is None:
            return wgpar.memory.memory_allocated(self.dev)
        return self.torch.cuda.memory_allocated() if self.tdev == "cuda" else 0

    def reset_peak(self) -> None:
        self.sync()
        if self.torch is None:
            wgpar.memory.reset_peak_memory_stats(self.dev)
        elif self.tdev == "cuda":
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        self.sync()
        if self.torch is None:
            return wgpar.memory.max_memory_allocated(self.dev)
        return self.torch.cuda.max_memory_allocated() if self.tdev == "cuda" else 0


def _numpy(t) -> np.ndarray:
    return t.numpy() if isinstance(t, wgpar.Tensor) else t.detach().cpu().numpy()


def _rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def _fwd_bwd(lib: _Lib, layer, xt, params, g, amp: bool) -> None:
    """One forward + backward of ``layer`` with fresh gradients (``g``: the output gradient)."""
    xt.grad = None
    for p in params:
        p.grad = None
    with lib.autocast(amp):
        y = layer(xt)
    y.backward(g)


def run_layer(lib: _Lib, make, x: np.ndarray, gy: np.ndarray | None, state: dict | None, steps: int, warmup: int,
              timed: bool, amp: bool = False, rounds: int = 1):
    """(outputs and gradients of the first call, fwd s, fwd+bwd s, peak bytes of a fwd+bwd, state dict);
    ``amp``: the forward under float16 autocast (the output gradient in the output's dtype)."""
    layer = lib.to(make(lib.nn))
    if state is not None:
        layer.load_state_dict(state if lib.torch is not None else {k: _numpy(v) for k, v in state.items()})
    xt = lib.tensor(x, requires_grad=True)
    params = list(layer.parameters())
    with lib.autocast(amp):
        y = layer(xt)
    g = lib.tensor(gy if gy is not None else np.ones(y.shape, np.float32)).to(y.dtype)
    y.backward(g)
    results = [_numpy(y).astype(np.float32), _numpy(xt.grad)] + [_numpy(p.grad) for p in params]
    if not timed:
        return results, None, None, None, layer.state_dict()

    def fwd():
        with lib.no_grad(), lib.autocast(amp):
            layer(xt)

    fwd_bwd = functools.partial(_fwd_bwd, lib, layer, xt, params, g, amp)
    tf = _report.timed(fwd, lib.sync, steps, warmup=warmup, rounds=rounds)
    tfb = _report.timed(fwd_bwd, lib.sync, steps, warmup=warmup, rounds=rounds)
    xt.grad = None
    for p in params:
        p.grad = None
    lib.reset_peak()
    before = lib.allocated()
    fwd_bwd()
    peak = lib.peak() - before
    return results, tf, tfb, peak, layer.state_dict()


def profile_layer(dev, make, x: np.ndarray, amp: bool, steps: int) -> tuple[list[list[str]], float, float]:
    """Where one layer's forward + backward spends its GPU time: per kernel family, dispatches and GPU
    microseconds per call in the forward and in the backward (wgpar.profiler over ``steps`` calls after a
    warm-up); and the wall and GPU milliseconds per call."""
    lib = _Lib("wgpar", dev=dev)
    layer = lib.to(make(lib.nn))
    xt = lib.tensor(x, requires_grad=True)
    params = list(layer.parameters())
    with lib.autocast(amp):
        y = layer(xt)
    g = lib.tensor(np.ones(y.shape, np.float32)).to(y.dtype)
    fwd_bwd = functools.partial(_fwd_bwd, lib, layer, xt, params, g, amp)

    for _ in range(2):
        fwd_bwd()
    lib.sync()
    t0 = time.perf_counter()
    with wgpar.profiler.profile() as prof:
        for _ in range(steps):
            fwd_bwd()
        lib.sync()
    wall = (time.perf_counter() - t0) / steps
    fam: dict[str, list[float]] = {}
    for k in prof.kernels():
        row = fam.setdefault(_kernel_role(k), [0, 0.0, 0, 0.0])  # forward dispatches, ns; backward dispatches, ns
        i = 2 if k.phase == "backward" else 0
        row[i] += 1
        row[i + 1] += k.gpu_dur or 0
    gpu = sum(r[1] + r[3] for r in fam.values()) / steps
    rows = [[name, f"{f / steps:.0f}", f"{fn / steps / 1e3:.1f}", f"{b / steps:.0f}", f"{bn / steps / 1e3:.1f}",
             f"{100 * (fn + bn) / steps / gpu:.0f}%" if gpu else "-"]
            for name, (f, fn, b, bn) in sorted(fam.items(), key=lambda kv: -(kv[1][1] + kv[1][3]))]
    return rows, wall * 1e3, gpu / 1e6


def _kernel_role(k) -> str:
    """A profiled kernel's family; the implicit GEMMs of a convolution by their role (matmul_fast runs all)."""
    if k.family == "matmul_fast":
        for binding, role in ((",gx:", "conv input grad (implicit GEMM)"), (",gw:", "conv weight grad (implicit GEMM)"),
                              (",y:", "conv forward (implicit GEMM)")):
            if binding in k.name:
                return role
    return k.family


def profiles(args, dev) -> tuple[list[str], list[list[str]]]:
    rows = []
    rng = np.random.default_rng(0)
    for name, (n, c, h, w), make, _ in LAYERS:
        if args.only and not any(s in name for s in args.only):
            continue
        if args.small:
            n, h, w = max(n // 4, 1), max(h // 4, 8), max(w // 4, 8)
        fams, wall, gpu = profile_layer(dev, make, rng.standard_normal((n, c, h, w), dtype=np.float32), args.amp,
                                        args.steps)
        for i, fam in enumerate(fams):
            rows.append(([name, f"{wall:.2f}", f"{gpu:.2f}"] if i == 0 else ["", "", ""]) + fam)
            print("  ".join(rows[-1]), flush=True)
    return ["layer", "fwd+bwd wall ms", "GPU ms", "kernel family", "fwd dispatches", "fwd GPU us",
            "bwd dispatches", "bwd GPU us", "share of GPU"], rows


def layers(args, dev, torch, tdev) -> tuple[list[str], list[list[str]]]:
    ours = _Lib("wgpar", dev=dev)
    theirs = _Lib("torch", torch, tdev) if torch is not None else None
    rng = np.random.default_rng(0)
    rows = []
    for name, (n, c, h, w), make, conv in LAYERS:
        if args.only and not any(s in name for s in args.only):
            continue
        if args.small:
            n, h, w = max(n // 4, 1), max(h // 4, 8), max(w // 4, 8)
        x = rng.standard_normal((n, c, h, w), dtype=np.float32)
        # the reference first: its initial parameters (and output shape) are what wgpar loads
        ref = None
        if theirs is not None:
            ref = run_layer(theirs, make, x, None, None, args.steps, args.warmup, False)
            gy = rng.standard_normal(ref[0][0].shape, dtype=np.float32)
            ref = run_layer(theirs, make, x, gy, ref[4], args.steps, args.warmup, tdev == "cuda", args.amp,
                            args.rounds)
        else:
            gy = None
        got = run_layer(ours, make, x, gy, ref[4] if ref else None, args.steps, args.warmup, True, args.amp,
                        args.rounds)
        check = "-" if ref is None else f"{max(_rel_diff(a, b) for a, b in zip(got[0], ref[0])):.0e}"
        _, wf, wfb, wpeak, _ = got
        tf, tfb, tpeak = (ref[1], ref[2], ref[3]) if ref is not None else (None, None, None)
        flops = None
        if conv is not None:
            o, k, s, d, g = conv
            oh, ow = got[0][0].shape[2:]
            flops = 2.0 * n * o * oh * ow * (c // g) * k * k
        ms = lambda t: f"{t * 1e3:.2f}" if t else "-"  # noqa: E731
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
        row = [name, f"{n}x{c}x{h}x{w}", ms(wf), ms(tf), ratio(wf, tf), ms(wfb), ms(tfb), ratio(wfb, tfb),
               f"{3 * flops / wfb / 1e9:.0f}" if flops else "-", f"{wpeak / 2**20:.1f}",
               f"{tpeak / 2**20:.1f}" if tpeak else "-", ratio(wpeak, tpeak), check]
        if args.amp:  # wgpar's float32 fwd+bwd in the same run: is autocast faster?
            f32 = run_layer(ours, make, x, gy, ref[4] if ref else None, args.steps, args.warmup, True,
                            rounds=args.rounds)[2]
            row += [ms(f32), ratio(wfb, f32)]
        rows.append(row)
        print("  ".join(row), flush=True)
    return ["layer", "input", "fwd ms", "torch fwd ms", "fwd ratio", "fwd+bwd ms", "torch fwd+bwd ms",
            "fwd+bwd ratio", "fwd+bwd GFLOP/s", "peak MiB", "torch peak MiB", "peak ratio", "max rel. diff"] + \
        (["wgpar float32 fwd+bwd ms", "autocast / float32"] if args.amp else []), rows


def resnet18(nn, F, classes: int = 10):
    """ResNet-18 for 32x32 inputs (a 3x3 stem, no max pooling), as the CIFAR-10 training recipes build it."""

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            y = self.blocks(F.relu(self.bn1(self.conv1(x))))
            return self.fc(F.adaptive_avg_pool2d(y, 1).reshape(x.shape[0], 512))

    return ResNet()


def resnet_step(lib: _Lib, x: np.ndarray, labels: np.ndarray, state: dict | None, steps: int, warmup: int):
    """(seconds per SGD step, peak bytes allocated over the steps, first loss, state dict)."""
    model = lib.to(resnet18(lib.nn, lib.F))
    if state is not None:
        model.load_state_dict(state if lib.torch is not None else
                              {k: v if isinstance(v, np.ndarray) else _numpy(v) for k, v in state.items()})
    model.train()
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xt = lib.tensor(x)
    yt = (lib.torch.tensor(labels, device=lib.tdev) if lib.torch is not None
          else wgpar.tensor(labels, dtype=wgpar.int32, device=lib.dev))
    losses = []

    def step():
        opt.zero_grad()
        loss = lib.F.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss)

    state0 = {k: v.clone() if lib.torch is not None else _numpy(v) for k, v in model.state_dict().items()}
    step()
    first = float(_numpy(losses[0]))
    lib.reset_peak()
    t = _report.timed(step, lib.sync, steps, warmup=warmup)
    return t, lib.peak(), first, state0


def _resnet_data(args) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    batch = 16 if args.small else 128
    return rng.standard_normal((batch, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int64)


def _torch_resnet(args, torch, tdev):
    torch.manual_seed(0)
    return resnet_step(_Lib("torch", torch, tdev), *_resnet_data(args), None, args.steps, args.warmup)


_CHILD_GPU: list[str] = []  # the GPU the child process's torch ran on


def _torch_resnet_in_child(args):
    """torch's (seconds, peak bytes, first loss, state) from a process of its own: with CUDA and wgpar's
    Vulkan device in one process both host-bound steps slowed down on an H100 (torch 36-38 ms against 17.8
    alone, wgpar 44.8 against 30.7), so this process never touches CUDA."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reference.npz"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--resnet", "--torch-reference-to", str(out),
                        "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--small"] if args.small else []),
                       check=True, timeout=900)
        z = np.load(out)
        _CHILD_GPU.append(str(z["gpu"]))
        return (float(z["seconds"]), int(z["peak"]), float(z["first"]),
                {k[len("state."):]: z[k] for k in z.files if k.startswith("state.")})


def resnet(args, dev, torch, tdev) -> tuple[list[str], list[list[str]]]:
    x, labels = _resnet_data(args)
    ref = None
    if torch is not None:
        ref = _torch_resnet_in_child(args) if tdev == "cuda" else _torch_resnet(args, torch, tdev)
    batch = len(x)
    t0 = time.perf_counter()
    got = resnet_step(_Lib("wgpar", dev=dev), x, labels.astype(np.int32), ref[3] if ref else None, args.steps,
                      args.warmup)
    print(f"wgpar ResNet-18 run took {time.perf_counter() - t0:.1f} s")
    timed_ref = ref is not None and tdev == "cuda"
    row = [f"ResNet-18, batch {batch}, 3x32x32", f"{got[0] * 1e3:.1f}", f"{ref[0] * 1e3:.1f}" if timed_ref else "-",
           f"{got[0] / ref[0]:.2f}x" if timed_ref else "-", f"{got[1] / 2**20:.0f}",
           f"{ref[1] / 2**20:.0f}" if timed_ref else "-", f"{got[1] / ref[1]:.2f}x" if timed_ref else "-",
           f"{got[2]:.4f}", f"{ref[2]:.4f}" if ref else "-"]
    print("  ".join(row))
    return ["model", "step ms", "torch step ms", "ratio", "peak MiB", "torch peak MiB", "peak ratio", "first loss",
            "torch first loss"], [row]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="batch and spatial sizes / 4 (lavapipe)")
    ap.add_argument("--resnet", action="store_true", help="the ResNet-18 training step instead of the layers")
    ap.add_argument("--only", nargs="*", default=[], help="layer rows whose name contains one of these")
    ap.add_argument("--steps", type=int, default=5, help="timed calls per measurement")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    ap.add_argument("--rounds", type=int, default=5,
                    help="layer rows: the median of this many measurements of --steps calls each")
    ap.add_argument("--no-torch", action="store_true", help="wgpar alone")
    ap.add_argument("--amp", action="store_true",
                    help="layer rows under float16 autocast on both sides, with wgpar's float32 fwd+bwd beside")
    ap.add_argument("--profile", action="store_true",
                    help="per layer, the GPU time of each kernel family in its forward and backward (no torch)")
    ap.add_argument("--device", type=int, default=0, help="wgpar device index")
    ap.add_argument("--torch-reference-to", type=Path, help=argparse.SUPPRESS)  # --resnet's torch run (a child)
    _report.add_report_flags(ap)
    args = ap.parse_args(argv)
    if args.amp and args.resnet:
        ap.error("--amp times the layer rows under autocast; the ResNet-18 step (--resnet) is float32")
    if args.profile and args.resnet:
        ap.error("--profile breaks down the layer rows; profile the ResNet step with wgpar.profiler")
    if args.torch_reference_to:
        torch_mod, tdev_child = _report.torch_or_none()
        t, peak, first, state = _torch_resnet(args, torch_mod, tdev_child)
        gpu = torch_mod.cuda.get_device_name(0) if tdev_child == "cuda" else "the CPU"
        np.savez(args.torch_reference_to, seconds=t, peak=peak, first=first, gpu=gpu,
                 **{f"state.{k}": _numpy(v) for k, v in state.items()})
        return 0
    torch, tdev = (None, None) if args.no_torch or args.profile else _report.torch_or_none()
    dev = wgpar.device(args.device)
    print(f"device: {_report.device_line(dev)}")
    tname = None
    if torch is not None and not (args.resnet and tdev == "cuda"):  # there CUDA is left to the child process
        tname = (f"torch {torch.__version__} FP32 (TF32 off) on {torch.cuda.get_device_name(0)}" if tdev == "cuda"
                 else f"torch {torch.__version__} on the CPU (results checked, not timed)")
        print(f"reference: {tname}")
    if args.profile:
        header, rows = profiles(args, dev)
    else:
        header, rows = (resnet if args.resnet else layers)(args, dev, torch, tdev)
    if _CHILD_GPU:
        tname = f"torch {torch.__version__} FP32 (TF32 off) on {_CHILD_GPU[0]}, in a process of its own"
    table = _report.markdown_table(header, rows)
    print(table)
    what = "resnet" if args.resnet else "conv-profile" if args.profile else "conv"
    amp = args.amp
    key = f"{what}:{_report.slug(dev.adapter_name)}{':small' if args.small else ''}{':amp' if amp else ''}"
    title = ("ResNet-18 training step (SGD momentum, BatchNorm)" if args.resnet else
             "Where each CNN layer's GPU time goes" if args.profile else
             "Convolution and CNN layers" + (", float16 autocast" if amp else ""))
    body = (f"## {title} ({dev.adapter_name}{', small sizes' if args.small else ''})\n\n"
            f"- device: {_report.device_line(dev)}" + (f"; reference: {tname}" if tname else "") + "\n"
            f"- date: {_report.today()}\n- command: `{_report.command_line()}`\n"
            f"- what: {'float16 autocast on both sides (torch.autocast on CUDA)' if amp else 'float32'}; "
            + (f"mean of {args.steps} calls after {args.warmup}, one wait for the device at the end. "
               if args.resnet or args.profile or args.rounds <= 1 else
               f"median of {args.rounds} means of {args.steps} calls (after {args.warmup}), each ended by one "
               "wait for the device. ")
            + ("wgpar.profiler around the fwd+bwd calls (input and parameter gradients, an output gradient of "
               "ones): per kernel family, dispatches and GPU time per call in the forward and the backward; wall "
               "ms per call under the profiler."
               if args.profile else
               "Step: zero_grad, forward, cross-entropy, backward, SGD(lr 0.01, momentum 0.9); peak: the most bytes "
               "allocated over the timed steps (parameters, momentum and activations included); torch on CUDA runs "
               "in a process of its own (its weights loaded into wgpar's model)."
               if args.resnet else
               "fwd under no_grad; fwd+bwd with input and parameter gradients; peak: the most bytes allocated "
               "during one fwd+bwd above what was allocated before it. max rel. diff: largest difference from "
               "the reference over output and gradients, relative to the largest value.")
            + f"\n\n{table}\n")
    _report.finish(args, key, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
