"""Adapters, devices, the caching allocator and kernel dispatch."""

from .adapters import adapter_names, device, devices, initialized_devices, open_device, resolve
from .config import ensure_xdg_runtime_dir
from .device import Device

ensure_xdg_runtime_dir()  # before the first adapter is opened (importing wgpu reads nothing of it)

__all__ = ["Device", "adapter_names", "device", "devices", "initialized_devices", "open_device", "resolve"]
