"""wgpar.save / wgpar.load: safetensors files, bitwise round trips of model and optimizer state."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy as stn

import wgpar
from wgpar import optim
from wgpar.nn.module import Module
from wgpar.nn.parameter import Parameter


class MLP(Module):
    def __init__(self, rng) -> None:
        super().__init__()
        self.w1 = Parameter(wgpar.tensor(rng.standard_normal((33, 5)).astype(np.float32)))
        self.b1 = Parameter(wgpar.tensor(rng.standard_normal(33).astype(np.float32)))
        self.w2 = Parameter(wgpar.tensor(rng.standard_normal((1, 33)).astype(np.float32)))
        self.register_buffer("seen", wgpar.tensor(np.array([7], dtype=np.int32)))

    def forward(self, x):
        return (x @ self.w1.T + self.b1).relu() @ self.w2.T


def _train(model, opt, x, y, steps):
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


def test_flat_state_dict_is_plain_safetensors(tmp_path, rng, dev):
    values = {
        "f32": rng.standard_normal((33, 5)).astype(np.float32),
        "nan_inf": np.array([np.nan, -np.inf, np.inf, -0.0, 1e-45], dtype=np.float32),
        "i32": rng.integers(-(2**31), 2**31 - 1, 129, dtype=np.int64).astype(np.int32),
        "mask": rng.random(7) > 0.5,
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    if dev.has_f16:
        values["f16"] = rng.standard_normal(7).astype(np.float16)
    sd = {k: wgpar.tensor(v) for k, v in values.items()}
    path = tmp_path / "flat.safetensors"
    wgpar.save(sd, path)
    raw = stn.load_file(str(path))  # any safetensors reader sees the tensors under their keys
    assert set(raw) == set(values)
    back = wgpar.load(path)
    assert list(back) == list(values)  # order kept
    for k, v in values.items():
        assert isinstance(back[k], wgpar.Tensor) and back[k].dtype is sd[k].dtype
        _same(raw[k], v)
        _same(back[k].numpy(), v)


def test_model_and_optimizer_round_trip_continue_identically(tmp_path, rng, dev):
    x = wgpar.tensor(rng.standard_normal((16, 5)).astype(np.float32))
    y = wgpar.tensor(rng.standard_normal((16, 1)).astype(np.float32))
    model = MLP(rng)
    opt = optim.AdamW([{"params": [model.w1, model.b1]}, {"params": [model.w2], "lr": 3e-3}], lr=1e-2,
                      amsgrad=True)
    _train(model, opt, x, y, 3)
    path = tmp_path / "ckpt.safetensors"
    wgpar.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "note": "ok"}, path)

    ck = wgpar.load(path)
    assert ck["epoch"] == 3 and ck["note"] == "ok"
    osd = ck["optim"]
    assert sorted(osd["state"]) == [0, 1, 2]  # int keys survive
    assert osd["param_groups"][1]["lr"] == 3e-3 and osd["param_groups"][0]["betas"] == (0.9, 0.999)
    assert osd["state"][2]["step"] == 3
    for k, v in model.state_dict().items():
        _same(ck["model"][k].numpy(), v.numpy())
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            _same(np.asarray(osd["state"][i][k]), np.asarray(v))

    model2 = MLP(np.random.default_rng(0))
    model2.load_state_dict(ck["model"])
    opt2 = optim.AdamW([{"params": [model2.w1, model2.b1]}, {"params": [model2.w2]}])
    opt2.load_state_dict(osd)
    assert opt2.param_groups[1]["lr"] == 3e-3
    _train(model, opt, x, y, 3)
    _train(model2, opt2, x, y, 3)
    for k, v in model.state_dict().items():
        _same(model2.state_dict()[k].numpy(), v.numpy())


def test_nesting_and_scalars(tmp_path, dev):
    obj = {"a.b": wgpar.ones(2), "a": {"b": wgpar.zeros(2), 3: [1, 2.5, None, True]},
           "t": (0.9, float("inf")), "arr": np.arange(4, dtype=np.float32)}
    path = tmp_path / "nested.safetensors"
    wgpar.save(obj, path)
    back = wgpar.load(path)
    assert back["a.b"].tolist() == [1, 1] and back["a"]["b"].tolist() == [0, 0]  # names did not collide
    assert back["a"][3] == [1, 2.5, None, True] and back["t"] == (0.9, float("inf"))
    assert isinstance(back["arr"], wgpar.Tensor) and back["arr"].tolist() == [0, 1, 2, 3]
    wgpar.save([wgpar.ones(1), 2], path)
    assert [type(v) for v in wgpar.load(path)] == [wgpar.Tensor, int]


def test_foreign_safetensors_file_loads_flat(tmp_path, dev):
    path = tmp_path / "foreign.safetensors"
    stn.save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array([1, 2], dtype=np.int64)},
                  str(path), metadata={"format": "np"})
    back = wgpar.load(path)
    assert set(back) == {"w", "n"}
    assert back["w"].shape == (2, 3) and back["n"].dtype is wgpar.int32 and back["n"].tolist() == [1, 2]


def test_bad_files_raise_value_error_naming_the_path(tmp_path, dev):
    good = tmp_path / "good.safetensors"
    wgpar.save({"w": wgpar.ones(1000), "opt": {"lr": 0.1}}, good)
    data = good.read_bytes()
    cases = {"truncated.safetensors": data[:-100], "header_only.safetensors": data[:20],
             "empty.safetensors": b"", "text.safetensors": b"this is not a checkpoint, it is plain text\n",
             "pickle.pt": b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94."}
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=name):
            wgpar.load(path)
    with pytest.raises(FileNotFoundError):
        wgpar.load(tmp_path / "missing.safetensors")


def test_unsupported_values_raise_type_error(tmp_path, dev):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match="set"):
        wgpar.save({"a": {1, 2}}, path)
    with pytest.raises(TypeError, match="keys"):
        wgpar.save({(1, 2): wgpar.ones(1)}, path)
    with pytest.raises(TypeError, match="object"):
        wgpar.save({"a": object()}, path)
    assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.multidevice
def test_load_onto_a_device(tmp_path, devs2):
    path = tmp_path / "d.safetensors"
    wgpar.save({"w": wgpar.arange(5, device=devs2[0])}, path)
    back = wgpar.load(path, device=devs2[1])
    assert back["w"].device is devs2[1] and back["w"].tolist() == [0, 1, 2, 3, 4]
