"""Storage: the one buffer behind a tensor and its views, returned to the allocator when it dies."""

from __future__ import annotations

from .dtypes import DType
from .runtime.device import Device


class Storage:
    """Owns one allocator block. Views share it; ``version`` counts in-place writes."""

    __slots__ = ("device", "block", "dtype", "numel", "version", "__weakref__")

    def __init__(self, device: Device, dtype: DType, numel: int) -> None:
        self.device = device
        self.dtype = dtype
        self.numel = numel
        self.version = 0
        self.block = None  # set first: __del__ runs even when malloc below raises
        # Zero-size tensors own no buffer: WebGPU bindings must be non-empty, and no kernel runs on them.
        self.block = device.malloc(numel * dtype.itemsize) if numel > 0 else None

    @property
    def buffer(self):
        return self.block.buffer if self.block is not None else None

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __del__(self) -> None:
        block = self.block
        if block is not None:
            self.block = None
            try:
                self.device.allocator.free(block)
            except Exception:  # interpreter shutdown: the allocator may already be gone
                pass
