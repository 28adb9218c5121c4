"""wgpar.save / wgpar.load: safetensors files, bitwise round trips of model and optimizer state."""

from __future__ import annotations

import json
import os
import stat
import struct

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


# -- foreign files, reserved names, corrupt trees --------------------------------------------------------
def _write_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """A safetensors file written by hand: {name: (dtype string, shape, raw little-endian bytes)}."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _metadata_file(path, rng):
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    wgpar.save({"__metadata__": wgpar.tensor(a), "w": wgpar.tensor(b), "sub": {"__metadata__": wgpar.tensor(b)}},
               path)
    return a, b


def test_a_key_named_metadata_round_trips_and_other_readers_read_the_file(tmp_path, rng, dev):
    path = tmp_path / "m.safetensors"
    a, b = _metadata_file(path, rng)
    back = wgpar.load(path)
    assert set(back) == {"__metadata__", "w", "sub"}
    _same(back["__metadata__"].numpy(), a)
    _same(back["w"].numpy(), b)
    _same(back["sub"]["__metadata__"].numpy(), b)
    flat = stn.load_file(str(path))  # the tensor is stored under an escaped name
    assert set(flat) == {"__metadata__#1", "w", "sub.__metadata__"}
    _same(flat["__metadata__#1"], a)


def test_safetensors_torch_reads_the_escaped_name(tmp_path, rng, torch):
    import safetensors.torch as stt

    path = tmp_path / "m.safetensors"
    a, _ = _metadata_file(path, rng)
    _same(stt.load_file(str(path))["__metadata__#1"].numpy(), a)


def test_foreign_low_precision_floats_convert_exactly(tmp_path, dev, torch):
    every = np.arange(256, dtype=np.uint8)
    bf16 = np.random.default_rng(7).integers(0, 2**16, 4097).astype(np.uint16)
    bf16[:4] = [0x7F80, 0xFF80, 0x7FC0, 0x8000]  # inf, -inf, NaN, -0.0
    path = tmp_path / "lowp.safetensors"
    _write_safetensors(path, {"bf": ("BF16", (17, 241), bf16.tobytes()), "e4": ("F8_E4M3", (256,), every.tobytes()),
                              "e5": ("F8_E5M2", (16, 16), every.tobytes())})
    back = wgpar.load(path)
    ref = {"bf": torch.from_numpy(bf16.view(np.int16)).view(torch.bfloat16).float().reshape(17, 241),
           "e4": torch.from_numpy(every).view(torch.float8_e4m3fn).float(),
           "e5": torch.from_numpy(every).view(torch.float8_e5m2).float().reshape(16, 16)}
    for name, want in ref.items():
        got = back[name]
        assert got.dtype is wgpar.float32 and got.shape == tuple(want.shape)
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)  # NaN where NaN, -0.0 kept
        assert (np.signbit(got.numpy()) == np.signbit(want.numpy())).all()


def test_foreign_wide_types_are_range_checked_before_narrowing(tmp_path, dev):
    ok = {"f64": ("F64", np.array([1e-40, -2.5, 3.4e38, np.inf, np.nan]), wgpar.float32),
          "i64": ("I64", np.array([-(2**31), 2**31 - 1, 0], np.int64), wgpar.int32),
          "u64": ("U64", np.array([0, 2**31 - 1], np.uint64), wgpar.int32),
          "u32": ("U32", np.array([7, 2**31 - 1], np.uint32), wgpar.int32),
          "i16": ("I16", np.array([-32768, 32767], np.int16), wgpar.int32),
          "u16": ("U16", np.array([0, 65535], np.uint16), wgpar.int32),
          "i8": ("I8", np.array([-128, 127], np.int8), wgpar.int32),
          "u8": ("U8", np.array([0, 255], np.uint8), wgpar.int32),
          "b": ("BOOL", np.array([True, False, True]), wgpar.bool_)}
    path = tmp_path / "wide.safetensors"
    _write_safetensors(path, {k: (dt, v.shape, v.tobytes()) for k, (dt, v, _) in ok.items()})
    back = wgpar.load(path)
    for k, (_, v, want_dtype) in ok.items():
        assert back[k].dtype is want_dtype, k
        want = v.astype(np.float32) if want_dtype is wgpar.float32 else v
        np.testing.assert_array_equal(back[k].numpy(), want, err_msg=k)
    bad = {"I64": np.array([0, 2**31], np.int64), "U64": np.array([2**63], np.uint64),
           "U32": np.array([2**31], np.uint32), "F64": np.array([1.0, -1e39])}
    for dt, v in bad.items():
        path = tmp_path / f"bad_{dt}.safetensors"
        _write_safetensors(path, {"fine": ("F32", (1,), b"\0" * 4), "layer.w": (dt, v.shape, v.tobytes())})
        with pytest.raises(ValueError) as info:
            wgpar.load(path)
        msg = str(info.value)
        assert path.name in msg and "'layer.w'" in msg and dt in msg, msg


@pytest.mark.parametrize("dtype", ["C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"])
def test_foreign_dtypes_wgpar_cannot_hold_raise_naming_key_and_dtype(tmp_path, dev, dtype):
    path = tmp_path / "c.safetensors"
    _write_safetensors(path, {"z": (dtype, (2,), b"\0" * (16 if dtype == "C64" else 2))})
    with pytest.raises(TypeError) as info:
        wgpar.load(path)
    msg = str(info.value)
    assert path.name in msg and "'z'" in msg and dtype in msg, msg


@pytest.mark.parametrize("tree", [
    "[" * 100_000 + "]" * 100_000,  # json itself gives up
    '{"list": ' * 5000 + "1" + "}" * 5000,  # parses, nests far too deep
    '{"dict": [[1]]}', '{"dict": "ab"}', '{"dict": [["a", 1, 2]]}', '{"dict": [[true, 1]]}', '{"dict": [[["k"], 1]]}',
    '{"tensor": ["w"]}', '{"tensor": "missing"}', '{"list": 5}', '{"tuple": {"a": 1}}', '{"set": [1]}',
    '{"dict": [], "list": []}', '[1, 2]', "not json",
])
def test_corrupt_metadata_tree_raises_a_clear_error_naming_the_path(tmp_path, dev, tree):
    path = tmp_path / "corrupt.safetensors"
    stn.save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"wgpar.format": "1", "wgpar.tree": tree})
    with pytest.raises(ValueError, match="corrupt.safetensors: corrupt checkpoint"):
        wgpar.load(path)


def test_save_refuses_containers_inside_themselves_and_deep_nesting(tmp_path, dev):
    path = tmp_path / "x.safetensors"
    loop: list = [wgpar.ones(1)]
    loop.append(loop)
    d: dict = {}
    d["me"] = {"again": d}
    for obj, what in ((loop, "contains itself"), (d, "contains itself")):
        with pytest.raises(ValueError, match=what):
            wgpar.save(obj, path)
    deep = wgpar.ones(2)
    for _ in range(100):
        deep = [deep]
    wgpar.save(deep, path)  # 100 levels: the limit, round trip
    back = wgpar.load(path)
    for _ in range(100):
        back = back[0]
    assert back.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="deeper than 100"):
        wgpar.save([deep], tmp_path / "y.safetensors")
    shared = wgpar.ones(1)
    same = [shared, shared, {"a": shared}]  # one object in several places is not a cycle
    wgpar.save(same, path)
    assert [t.tolist() for t in wgpar.load(path)[:2]] == [[1.0], [1.0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]  # nothing half-written


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_checkpoints_are_written_with_the_users_umask(tmp_path, dev, umask):
    from wgpar.distributed.fsdp import save_sharded_checkpoint
    from wgpar.nn import Linear

    old = os.umask(umask)
    try:
        wgpar.save({"w": wgpar.ones(3, device=dev)}, tmp_path / "model.safetensors")
        save_sharded_checkpoint(Linear(3, 2, device=dev), tmp_path / "sharded")
    finally:
        os.umask(old)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["model.safetensors", "sharded/index.json", "sharded/rank00000-of-00001.safetensors"]  # no temp
    for name in files:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


def test_the_old_module_path_warns():
    import importlib
    import sys

    sys.modules.pop("wgpar.checkpoint", None)
    with pytest.warns(DeprecationWarning, match="wgpar.serialization"):
        old = importlib.import_module("wgpar.checkpoint")
    assert old.save is wgpar.save and old.load is wgpar.load
