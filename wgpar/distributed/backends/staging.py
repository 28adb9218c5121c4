"""Persistent host-mapped buffers of one rank, leased per transfer.

Every byte a collective moves crosses the host: the GPU copies into a MAP_READ
staging buffer that is read in place once mapped, and results are written
into a MAP_WRITE upload buffer that the GPU copies from. Fresh host memory is
expensive to touch (docs/design.md), so these buffers are made once and
reused. Several collectives may be in flight at once (asynchronous ones, or a
send whose receiver has not read it yet), so each leases its own buffers from
this pool, by power-of-two size class, and gives them back when done.

After a failure a buffer whose mapping another rank may still read or write
is *abandoned*: never unmapped or reused (that would crash the reader), only
settled and dropped by ``reset``, once no rank is inside a collective.
"""

from __future__ import annotations

import threading

from ...runtime.device import Device
from ...runtime.transfer import StagingBuffer, UploadBuffer

_MIN_CLASS = 1 << 16
# Upload buffers are made rather than waited for up to this many bytes in all (then the oldest is reused).
# A step keeps at most its gradients' bytes in flight; FSDP's NO_SHARD on 2 GiB of gradients (2 processes,
# H200) took 1.35x thread ranks' step with 1 GiB here and 1.05x with 4 GiB.
UPLOAD_BYTES_CAP = 4 << 30


def size_class(nbytes: int, limit: int) -> int:
    """Capacity of the buffer leased for ``nbytes``: the next power of two (at least 64 KiB), or the
    size rounded to 256 bytes where a power of two would exceed the device's largest buffer."""
    cap = max(_MIN_CLASS, 1 << max(0, (nbytes - 1).bit_length()))
    return cap if cap <= limit else -(-nbytes // 256) * 256


class TransferPool:
    """Staging (download) and upload buffers of one device, leased by size class."""

    def __init__(self, device: Device, label: str) -> None:
        self.device = device
        self.label = label
        self._lock = threading.Lock()
        self._down: dict[int, list[StagingBuffer]] = {}
        self._up: dict[int, list[UploadBuffer]] = {}
        self._abandoned: list[StagingBuffer | UploadBuffer] = []
        self.num_created = 0
        self._up_bytes = 0  # capacity of every upload buffer made

    def _class(self, nbytes: int) -> int:
        return size_class(max(4, nbytes), self.device.max_buffer)

    def down(self, nbytes: int) -> StagingBuffer:
        """A staging buffer of at least ``nbytes``, idle (its own until ``give_back``)."""
        cap = self._class(nbytes)
        with self._lock:
            free = self._down.get(cap)
            if free:
                return free.pop()
        self.num_created += 1
        return StagingBuffer(self.device, cap, f"{self.label}:down")

    def up(self, nbytes: int) -> UploadBuffer:
        """An upload buffer of at least ``nbytes``: an idle one already mapped again, else a new one; past
        ``UPLOAD_BYTES_CAP`` the one given back first (its view waits for its re-map).

        A buffer given back re-maps only once the GPU has run its copy, which sits in the queue behind
        everything submitted before it: during backward, bucket k + 1's all-reduce would wait for the
        rest of backward if it took bucket k's buffer."""
        cap = self._class(nbytes)
        with self._lock:
            free = self._up.get(cap)
            if free:
                free[0].mapped_again(poll=True)  # one device poll settles every finished re-map
                for i in range(len(free) - 1, -1, -1):
                    if free[i].mapped_again(poll=False):
                        return free.pop(i)
                if not self.room_for(cap):
                    return free.pop(0)
            self._up_bytes += cap
        self.num_created += 1
        return UploadBuffer(self.device, cap, f"{self.label}:up")

    def room_for(self, nbytes: int) -> bool:
        """Whether one more upload buffer of ``nbytes`` stays within ``UPLOAD_BYTES_CAP``."""
        return self._up_bytes + nbytes <= UPLOAD_BYTES_CAP

    def give_back(self, buf: StagingBuffer | UploadBuffer) -> None:
        """Return a buffer nobody else reads any more (a staging buffer is unmapped here)."""
        if isinstance(buf, StagingBuffer):
            buf.release()
            if not buf.idle:  # a map still pending: it cannot be reused before it settles
                self.abandon(buf)
                return
            store = self._down
        else:
            store = self._up
        with self._lock:
            store.setdefault(buf.capacity, []).append(buf)

    def abandon(self, buf: StagingBuffer | UploadBuffer) -> None:
        """Keep ``buf`` out of use (another rank may still read or write its mapping) until ``reset``."""
        with self._lock:
            self._abandoned.append(buf)

    def reset(self, timeout: float = 5.0) -> None:
        """Settle abandoned buffers (no rank reads them any more) and put them back in the pool."""
        with self._lock:
            abandoned, self._abandoned = self._abandoned, []
        for buf in abandoned:
            if buf.settle(timeout) is False:  # an upload whose re-map never finished: drop it
                continue
            store = self._down if isinstance(buf, StagingBuffer) else self._up
            with self._lock:
                store.setdefault(buf.capacity, []).append(buf)

    @property
    def num_abandoned(self) -> int:
        return len(self._abandoned)

    @property
    def num_idle(self) -> int:
        """Buffers waiting in the pool (equal to ``num_created`` when no transfer holds one)."""
        with self._lock:
            return sum(len(v) for v in (*self._down.values(), *self._up.values()))

    def host_bytes(self) -> int:
        """Bytes of host-mapped memory this pool holds (idle and abandoned)."""
        with self._lock:
            held = [b for bufs in (*self._down.values(), *self._up.values()) for b in bufs] + self._abandoned
        return sum(b.capacity for b in held)
