"""Storage: the one buffer behind a tensor and its views, returned to the allocator when it dies.

A Storage can also give its buffer back early and take a new one later while it, and every tensor
over it, stays the same object (``free`` / ``materialize``): FSDP keeps a full-size Parameter whose
memory exists only while its module runs. See docs/design.md "Hooks for FSDP".
"""

from __future__ import annotations

from .dtypes import DType
from .errors import StorageFreedError
from .runtime import memory_history as _hist
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
        if numel > 0:
            nbytes = numel * dtype.itemsize
            # straight to the allocator within the binding limit (one call less per op); past it the device raises
            self.block = device.allocator.malloc(nbytes) if nbytes <= device.max_binding else device.malloc(nbytes)

    @property
    def buffer(self):
        # Every kernel, copy, upload and readback gets its buffer here, so this is the one check
        # for freed storage; the live case pays nothing more than before.
        """The wgpu buffer holding this storage's elements (None for an empty storage).

        Raises StorageFreedError if the storage was freed (e.g. an FSDP shard resharded); no torch counterpart.
        """
        block = self.block
        if block is not None:
            return block.buffer
        if self.numel == 0:
            return None
        raise StorageFreedError(
            f"the storage of this tensor ({self.numel} {self.dtype.name} elements, {self.nbytes} bytes, on "
            f"{self.device}) was freed (e.g. resharded by FSDP); call .untyped_storage().materialize() on it "
            "and write its values before using it")

    @property
    def nbytes(self) -> int:
        """Size of the storage in bytes: ``numel * dtype.itemsize`` (``torch.UntypedStorage.nbytes()``, here a
        property)."""
        return self.numel * self.dtype.itemsize

    @property
    def is_freed(self) -> bool:
        """True between ``free()`` and ``materialize()`` (never for a zero-size storage)."""
        return self.block is None and self.numel > 0

    def free(self) -> None:
        """Give this storage's memory back to the device's allocator now; a no-op if already freed.

        The Storage and the tensors over it stay valid objects, but any op, copy or readback that
        touches them raises StorageFreedError until ``materialize()``. ``allocated_bytes`` drops by
        exactly ``nbytes``.

        Safe while queued GPU work still reads the buffer: the allocator hands the block to a later
        allocation on this device, whose writes are recorded after that work on the device's one
        queue and so run after it (docs/design.md, "Memory lifecycle"); the buffer itself is
        destroyed only by ``empty_cache``, which first waits for the queue to go idle.
        """
        block, self.block = self.block, None
        if block is not None:
            self.device.allocator.free(block)

    def materialize(self) -> None:
        """Take a fresh block of ``nbytes`` for a freed storage; a no-op if it has memory.

        The contents are uninitialised: write them before reading. This counts as an in-place write
        (the version goes up), so a tensor the autograd graph saved fails backward's version check
        unless its values are restored inside ``wgpar.autograd.preserve_version``.
        ``allocated_bytes`` rises by exactly ``nbytes``; may raise OutOfMemoryError.
        """
        if self.block is not None or self.numel == 0:
            return
        self.block = self.device.malloc(self.nbytes)
        self.bump_version()

    def bump_version(self) -> None:
        """Count one in-place write: every op that writes a storage in place calls this, so tensors the
        autograd graph saved fail backward's version check (and host-known value ranges lapse)."""
        self.version += 1

    def tag(self, category: str) -> None:
        """Put this storage's memory in ``category`` on the memory timeline (``wgpar.memory``); a new block
        after ``free``/``materialize`` takes the category of the code that allocates it."""
        _hist.tag(self.device.allocator, self.block, category)

    def __repr__(self) -> str:
        state = "freed" if self.is_freed else f"{self.nbytes} bytes"
        return f"<Storage {self.numel} x {self.dtype.name} on {self.device}: {state}>"

    def __del__(self) -> None:
        block = self.block
        if block is not None:
            self.block = None
            try:
                self.device.allocator.free(block)
            except Exception:  # interpreter shutdown: the allocator may already be gone
                pass
