"""Asynchronous readback through persistent staging buffers, with a timeout on every wait.

A collective starts the copy and the map on every rank before any rank waits,
so transfers from several devices overlap. wgpu's own sync_wait has no
timeout (and hangs forever if the device is lost), so waits go through the
promise's completion event with a deadline.
"""

from __future__ import annotations

import time

import wgpu

from .device import Device


class TransferTimeout(TimeoutError):
    pass


def wait_promise(promise, timeout: float, what: str) -> None:
    """Wait for a wgpu promise at most ``timeout`` seconds, then resolve it (raising its error)."""
    event = getattr(promise, "_thread_event", None)
    if event is not None:  # wgpu-native resolves promises from a per-device poller thread
        if not event.wait(timeout):
            raise TransferTimeout(f"{what}: not finished after {timeout:.1f} s")
    else:  # another backend: poll its state
        deadline = time.monotonic() + timeout
        while getattr(promise, "_state", "") == "pending":
            if time.monotonic() > deadline:
                raise TransferTimeout(f"{what}: not finished after {timeout:.1f} s")
            time.sleep(0.0005)
    promise.sync_wait()


class StagingBuffer:
    """A MAP_READ buffer on one device, reused for every readback of up to ``capacity`` bytes."""

    def __init__(self, device: Device, capacity: int, label: str = "staging") -> None:
        self.device = device
        self.capacity = max(4, -(-capacity // 4) * 4)
        self._label = f"wgpar:{device.index}:{label}"
        self.buffer = self._create()
        self._promise = None
        self._nbytes = 0

    def _create(self) -> wgpu.GPUBuffer:
        return self.device._dev.create_buffer(label=self._label, size=self.capacity,
                                              usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def start(self, src: wgpu.GPUBuffer, src_offset: int, nbytes: int) -> None:
        """Record the copy, submit it, and ask for the map; returns without waiting."""
        if self._promise is not None:
            raise RuntimeError(f"staging buffer on {self.device} is still in use by an earlier transfer")
        if nbytes > self.capacity:
            raise ValueError(f"transfer of {nbytes} bytes exceeds the staging buffer's {self.capacity} bytes")
        self._nbytes = nbytes
        if nbytes:
            self.device.copy(src, src_offset, self.buffer, 0, nbytes)
            self.device.flush()
            self._promise = self.buffer.map_async(wgpu.MapMode.READ, 0, self.capacity)

    def wait(self, timeout: float, what: str = "readback") -> memoryview:
        """Wait for the map (at most ``timeout`` s) and return a copy of the bytes."""
        if self._nbytes == 0:
            return memoryview(b"")
        promise, self._promise = self._promise, None
        if promise is None:
            raise RuntimeError("wait() without start()")
        try:
            wait_promise(promise, timeout, f"{what} on {self.device}")
        except TransferTimeout:
            # A pending map cannot be cancelled: leave that buffer to finish on its own, use a new one.
            self.buffer = self._create()
            raise
        try:
            return self.buffer.read_mapped(0, self._nbytes, copy=True)
        finally:
            self.buffer.unmap()
