"""Train an MLP classifier on scikit-learn's handwritten digits on one WebGPU adapter.

    python examples/train_mlp.py --device 0 --epochs 15 --batch-size 64 --lr 3e-3

Prints loss and test accuracy per epoch, then the device and its memory_stats.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import wgpar
from wgpar import nn
from wgpar.nn import functional as F


def load_digits(seed: int):
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
    wgpar.manual_seed(seed)
    xtr, ytr, xte, yte = load_digits(seed)
    model = make_model(device)
    opt = wgpar.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=epochs * -(-len(xtr) // batch_size), unit="step", leave=False)
        except ImportError:
            bar = None
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(xtr))
        running = None
        for start in range(0, len(xtr), batch_size):
            idx = order[start:start + batch_size]
            xb = wgpar.tensor(xtr[idx], device=device)
            loss = F.cross_entropy(model(xb), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Sum losses on the device: a readback per step would stall the GPU.
            running = loss.detach() if running is None else running + loss.detach()
            if bar is not None:
                bar.update(1)
        n_batches = -(-len(xtr) // batch_size)
        mean_loss = running.item() / n_batches
        acc = accuracy(model, xte, yte, device)
        history.append((epoch, mean_loss, acc))
        msg = f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {acc * 100:.2f}%"
        if bar is not None:
            bar.write(msg)
        else:
            print(msg)
    if bar is not None:
        bar.close()
    return model, history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0, help="wgpar device index (see wgpar.devices())")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = wgpar.device(args.device)
    print(f"device: {device!r}")
    t0 = time.perf_counter()
    _, history = train(device, args.epochs, args.batch_size, args.lr, args.seed)
    wgpar.synchronize(device)
    print(f"final test accuracy {history[-1][2] * 100:.2f}% in {time.perf_counter() - t0:.1f} s")
    stats = wgpar.memory_stats(device)
    print("memory_stats: " + ", ".join(f"{k}={v}" for k, v in stats.items()))


if __name__ == "__main__":
    main()
