"""Module conveniences against torch.nn's behaviour: apply, half / float, Sequential as a list, the
warning for Modules kept in plain containers, and forward hooks on the convolution layers."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import numpy as np
import pytest

import wgpar
from wgpar import nn

from .helpers import assert_close


def cnn(lib, seed=0):
    """The same small CNN from wgpar.nn or torch.nn."""
    return lib.Sequential(lib.Conv2d(3, 4, 3, padding=1), lib.BatchNorm2d(4), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Flatten(), lib.Linear(4 * 3 * 3, 5))


def test_apply_visits_children_first_like_torch(torch):
    seen = {}
    for name, lib in (("wgpar", nn), ("torch", torch.nn)):
        model = lib.Sequential(lib.Sequential(lib.Linear(2, 3), lib.ReLU()), lib.Linear(3, 1))
        order: list[str] = []
        assert model.apply(lambda m, order=order: order.append(type(m).__name__)) is model
        seen[name] = order
    assert seen["wgpar"] == seen["torch"] == ["Linear", "ReLU", "Sequential", "Linear", "Sequential"]


def test_apply_initialises_weights(rng):
    model = cnn(nn)

    def init(m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.zeros_(m.weight)

    model.apply(init)
    assert not model[0].weight.numpy().any() and not model[5].weight.numpy().any()
    assert model[1].weight.numpy().all()  # BatchNorm untouched


def test_half_and_float_convert_float_tensors_only(rng, dev):
    if not dev.has_f16:
        pytest.skip("adapter without shader-f16")
    model = cnn(nn)
    assert model.half() is model
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        want = wgpar.int32 if name.endswith("num_batches_tracked") else wgpar.float16
        assert t.dtype is want, name
    x = wgpar.tensor(rng.standard_normal((2, 3, 6, 6)), dtype=wgpar.float16)
    out = model(x)
    assert out.dtype is wgpar.float16 and out.shape == (2, 5)
    model.float()
    assert all(p.dtype is wgpar.float32 for p in model.parameters())
    assert model[1].num_batches_tracked.dtype is wgpar.int32 and model[1].num_batches_tracked.item() == 1


def _names(seq):
    return [(k, type(m).__name__) for k, m in seq.named_children()]


def test_sequential_behaves_like_torchs(torch):
    got = {}
    for name, lib in (("wgpar", nn), ("torch", torch.nn)):
        s = lib.Sequential(lib.Linear(2, 2), lib.ReLU())
        log = [len(s)]
        s.append(lib.Tanh())
        s.extend([lib.Sigmoid(), lib.GELU()])
        s.insert(1, lib.Softmax())
        s.insert(-1, lib.Dropout())
        log.append(_names(s))
        log.append(type(s[-2]).__name__)
        log.append(_names(s[1:4]))
        log.append(type(s.pop(0)).__name__)
        del s[2]
        s[0] = lib.LayerNorm(2)
        log.append(_names(s))
        log.append([type(m).__name__ for m in s])
        with pytest.raises(IndexError):
            s[len(s)]
        with pytest.raises(IndexError):
            s.insert(len(s) + 1, lib.ReLU())
        od = lib.Sequential(OrderedDict([("conv", lib.Conv2d(1, 1, 1)), ("act", lib.ReLU())]))
        log.append(_names(od))
        log.append(list(od.state_dict()))
        got[name] = log
    assert got["wgpar"] == got["torch"]


def test_sequential_takes_modules_only():
    with pytest.raises(TypeError, match=r"Sequential takes Modules, got int"):
        nn.Sequential(nn.ReLU(), 3)
    with pytest.raises(TypeError, match=r"append: Sequential takes Modules"):
        nn.Sequential().append(lambda x: x)


def test_modules_in_a_plain_container_warn_once_naming_the_fix():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2), nn.ReLU()]
            self.sizes = [1, 2, 3]  # no Modules: no warning

    class Keyed(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = {"a": nn.Linear(2, 2)}
            self.pair = (nn.Linear(2, 2), 3)

    with pytest.warns(UserWarning, match=r"Plain.layers is a list holding Modules.*use nn.ModuleList"):
        m = Plain()
    assert list(m.parameters()) == []  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Plain()  # once per class and attribute
    with pytest.warns(UserWarning) as record:
        Keyed()
    assert [str(w.message).split(":")[0] for w in record] == ["Keyed.heads is a dict holding Modules",
                                                               "Keyed.pair is a tuple holding Modules"]
    assert "nn.ModuleDict" in str(record[0].message) and "nn.ModuleList" in str(record[1].message)


def test_forward_hooks_on_the_new_layers_match_torch(rng, torch):
    """A pre-hook that rescales the conv's input and forward hooks that record every layer's output
    shape and replace the pool's output give what torch gives."""
    models = {"wgpar": cnn(nn), "torch": cnn(torch.nn)}
    state = {k: v.numpy() for k, v in models["wgpar"].state_dict().items()}
    models["torch"].load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    results = {}
    for name, model in models.items():
        shapes = []

        def record(m, args, out, log=shapes):
            log.append((type(m).__name__, tuple(out.shape)))

        model[0].register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
        for layer in model:
            layer.register_forward_hook(record)
        model[3].register_forward_hook(lambda m, args, out: out * 0.5)
        xin = wgpar.tensor(x) if name == "wgpar" else torch.tensor(x)
        out = model(xin)
        results[name] = (shapes, out.numpy() if name == "wgpar" else out.detach().numpy())
    assert results["wgpar"][0] == results["torch"][0]
    assert_close(results["wgpar"][1], results["torch"][1], rtol=1e-4, atol=1e-5)
