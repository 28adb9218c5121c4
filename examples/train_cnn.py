"""Train a small CNN (Conv2d, BatchNorm2d, ReLU, MaxPool2d, Flatten, Linear) on scikit-learn's 8x8
handwritten digits on one WebGPU adapter.

    python examples/train_cnn.py --device 0 --epochs 4 --batch-size 64 --lr 3e-3 --width 16

Prints loss, test accuracy and training time per epoch, then the final accuracy, the time and memory_stats.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.utils.data import DataLoader, TensorDataset

# 98.3-98.9% test accuracy in about 40 s on lavapipe with two CPU cores (README, "Examples").
DEFAULTS = dict(epochs=4, batch_size=64, lr=3e-3, width=16)


def load_digits(seed: int):
    """(train images, train labels, test images, test labels): 80% / 20%, images [N, 1, 8, 8] in [-0.5, 0.5]."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install 'wgpar[examples]'") from None
    data = sk_load()
    x = (data.images / 16.0 - 0.5).astype(np.float32)[:, None]
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def make_model(device, width: int = DEFAULTS["width"]) -> nn.Module:
    """Two conv blocks (8x8 -> 4x4 -> 2x2) and a linear classifier."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, device=device), nn.BatchNorm2d(width, device=device), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, device=device), nn.BatchNorm2d(2 * width, device=device), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 2 * 2, 10, device=device),
    )


@wgpar.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device) -> float:
    """Test accuracy in eval mode (BatchNorm uses its running statistics)."""
    model.eval()
    pred = model(wgpar.tensor(x, device=device)).argmax(dim=1)
    model.train()
    return float((pred == wgpar.tensor(y, device=device)).float().mean().item())


def train(device, epochs: int, batch_size: int, lr: float, seed: int = 0, width: int = DEFAULTS["width"],
          limit: int | None = None, progress: bool = True):
    """Train and return (model, [(epoch, mean loss, test accuracy), ...]); ``limit`` keeps only the first
    ``limit`` training images (quick runs)."""
    wgpar.manual_seed(seed)
    xtr, ytr, xte, yte = load_digits(seed)
    if limit is not None:
        xtr, ytr = xtr[:limit], ytr[:limit]
    model = make_model(device, width)
    opt = wgpar.optim.Adam(model.parameters(), lr=lr)
    # BatchNorm needs two values per channel: a lone last image is left out (drop_last then).
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=batch_size, shuffle=True, generator=seed,
                        drop_last=len(xtr) % batch_size == 1, device=device)
    n_batches = len(loader)
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=epochs * n_batches, unit="step", leave=False)
        except ImportError:
            bar = None
    history = []
    for epoch in range(1, epochs + 1):
        running, steps = None, 0
        start = time.perf_counter()
        for xb, yb in loader:  # uploaded on the loader's thread while the previous step runs
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Sum losses on the device: a readback per step would stall the GPU.
            running = loss.detach() if running is None else running + loss.detach()
            steps += 1
            if bar is not None:
                bar.update(1)
                bar.set_description(f"epoch {epoch}")
        mean_loss = running.item() / steps  # waits for the epoch's last step
        seconds = time.perf_counter() - start
        acc = accuracy(model, xte, yte, device)
        history.append((epoch, mean_loss, acc))
        msg = (f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {acc * 100:.2f}%  "
               f"train {seconds:.2f} s ({steps / seconds:.0f} steps/s)")
        if bar is not None:
            bar.write(msg)
        else:
            print(msg)
    if bar is not None:
        bar.close()
    return model, history


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its errors
    return parse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", type=int, default=0, help="wgpar device index (see wgpar.devices())")
    ap.add_argument("--epochs", type=_positive(int), default=DEFAULTS["epochs"], help="passes over the training set")
    ap.add_argument("--batch-size", type=_positive(int), default=DEFAULTS["batch_size"],
                    help="images per step (at least 2: BatchNorm)")
    ap.add_argument("--lr", type=_positive(float), default=DEFAULTS["lr"], help="Adam's learning rate")
    ap.add_argument("--width", type=_positive(int), default=DEFAULTS["width"],
                    help="channels of the first conv (the second has twice as many)")
    ap.add_argument("--limit", type=_positive(int), default=None, help="train on only this many images")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split, the init and the batch order")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = ap.parse_args(argv)
    if args.batch_size < 2:
        ap.error("--batch-size must be at least 2: BatchNorm2d needs more than one value per channel")
    n_devices = len(wgpar.devices())
    if not 0 <= args.device < n_devices:
        ap.error(f"--device {args.device} is out of range: this machine has {n_devices} device(s), "
                 f"0 to {n_devices - 1}")
    device = wgpar.device(args.device)
    print(f"device: {device.adapter_name} ({device.backend})")
    t0 = time.perf_counter()
    _, history = train(device, args.epochs, args.batch_size, args.lr, args.seed, args.width, args.limit,
                       progress=not args.no_progress)
    wgpar.synchronize(device)
    print(f"final test accuracy {history[-1][2] * 100:.2f}% in {time.perf_counter() - t0:.1f} s")
    stats = wgpar.memory_stats(device)
    print("memory_stats: " + ", ".join(f"{k}={v}" for k, v in stats.items()))


if __name__ == "__main__":
    main()
