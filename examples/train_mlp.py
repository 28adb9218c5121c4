"""Train an MLP classifier on scikit-learn's handwritten digits on one WebGPU adapter.

    python examples/train_mlp.py --device 0 --epochs 15 --batch-size 64 --lr 3e-3

A DataLoader shuffles the training set every epoch (seeded) and uploads the next batches to the
device on a background thread while the current step runs. Prints loss and test accuracy per epoch,
then the device and its memory_stats.
"""

from __future__ import annotations

import time

import common  # examples/common.py: a script's own directory is on sys.path
import numpy as np

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.utils.data import DataLoader, TensorDataset


def load_digits(seed: int):
    """(x_train, y_train, x_test, y_test): 80% / 20% of the 1797 digits, standardised, split by ``seed``."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install 'wgpar[examples]'") from None
    data = sk_load()
    x = (data.data / 16.0).astype(np.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-3)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def make_model(device, hidden: int = 128) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden, device=device), nn.ReLU(),
        nn.Linear(hidden, hidden, device=device), nn.ReLU(),
        nn.Linear(hidden, 10, device=device),
    )


@wgpar.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device) -> float:
    model.eval()
    pred = model(wgpar.tensor(x, device=device)).argmax(dim=1)
    model.train()
    return float((pred == wgpar.tensor(y, device=device)).float().mean().item())


def train(device, epochs: int, batch_size: int, lr: float, seed: int = 0, progress: bool = True):
    """Train ``make_model`` on ``device``; returns the model and per epoch (epoch, loss, accuracy, seconds)."""
    wgpar.manual_seed(seed)
    xtr, ytr, xte, yte = load_digits(seed)
    model = make_model(device)
    opt = wgpar.optim.Adam(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=batch_size, shuffle=True, generator=seed, device=device)
    bar = common.progress(epochs * len(loader), progress)
    history = []
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        if bar:
            bar.set_description(f"epoch {epoch}/{epochs}")
        running = None
        for step, (xb, yb) in enumerate(loader, 1):
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Sum losses on the device; read the running mean back only every 10 steps (a readback waits
            # for the GPU to finish everything queued).
            running = loss.detach() if running is None else running + loss.detach()
            if bar:
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{running.item() / step:.4f}")
                bar.update(1)
        mean_loss = running.item() / len(loader)
        seconds = time.perf_counter() - t0  # training only, as data_parallel.py times it
        acc = accuracy(model, xte, yte, device)
        history.append((epoch, mean_loss, acc, seconds))
        common.report(bar, f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {acc * 100:.2f}%")
    if bar:
        bar.close()
    return model, history


def build_parser():
    ap = common.parser(__doc__)
    ap.add_argument("--device", type=common.at_least(0), default=0,
                    help="wgpar device index (one per adapter: see wgpar.devices())")
    ap.add_argument("--epochs", type=common.at_least(1), default=15, help="passes over the training set")
    ap.add_argument("--batch-size", type=common.at_least(1), default=64, help="samples per step")
    ap.add_argument("--lr", type=common.positive_float, default=3e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=common.at_least(0), default=0,
                    help="seeds the weights, the train/test split and the shuffles")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_device_index(ap, args.device)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = wgpar.device(args.device)
    print(f"device: {device}")
    t0 = time.perf_counter()
    _, history = train(device, args.epochs, args.batch_size, args.lr, args.seed)
    wgpar.synchronize(device)
    print(f"final test accuracy {history[-1][2] * 100:.2f}% in {time.perf_counter() - t0:.1f} s")
    print(common.memory_line(f"wgpu:{device.index}", device))


if __name__ == "__main__":
    main()
