"""Host transfers through persistent staging buffers, with a timeout on every wait.

Downloads: the GPU copies into a MAP_READ buffer and the buffer is mapped;
the host reads the mapped memory in place (``view``), with no extra copy.
Uploads: a MAP_WRITE buffer stays mapped while idle, the host writes into it
in place, and ``commit`` unmaps it and lets the GPU copy it into the target,
then maps it again in the background. Both buffers are allocated once and
reused: fresh host memory is costly to touch (first-touch page faults cost
more than the PCIe transfer itself on the GPU machines measured here; see
BENCHMARKS.md), and queue.write_buffer allocates a new staging area per call.

wgpu's sync_wait has no timeout (and hangs forever if the device is lost), so
waits go through the promise's completion event with a deadline.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import wgpu

from . import profiling

if TYPE_CHECKING:  # only for annotations: device.py imports this module
    from .device import Device


class TransferTimeout(TimeoutError):
    pass


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_COPY_BLOCK = 4 << 20  # bytes per task of a parallel host copy


_sharers = 1  # processes of this host that each run a host pool (MPI ranks)


def host_cores() -> int:
    """The cores this process may run on (its affinity: Open MPI binds each rank to one core unless
    launched with ``--bind-to none``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def host_threads() -> int:
    """Workers of the host pool: this process's cores (``host_cores``), shared among the processes of
    the host that each run one (``share_host_pool``), at least 2 and at most 16."""
    return max(2, min(16, host_cores() // _sharers))


def share_host_pool(processes: int) -> None:
    """``processes`` processes of this host (MPI ranks) run host pools at once: each takes its share of
    the cores (called before the pool is first used)."""
    global _sharers
    with _pool_lock:
        _sharers = max(1, int(processes))


def host_pool() -> ThreadPoolExecutor:
    """Threads for host-side copies and reductions (NumPy releases the GIL), made on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=host_threads(), thread_name_prefix="wgpar-host")
        return _pool


def host_copy(dst: memoryview, src) -> None:
    """Copy bytes into (mapped) memory in blocks on the host pool: one core cannot saturate PCIe."""
    d = np.frombuffer(dst, dtype=np.uint8)
    s = np.frombuffer(memoryview(src).cast("B"), dtype=np.uint8)
    if s.size <= _COPY_BLOCK:
        np.copyto(d[: s.size], s)
        return
    tasks = [host_pool().submit(np.copyto, d[a:a + _COPY_BLOCK], s[a:a + _COPY_BLOCK])
             for a in range(0, s.size - _COPY_BLOCK, _COPY_BLOCK)]
    tail = (s.size - 1) // _COPY_BLOCK * _COPY_BLOCK
    np.copyto(d[tail:s.size], s[tail:])
    for t in tasks:
        t.result()


class _NoPollToken:
    """Stands in for wgpu-py's poller token: we poll this map ourselves, without blocking."""

    def set_done(self) -> None:
        pass


def map_async(buffer: wgpu.GPUBuffer, mode, offset: int = 0, size: int | None = None):
    """``buffer.map_async`` without waking wgpu-py's poller thread.

    While a map is pending, wgpu-py's per-device poller calls a *blocking* device poll that
    waits for all submitted work, and submits on that device (and, as measured on two H200s,
    on the other device too) wait behind it: the GPUs stop overlapping. Maps made here are
    completed by ``wait_promise``'s non-blocking polls instead. Call with the device lock held.
    """
    dev = buffer._device
    poller = getattr(dev, "_poller", None)
    if poller is None:
        return buffer.map_async(mode, offset, size)
    real = poller.get_token
    poller.get_token = _NoPollToken
    try:
        promise = buffer.map_async(mode, offset, size)
    finally:
        poller.get_token = real
    promise._wgpar_poll = dev._poll  # the non-blocking wgpuDevicePoll that completes it
    return promise


def wait_promise(promise, timeout: float, what: str) -> None:
    """Wait for a wgpu promise at most ``timeout`` seconds, then resolve it (raising its error)."""
    event = getattr(promise, "_thread_event", None)
    poll = getattr(promise, "_wgpar_poll", None)
    deadline = time.monotonic() + timeout
    if poll is not None and event is not None:  # ours: poll without blocking until it resolves
        pause = 0.00005
        while not event.is_set():
            poll(False)
            if event.wait(pause):
                break
            if time.monotonic() > deadline:
                raise TransferTimeout(f"{what}: not finished after {timeout:.1f} s")
            pause = min(pause * 2, 0.00025)  # a map is waited on in the critical path: wake often
    elif event is not None:  # wgpu-native resolves promises from a per-device poller thread
        if not event.wait(timeout):
            raise TransferTimeout(f"{what}: not finished after {timeout:.1f} s")
    else:  # another backend: poll its state
        while getattr(promise, "_state", "") == "pending":
            if time.monotonic() > deadline:
                raise TransferTimeout(f"{what}: not finished after {timeout:.1f} s")
            time.sleep(0.0005)
    promise.sync_wait()


def promise_done(promise, poll: bool = True) -> bool:
    """Whether a map ``promise`` has resolved, without waiting (one non-blocking device poll for ours unless
    ``poll`` is False: a poll settles every finished map of the device, so one per batch of checks does)."""
    event = getattr(promise, "_thread_event", None)
    if event is None:
        return getattr(promise, "_state", "pending") != "pending"
    if poll and not event.is_set():
        poll = getattr(promise, "_wgpar_poll", None)
        if poll is not None:
            poll(False)
    return event.is_set()


def _round4(n: int) -> int:
    return max(4, -(-n // 4) * 4)


class StagingBuffer:
    """A MAP_READ buffer on one device, reused for every readback of up to ``capacity`` bytes.

    ``start`` records the copy, submits and asks for the map without waiting; ``view`` waits
    (with a timeout) and returns the mapped bytes in place; ``release`` unmaps (the view
    must not be used after it). ``wait`` is view + copy + release in one.
    """

    def __init__(self, device: Device, capacity: int, label: str = "staging") -> None:
        self.device = device
        self.capacity = _round4(capacity)
        self._label = label
        self.buffer = self._create()
        self._promise = None
        self._nbytes = 0
        self._mapped = False

    def _create(self) -> wgpu.GPUBuffer:
        return self.device.create_buffer(self._label, self.capacity,
                                         wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def record(self, src: wgpu.GPUBuffer, src_offset: int, nbytes: int) -> None:
        """Record the GPU copy into this buffer, in stream order, without submitting or mapping."""
        if self._promise is not None or self._mapped:
            raise RuntimeError(f"staging buffer on {self.device} is still in use by an earlier transfer")
        if nbytes > self.capacity:
            raise ValueError(f"transfer of {nbytes} bytes exceeds the staging buffer's {self.capacity} bytes")
        self._nbytes = nbytes
        if nbytes:
            self.device.copy(src, src_offset, self.buffer, 0, nbytes)

    def request_map(self) -> None:
        """Ask for the map of a recorded copy (the caller has flushed the device)."""
        if self._nbytes and self._promise is None and not self._mapped:
            with self.device._lock:
                self._promise = map_async(self.buffer, wgpu.MapMode.READ, 0, self.capacity)

    def start(self, src: wgpu.GPUBuffer, src_offset: int, nbytes: int) -> None:
        """Record the copy, submit it, and ask for the map; returns without waiting."""
        with profiling.span("device -> staging", "transfer", bytes=nbytes, device=self.device.index):
            self.record(src, src_offset, nbytes)
            if nbytes:
                self.device.flush()
                self.request_map()

    def view(self, timeout: float, what: str = "readback") -> memoryview:
        """The transferred bytes, read in place from the mapped buffer (valid until ``release``)."""
        if self._nbytes == 0:
            return memoryview(b"")
        promise, self._promise = self._promise, None
        if promise is None:
            raise RuntimeError("view() without start()")
        try:
            with profiling.span("map wait", "transfer", bytes=self._nbytes, device=self.device.index):
                wait_promise(promise, timeout, f"{what} on {self.device}")
        except TransferTimeout:
            # A pending map cannot be cancelled: leave that buffer to finish on its own, use a new one.
            self.buffer = self._create()
            raise
        self._mapped = True
        return self.buffer.read_mapped(0, self._nbytes, copy=False)

    def release(self) -> None:
        if self._mapped:
            self._mapped = False
            self.buffer.unmap()

    @property
    def idle(self) -> bool:
        """Neither mapped nor waiting for a map: ready for the next ``start``."""
        return self._promise is None and not self._mapped

    def settle(self, timeout: float) -> None:
        """Make the buffer idle after a failure, when nobody reads it any more: wait for a pending map
        (a map still pending after ``timeout`` is left to finish on a buffer of its own), then unmap."""
        promise, self._promise = self._promise, None
        if promise is not None:
            try:
                wait_promise(promise, timeout, f"settling a staging buffer on {self.device}")
                self._mapped = True
            except TransferTimeout:
                self.buffer = self._create()
            except Exception:  # the map itself failed: nothing is mapped
                pass
        self.release()

    def wait(self, timeout: float, what: str = "readback") -> memoryview:
        """Wait for the transfer and return a copy of the bytes (the buffer is free again)."""
        data = self.view(timeout, what)
        try:
            return memoryview(bytes(data)) if len(data) else data
        finally:
            self.release()


class UploadBuffer:
    """A MAP_WRITE buffer kept mapped while idle: write into ``view()``, then ``commit`` it to a target."""

    def __init__(self, device: Device, capacity: int, label: str = "upload") -> None:
        self.device = device
        self.capacity = _round4(capacity)
        self.buffer = device.create_buffer(label, self.capacity,
                                           wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC,
                                           mapped_at_creation=True)
        self._promise = None

    @property
    def ready(self) -> bool:
        """Mapped now: its last commit's copy has run, so ``view`` will not wait (checked without waiting)."""
        return self.mapped_again(poll=True)

    def mapped_again(self, poll: bool) -> bool:
        """``ready``; with ``poll`` False as the device's last poll left it (no native call)."""
        return self._promise is None or promise_done(self._promise, poll)

    def view(self, timeout: float, what: str = "upload") -> memoryview:
        """Writable mapped memory (valid until ``commit``), once the previous commit has finished."""
        if self._promise is not None:
            promise, self._promise = self._promise, None
            with profiling.span("upload buffer wait", "transfer", device=self.device.index):
                wait_promise(promise, timeout, f"{what} on {self.device}")
        return self.buffer._experimental_get_mapped_range(0, self.capacity)

    def commit(self, dst: wgpu.GPUBuffer, dst_offset: int, nbytes: int) -> None:
        """Unmap, copy the first ``nbytes`` into ``dst`` on the GPU, and start mapping again."""
        self.commit_many([(0, dst, dst_offset, nbytes)])

    def commit_many(self, copies: list[tuple[int, wgpu.GPUBuffer, int, int]]) -> None:
        """Unmap, record each ``(offset, dst, dst_offset, nbytes)`` copy out of this buffer (offsets and
        sizes multiples of 4), submit, and start mapping again."""
        for off, _, _, nbytes in copies:
            if off + nbytes > self.capacity:
                raise ValueError(f"upload of {nbytes} bytes at offset {off} exceeds the buffer's {self.capacity} bytes")
        self.buffer.unmap()
        try:
            with profiling.span("staging -> device", "transfer", bytes=sum(c[3] for c in copies),
                                device=self.device.index):
                for off, dst, dst_offset, nbytes in copies:
                    if nbytes:
                        self.device.copy(self.buffer, off, dst, dst_offset, nbytes)
                if any(nbytes for *_, nbytes in copies):
                    self.device.flush()
        finally:  # also after a failed flush: the next view() waits for this map
            with self.device._lock:
                self._promise = map_async(self.buffer, wgpu.MapMode.WRITE, 0, self.capacity)

    def settle(self, timeout: float) -> bool:
        """Wait for a pending re-map (after a failure); False when it did not finish in time."""
        promise, self._promise = self._promise, None
        if promise is None:
            return True
        try:
            wait_promise(promise, timeout, f"settling an upload buffer on {self.device}")
            return True
        except TransferTimeout:
            return False
