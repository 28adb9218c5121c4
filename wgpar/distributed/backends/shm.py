"""Host memory shared by the processes of one host: an MPI-3 shared window on a host's communicator.

Inside one host the MPI backend moves collective data through shared memory,
not MPI messages (MPI's own host Allreduce ran at 1.6 GB/s where the threaded
backend's mapped-buffer reduction reached 12.5 GB/s). The arena holds three
sets of input slots, one slot per rank of the host each (chunk i of a pipelined
collective uses set i % 3: a rank may copy chunk i + 2 in while the others
still reduce chunk i), and two result slots on one host (chunk i uses slot
i % 2), three where the group spans hosts (the leaders' MPI step keeps chunk i's
result in flight while the host reduces chunk i + 1 and copies chunk i - 1 out),
all ``slot_bytes`` long: 3 L + 2 (or 3 L + 3) slots of at most the chunk size
for a host of L ranks. It is allocated on the first collective that needs it and
grows (collectively: every rank of the host decides the same from the agreed
metadata) up to ``max_slot`` bytes per slot.
"""

from __future__ import annotations

import os

import numpy as np

_MIN_SLOT = 1 << 16
INPUT_SETS = 3


def arena_slots(local_size: int, results: int = 2) -> int:
    """Slots of the arena of a host of ``local_size`` ranks: the input sets and ``results`` result slots."""
    return INPUT_SETS * local_size + results


def shm_slot_cap(local_size: int, chunk: int, results: int = 2) -> int:
    """The largest slot (a power of two, at most ``chunk``) whose arena fits in half of /dev/shm's free
    space (MPICH backs shared windows there; a container's small /dev/shm would crash with SIGBUS)."""
    cap = chunk
    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
    except OSError:
        return cap
    while cap > _MIN_SLOT and arena_slots(local_size, results) * cap > free // 2:
        cap //= 2
    return cap


def slot_size(nbytes: int, cap: int) -> int:
    """The slot for a collective of ``nbytes``: the next power of two (at least 64 KiB), at most ``cap``."""
    return min(cap, max(_MIN_SLOT, 1 << max(0, (nbytes - 1).bit_length())))


_LINE = 64  # bytes between two ranks' counters (one cache line each)


def shared_window(MPI, node, nbytes: int):
    """(window, bytes): ``nbytes`` of shared memory over the host communicator ``node``, one contiguous
    block owned by the host's rank 0, seen by every rank as a uint8 array and locked for passive access
    (collective over ``node``)."""
    win = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, 1, comm=node)
    buf, _ = win.Shared_query(0)
    base = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    win.Lock_all(MPI.MODE_NOCHECK)
    return win, base


def release_window(win) -> None:
    """Unlock and free a ``shared_window`` (collective over its host)."""
    win.Unlock_all()
    win.Free()


def cache_lines(base: np.ndarray) -> np.ndarray:
    """One int64 per cache line of ``base`` (flags and counters that no two ranks share a line for)."""
    return base.view(np.int64)[::_LINE // 8]


class SharedArena:
    """The input slots of the host's ``ranks`` ranks and ``results`` result slots, shared over the host
    communicator ``node``."""

    def __init__(self, MPI, node, ranks: int, results: int = 2) -> None:
        self.MPI = MPI
        self.node = node
        self.ranks = ranks
        self.results = results
        self.slot_bytes = 0
        self._win = None
        self._base: np.ndarray | None = None

    def ensure(self, slot_bytes: int) -> None:
        """Grow to ``slot_bytes`` per slot (collective over the host: every rank passes the same value)."""
        if slot_bytes <= self.slot_bytes:
            return
        self.free()
        self._win, self._base = shared_window(self.MPI, self.node, arena_slots(self.ranks, self.results) * slot_bytes)
        self.slot_bytes = slot_bytes

    def _slot(self, k: int, dtype, count: int) -> np.ndarray:
        start = k * self.slot_bytes
        return self._base[start:start + self.slot_bytes].view(dtype)[:count]

    def inputs(self, s: int, j: int, dtype, count: int) -> np.ndarray:
        """Rank ``j``'s slot of input set ``s`` (0 .. INPUT_SETS - 1) as ``count`` items of ``dtype``."""
        return self._slot(s * self.ranks + j, dtype, count)

    def result(self, h: int, dtype, count: int) -> np.ndarray:
        """Result slot ``h`` (0 .. results - 1) as ``count`` items of ``dtype``."""
        if not 0 <= h < self.results:
            raise IndexError(f"result slot {h} of an arena of {self.results}")
        return self._slot(INPUT_SETS * self.ranks + h, dtype, count)

    def sync(self) -> None:
        """Make this process's writes visible (call before and after the host barrier)."""
        if self._win is not None:
            self._win.Sync()

    def free(self) -> None:
        """Release the window (collective over the host)."""
        if self._win is not None:
            self._base = None
            release_window(self._win)
            self._win = None
            self.slot_bytes = 0




class HostFlags:
    """A barrier of the host's ranks through shared memory: one arrival counter per rank, each on its
    own cache line of a small shared window (allocated once, collective over ``node``).

    ``arrive`` makes this process's earlier writes to shared memory visible (MPI_Win_sync, a memory
    barrier) and then publishes its next count; ``ready`` is true once every rank's counter has reached
    it, and makes their writes visible to this process. Every rank of the host passes the same
    barriers in the same order (the header exchange keeps collectives in step), so the counts agree:
    a rank that is ahead has only ever published larger counts. No MPI round trip: a waiting rank
    reads the others' counters (polling, with a timeout, in ``MPIGroup._host_barrier``).
    """

    def __init__(self, MPI, node) -> None:
        self.node = node
        self.me, self.size = node.Get_rank(), node.Get_size()
        self._win, base = shared_window(MPI, node, self.size * _LINE)
        self._flags = cache_lines(base)
        self.count = 0
        if self.me == 0:
            self._flags[:] = 0
        self._win.Sync()
        node.Barrier()  # everyone sees the zeroed counters before anyone arrives

    def arrive(self) -> None:
        """Publish this rank's arrival at the next barrier (after its writes so far)."""
        self.count += 1
        self._win.Sync()
        self._flags[self.me] = self.count

    def ready(self) -> bool:
        """Whether every rank of the host has arrived at this rank's current barrier."""
        if int(self._flags.min()) < self.count:
            return False
        self._win.Sync()
        return True

    def late(self) -> list[int]:
        """The host ranks that have not arrived at the current barrier."""
        return [k for k in range(self.size) if int(self._flags[k]) < self.count]

    def free(self) -> None:
        if self._win is not None:
            self._flags = None
            release_window(self._win)
            self._win = None


MAIL_SLOTS = 4  # slots per sending rank of a host
_MAIL_MAX_SLOT = 64 << 20
MAIL_BUDGET = 1 << 30  # bytes of every rank's slots together


def mail_slot_cap(local_size: int, chunk: int) -> int:
    """The mailbox's slot size: at most ``chunk`` and 64 MiB, halved until every rank's slots fit in
    ``MAIL_BUDGET`` and a quarter of /dev/shm's free space; 0 (no mailbox) below 64 KiB or with one rank.

    A message larger than a slot takes MPI's path, which moves only while both processes call MPI: on an
    H200 (two processes, 2026-11-26) a 1F1B pipeline step with 32 MiB activations took 1.61-1.66x the
    thread ranks' through 4 MiB slots and 1.00-1.02x through 64 MiB ones. So 64 MiB slots on 2-4 ranks,
    32 MiB on 8."""
    if local_size < 2:
        return 0
    cap = min(chunk, _MAIL_MAX_SLOT)
    limit = MAIL_BUDGET
    try:
        st = os.statvfs("/dev/shm")
        limit = min(limit, st.f_bavail * st.f_frsize // 4)
    except OSError:
        pass
    while cap >= _MIN_SLOT and local_size * MAIL_SLOTS * cap > limit:
        cap //= 2
    return cap if cap >= _MIN_SLOT else 0


class Mailbox:
    """Point-to-point messages between the processes of one host through shared memory: ``MAIL_SLOTS`` slots of
    ``slot_bytes`` per sending rank, for any receiver of the host, each with a state on its own cache line (0
    free, 1 full). Only the sender turns a slot full (after its writes, made visible first) and only the
    receiver the header names turns it free (after its reads): each side has one communication thread per
    group, so no slot has two writers. MPI still carries the message's header, in order, naming the slot.
    Slots per sender, not per pair: L ranks need L x MAIL_SLOTS slots, not L (L - 1) x MAIL_SLOTS, so a
    slot can be as large as a pipeline's activations.

    Allocated once, collective over ``node`` (``slot_bytes`` must agree)."""

    def __init__(self, MPI, node, slot_bytes: int) -> None:
        self.size = node.Get_size()
        self.me = node.Get_rank()
        self.slot_bytes = slot_bytes
        n = self.size * MAIL_SLOTS
        flag_bytes = n * _LINE
        self._win, base = shared_window(MPI, node, flag_bytes + n * slot_bytes)
        self._state = cache_lines(base[:flag_bytes])
        self._data = base[flag_bytes:]
        if self.me == 0:
            self._state[:] = 0
        self._win.Sync()
        node.Barrier()  # everyone sees the free states before anyone sends

    def _index(self, sender: int, k: int) -> int:
        """Slot ``k`` of host rank ``sender``."""
        return sender * MAIL_SLOTS + k

    def claim(self) -> int | None:
        """A free slot of this rank's (for any receiver), or None when all are full."""
        for k in range(MAIL_SLOTS):
            if self._state[self._index(self.me, k)] == 0:
                self._win.Sync()  # the last receiver's reads of it happened before it read free
                return k
        return None

    def full(self, sender: int) -> list[int]:
        """The slots of ``sender`` not yet freed by their receivers."""
        return [k for k in range(MAIL_SLOTS) if self._state[self._index(sender, k)] != 0]

    def slot(self, sender: int, k: int, nbytes: int) -> np.ndarray:
        i = self._index(sender, k)
        return self._data[i * self.slot_bytes:i * self.slot_bytes + nbytes]

    def post(self, k: int) -> None:
        """Mark this rank's slot ``k`` full, after this process's writes into it (its header names the
        receiver)."""
        self._win.Sync()
        self._state[self._index(self.me, k)] = 1

    def opened(self) -> None:
        """Before reading a slot whose header arrived: make the sender's writes visible."""
        self._win.Sync()

    def free(self, sender: int, k: int) -> None:
        """Mark ``sender``'s slot ``k`` to this rank free, after this process's reads of it."""
        self._win.Sync()
        self._state[self._index(sender, k)] = 0
