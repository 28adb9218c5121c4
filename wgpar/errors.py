"""wgpar's exception types: each subclasses the builtin a Python user would catch."""

from __future__ import annotations


class WgparError(RuntimeError):
    """A failure inside wgpar or wgpu that is not the caller's input."""


class OutOfMemoryError(MemoryError):
    """A device could not allocate a buffer even after its cache was released."""


class DeviceMismatchError(ValueError):
    """Tensors on different devices were combined; wgpar never copies silently."""


class BindingLimitError(ValueError):
    """A tensor is larger than the device's largest storage binding."""


class AdapterNotFoundError(RuntimeError):
    """No WebGPU adapter matches the request (or none exists at all)."""


class StorageFreedError(RuntimeError):
    """A tensor was used while its storage was freed (``Storage.free``; FSDP's resharded parameters)."""


class ZeroDivisionRuntimeError(WgparError, ZeroDivisionError):
    """Integer division or remainder by zero: a RuntimeError as in PyTorch, and a ZeroDivisionError."""


class HostDeviceError(TypeError, ValueError):
    """A CPU (host) tensor was asked for (``t.cpu()``, ``device="cpu"``): wgpar has none. A TypeError
    (the tensor type has no such form) and a ValueError (like every other refused device string)."""
