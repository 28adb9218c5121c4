"""Per-device caching allocator with exact memory counts.

A tensor's storage owns one block. When the storage dies its block goes back
to a size-bucketed free list and is reused by the next allocation of the same
bucket. Reuse is safe without waiting for the GPU because every use of a
buffer on this device goes through one queue, in order; the one exception,
``queue.write_buffer`` (which runs before still-unsubmitted work), is handled
by the device flushing before any host upload.

An optional limit caps ``reserved_bytes`` (what a device with that much memory could hold):
a buffer that would pass it is refused like a real out-of-memory error, so the cache is released
and the allocation retried once before OutOfMemoryError. ``wgpar.set_memory_limit`` sets it per
device, ``WGPAR_MEMORY_LIMIT`` for every device (tests and examples show what fits in less memory).

Memory really goes back to wgpu only in :meth:`CachingAllocator.release_cache`,
which the device calls after its queue is idle, and which drops buffers
instead of destroying them: destroying a buffer that queued work still uses
aborts the process.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import TypeVar

import wgpu

from ..errors import OutOfMemoryError

_MIN_BLOCK = 256

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def round_size(nbytes: int, limit: int) -> int:
    """Bucket size for a request: at most 25% above it, never above ``limit``."""
    if nbytes <= _MIN_BLOCK:
        return _MIN_BLOCK
    granule = max(_MIN_BLOCK, 1 << (nbytes.bit_length() - 3))
    size = -(-nbytes // granule) * granule
    if size > limit:
        size = -(-nbytes // 4) * 4
    return size


class Block:
    """One buffer handed out by the allocator; ``nbytes`` is what was asked for."""

    __slots__ = ("buffer", "size", "nbytes")

    def __init__(self, buffer: wgpu.GPUBuffer, size: int, nbytes: int) -> None:
        self.buffer = buffer
        self.size = size
        self.nbytes = nbytes


class CachingAllocator:
    def __init__(
        self,
        create: Callable[[int], wgpu.GPUBuffer],
        limit: int,
        on_release: Callable[[list[wgpu.GPUBuffer]], None],
        name: str,
    ) -> None:
        self._create = create
        self._limit = limit
        self._on_release = on_release
        self._name = name
        # Storage.__del__ frees blocks, and the cyclic GC may run it at any Python allocation, also on
        # a thread that holds this lock. So: a reentrant lock, and no object is made while it is held
        # (a nested free in mid-update would corrupt the counts or the buckets).
        self._lock = threading.RLock()
        self._free: dict[int, list[wgpu.GPUBuffer]] = {}
        # Every buffer handed out stays referenced here until freed. Otherwise a tensor in a garbage
        # cycle (autograd graph, a traceback) takes its buffer into the cycle, and the collector runs
        # the buffer's finalizer (releasing the wgpu handle) as well as Storage.__del__, which puts
        # the dead buffer back in the cache: its next use aborts the process.
        self._in_use: dict[int, wgpu.GPUBuffer] = {}
        self.allocated_bytes = 0
        self.peak_allocated_bytes = 0
        self.reserved_bytes = 0
        self.cached_bytes = 0
        self.num_allocs = 0
        self.num_frees = 0
        self.num_buffer_creates = 0
        self.num_cache_hits = 0
        self.num_ooms = 0
        self.memory_limit: int | None = None  # cap on reserved_bytes; see set_limit
        # Called before the one retry after an out-of-memory error: must return every cached buffer
        # to wgpu for real (the device waits for its queue, drops the cache, and polls).
        self.reclaim: Callable[[], object] = self.release_cache

    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes, self._limit)
        buf = None
        with self._lock:
            bucket = self._free.get(size)
            if bucket:
                buf = bucket.pop()
                self.cached_bytes -= size
                self.num_cache_hits += 1
                self._in_use[id(buf)] = buf
                self._count_alloc(nbytes)
        if buf is None:
            buf = self._create_with_retry(size, nbytes)
            with self._lock:
                self.reserved_bytes += size
                self.num_buffer_creates += 1
                self._in_use[id(buf)] = buf
                self._count_alloc(nbytes)
        return Block(buf, size, nbytes)

    def _count_alloc(self, nbytes: int) -> None:
        self.allocated_bytes += nbytes
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        self.num_allocs += 1

    def set_limit(self, nbytes: int | None) -> int | None:
        """Cap ``reserved_bytes`` at ``nbytes`` (None: no cap); returns the previous cap.

        Buffers already held stay; only new ones are refused past the cap.
        """
        if nbytes is not None:
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise ValueError(f"{self._name}: the memory limit must be a number of bytes >= 0 or None, "
                                 f"got {nbytes!r}")
        prev, self.memory_limit = self.memory_limit, nbytes
        return prev

    def _create_within_limit(self, size: int) -> wgpu.GPUBuffer:
        limit = self.memory_limit
        if limit is not None and self.reserved_bytes + size > limit:
            raise MemoryError(f"not enough memory left under the limit of {limit} bytes")
        return self._create(size)

    def _create_with_retry(self, size: int, nbytes: int) -> wgpu.GPUBuffer:
        try:
            return create_with_retry(lambda: self._create_within_limit(size), self.reclaim)
        except OutOfMemoryError as exc:
            self.num_ooms += 1
            limit = "" if self.memory_limit is None else f"; memory limit {self.memory_limit} bytes"
            raise OutOfMemoryError(
                f"{self._name}: out of memory allocating {nbytes} bytes (block {size} bytes) after releasing "
                f"the cache; {self.allocated_bytes} bytes allocated by tensors, {self.reserved_bytes} bytes "
                f"reserved{limit} ({exc})") from None

    def free(self, block: Block) -> None:
        buf, block.buffer = block.buffer, None
        if buf is None:
            return
        new_bucket: list[wgpu.GPUBuffer] = []  # made outside the lock (see __init__)
        with self._lock:
            self.allocated_bytes -= block.nbytes
            self.num_frees += 1
            del self._in_use[id(buf)]
            self._free.setdefault(block.size, new_bucket).append(buf)
            self.cached_bytes += block.size

    def release_cache(self) -> int:
        """Drop every cached buffer; returns the bytes given back to wgpu."""
        empty: dict[int, list[wgpu.GPUBuffer]] = {}
        with self._lock:
            old, self._free = self._free, empty
            released = self.cached_bytes
            self.reserved_bytes -= released
            self.cached_bytes = 0
        dropped = [b for bucket in old.values() for b in bucket]
        self._on_release(dropped)
        return released

    def stats(self) -> dict[str, int]:
        with self._lock:
            values = (self.allocated_bytes, self.peak_allocated_bytes, self.reserved_bytes, self.cached_bytes,
                      self.num_allocs, self.num_frees, self.num_buffer_creates, self.num_cache_hits,
                      self.num_ooms)
        return dict(zip(_STAT_NAMES, values))

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_allocated_bytes = self.allocated_bytes


_STAT_NAMES = ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "cached_bytes", "num_allocs",
               "num_frees", "num_buffer_creates", "num_cache_hits", "num_ooms")


T = TypeVar("T")


def create_with_retry(create: Callable[[], T], reclaim: Callable[[], object]) -> T:
    """``create()``; on an out-of-memory error, collect garbage cycles (dead objects holding tensors, e.g. a
    dropped model whose modules and hooks refer to each other, wait for the cycle collector), ``reclaim()``
    (give cached buffers back to wgpu once the queue is idle) and try exactly once more.
    Every buffer wgpar makes goes through here: tensor blocks
    and the staging and upload buffers of host transfers.

    Raises OutOfMemoryError (holding wgpu's message) when the second try fails for lack of memory too;
    the caller rewords it with the bytes and the device. Other errors pass through unchanged.
    """
    try:
        return create()
    except Exception as first:  # wgpu reports OOM as GPUValidationError or MemoryError
        if not _looks_like_oom(first):
            raise
    gc.collect()  # their blocks return to the cache, which reclaim() then gives back
    reclaim()
    try:
        return create()
    except Exception as second:
        if not _looks_like_oom(second):
            raise
        raise OutOfMemoryError(str(second)) from None


def _looks_like_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return "memory" in text and ("not enough" in text or "out of" in text)
