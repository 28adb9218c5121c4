"""Adapters, devices, the caching allocator and kernel dispatch."""

from .adapters import adapter_names, device, devices, initialized_devices, open_device, resolve
from .device import Device

__all__ = ["Device", "adapter_names", "device", "devices", "initialized_devices", "open_device", "resolve"]
