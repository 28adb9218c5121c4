"""Reading another process's memory in place (Linux cross-memory attach, ``process_vm_readv``).

Two processes cannot share a wgpu mapping, so without this each process of a host copies the part of
its mapped readback that the others reduce into shared memory first (``shm.SharedArena``), and they
read it from there. The host step is bound by memory bandwidth (an H100 host: the shared-memory
reduction moved bytes at memcpy's rate), and those copies are a third of its traffic. With peer reads a
process reads the others' mapped readbacks where they lie, a block at a time into a small buffer of its
own (it stays in cache for the reduction that follows), as a thread rank reads the other devices'
mappings.

Every process lets the others read it (``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``: Yama's
``ptrace_scope`` 1, Ubuntu's default, otherwise allows it only to a process's ancestors). Whether reads
work is tested once when a group is made, among the host's ranks; where one fails (``ptrace_scope`` 2 or
3, a container whose seccomp profile blocks the call or that lacks CAP_SYS_PTRACE, not Linux) the host
copies through shared memory as before. ``WGPAR_MPI_PEER_READS=0`` chooses that path too.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

from .shm import _LINE, release_window, shared_window

SETS = 3  # published regions per rank: chunk i of a pipelined collective uses set i % 3
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF)
_PROBE_BYTES = 4096


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None


def _calls():
    """libc's prctl and process_vm_readv (ctypes releases the GIL during the call); None off Linux."""
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            read = libc.process_vm_readv
        except (OSError, AttributeError):
            return None
        read.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                         ctypes.c_ulong, ctypes.c_ulong]
        read.restype = ctypes.c_ssize_t
        _libc = (libc.prctl, read)
    return _libc


def read_into(pid: int, address: int, out: np.ndarray) -> None:
    """Copy ``out.nbytes`` bytes at ``address`` in process ``pid`` into ``out`` (contiguous)."""
    calls = _calls()
    if calls is None:
        raise OSError("process_vm_readv is not available on this platform")
    read = calls[1]
    done, total, base = 0, out.nbytes, out.ctypes.data
    while done < total:
        local = _IOVec(base + done, total - done)
        remote = _IOVec(address + done, total - done)
        got = read(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv of {total - done} bytes at {address + done:#x} in process {pid}: "
                               f"{os.strerror(err) if got < 0 else 'nothing read'}")
        done += got


class PeerTable:
    """Where each rank of a host published the memory the others may read: its pid and, for each of
    ``SETS`` sets, an address and a length, on one cache line per rank of a small shared window (collective
    over the host communicator ``node``). A rank writes only its own line; the host barrier that follows
    makes the writes visible to the others."""

    def __init__(self, MPI, node) -> None:
        self.me, self.size = node.Get_rank(), node.Get_size()
        self._win, base = shared_window(MPI, node, self.size * _LINE)
        self._lines = base.view(np.int64).reshape(self.size, _LINE // 8)
        self._lines[self.me, 0] = os.getpid()
        self._win.Sync()

    def publish(self, s: int, address: int, nbytes: int) -> None:
        """Set ``s``: this rank's readable memory is ``nbytes`` bytes at ``address``."""
        self._lines[self.me, 1 + 2 * s] = address
        self._lines[self.me, 2 + 2 * s] = nbytes

    def entry(self, k: int, s: int) -> tuple[int, int, int]:
        """(pid, address, bytes) that host rank ``k`` published in set ``s``."""
        line = self._lines[k]
        return int(line[0]), int(line[1 + 2 * s]), int(line[2 + 2 * s])

    def free(self) -> None:
        if self._win is not None:
            self._lines = None
            release_window(self._win)
            self._win = None


def open_peer_reads(MPI, node) -> PeerTable | None:
    """A PeerTable when every rank of the host can read every other one's memory, else None (collective
    over ``node``: every rank returns the same kind). Each rank publishes a small probe of its own bytes
    and reads the others'."""
    calls = _calls()
    ok = calls is not None
    if ok:
        calls[0](_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # fails harmlessly where Yama is absent
    table = PeerTable(MPI, node)
    probe = np.frombuffer(os.urandom(_PROBE_BYTES), np.uint8).copy()
    table.publish(0, probe.ctypes.data, probe.nbytes)
    table._win.Sync()
    want = node.allgather(probe.tobytes())
    for k in range(table.size):
        if ok and k != table.me:
            got = np.empty(_PROBE_BYTES, np.uint8)
            try:
                read_into(table.entry(k, 0)[0], table.entry(k, 0)[1], got)
                ok = got.tobytes() == want[k]
            except OSError:
                ok = False
    ok = bool(node.allreduce(int(ok), op=MPI.MIN))
    node.Barrier()  # nobody reads a probe any more
    del probe
    if not ok:
        table.free()
        return None
    return table


class PeerArray:
    """``count`` items of ``dtype`` from byte ``offset`` of the memory host rank ``k`` publishes in set
    ``s`` of ``table``: a lazy view, sliced without reading; ``fetch`` reads a block (the address is looked
    up then, so a view made before the owner published stays valid)."""

    __slots__ = ("table", "k", "s", "offset", "count", "dtype")

    def __init__(self, table: PeerTable, k: int, s: int, dtype, count: int, offset: int = 0) -> None:
        self.table, self.k, self.s, self.count, self.offset = table, k, s, count, offset
        self.dtype = np.dtype(dtype)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key: slice) -> PeerArray:
        start, stop, step = key.indices(self.count)
        if step != 1:
            raise ValueError("a PeerArray is sliced contiguously")
        return PeerArray(self.table, self.k, self.s, self.dtype, max(0, stop - start),
                         self.offset + start * self.dtype.itemsize)

    def fetch(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        """Items ``[a, b)`` read into ``out`` (at least ``b - a`` items of this dtype); returns them."""
        pid, address, nbytes = self.table.entry(self.k, self.s)
        isz = self.dtype.itemsize
        lo, hi = self.offset + a * isz, self.offset + b * isz
        if not 0 <= a <= b <= self.count or hi > nbytes:
            raise ValueError(f"peer read of bytes [{lo}, {hi}) of host rank {self.k}'s set {self.s}, which "
                             f"holds {nbytes} bytes")
        block = out[:b - a]
        read_into(pid, address + lo, block)
        return block
