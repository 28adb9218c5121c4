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

While ``wgpar.memory.record_history`` records, every malloc, free, cache release and staging
buffer is an event of ``runtime/memory_history.py`` carrying the counts after it; otherwise each
malloc and free reads one global more.

Memory really goes back to wgpu only in :meth:`CachingAllocator.release_cache`,
which the device calls after its queue is idle, and which drops buffers
instead of destroying them: destroying a buffer that queued work still uses
aborts the process.
"""

from __future__ import annotations

import bisect
import gc
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

import wgpu

from ..errors import OutOfMemoryError
from . import memory_history as _hist

_MIN_BLOCK = 256
_SIZES_MAX = 4096  # request sizes whose block size is remembered

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

    # category: set by memory_history.tag, or by a malloc while a history records (else unset: "other")
    # serial: the buffer's creation number on its allocator (the cache hands out the lowest free one)
    __slots__ = ("buffer", "size", "nbytes", "category", "serial")

    def __init__(self, buffer: wgpu.GPUBuffer, size: int, nbytes: int) -> None:
        self.buffer = buffer
        self.size = size
        self.nbytes = nbytes
        self.serial = 0


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
        self.device_index = -1  # the Device sets it; names the device in the memory timeline
        # Storage.__del__ frees blocks, and the cyclic GC may run it at any Python allocation, also on
        # a thread that holds this lock. So: a reentrant lock, and no object is made while it is held
        # (a nested free in mid-update would corrupt the counts or the buckets).
        self._lock = threading.RLock()
        # Per bucket size, the cached buffers' serials, negated and ascending: pop() gives the lowest
        # serial. Handing out the lowest free buffer (not the last freed) makes a repeated step's
        # buffers the same every step, whatever order the last step freed them in, so the device's
        # bind groups (keyed by buffers) are reused instead of made again for every dispatch.
        self._free: dict[int, list[int]] = {}
        self._cached: dict[int, wgpu.GPUBuffer] = {}  # serial -> cached buffer
        self._next_serial = 0
        self._sizes: dict[int, int] = {}  # request -> block size (round_size)
        # Every buffer handed out stays referenced here until freed. Otherwise a tensor in a garbage
        # cycle (autograd graph, a traceback) takes its buffer into the cycle, and the collector runs
        # the buffer's finalizer (releasing the wgpu handle) as well as Storage.__del__, which puts
        # the dead buffer back in the cache: its next use aborts the process.
        # The blocks too: a history's census reads their categories.
        self._in_use: dict[int, Block] = {}
        self.allocated_bytes = 0
        self.peak_allocated_bytes = 0
        self.reserved_bytes = 0
        self.cached_bytes = 0
        self.num_allocs = 0
        self.num_frees = 0
        self.num_buffer_creates = 0
        self.num_cache_hits = 0
        self.num_ooms = 0
        self.staging_bytes = 0  # host-transfer buffers (Device.create_buffer), outside reserved_bytes
        self._seq = 0  # orders this device's memory-history events
        self.memory_limit: int | None = None  # cap on reserved_bytes; see set_limit
        # Called before the one retry after an out-of-memory error: must return every cached buffer
        # to wgpu for real (the device waits for its queue, drops the cache, and polls).
        self.reclaim: Callable[[], object] = self.release_cache
        _hist.register(self)

    def malloc(self, nbytes: int) -> Block:
        size = self._sizes.get(nbytes)
        if size is None:
            size = self._size_of(nbytes)
        block = Block(None, size, nbytes)
        rec = None
        lock = self._lock
        lock.acquire()  # acquire / release in try / finally: half the cost of `with` (this runs per op)
        try:
            bucket = self._free.get(size)
            if bucket:
                block.serial = serial = -bucket.pop()
                buf = block.buffer = self._cached.pop(serial)
                self.cached_bytes -= size
                self.num_cache_hits += 1
                self._in_use[id(buf)] = block
                allocated = self.allocated_bytes = self.allocated_bytes + nbytes
                if allocated > self.peak_allocated_bytes:
                    self.peak_allocated_bytes = allocated
                self.num_allocs += 1
                rec = _hist.ACTIVE
                if rec is not None:  # only names and ints here: no object is made under the lock
                    seq = self._seq = self._seq + 1
                    allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        finally:
            lock.release()
        from_cache = block.buffer is not None
        if not from_cache:
            buf = block.buffer = self._create_with_retry(size, nbytes)
            with self._lock:
                block.serial = self._next_serial = self._next_serial + 1
                self.reserved_bytes += size
                self.num_buffer_creates += 1
                self._in_use[id(buf)] = block
                self._count_alloc(nbytes)
                rec = _hist.ACTIVE
                if rec is not None:
                    seq = self._seq = self._seq + 1
                    allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        if rec is not None:
            block.category = cat = _hist.current_category()
            rec.record(self.device_index, "alloc", cat, nbytes, size, from_cache, None, seq, allocated, reserved,
                       staging)
        return block

    def _count_alloc(self, nbytes: int) -> None:
        self.allocated_bytes += nbytes
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        self.num_allocs += 1

    def _size_of(self, nbytes: int) -> int:
        """``round_size`` remembered per request size (a training step asks for the same few sizes)."""
        if len(self._sizes) >= _SIZES_MAX:
            self._sizes.clear()
        size = self._sizes[nbytes] = round_size(nbytes, self._limit)
        return size

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
        size = block.size
        new_bucket: list[int] = []  # made outside the lock (see __init__)
        lock = self._lock
        lock.acquire()
        try:
            self.allocated_bytes -= block.nbytes
            self.num_frees += 1
            del self._in_use[id(buf)]
            bisect.insort(self._free.setdefault(size, new_bucket), -block.serial)
            self._cached[block.serial] = buf
            self.cached_bytes += size
            rec = _hist.ACTIVE
            if rec is not None:
                seq = self._seq = self._seq + 1
                allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        finally:
            lock.release()
        if rec is not None:
            rec.record(self.device_index, "free", _hist.block_category(block), block.nbytes, size, False, None,
                       seq, allocated, reserved, staging)

    def retag(self, block: Block, name: str) -> None:
        """Give a live block category ``name``, as an event of the running history (memory_history.tag)."""
        with self._lock:
            if block.buffer is None:
                return
            old = _hist.block_category(block)
            block.category = name
            rec = _hist.ACTIVE
            if rec is not None:
                seq = self._seq = self._seq + 1
        if rec is not None:
            rec.record(self.device_index, "retag", name, block.nbytes, block.size, False, old, seq, None, None, None)

    def track_staging(self, buffer: wgpu.GPUBuffer, size: int) -> None:
        """Count a host-transfer buffer made outside the blocks (``staging_bytes``) until it is dropped."""
        with self._lock:
            self.staging_bytes += size
            rec = _hist.ACTIVE
            if rec is not None:
                seq = self._seq = self._seq + 1
                allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        if rec is not None:
            rec.record(self.device_index, "staging alloc", _hist.STAGING, size, size, False, None, seq, allocated,
                       reserved, staging)
        weakref.finalize(buffer, self._staging_dropped, size)

    def _staging_dropped(self, size: int) -> None:
        with self._lock:
            self.staging_bytes -= size
            rec = _hist.ACTIVE
            if rec is not None:
                seq = self._seq = self._seq + 1
                allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        if rec is not None:
            rec.record(self.device_index, "staging free", _hist.STAGING, size, size, False, None, seq, allocated,
                       reserved, staging)

    def census(self, t: int) -> _hist.DeviceStart:
        """This device's memory by category when a history starts (called with the lock held)."""
        by_category = dict.fromkeys(_hist.TENSOR_CATEGORIES, 0)
        live = 0
        for block in self._in_use.values():
            by_category[_hist.block_category(block)] += block.nbytes
            live += block.size
        return _hist.DeviceStart(self.device_index, t, by_category, live, self.cached_bytes, self.staging_bytes)

    def release_cache(self) -> int:
        """Drop every cached buffer; returns the bytes given back to wgpu."""
        empty: dict[int, list[int]] = {}
        none_cached: dict[int, wgpu.GPUBuffer] = {}
        with self._lock:
            self._free = empty
            old, self._cached = self._cached, none_cached
            released = self.cached_bytes
            self.reserved_bytes -= released
            self.cached_bytes = 0
            rec = _hist.ACTIVE
            if rec is not None and released:
                seq = self._seq = self._seq + 1
                allocated, reserved, staging = self.allocated_bytes, self.reserved_bytes, self.staging_bytes
        if rec is not None and released:
            rec.record(self.device_index, "release", _hist.CACHE, 0, released, False, None, seq, allocated, reserved,
                       staging)
        dropped = list(old.values())
        self._on_release(dropped)
        return released

    def stats(self) -> dict[str, int]:
        with self._lock:
            values = (self.allocated_bytes, self.peak_allocated_bytes, self.reserved_bytes, self.cached_bytes,
                      self.num_allocs, self.num_frees, self.num_buffer_creates, self.num_cache_hits,
                      self.num_ooms, self.staging_bytes)
        return dict(zip(_STAT_NAMES, values))

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_allocated_bytes = self.allocated_bytes


_STAT_NAMES = ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "cached_bytes", "num_allocs",
               "num_frees", "num_buffer_creates", "num_cache_hits", "num_ooms", "staging_bytes")


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
