"""Finding adapters and handing out Devices.

wgpu lists one GPU once per backend (Vulkan and OpenGL, say): wgpar keeps the
native backends (Vulkan, Metal, D3D12) and falls back to OpenGL only when no
native adapter exists. Software adapters (lavapipe) are dropped when a real
GPU is present, unless selected by name. Device slots beyond the number of
physical adapters are extra, independent GPUDevices on the adapters, round-robin,
so multi-device code runs on one GPU or on lavapipe; only devices(n) and
open_device make them, never device(i).
"""

from __future__ import annotations

import threading

import numpy as np
import wgpu

from ..errors import AdapterNotFoundError, HostDeviceError
from .config import CONFIG
from .device import Device
from .llvm_clash import load_triton_first

_NATIVE = ("vulkan", "metal", "d3d12")
_TYPE_ORDER = {"discretegpu": 0, "integratedgpu": 1, "virtualgpu": 2, "unknown": 3, "cpu": 4}

NO_HOST_TENSOR = ("wgpar has no CPU tensor: tensor.numpy() copies the values into a NumPy array (what PyTorch's "
                  "t.detach().cpu().numpy() gives), .tolist() into lists and .item() into one number")

NO_CUDA = ("wgpar has no CUDA device: it reaches an NVIDIA GPU, like any other, as a WebGPU adapter (Vulkan, "
           "D3D12 or Metal). Choose the adapter with wgpar.device(i) (wgpar.adapter_names() lists them) or with the "
           "environment variable WGPAR_ADAPTER=<index or name substring> (WGPAR_BACKEND=vulkan|metal|d3d12|opengl "
           "restricts the backend)")

_lock = threading.Lock()
_adapters: list[wgpu.GPUAdapter] | None = None
_slots: dict[int, Device] = {}


def _describe(a: wgpu.GPUAdapter) -> str:
    i = a.info
    return f"{i.get('device', '?')} ({i.get('backend_type', '?')}, {i.get('adapter_type', '?')})"


def _physical() -> list[wgpu.GPUAdapter]:
    global _adapters
    if _adapters is not None:
        return _adapters
    load_triton_first()  # before the Vulkan loader brings Mesa's LLVM in (see llvm_clash.py)
    found = list(wgpu.gpu.enumerate_adapters_sync())
    if not found:
        raise AdapterNotFoundError(
            "no WebGPU adapter found: install a Vulkan, Metal or D3D12 driver, or Mesa's software "
            "Vulkan adapter (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)")
    backend = lambda a: str(a.info.get("backend_type", "")).lower()  # noqa: E731
    kind = lambda a: str(a.info.get("adapter_type", "unknown")).lower()  # noqa: E731
    if CONFIG.backend:
        found = [a for a in found if backend(a) == CONFIG.backend]
    native = [a for a in found if backend(a) in _NATIVE]
    chosen = _dedupe(native or found)
    if CONFIG.adapter is not None:
        chosen = _select(chosen, CONFIG.adapter)
    elif any(kind(a) != "cpu" for a in chosen):
        chosen = [a for a in chosen if kind(a) != "cpu"]
    chosen.sort(key=lambda a: _TYPE_ORDER.get(kind(a), 3))  # stable: keeps wgpu's order within a type
    if not chosen:
        raise AdapterNotFoundError(f"no adapter left after WGPAR_BACKEND={CONFIG.backend!r}")
    _adapters = chosen
    return chosen


def _dedupe(found: list[wgpu.GPUAdapter]) -> list[wgpu.GPUAdapter]:
    """Keep each GPU once: of the backends listing one (vendor, device, name), only the preferred one.

    Identical cards on the same backend stay separate (they are separate GPUs); the same card seen
    through Vulkan and D3D12 (Windows) counts once.
    """
    def rank(a: wgpu.GPUAdapter) -> int:
        b = str(a.info.get("backend_type", "")).lower()
        return _NATIVE.index(b) if b in _NATIVE else len(_NATIVE)

    def ident(a: wgpu.GPUAdapter) -> tuple:
        i = a.info
        return i.get("vendor_id"), i.get("device_id"), i.get("device")

    best: dict[tuple, int] = {}
    for a in found:
        best[ident(a)] = min(best.get(ident(a), rank(a)), rank(a))
    return [a for a in found if rank(a) == best[ident(a)]]


def _select(candidates: list[wgpu.GPUAdapter], want: str) -> list[wgpu.GPUAdapter]:
    names = [_describe(a) for a in candidates]
    if want.isdigit():
        i = int(want)
        if i >= len(candidates):
            raise AdapterNotFoundError(f"WGPAR_ADAPTER={want}: only {len(candidates)} adapters: {names}")
        return [candidates[i]]
    hits = [a for a, n in zip(candidates, names) if want.lower() in n.lower()]
    if not hits:
        raise AdapterNotFoundError(f"WGPAR_ADAPTER={want!r} matches none of {names}")
    return hits


def adapter_names() -> list[str]:
    """The physical adapters wgpar will use, in device order."""
    return [_describe(a) for a in _physical()]


def _index(index) -> int:
    if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)) or index < 0:
        raise ValueError(f"device index must be a non-negative int, got {index!r}")
    return int(index)


def device(index: int | str | Device = 0) -> Device:
    """Device ``index``: an adapter's (index < the number of adapters), or a device ``devices(n)``
    (or an MPI launch) made; a Device, ``"wgpu"`` or ``"wgpu:N"`` are accepted too. Any other index
    raises ValueError naming the adapters and devices that exist: only ``devices(n)`` makes logical
    devices (several independent devices on one adapter).

    Arguments:
        index: the device's index, or one of the spellings above.
    """
    if isinstance(index, Device):
        return index
    if isinstance(index, str):
        return resolve(index)
    index = _index(index)
    with _lock:
        dev = _slots.get(index)
        if dev is not None:
            return dev
        phys = _physical()
        if index < len(phys):
            return _open_locked(index, phys)
        made = sorted(_slots)
        have = f"devices {made[0]}..{made[-1]}" if len(made) > 1 else f"device {made[0]}" if made else "no device"
        raise ValueError(f"wgpar.device({index}): there {'is' if len(phys) == 1 else 'are'} {len(phys)} "
                         f"adapter{'s' * (len(phys) != 1)} ({', '.join(_describe(a) for a in phys)}) and {have} "
                         f"so far; wgpar.devices({index + 1}) makes {index + 1} devices, logical ones on shared "
                         "adapters past the adapters' count")


def open_device(index: int) -> Device:
    """Device ``index``, made if it does not exist yet: adapter ``index % A`` of the A adapters, a logical
    device of its own (own memory and queue) when ``index >= A``. ``devices(n)`` opens 0..n-1; an MPI
    process with local rank k opens k (docs/design.md); tests open a device of their own with it.

    Arguments:
        index: a non-negative int.
    """
    index = _index(index)
    with _lock:
        dev = _slots.get(index)
        return dev if dev is not None else _open_locked(index, _physical())


def _open_locked(index: int, phys: list[wgpu.GPUAdapter]) -> Device:
    dev = _slots[index] = Device(phys[index % len(phys)], index, logical=index // len(phys))
    return dev


def devices(n: int | None = None) -> list[Device]:
    """One Device per physical adapter, or ``n`` devices: 0..n-1, logical ones on shared adapters past
    the number of adapters (so multi-device code runs on one GPU or on lavapipe).

    Arguments:
        n: how many (default: one per adapter).
    """
    if n is None:
        n = len(_physical())
    if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)) or n < 1:
        raise ValueError(f"devices(n) needs an int n >= 1, got {n!r}")
    return [open_device(i) for i in range(int(n))]


def resolve(dev: Device | int | str | None) -> Device:
    """Accept a Device, an index, ``"wgpu"`` (device 0) or ``"wgpu:N"``, or None (device 0).

    Other frameworks' device strings ("cuda:1", "cpu", "mps") raise ValueError: wgpar never maps
    them onto its own devices.
    """
    if dev is None:
        return device(0)
    if isinstance(dev, Device):
        return dev
    if type(dev).__module__ == "torch":  # a torch.device: judged by its string, "cpu" or "cuda:0"
        dev = str(dev)
    if isinstance(dev, str):
        kind, sep, tail = dev.partition(":")
        if kind == "wgpu" and not sep:
            return device(0)
        if kind == "wgpu" and tail.isascii() and tail.isdigit():
            return device(int(tail))
        what = (f"device {dev!r} is not a wgpar device: wgpar runs on WebGPU adapters and accepts a Device, an "
                "index, 'wgpu' or 'wgpu:N' (see wgpar.devices())")
        if kind == "cpu":
            raise HostDeviceError(f"{what}. {NO_HOST_TENSOR}")
        if kind == "cuda":
            raise ValueError(f"{what}. {NO_CUDA}")
        raise ValueError(what)
    return device(dev)


def initialized_devices() -> list[Device]:
    with _lock:
        return [_slots[k] for k in sorted(_slots)]
