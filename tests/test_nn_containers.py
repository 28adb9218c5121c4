"""ModuleList / ModuleDict, weight tying, and Module.to(dtype) in place (torch.nn's semantics)."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.nn import functional as F

from . import gradcheck


def test_module_list_and_dict_register_like_torch(torch):
    ml = nn.ModuleList([nn.Linear(3, 4), nn.Linear(4, 5)])
    ml.append(nn.LayerNorm(5))
    ml += [nn.Linear(5, 2)]
    ml.insert(1, nn.Linear(4, 4))
    md = nn.ModuleDict({"a": nn.Linear(2, 2)})
    md["b"] = nn.Linear(2, 3)
    root = nn.Module()
    root.layers, root.heads = ml, md
    tml = torch.nn.ModuleList([torch.nn.Linear(3, 4), torch.nn.Linear(4, 5)])
    tml.append(torch.nn.LayerNorm(5))
    tml += [torch.nn.Linear(5, 2)]
    tml.insert(1, torch.nn.Linear(4, 4))
    troot = torch.nn.Module()
    troot.layers = tml
    troot.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 3)})
    assert list(root.state_dict()) == list(troot.state_dict())
    assert len(ml) == 5 and isinstance(ml[-1], nn.Linear) and ml[1].in_features == 4
    assert [type(m).__name__ for m in ml[1:3]] == ["Linear", "Linear"]
    popped = ml.pop(1)
    assert popped.out_features == 4 and len(ml) == 4
    assert [k for k, _ in ml.named_children()] == ["0", "1", "2", "3"]  # renumbered, as torch does
    del ml[0]
    assert ml[0].in_features == 4 and [k for k, _ in ml.named_children()] == ["0", "1", "2"]
    assert list(md) == ["a", "b"] and "b" in md and md.pop("a").out_features == 2 and list(md.keys()) == ["b"]
    with pytest.raises(IndexError, match="out of range"):
        ml[7]
    with pytest.raises(TypeError, match="takes Modules"):
        ml.append(3)
    with pytest.raises(KeyError, match="without '.'"):
        md["x.y"] = nn.ReLU()
    with pytest.raises(NotImplementedError, match="container"):
        ml(wgpar.zeros(1))


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 6)
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(2)])
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter, two uses

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x).relu()
        return self.head(x)


def _tied_backward(rng):
    m = _Tied()
    assert len(list(m.parameters())) == 1 + 2 * 2  # wte (= head), two Linears
    idx = rng.integers(0, 11, (3, 4))
    y = rng.integers(0, 11, 12)
    F.cross_entropy(m(wgpar.tensor(idx)).reshape(-1, 11), y).backward()
    return m, idx, y


def test_tied_weight_gets_both_gradients(rng):
    """A tied embedding / output matrix is one parameter whose gradient sums both uses: the same network in
    NumPy float64, differentiated by central differences in the one matrix."""
    m, idx, y = _tied_backward(rng)
    blocks = [(b.weight.numpy().astype(np.float64), b.bias.numpy().astype(np.float64)) for b in m.blocks]

    def loss(W):
        x = W[idx]
        for w, b in blocks:
            x = np.maximum(x @ w.T + b, 0)
        z = (x @ W.T).reshape(-1, 11)
        z = z - z.max(-1, keepdims=True)
        return -(z[np.arange(12), y] - np.log(np.exp(z).sum(-1))).mean()

    want, = gradcheck.numeric_grad(loss, [m.wte.weight.numpy().astype(np.float64)], 1.0)
    np.testing.assert_allclose(m.wte.weight.grad.numpy(), want, rtol=1e-4, atol=1e-6)


def test_tied_weight_gradient_matches_torch(rng, torch):
    m, idx, y = _tied_backward(rng)
    W = torch.tensor(m.wte.weight.numpy(), dtype=torch.float64, requires_grad=True)
    x = W[torch.tensor(idx)]
    for b in m.blocks:
        x = torch.relu(x @ torch.tensor(b.weight.numpy(), dtype=torch.float64).T
                       + torch.tensor(b.bias.numpy(), dtype=torch.float64))
    torch.nn.functional.cross_entropy((x @ W.T).reshape(-1, 11), torch.tensor(y)).backward()
    np.testing.assert_allclose(m.wte.weight.grad.numpy(), W.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_to_dtype_converts_in_place_and_keeps_ties(rng):
    m = _Tied()
    params = list(m.parameters())
    w0 = m.wte.weight.numpy()
    opt = optim.AdamW(m.parameters(), lr=1e-2)
    m.register_buffer("steps", wgpar.tensor(np.array([3], dtype=np.int32)))
    assert m.to(wgpar.float16) is m
    assert list(m.parameters()) == params  # the same Parameter objects: opt still holds them
    assert m.head.weight is m.wte.weight and m.wte.weight.dtype is wgpar.float16
    assert all(p.dtype is wgpar.float16 for p in m.parameters())
    assert m.steps.dtype is wgpar.int32  # only floating-point tensors convert
    np.testing.assert_array_equal(m.wte.weight.numpy(), w0.astype(np.float16))
    idx = wgpar.tensor(rng.integers(0, 11, (2, 5)))
    F.cross_entropy(m(idx).reshape(-1, 11), rng.integers(0, 11, 10)).backward()
    assert m.wte.weight.grad.dtype is wgpar.float16
    opt.step()  # the optimizer built before .to() updates the converted parameters
    assert not np.array_equal(m.wte.weight.numpy(), w0.astype(np.float16))
    m.float()
    assert m.wte.weight.dtype is wgpar.float32 and m.wte.weight.grad.dtype is wgpar.float32
    with pytest.raises(TypeError, match="floating point"):
        m.to(wgpar.int32)


def test_to_device_moves_in_place(devs2):
    a, b = devs2
    m = _Tied().to(a)
    p = m.wte.weight
    m.to(b)
    assert m.wte.weight is p and p.device is b and m.head.weight is p and m.blocks[1].bias.device is b
