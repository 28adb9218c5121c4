"""Small models shared by the FSDP tests: awkward sizes, a 0-d and 1-d parameters, a frozen parameter,
a parameter shared by two modules, and a block that forward runs twice."""

from __future__ import annotations

import numpy as np

import wgpar
from wgpar import nn, optim
from wgpar.nn import functional as F


class Scale(nn.Module):
    """x * s with a 0-d parameter s."""

    def __init__(self, device=None) -> None:
        super().__init__()
        self.s = nn.Parameter(wgpar.tensor(np.float32(1.25), device=device))

    def forward(self, x):
        return x * self.s


class Net(nn.Module):
    """6 -> 33 -> 3 classes; dim-0 sizes 33, 3 (fewer rows than 4 ranks), 1-d and 0-d parameters."""

    def __init__(self, device=None, tied: bool = True, frozen: bool = True) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 33, device=device)
        self.norm = nn.LayerNorm(33, device=device)
        self.block = nn.Sequential(nn.Linear(33, 33, device=device), nn.Tanh())  # runs twice
        self.tied1 = nn.Linear(33, 17, bias=False, device=device)
        self.tied2 = nn.Linear(33, 17, bias=False, device=device)
        if tied:
            self.tied2.weight = self.tied1.weight  # one parameter, two modules (two units)
        self.head = nn.Linear(34, 3, device=device)
        self.scale = Scale(device)
        if frozen:
            self.inp.bias.requires_grad = False

    def forward(self, x):
        h = self.norm(F.gelu(self.inp(x)))
        h = self.block(self.block(h))
        h = wgpar.cat([self.tied1(h), self.tied2(h * 0.5)], dim=1)
        return self.scale(self.head(h))


def make_net(seed: int, device=0, **kw) -> Net:
    wgpar.manual_seed(seed)
    return Net(device, **kw)


def mlp(seed: int, width: int, layers: int, classes: int, device=0) -> nn.Sequential:
    wgpar.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width, device=device), nn.ReLU()]
    mods.append(nn.Linear(width, classes, device=device))
    return nn.Sequential(*mods)


OPTS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.2, momentum=0.9),
    # eps well above float32 noise (see test_data_parallel.py: Adam's step otherwise follows the sign of
    # summation noise in gradient entries near 1e-8, and split batches sum in another order).
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01, eps=1e-4, weight_decay=0.05),
}


def single_device(model: nn.Module, X: np.ndarray, Y: np.ndarray, make_opt, steps: int) -> list[float]:
    opt = make_opt(model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(wgpar.tensor(X, device=model.device)), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-12))
