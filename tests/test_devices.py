"""Adapters and devices: deduplication, logical devices, WGPAR_ADAPTER selection, repr."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import wgpar
from wgpar.runtime import adapters
from wgpar.runtime.config import Config

from .helpers import assert_close


class FakeAdapter:
    """Just enough of a wgpu.GPUAdapter for the selection logic (which reads only ``info``)."""

    def __init__(self, device, backend, kind="DiscreteGPU", vendor_id=0x10DE, device_id=1):
        self.info = {"device": device, "backend_type": backend, "adapter_type": kind,
                     "vendor_id": vendor_id, "device_id": device_id}

    def __repr__(self):
        return f"Fake({self.info['device']}, {self.info['backend_type']})"


def _physical_with(monkeypatch, found, adapter=None, backend=None):
    monkeypatch.setattr(adapters, "_adapters", None)
    monkeypatch.setattr(adapters, "CONFIG", Config(adapter=adapter, backend=backend, submit_threshold=512))
    monkeypatch.setattr(adapters.wgpu.gpu, "enumerate_adapters_sync", lambda: list(found))
    return adapters._physical()


def test_devices_one_per_physical_adapter(dev):
    devs = wgpar.devices()
    assert len(devs) == len(wgpar.adapter_names()) >= 1
    assert devs[0] is dev is wgpar.device(0)
    # One device per adapter object wgpar kept; two identical GPUs share a name, so names prove nothing.
    assert len({id(a) for a in adapters._physical()}) == len(devs)
    # The real enumeration lists each GPU under Vulkan and OpenGL (lavapipe too): only one may survive,
    # so devices that share an adapter name (identical cards) share a backend as well.
    by_name: dict[str, set[str]] = {}
    for d in devs:
        by_name.setdefault(d.adapter_name, set()).add(d.backend)
    assert all(len(backends) == 1 for backends in by_name.values()), by_name
    assert all(d.backend.lower() != "opengl" for d in devs) or len(devs) == 1


def test_same_gpu_on_several_backends_counts_once(monkeypatch):
    gpu = dict(device="NVIDIA H100", vendor_id=0x10DE, device_id=0x2330)
    found = [FakeAdapter(backend="Vulkan", **gpu), FakeAdapter(backend="D3D12", **gpu),
             FakeAdapter(backend="OpenGL", **gpu),
             FakeAdapter("llvmpipe", "Vulkan", kind="CPU", vendor_id=0x10005, device_id=0)]
    chosen = _physical_with(monkeypatch, found)
    assert len(chosen) == 1, chosen
    assert chosen[0].info["backend_type"] in ("Vulkan", "D3D12")


def test_two_identical_gpus_are_two_adapters(monkeypatch):
    # Two cards of one model differ in nothing wgpu reports except their position in the list.
    found = [FakeAdapter("RTX 4090", "Vulkan", device_id=7), FakeAdapter("RTX 4090", "Vulkan", device_id=7),
             FakeAdapter("RTX 4090", "OpenGL", device_id=7), FakeAdapter("RTX 4090", "OpenGL", device_id=7)]
    chosen = _physical_with(monkeypatch, found)
    assert [a.info["backend_type"] for a in chosen] == ["Vulkan", "Vulkan"]
    assert chosen[0] is found[0] and chosen[1] is found[1]


def test_identical_gpus_on_two_native_backends_count_once_each(monkeypatch):
    # Windows: two H200s seen through Vulkan and D3D12 (4 entries) are 2 GPUs, through the preferred backend.
    gpu = dict(vendor_id=0x10DE, device_id=0x2335)
    found = [FakeAdapter("NVIDIA H200", "D3D12", **gpu), FakeAdapter("NVIDIA H200", "Vulkan", **gpu),
             FakeAdapter("NVIDIA H200", "D3D12", **gpu), FakeAdapter("NVIDIA H200", "Vulkan", **gpu)]
    chosen = _physical_with(monkeypatch, found)
    assert chosen == [found[1], found[3]]


def test_opengl_only_when_nothing_native(monkeypatch):
    chosen = _physical_with(monkeypatch, [FakeAdapter("Old GPU", "OpenGL")])
    assert [a.info["backend_type"] for a in chosen] == ["OpenGL"]


def test_software_adapter_dropped_next_to_a_gpu_and_discrete_first(monkeypatch):
    found = [FakeAdapter("llvmpipe", "Vulkan", kind="CPU", vendor_id=0x10005, device_id=0),
             FakeAdapter("Intel UHD", "Vulkan", kind="IntegratedGPU", vendor_id=0x8086, device_id=3),
             FakeAdapter("Radeon RX", "Vulkan", kind="DiscreteGPU", vendor_id=0x1002, device_id=4)]
    chosen = _physical_with(monkeypatch, found)
    assert [a.info["device"] for a in chosen] == ["Radeon RX", "Intel UHD"]


def test_wgpar_backend_restricts(monkeypatch):
    gpu = dict(device="GPU", vendor_id=1, device_id=2)
    chosen = _physical_with(monkeypatch, [FakeAdapter(backend="Vulkan", **gpu), FakeAdapter(backend="OpenGL", **gpu)],
                            backend="opengl")
    assert [a.info["backend_type"] for a in chosen] == ["OpenGL"]


def test_select_by_index_and_name():
    cands = [FakeAdapter("NVIDIA RTX 4090", "Vulkan"), FakeAdapter("AMD Radeon RX 7900", "Vulkan", vendor_id=0x1002),
             FakeAdapter("llvmpipe (LLVM 15)", "Vulkan", kind="CPU")]
    assert adapters._select(cands, "1") == [cands[1]]
    assert adapters._select(cands, "0") == [cands[0]]
    assert adapters._select(cands, "radeon") == [cands[1]]  # case-insensitive substring
    assert adapters._select(cands, "LLVMPIPE") == [cands[2]]
    assert adapters._select(cands, "vulkan") == cands  # the backend is part of the described name
    with pytest.raises(wgpar.AdapterNotFoundError, match="only 3 adapters"):
        adapters._select(cands, "3")
    with pytest.raises(wgpar.AdapterNotFoundError, match="intel"):
        adapters._select(cands, "intel")


def test_wgpar_adapter_selects_software_adapter_by_name(monkeypatch):
    # A CPU adapter named explicitly is kept even when a GPU exists.
    found = [FakeAdapter("RTX", "Vulkan"), FakeAdapter("llvmpipe", "Vulkan", kind="CPU", vendor_id=0x10005)]
    chosen = _physical_with(monkeypatch, found, adapter="llvm")
    assert [a.info["device"] for a in chosen] == ["llvmpipe"]


def _run_with_env(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WGPAR_ADAPTER=env_value, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    code = "import wgpar; print(wgpar.adapter_names()); print(wgpar.device(0).adapter_name)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_wgpar_adapter_env_in_subprocess(dev):
    name = dev.adapter_name
    ok = _run_with_env("0")
    assert ok.returncode == 0, ok.stderr
    assert name in ok.stdout
    word = name.split()[0].upper()
    ok = _run_with_env(word)
    assert ok.returncode == 0, ok.stderr
    assert name in ok.stdout
    bad = _run_with_env("no-such-adapter-xyz")
    assert bad.returncode != 0
    assert "AdapterNotFoundError" in bad.stderr and "no-such-adapter-xyz" in bad.stderr


@pytest.mark.multidevice
def test_logical_devices_are_independent(devs2):
    a, b = devs2
    assert a is not b and a.index == 0 and b.index == 1
    assert wgpar.devices(2) == devs2 and wgpar.device(1) is b
    assert a._dev is not b._dev and a.queue is not b.queue and a.allocator is not b.allocator
    if len(wgpar.devices()) == 1:
        assert b.logical == 1 and a.adapter_name == b.adapter_name
    before_a = wgpar.memory_stats(a)["allocated_bytes"]
    t = wgpar.zeros(1000, device=b)
    assert wgpar.memory_stats(a)["allocated_bytes"] == before_a
    assert wgpar.memory_stats(b)["allocated_bytes"] >= t.nbytes
    assert t.device is b


@pytest.mark.multidevice
def test_device_spellings(devs2, rng):
    _, b = devs2
    data = rng.standard_normal(5).astype(np.float32)
    for spelling in (b, 1, np.int64(1), "wgpu:1"):
        t = wgpar.tensor(data, device=spelling)
        assert t.device is b
        assert_close(t.numpy(), data)


def test_bad_device_arguments():
    with pytest.raises(ValueError):
        wgpar.device(-1)
    with pytest.raises(ValueError):
        wgpar.devices(0)
    with pytest.raises(ValueError, match="wgpu:N"):
        wgpar.zeros(3, device="cuda")


def test_repr_names_adapter_backend_and_limits(dev):
    r = repr(dev)
    assert dev.adapter_name in r
    assert dev.backend in r
    assert "max-storage-buffer-binding-size" in r
    assert str(dev.max_binding) in r
    assert str(dev).startswith("wgpu:0")


def test_environment_configuration(monkeypatch):
    from wgpar.runtime import config

    monkeypatch.setenv("WGPAR_ADAPTER", "radeon")
    monkeypatch.setenv("WGPAR_BACKEND", "Vulkan")
    monkeypatch.setenv("WGPAR_SUBMIT_THRESHOLD", "64")
    c = config.load()
    assert (c.adapter, c.backend, c.submit_threshold) == ("radeon", "vulkan", 64)
    monkeypatch.setenv("WGPAR_SUBMIT_THRESHOLD", "0")
    assert config.load().submit_threshold == 1
    monkeypatch.setenv("WGPAR_SUBMIT_THRESHOLD", "many")
    with pytest.raises(ValueError, match="WGPAR_SUBMIT_THRESHOLD"):
        config.load()
    for name in ("WGPAR_ADAPTER", "WGPAR_BACKEND", "WGPAR_SUBMIT_THRESHOLD"):
        monkeypatch.delenv(name)
    c = config.load()
    assert (c.adapter, c.backend, c.submit_threshold) == (None, None, 512)


def _import_and_compute(env: dict) -> subprocess.CompletedProcess:
    code = ("import os, wgpar; print((wgpar.ones(3) * 2).numpy().tolist()); "
            "print(os.environ['XDG_RUNTIME_DIR'])")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_RUNTIME_DIR is a Linux desktop variable")
def test_without_xdg_runtime_dir_wgpar_sets_a_private_one_and_prints_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(tmp_path)
    out = _import_and_compute(env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no "error: XDG_RUNTIME_DIR is invalid or not set" from the Vulkan stack
    result, path = out.stdout.split("\n")[:2]
    assert result == "[2.0, 2.0, 2.0]"
    assert path == str(tmp_path / f"wgpar-runtime-{os.getuid()}")
    assert (tmp_path / f"wgpar-runtime-{os.getuid()}").stat().st_mode & 0o777 == 0o700


def test_xdg_runtime_dir_default_is_private_and_never_overrides_the_user(tmp_path, monkeypatch):
    from wgpar.runtime.config import ensure_xdg_runtime_dir

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/mine")
    assert ensure_xdg_runtime_dir() is None and os.environ["XDG_RUNTIME_DIR"] == "/mine"
    if not sys.platform.startswith("linux"):
        return
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    shared = tmp_path / f"wgpar-runtime-{os.getuid()}"
    shared.mkdir(mode=0o755)  # the usual path exists but is not private: a fresh private directory instead
    shared.chmod(0o755)
    fresh = ensure_xdg_runtime_dir()
    assert fresh is not None and fresh != str(shared) and fresh.startswith(str(tmp_path))
    assert os.environ["XDG_RUNTIME_DIR"] == fresh and os.stat(fresh).st_mode & 0o777 == 0o700
