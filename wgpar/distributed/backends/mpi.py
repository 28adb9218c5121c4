"""The MPI backend: ranks are processes started by mpiexec, one device each.

Each process owns one device: device ``local_rank`` (``wgpar.runtime.open_device``), where the
local rank is the process's rank among the processes of its host, so on a host
with A adapters (after WGPAR_ADAPTER / WGPAR_BACKEND filtering) process k uses
adapter k % A (an extra logical device on it when k >= A). Set WGPAR_ADAPTER
per process (mpiexec's ``-env`` or a wrapper script) to pin processes to
adapters, or pass ``init_process_group(device=...)``.

A collective runs in two halves, as on thread ranks (the protocol is
``staged.py``'s; this file moves the data). The *launch* runs on the
calling thread: it records the GPU copies of the input into leased staging
buffers (in chunks, so it reads the input in the device's stream order) and
requests their maps. The *completion* runs on the group's communication
thread, in call order:

1. Header exchange: every rank sends every other rank a small header (kind
   and metadata); a rank that does not arrive within the timeout is named,
   ranks that disagree raise a CollectiveError naming the ranks and the field.
2. Data, chunk by chunk (pipelined: while the host works on chunk i, the
   GPU copies chunk i + 1 down and chunk i - 1 up). Inside a host the
   processes exchange data through a shared-memory arena (an MPI-3 shared
   window): each rank copies its mapped readback into its slot, the host's
   ranks meet at a barrier, and each reduces its slice of the chunk into the
   result slot (the threaded backend's reduction, in the same rank order, so
   the results are bit for bit the same). Between hosts, one leader per host
   runs the MPI collective on the host's partial result (hierarchical:
   reduce inside the host, MPI among the leaders, share inside the host),
   pipelined too: the leaders' step of chunk i is in flight (started, and
   tested so that MPI advances it) while the host reduces chunk i + 1 and
   copies chunk i - 1 out (``_reduce_hosts``; the gathers, ``_gather``, alike).
3. Every rank writes its result into leased mapped upload buffers, which
   the GPU copies into the output chunk by chunk.

send / recv inside a host copy the message through a shared-memory mailbox
slot and send MPI only its header (shm.Mailbox); otherwise (another host, a
message larger than a slot, the pair's slots all full) they hand the mapped
staging memory to MPI in place and receive into mapped upload memory. A send
completes once its data is in the slot or handed to MPI; a thread of its own
(mpi_sends.SendPump) keeps testing the sends until the receivers took them.

Failures end the job (MPI cannot repair a communicator): see mpi_world.py.
``reset()`` raises on a broken group.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

import numpy as np

from ... import dtypes as _dt
from ...runtime import adapters as _adapters
from ...runtime import profiling
from ...runtime.config import CONFIG
from ...runtime.device import Device
from ...runtime.transfer import host_cores, host_threads
from ...tensor import Tensor
from ..errors import CollectiveError, CollectiveTimeoutError, RankError
from ..group import DEFAULT_TIMEOUT, check_agreement, check_reduce_op, split_sizes
from .chunked import ChunkedReadback, ChunkedUpload
from .common import Progress, byte_offset, check_timeout, kind_name, round4
from .hostreduce import (
    bundle,
    check_reducible,
    copy_into,
    copy_tasks,
    finish_tasks,
    host_dtype,
    reduce_tasks,
    run_tasks,
    submit_tasks,
)
from .mpi_sends import PAUSE_IN_FLIGHT, SendPump
from .mpi_world import Interrupted, World, world
from .shm import HostFlags, Mailbox, SharedArena, arena_slots, mail_slot_cap, shm_slot_cap, slot_size
from .staged import Completion, StagedGroup
from .staging import TransferPool

_HDR = 1024  # bytes of a collective's header (its kind and metadata)
_HDR_TAG, _OBJ_TAG = 0, 1
_RECV_AHEAD = 2  # chunks of a message received ahead of the one being committed
# Seconds a recv keeps waiting after its sender's next collective header arrived: the header travels on
# another communicator, which MPI does not order against the message's.
_MOVED_ON_GRACE = 1.0
# Elements per host-pool task: a chunk is split over the host's ranks, so smaller tasks than the
# threaded backend's keep the pool busy within one chunk.
_BLOCK = 1 << 18
_MAX_FLAG_PAUSE = 0.0002  # seconds between two looks at the host barrier's counters, once past the spin


def _pack(obj: Any, what: str) -> bytearray:
    body = pickle.dumps(obj)
    if len(body) > _HDR - 4:
        raise ValueError(f"{what}: its metadata takes {len(body)} bytes, more than a header's {_HDR - 4}")
    buf = bytearray(_HDR)
    struct.pack_into("<I", buf, 0, len(body))
    buf[4:4 + len(body)] = body
    return buf


def _unpack(buf: bytearray) -> Any:
    (n,) = struct.unpack_from("<I", buf)
    return pickle.loads(bytes(buf[4:4 + n]))


def _short(kind: str) -> str:
    """A label-carrying kind short enough for a header (long labels keep a digest, so they still differ)."""
    if len(kind) <= 256:
        return kind
    return f"{kind[:200]}...#{hashlib.sha1(kind.encode()).hexdigest()[:16]}"


_user_ops: dict[tuple[str, str], Any] = {}


def _mpi_op(MPI, op: str, dtype: np.dtype, is_bool: bool):
    """The MPI reduction for the leaders' step. MPI's built-in MAX and MIN drop NaN; wgpar's propagate it,
    so floats use NumPy's maximum / minimum as user-defined operations."""
    if is_bool:  # 0/1 values: sum and max are "any", prod and min are "all"
        op = "max" if op in ("sum", "max") else "min"
    if op == "sum":
        return MPI.SUM
    if op == "prod":
        return MPI.PROD
    if dtype.kind != "f":
        return MPI.MAX if op == "max" else MPI.MIN
    key = (op, dtype.str)
    if key not in _user_ops:
        fn = np.maximum if op == "max" else np.minimum

        def reduce(inbuf, inoutbuf, datatype, fn=fn, dt=dtype):
            acc = np.frombuffer(inoutbuf, dtype=dt)
            fn(np.frombuffer(inbuf, dtype=dt), acc, out=acc)

        _user_ops[key] = MPI.Op.Create(reduce, commute=True)
    return _user_ops[key]


def _mpi_type(MPI, dtype: np.dtype):
    return {"f": MPI.FLOAT, "i": MPI.INT}[dtype.kind]


def default_chunk(local_size: int, num_hosts: int) -> int:
    """Bytes per pipelined chunk where WGPAR_MPI_CHUNK_KB is unset. Each chunk costs its host step about a
    millisecond besides its bytes (the host pool's hand-offs and a host barrier): on an H100 host (two
    processes, 2026-11-26) a 256 MiB all-reduce took 133-137 ms in 4 MiB chunks, 42-47 in 16 MiB and 34-37 in
    64 MiB, against 34-43 ms on thread ranks. So inside one host 64 MiB, halved while the arena's 3 L + 2
    slots (``shm.arena_slots``) would pass 1 GiB, to at least 16 MiB; across hosts 16 MiB, where the leaders'
    MPI step of a chunk overlaps the host's work on the next and was measured so (BENCHMARKS.md)."""
    if num_hosts > 1:
        return 16 << 20
    chunk = 64 << 20
    while chunk > 16 << 20 and arena_slots(local_size) * chunk > 1 << 30:
        chunk //= 2
    return chunk


class _HostSource:
    """A host array standing in for a readback (``MPIGroup.host_all_reduce``)."""

    def __init__(self, data: np.ndarray) -> None:
        self._bytes = data.reshape(-1).view(np.uint8)

    def array(self, off: int, count: int, dtype: np.dtype, timeout: float, what: str) -> np.ndarray:
        return self._bytes[off:off + count * dtype.itemsize].view(dtype)


class _HostTarget:
    """A host array standing in for an upload (``MPIGroup.host_all_reduce``)."""

    def __init__(self, out: np.ndarray) -> None:
        self._bytes = out.reshape(-1).view(np.uint8)
        self.item = out.dtype

    def targets(self, off: int, count: int) -> list[tuple[int, np.ndarray]]:
        return [(0, self._bytes[off:off + count * self.item.itemsize].view(self.item))]

    def write(self, off: int, values: np.ndarray, divide: float | None = None, block: int = _BLOCK) -> None:
        for start, dst in self.targets(off, len(values)):
            copy_into(dst, values[start:start + len(dst)], divide, block)

    def advance(self, upto: int) -> None:
        pass


class _LeadersStep:
    """A leader's MPI step of one chunk with the other hosts' leaders (``kind``: "all-reduce" of the host's
    result, or "exchange" of the bytes a gather's ranks wrote), in flight: started by
    ``MPIGroup._leaders_start`` / ``_leaders_share``, tested while the host's tasks run, waited for before
    the barrier that lets the host's ranks copy it out."""

    __slots__ = ("reqs", "chunk", "nbytes", "t0", "kind", "done")

    def __init__(self, reqs: list, chunk: int, nbytes: int, t0: float, kind: str) -> None:
        self.reqs, self.chunk, self.nbytes, self.t0, self.kind, self.done = reqs, chunk, nbytes, t0, kind, False


class _Chunks:
    """One rank's view of an elementwise collective's chunks (``_pipeline`` and ``_reduce_hosts``): the
    elements of each it reduces, its mapped readback of them, and the copy of the other ranks' shares into
    its input slot of the arena."""

    def __init__(self, group: MPIGroup, what: str, rb: ChunkedReadback, n: int, hdt: np.dtype, shared: bool,
                 lo: int, hi: int) -> None:
        E = group._chunk_elems(n)
        self.chunks = [(a, min(a + E, n)) for a in range(0, n, E)]
        self.group, self.what, self.rb, self.hdt, self.shared, self.lo, self.hi = group, what, rb, hdt, shared, lo, hi
        self.W = host_threads()
        self.maps: dict[int, np.ndarray] = {}  # the mapped readback of the chunks in use

    def share(self, i: int) -> tuple[int, int]:
        """The elements of chunk i this rank reduces: its slice of the chunk (shared), else its own range."""
        a, b = self.chunks[i]
        if self.shared:
            L, me = self.group.local_size, self.group.local_rank
            bounds = np.cumsum([0, *split_sizes(b - a, L)])
            return a + int(bounds[me]), a + int(bounds[me + 1])
        s0 = min(max(a, self.lo), b)
        return s0, max(min(b, self.hi), s0)

    def mapped(self, i: int) -> np.ndarray:
        if i not in self.maps:
            a, b = self.chunks[i]
            g = self.group
            self.maps[i] = g._mapping(lambda: self.rb.array(a * self.hdt.itemsize, b - a, self.hdt, g._timeout,
                                                            self.what), self.what)
        return self.maps[i]

    def copy_in(self, i: int) -> list:
        """Tasks: the others' shares of chunk i into this rank's slot (none past the last chunk)."""
        if self.group.local_size == 1 or i >= len(self.chunks):
            return []
        a, b = self.chunks[i]
        s0, s1 = self.share(i)
        mine, slot = self.mapped(i), self.group._arena.inputs(i % 3, self.group.local_rank, self.hdt, b - a)
        return copy_tasks(slot[:s0 - a], mine[:s0 - a], workers=self.W) + \
            copy_tasks(slot[s1 - a:], mine[s1 - a:], workers=self.W)

    def open(self) -> list[Future]:
        """The pipeline's start: chunk 0's copy in, the first host barrier, chunk 1's copy in started as it
        waits (its futures returned)."""
        g = self.group
        if g.local_size == 1:
            return []
        (a, b), (s0, s1) = self.chunks[0], self.share(0)
        with profiling.span("copy into shared memory", "collective", rank=g.ranks[g.rank],
                            bytes=(b - a - s1 + s0) * self.hdt.itemsize):
            run_tasks(bundle(self.copy_in(0), self.W))
        return g._host_barrier(self.what, lambda: self.copy_in(1), self.W)

    def done(self, i: int) -> None:
        """Chunk i's readback is no longer needed."""
        self.maps.pop(i, None)


class MPIGroup(StagedGroup):
    """One process's view of a group of MPI processes (a communicator), each owning one device.

    Arguments:
        w: the process's World.
        comm: the group's communicator (the group owns it).
        device: this process's device.
        timeout: seconds every wait inside a collective may take.
        ranks: the members' ranks in the root group (sub-groups made by ``split``).
        name: names the communication thread and the staging buffers.
    """

    backend = "mpi"
    _broken_advice = "the MPI backend cannot recover: end the job and start it again"

    def __init__(self, w: World, comm, device: Device, timeout: float = DEFAULT_TIMEOUT, *,
                 ranks: Sequence[int] | None = None, name: str = "world") -> None:
        MPI = self.MPI = w.MPI
        self.world = w
        self.comm = comm
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.ranks = tuple(ranks) if ranks is not None else tuple(range(self.world_size))
        self.device = device
        self.name = name
        self._timeout = check_timeout(timeout)
        # Separate communicators keep the traffic kinds apart (MPI matches messages per communicator).
        self._hdr = comm.Dup()  # collective headers, run_spmd's results
        self._p2p = comm.Dup()  # send / recv headers (tag: the caller's tag)
        self._p2p_data = comm.Dup()  # send / recv payloads
        # MPI defines TAG_UB on COMM_WORLD only (Open MPI returns None on a split communicator); every
        # MPI allows at least 32767.
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.tag_ub = int(ub) if ub is not None else 32767
        self.world_ranks = tuple(comm.allgather(w.rank))  # each member's rank in the job
        per_host = CONFIG.mpi_ranks_per_host
        if per_host:  # pretend every ``per_host`` consecutive world ranks are a host (tests, benchmarks)
            self.node = comm.Split(w.rank // per_host, self.rank)
        else:
            self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = self.node.Get_rank(), self.node.Get_size()
        # A waiting thread spins (polls without sleeping) only where every process of the host has a core
        # to spare for it: on a full machine (or one core per rank, Open MPI's default binding) the spin
        # would take the core from its own or another rank's host reduction; short sleeps instead.
        spare = host_cores() >= 2 * self.local_size
        self._spin, self._max_pause = (0.002, 0.001) if spare else (0.0, 0.0002)
        self.leaders = comm.Split(0 if self.local_rank == 0 else MPI.UNDEFINED, self.rank)
        host = self.node.bcast(self.leaders.Get_rank() if self.local_rank == 0 else None, root=0)
        self.hosts = tuple(comm.allgather(host))  # the host (leader's rank) of every member
        self.num_hosts = max(self.hosts) + 1
        kb = CONFIG.mpi_chunk_kb
        self.chunk = 1 << max(16, (kb * 1024 - 1).bit_length()) if kb else default_chunk(self.local_size,
                                                                                          self.num_hosts)
        # Across hosts a third result slot: the leaders' step of chunk i is in flight while the host reduces
        # chunk i + 1 and copies chunk i - 1 out (``_reduce_hosts``).
        results = 3 if self.num_hosts > 1 else 2
        self._max_slot = comm.allreduce(shm_slot_cap(self.local_size, self.chunk, results), op=MPI.MIN)
        self._arena = SharedArena(MPI, self.node, self.local_size, results)
        self._flags = HostFlags(MPI, self.node)  # the host barrier
        self._host_members = tuple(self.node.allgather(self.rank))  # the group rank of each host rank
        mail = self.node.allreduce(mail_slot_cap(self.local_size, self.chunk), op=MPI.MIN)
        self._mail = Mailbox(MPI, self.node, mail) if mail else None  # send / recv inside the host
        self._pool = TransferPool(device, f"mpi:{name}:{self.rank}")
        self._progress = Progress(f"wgpar-mpi-{name}")
        self._sends = SendPump(MPI.Request.Testall, f"wgpar-mpi-{name}-sends")  # handed to MPI, not yet taken
        # Messages this rank sent each member and received from each; what each member had sent this rank
        # when it entered the last collective (its header says): at exit the difference is what this
        # rank never received (a small message is delivered eagerly, so its sender never knows).
        self._sent = [0] * self.world_size
        self._received = [0] * self.world_size
        self._peer_sent = [0] * self.world_size
        self._seq = 0
        self._broken: str | None = None
        self._children: list[MPIGroup] = []
        # The leaders' MPI steps (benchmarks): the time this process spent in them that no host work hid
        # (the calls that start and test them, and the waits for them once its host work was done), and the
        # time they were in flight (from the start to the test that saw them complete).
        self.inter_host_seconds = 0.0
        self.inter_host_flight_seconds = 0.0
        w.register(self)

    # -- state ----------------------------------------------------------------------------
    @property
    def timeout(self) -> float:
        """The collective timeout, in seconds."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = check_timeout(seconds)
        for child in self._children:
            child.timeout = seconds

    @property
    def broken(self) -> str | None:
        """Why the group is broken (this rank's failure or the world's), None while it works."""
        return self._broken or self.world.failure

    def abort(self, reason: str) -> None:
        """Fail the job: every rank waiting in (or later entering) a collective raises, naming this rank."""
        self._fail(reason)

    def _fail(self, reason: str, late: Sequence[int] = ()) -> None:
        """A local failure ends the job: break the group and notify every rank. ``late``: members that
        did not arrive (the failure protocol does not wait for their acknowledgement)."""
        if self._broken is None:
            self._broken = reason
        self.world.notify(reason, [self.world_ranks[r] for r in late])

    def reset(self) -> None:
        """Raises on a broken group: MPI cannot repair a communicator once a rank failed.

        On a healthy group it only waits for the collectives in flight.
        """
        why = self.broken
        if why:
            raise CollectiveError(
                f"reset on rank {self.rank}: the MPI backend cannot recover from a failure ({why}); MPI cannot "
                "repair a communicator once a rank failed. End the job (run_spmd does, and so does an exception "
                "nobody catches) and start it again")
        self._progress.drain(self._timeout + 10)

    def close(self) -> None:
        """Stop the communication threads of this group and its sub-groups."""
        for child in self._children:
            child.close()
        self._progress.close()
        self._sends.stop()

    def quiesce(self) -> None:
        """At exit: stop the communication thread, then wait (with the timeout) until every send was taken
        by its receiver; one that never is fails the job instead of leaving MPI_Finalize waiting."""
        self._progress.close()
        in_flight = self._sends.stop()
        unreceived = self._unreceived()
        if unreceived:
            # Its senders are exiting too, some already in MPI_Finalize where they never acknowledge the
            # notice: a short wait for the acknowledgements, then the abort.
            self.world.grace = min(self.world.grace, 1.0)
            self._fail(unreceived)
            return
        pending = [req for reqs in in_flight for req in reqs]
        if pending and not self.world.wait(pending, self._timeout, lambda: None):
            self._fail(f"exiting with {len(in_flight)} send(s) that no rank received within {self._timeout:g} s")

    def _unreceived(self) -> str | None:
        """At exit: the messages members sent this rank (up to their last collective) that it never
        received, named by sender, receiver, tag and bytes (their headers are read off the queue); None
        when there are none."""
        MPI = self.MPI
        missing = {r: self._peer_sent[r] - self._received[r] for r in range(self.world_size)
                   if self._peer_sent[r] > self._received[r]}
        if not missing:
            return None
        parts = []
        status = MPI.Status()
        for src, n in missing.items():
            named = []
            for _ in range(min(n, 4)):  # they were sent, so they arrive: wait (bounded) for each header
                deadline = time.monotonic() + self._timeout
                while not self._p2p.Iprobe(src, MPI.ANY_TAG, status) and time.monotonic() < deadline:
                    time.sleep(0.001)
                if status.Get_source() != src:
                    break
                tag, hdr = status.Get_tag(), bytearray(_HDR)
                self._p2p.Recv(hdr, src, tag)
                shape, dtype_name, nbytes, *_ = _unpack(hdr)
                named.append(f"tag {tag}, {nbytes} bytes ({dtype_name} {tuple(shape)})")
                status = MPI.Status()
            more = f" and {n - len(named)} more" if n > len(named) else ""
            parts.append(f"{n} message(s) from rank {src} to rank {self.rank} were never received: "
                         f"{'; '.join(named) or 'headers not found'}{more}")
        return (f"group {self.name}: rank {self.rank} exits, but " + "; ".join(parts) +
                " (every send needs a matching recv)")

    # -- plumbing -------------------------------------------------------------------------
    def _wait(self, requests: Sequence, what: str, on_timeout: Callable[[], str], spin: float | None = None,
              late: Callable[[], Sequence[int]] = tuple, max_pause: float | None = None) -> None:
        """Wait for MPI requests with the group's timeout; a timeout fails the job with ``on_timeout()``
        naming the members ``late()`` returns. ``spin``: seconds of polling without sleeping (World.wait;
        default: the group's, which is 0 where the host's processes have no core to spare);
        ``max_pause``: the longest sleep between two looks after that (default: the group's)."""
        spin = self._spin if spin is None else spin
        pause = self._max_pause if max_pause is None else max_pause
        try:
            done = self.world.wait(requests, self._timeout, lambda: self._broken, spin, pause)
        except Interrupted as exc:
            raise CollectiveError(f"{what} on rank {self.rank}: aborted, {exc}") from None
        if not done:
            reason = on_timeout()
            self._fail(reason, late())
            raise CollectiveTimeoutError(reason)

    def _host_barrier(self, what: str, ahead: Callable[[], list] | None = None, workers: int = 0) -> list[Future]:
        """Meet the other ranks of this host (their writes to the arena become visible): each publishes an
        arrival count in shared memory (``HostFlags``) and polls the others', with the group's timeout.

        ``ahead``: tasks that need only the barriers before this one, started on the host pool (bundled for
        ``workers``) once this rank has arrived, so that they run while it waits; returns their futures
        (the caller finishes them before its next barrier; after an error they are finished here)."""
        if self.local_size == 1:
            return []
        flags = self._flags
        self._arena.sync()
        flags.arrive()
        futures: list[Future] = []
        try:
            if ahead is not None:
                futures = submit_tasks(bundle(ahead(), workers))
            if not flags.ready():
                with profiling.span("host barrier", "collective", rank=self.ranks[self.rank]):
                    self._poll(flags.ready, what, lambda: (
                        f"{what}: rank(s) {[self._host_members[k] for k in flags.late()]} of this host stopped "
                        f"inside the collective for {self._timeout:g} s"))
        except BaseException:
            wait(futures)  # they write this rank's own slot: let them stop before the error leaves
            raise
        self._arena.sync()
        return futures

    def _poll(self, ready: Callable[[], bool], what: str, on_timeout: Callable[[], str]) -> None:
        """Wait until ``ready()`` (a check of shared memory, no MPI call), with the group's timeout: it spins
        (yielding the GIL) for the group's spin time, then sleeps at most ``_max_pause`` between checks,
        and every millisecond looks for failure notices."""
        now = time.monotonic()
        deadline, spin_until, next_check = now + self._timeout, now + self._spin, now
        pause = 1e-5
        while not ready():
            now = time.monotonic()
            if now >= next_check:
                why = self._broken or self.world.poll()
                if why:
                    raise CollectiveError(f"{what} on rank {self.rank}: aborted, {why}")
                if now > deadline:
                    reason = on_timeout()
                    self._fail(reason)
                    raise CollectiveTimeoutError(reason)
                next_check = now + 0.001
            if now < spin_until:
                time.sleep(0)
            else:
                time.sleep(pause)
                pause = min(pause * 1.5, _MAX_FLAG_PAUSE)

    def _agree(self, kind: str, meta: dict, info: Any = None) -> list[Any]:
        """The header exchange: every rank learns every rank's kind, metadata and ``info``; they must agree
        on the kind and the metadata. Returns every rank's ``info`` in rank order."""
        seq = self._seq
        self._seq += 1
        what = f"{kind} #{seq}"
        mine = (_short(kind), meta, info)
        if self.world_size == 1:
            return [info]
        others = [r for r in range(self.world_size) if r != self.rank]
        bufs = {r: bytearray(_HDR) for r in others}
        recvs = {r: self._hdr.Irecv(bufs[r], r, _HDR_TAG) for r in others}
        # Each header carries how many messages this rank has sent its receiver (see _unreceived).
        sends = [self._hdr.Isend(_pack((*mine, self._sent[r]), what), r, _HDR_TAG) for r in others]

        def late() -> list[int]:
            return [r for r, q in recvs.items() if not q.Test()]

        with profiling.span("header exchange", "collective", rank=self.ranks[self.rank]):
            self._wait([*recvs.values(), *sends], what,
                       lambda: f"{what}: rank(s) {late()} did not arrive within {self._timeout:g} s", late=late)
        entries = {}
        for r in others:
            *entries[r], self._peer_sent[r] = _unpack(bufs[r])
        entries[self.rank] = mine
        kinds = [entries[r][0] for r in range(self.world_size)]
        if len(set(kinds)) > 1:
            other = next(r for r in range(self.world_size) if kinds[r] != kinds[0])
            self._broken = f"rank {other} called {kinds[other]} as collective #{seq} while rank 0 called {kinds[0]}"
            raise CollectiveError(self._broken)
        try:
            check_agreement(kind, {r: entries[r][1] for r in range(self.world_size)})
        except ValueError as exc:
            raise CollectiveError(f"{what}: {exc}") from None
        return [entries[r][2] for r in range(self.world_size)]

    # -- transfers ------------------------------------------------------------------------
    def _readback(self, t: Tensor) -> ChunkedReadback:
        rb = ChunkedReadback(self._pool, t, self.chunk)
        self._count(d2h=t.nbytes)
        return rb

    def _upload(self, target: Tensor, what: str, item: np.dtype | None = None) -> ChunkedUpload:
        """Uploads into ``target`` (contiguous, 4-aligned), chunk by chunk, through the pool's upload buffers."""
        buf, base = target._storage.buffer, byte_offset(target)

        def copies(j: int, start: int, end: int):
            return [(0, buf, base + start, round4(end - start))]

        return ChunkedUpload(self._pool, target.nbytes, self.chunk, item or host_dtype(target.dtype), copies,
                             self._timeout, what)

    # -- the data movers ------------------------------------------------------------------
    def _chunk_elems(self, n: int) -> int:
        """Elements per chunk of an elementwise collective of ``n`` elements (the arena is grown to fit)."""
        slot = slot_size(min(4 * n, self.chunk), self._max_slot)
        self._arena.ensure(slot)
        return slot // 4  # results are at most 4 bytes per element (float16 accumulates in float32)

    def _reduce(self, what: str, rb: ChunkedReadback, n: int, dtype: _dt.DType, op: str, lo: int, hi: int,
                up: ChunkedUpload, shared: bool) -> None:
        """Reduce ``n`` elements elementwise over the group and write elements ``[lo, hi)`` of the result
        to ``up``. ``shared``: every rank wants the same range (all-reduce), so the host's ranks each
        reduce a slice (a reduce-scatter, then an all-gather through the shared result slot); otherwise
        each reduces its own range.

        Each rank copies into its arena slot only the elements other ranks reduce (its own slice is read
        from its mapped readback in place), and writes its reduced slice straight into its upload as well
        as into the result slot, so it copies out of shared memory only the other ranks' slices: every
        byte crosses shared memory once each way. On one host the chunks are pipelined (``_pipeline``)."""
        if n == 0:
            return
        if self.num_hosts > 1:
            self._reduce_hosts(what, rb, n, dtype, op, lo, hi, up, shared)
        else:
            self._pipeline(what, rb, n, dtype, op, lo, hi, up, shared)

    def _pipeline(self, what: str, rb: ChunkedReadback, n: int, dtype: _dt.DType, op: str, lo: int, hi: int,
                  up: ChunkedUpload, shared: bool) -> None:
        """``_reduce`` inside one host, chunk by chunk in steps: after the host barrier that ends step i - 1,
        step i reduces this rank's slice of chunk i and copies the other ranks' slices of chunk i - 1's
        result out of shared memory (shared), as one batch of tasks on the host pool, then meets the others
        at the next barrier. The copy of chunk i + 2's shares of the other ranks into this rank's slot
        needs no barrier but the one before, so it starts as soon as this rank arrives at the barrier that
        ends step i and runs while it waits for the others (a process that finished early works ahead
        instead of idling). One barrier per step suffices: step i writes result slot i % 2, which the
        others last read in step i - 1 (chunk i - 2's results), and reads input set i % 3 and result slot
        (i - 1) % 2, written before the barrier that opened it; chunk i + 2's copy writes input set
        (i + 2) % 3, which the others last read in step i - 1. While the pool works, the next step's tasks
        are built (its map and upload buffer awaited) and the upload chunks the last step finished are
        committed. The reduction itself is ``reduce_into``'s, blocks of the same elements in the same rank
        order: the same bits."""
        hdt = host_dtype(dtype)
        isz = hdt.itemsize
        acc = np.dtype(np.float32) if hdt == np.float16 else hdt
        is_bool = dtype is _dt.bool_
        L, me, arena = self.local_size, self.local_rank, self._arena
        rank = self.ranks[self.rank]
        cs = _Chunks(self, what, rb, n, hdt, shared, lo, hi)
        chunks, share, mapped, copy_in, W = cs.chunks, cs.share, cs.mapped, cs.copy_in, cs.W
        N = len(chunks)
        gather = shared and L > 1  # the others' slices come back through the result slot

        def reduce(i: int) -> list:
            """Tasks: this rank's slice of chunk i into its upload (and the result slot, for the others)."""
            a, b = chunks[i]
            s0, s1 = share(i)
            if s0 >= s1:
                return []
            parts = [mapped(i) if k == me else arena.inputs(i % 3, k, hdt, b - a) for k in range(L)]
            out = arena.result(i % 2, hdt, b - a) if gather else None
            tasks = []
            for first, dst in up.targets((s0 - lo) * isz, s1 - s0):
                x0 = s0 - a + first
                xs = [x[x0:x0 + len(dst)] for x in parts]
                if out is None:
                    tasks += reduce_tasks(xs, [dst], op, is_bool, _BLOCK, workers=W)
                elif hdt == acc:  # accumulate in the result slot itself
                    tasks += reduce_tasks(xs, [dst], op, is_bool, _BLOCK, acc=out[x0:x0 + len(dst)], workers=W)
                else:  # float16: the slot holds the rounded result, so copying it out is a plain copy
                    tasks += reduce_tasks(xs, [out[x0:x0 + len(dst)], dst], op, is_bool, _BLOCK, workers=W)
            return tasks

        def copy_out(i: int) -> list:
            """Tasks: the other ranks' slices of chunk i's result out of the result slot into the upload."""
            if not gather or i < 0:
                return []
            a, b = chunks[i]
            s0, s1 = share(i)
            out = arena.result(i % 2, hdt, b - a)
            tasks = []
            for x, y in ((a, s0), (s1, b)):
                if x < y:
                    for first, dst in up.targets((x - lo) * isz, y - x):
                        x0 = x - a + first
                        tasks += copy_tasks(dst, out[x0:x0 + len(dst)], workers=W)
            return tasks

        def done(i: int) -> int:
            """Bytes of the upload complete once step i has run."""
            if gather:
                return (chunks[i - 1][1] - lo) * isz if i > 0 else 0
            return (share(i)[1] - lo) * isz

        ahead = cs.open()  # chunk i + 2's copy in, started at the barrier that ends step i
        tasks = reduce(0)
        complete = 0  # upload bytes the steps so far finished: committed while the next step runs
        for i in range(N):
            with profiling.span("host step", "collective", rank=rank):
                futures = ahead + submit_tasks(bundle(tasks, W))
                ahead = []
                try:
                    up.advance(complete)  # the GPU copies of what the last step finished start now
                    tasks = reduce(i + 1) + copy_out(i) if i + 1 < N else []
                finally:
                    finish_tasks(futures)
            del futures
            cs.done(i)
            complete = done(i)
            if L > 1 and (gather or i + 1 < N):
                ahead = self._host_barrier(what, lambda i=i: copy_in(i + 2), W)
        up.advance(complete)
        if gather:
            with profiling.span("copy out of shared memory", "collective", rank=rank):
                run_tasks(bundle(copy_out(N - 1), W))
            up.advance((hi - lo) * isz)

    def _reduce_hosts(self, what: str, rb: ChunkedReadback, n: int, dtype: _dt.DType, op: str, lo: int, hi: int,
                      up: ChunkedUpload, shared: bool) -> None:
        """``_reduce`` across hosts (hierarchical), chunk by chunk in steps: the host's ranks reduce their
        slices of chunk i into result slot i % 3 (sum for mean), the leader all-reduces the slot with the
        other hosts' leaders (MPI, in place), and every rank copies its range of the result out (dividing
        for mean). ``shared`` changes nothing here: every rank wants a range of the same result.

        Step i, after the host barrier that ends step i - 1: the leader starts the leaders' step of chunk
        i - 1 (``Iallreduce``; every rank's slice of chunk i - 1 was in its slot before that barrier), then
        the host's ranks reduce their slices of chunk i and copy chunk i - 2's result out, as one batch of
        tasks on the host pool, while the leader tests its request (a non-blocking collective advances only
        while its process calls MPI) and, once the tasks are done, waits for it; then the ranks meet at the
        next barrier. So the network step of chunk i - 1 runs during the host's work on chunks i and i - 2
        (and, through the upload ring and the chunked readback, during the GPU copies of chunk i - 2's
        result up and of later chunks down), and each chunk costs one barrier instead of three. As in
        ``_pipeline``, chunk i + 2's copy into this rank's input slot starts when it arrives at the barrier
        that ends step i. Slot reuse, one barrier per step: result slot i % 3 is written in step i (the
        reduction), read and written by MPI in step i + 1 and read in step i + 2 (the copies out), so its
        next writer, step i + 3, comes after a barrier that ends all of them; input set i % 3 is read in step
        i and next written by chunk i + 3's copy in, started at the barrier that ends step i + 1.
        The reduction is the unpipelined one's, block for block (the same bits: the host's ranks in rank
        order, then MPI among the leaders; float16 accumulates in float32; mean divides once, at the copy
        out)."""
        hdt = host_dtype(dtype)
        isz = hdt.itemsize
        acc = np.dtype(np.float32) if hdt == np.float16 else hdt
        is_bool = dtype is _dt.bool_
        L, me, arena = self.local_size, self.local_rank, self._arena
        part_op = "sum" if op == "mean" else op  # across hosts: sum, then divide once
        divide = self.world_size if op == "mean" else None
        rank = self.ranks[self.rank]
        cs = _Chunks(self, what, rb, n, hdt, True, lo, hi)  # every rank reduces its slice of each chunk
        chunks, share, mapped, copy_in, W = cs.chunks, cs.share, cs.mapped, cs.copy_in, cs.W
        N = len(chunks)

        def result(i: int) -> np.ndarray:
            a, b = chunks[i]
            return arena.result(i % 3, acc, b - a)

        def reduce(i: int) -> list:
            """Tasks: this rank's slice of chunk i into the result slot."""
            if i >= N:
                return []
            a, b = chunks[i]
            s0, s1 = share(i)
            parts = [mapped(i) if k == me else arena.inputs(i % 3, k, hdt, b - a) for k in range(L)]
            return reduce_tasks([x[s0 - a:s1 - a] for x in parts], [result(i)[s0 - a:s1 - a]], part_op, is_bool,
                                _BLOCK, workers=W)

        def copy_out(i: int) -> list:
            """Tasks: this rank's range of chunk i's result (all hosts') into its upload."""
            if not 0 <= i < N:
                return []
            a, b = chunks[i]
            s, e = max(a, lo), min(b, hi)
            tasks = []
            if s < e:
                out = result(i)
                for first, dst in up.targets((s - lo) * isz, e - s):
                    x0 = s - a + first
                    tasks += copy_tasks(dst, out[x0:x0 + len(dst)], divide, workers=W)
            return tasks

        def done(i: int) -> int:
            """Bytes of the upload complete once chunk i was copied out."""
            return max(0, min(chunks[i][1], hi) - lo) * isz

        ahead = cs.open()  # chunk i + 2's copy in, started at the barrier that ends step i
        tasks = reduce(0)
        complete = 0  # upload bytes the steps so far finished: committed while the next step runs
        for i in range(N + 2):
            net = None  # the leaders' step of chunk i - 1, in flight during this step
            with profiling.span("host step", "collective", rank=rank):
                if me == 0 and 1 <= i <= N:
                    net = self._leaders_start(result(i - 1), part_op, is_bool, i - 1)
                futures = ahead + submit_tasks(bundle(tasks, W))
                ahead = []
                try:
                    up.advance(complete)  # the GPU copies of what the last step finished start now
                    if net is not None:
                        self._leaders_test(net)
                    tasks = reduce(i + 1) + copy_out(i - 1)
                finally:
                    self._finish_testing(futures, net)
            del futures
            cs.done(i)
            if i >= 2:
                complete = done(i - 2)
            if net is not None:
                self._leaders_wait(net, what)
            if i <= N:  # a later step copies out what the leaders' step of chunk i - 1 brought
                ahead = self._host_barrier(what, lambda i=i: copy_in(i + 2), W)
        up.advance(complete)

    def _finish_testing(self, futures: list[Future], net: _LeadersStep | None) -> None:
        """``finish_tasks(futures)``, testing the leaders' step ``net`` (if any) while they run: MPI advances
        a non-blocking collective only while its process calls into MPI."""
        if net is not None and futures:
            pause = 2e-5
            while not self._leaders_test(net):
                if not wait(futures, timeout=pause)[1]:
                    break
                pause = min(pause * 1.5, _MAX_FLAG_PAUSE)
        finish_tasks(futures)

    def _leaders_start(self, arr: np.ndarray, op: str, is_bool: bool, chunk: int) -> _LeadersStep:
        """Start the leaders' all-reduce of ``arr`` (in place, this host's result slot of chunk ``chunk``)."""
        MPI = self.MPI
        t0 = time.perf_counter()
        req = self.leaders.Iallreduce(MPI.IN_PLACE, [arr, _mpi_type(MPI, arr.dtype)],
                                      _mpi_op(MPI, op, arr.dtype, is_bool))
        self.inter_host_seconds += time.perf_counter() - t0
        return _LeadersStep([req], chunk, arr.nbytes, t0, "all-reduce")

    def _leaders_test(self, net: _LeadersStep) -> bool:
        """Whether the leaders' step completed (a test: it advances the collective)."""
        if not net.done and self.MPI.Request.Testall(net.reqs):
            net.done = True
            self.inter_host_flight_seconds += time.perf_counter() - net.t0
        return net.done

    def _leaders_wait(self, net: _LeadersStep, what: str) -> None:
        """Wait for the leaders' step, polling without sleeping (a collective's later rounds start only
        when this process calls into MPI); a timeout names the other hosts."""
        if net.done:
            return
        t0 = time.perf_counter()
        with profiling.span("leaders' step", "collective", rank=self.ranks[self.rank], bytes=net.nbytes):
            self._wait(net.reqs, what, lambda: self._late_hosts(what, f"the leaders' {net.kind} of chunk {net.chunk} "
                                                                       f"({net.nbytes} bytes)"),
                       spin=self._timeout)
        t1 = time.perf_counter()
        net.done = True
        self.inter_host_seconds += t1 - t0
        self.inter_host_flight_seconds += t1 - net.t0

    def _late_hosts(self, what: str, step: str) -> str:
        """A timeout message naming the other hosts (their leaders and ranks): one of them is late."""
        mine = self.hosts[self.rank]
        others = [h for h in range(self.num_hosts) if h != mine]
        members = {h: [r for r in range(self.world_size) if self.hosts[r] == h] for h in others}
        named = "; ".join(f"host {h}: ranks {rs} (leader rank {rs[0]})" for h, rs in members.items())
        return (f"{what}: {step} did not complete within {self._timeout:g} s: a rank of another host stopped "
                f"inside the collective ({named})")

    def _gather(self, what: str, pieces: list[tuple[int, int, int]], total: int, rb: ChunkedReadback | None,
                up: ChunkedUpload | None) -> None:
        """Every rank r contributes its bytes at ``[off, off + nbytes)`` of a ``total``-byte concatenation
        (``pieces``: (rank, off, nbytes)); the whole concatenation goes to ``up`` (None: not wanted).

        Chunk by chunk in steps, as ``_reduce_hosts``: step i copies this rank's bytes of chunk i into result
        slot i % 2 (one host) or i % 3 (across hosts) and copies chunk i - 1's (one host) or i - 2's (across
        hosts) out of its slot into the upload, as one batch of tasks on the host pool, then the host's
        ranks meet at a barrier. Across hosts the leader starts the leaders' exchange of chunk i - 1 at the
        beginning of step i (it sends the bytes its host's ranks wrote to every other leader and receives
        theirs, into the slot), tests it while the tasks run and waits for it before the barrier, so the
        network step runs while the host copies chunks i and i - 2. A slot is next written one step after
        the step that copies it out, behind the barrier that ends that step."""
        if total == 0:
            return
        S = slot_size(min(total, self.chunk), self._max_slot)
        arena = self._arena
        arena.ensure(S)
        hosts = self.num_hosts > 1
        lag = 2 if hosts else 1  # steps from a chunk's copy in to its copy out (across hosts, the leaders' step)
        rank = self.ranks[self.rank]
        W = host_threads()
        chunks = [(c0, min(c0 + S, total)) for c0 in range(0, total, S)]
        N = len(chunks)
        mine = [(off, nb) for r, off, nb in pieces if r == self.rank]

        def slot(i: int) -> np.ndarray:
            c0, c1 = chunks[i]
            return arena.result(i % (lag + 1), np.uint8, c1 - c0)

        def copy_in(i: int) -> list:
            """Tasks: this rank's bytes of chunk i into its slot."""
            if i >= N:
                return []
            (c0, c1), buf, tasks = chunks[i], slot(i), []
            for off, nb in mine:
                s, e = max(off, c0), min(off + nb, c1)
                if s < e:
                    for rel, src in self._mapping(lambda s=s, e=e, off=off: rb.span(s - off, e - s, self._timeout,
                                                                                   what), what):
                        dst = s - c0 + rel
                        tasks += copy_tasks(buf[dst:dst + len(src)], np.frombuffer(src, dtype=np.uint8),
                                            block=4 * _BLOCK, workers=W)
            return tasks

        def copy_out(i: int) -> list:
            """Tasks: chunk i out of its slot into the upload."""
            if up is None or not 0 <= i < N:
                return []
            c0, c1 = chunks[i]
            buf = slot(i)
            return [t for rel, dst in up.span(c0, c1 - c0)
                    for t in copy_tasks(dst, buf[rel:rel + len(dst)], block=4 * _BLOCK, workers=W)]

        tasks = copy_in(0)
        complete = 0  # upload bytes the steps so far finished: committed while the next step runs
        for i in range(N + lag):
            net = None  # across hosts, the leaders' exchange of chunk i - 1, in flight during this step
            with profiling.span("host step", "collective", rank=rank):
                if hosts and self.local_rank == 0 and 1 <= i <= N:
                    net = self._leaders_share(slot(i - 1), *chunks[i - 1], pieces, i - 1)
                futures = submit_tasks(bundle(tasks, W))
                try:
                    if up is not None:
                        up.advance(complete)
                    if net is not None:
                        self._leaders_test(net)
                    tasks = copy_in(i + 1) + copy_out(i + 1 - lag)
                finally:
                    self._finish_testing(futures, net)
            del futures
            if i >= lag:
                complete = chunks[i - lag][1]
            if net is not None:
                self._leaders_wait(net, what)
            if i < N + lag - 1:
                self._host_barrier(what)
        if up is not None:
            up.advance(complete)

    def _leaders_share(self, buf: np.ndarray, c0: int, c1: int, pieces, chunk: int) -> _LeadersStep:
        """Between hosts, start the exchange of chunk ``chunk`` (bytes ``[c0, c1)``, in ``buf``): each leader
        sends the bytes its host's ranks wrote to every other leader and receives theirs."""
        me = self.hosts[self.rank]
        reqs = []
        t0 = time.perf_counter()
        for r, off, nb in pieces:
            s, e = max(off, c0) - c0, min(off + nb, c1) - c0
            if s >= e:
                continue
            h = self.hosts[r]
            if h == me:
                reqs += [self.leaders.Isend(buf[s:e], other, 0) for other in range(self.num_hosts) if other != me]
            else:
                reqs.append(self.leaders.Irecv(buf[s:e], h, 0))
        self.inter_host_seconds += time.perf_counter() - t0
        return _LeadersStep(reqs, chunk, c1 - c0, t0, "exchange")

    # -- collectives ----------------------------------------------------------------------
    def _collective(self, kind: str, meta: dict, rb: ChunkedReadback | None, body: Callable[[Any], Any],
                    info: Any = None) -> Completion:
        """A completion that agrees on the header, then runs ``body(infos)``; the readback is given back
        when done (and abandoned after a failure that may leave MPI reading it)."""
        def complete():
            try:
                infos = self._agree(kind, meta, info)
            except BaseException:
                if rb is not None:
                    rb.release()
                raise
            try:
                result = body(infos)
            except BaseException:
                if rb is not None:
                    rb.abandon()
                raise
            if rb is not None:
                rb.release()
            return result

        return complete

    def _run_upload(self, up: ChunkedUpload, fn: Callable[[], None]) -> None:
        try:
            fn()
            up.finish()
        except BaseException:
            up.abandon()
            raise

    def _start_all_reduce(self, kind: str, meta: dict, tensor: Tensor, op: str) -> Completion:
        n = tensor.numel()
        return self._start_reduction(kind, meta, tensor, tensor, self._stand_in(tensor), op, 0, n, shared=True)

    def _start_scatter_reduced(self, kind: str, meta: dict, tensor: Tensor, output: Tensor, target: Tensor,
                               op: str, lo: int, hi: int) -> Completion:
        return self._start_reduction(kind, meta, tensor, output, target, op, lo, hi, shared=False)

    def _start_reduction(self, kind: str, meta: dict, tensor: Tensor, output: Tensor, target: Tensor, op: str,
                         lo: int, hi: int, shared: bool) -> Completion:
        rb = self._readback(tensor)
        n, dtype = tensor.numel(), tensor.dtype

        def body(_):
            # Step i writes chunk i, finishes chunk i - 1 and commits chunk i - 2 (finished by step i - 1): three
            # upload buffers open at once, each back in the pool at its commit (across hosts one chunk later each).
            up = self._upload(target, kind)
            self._run_upload(up, lambda: self._reduce(kind, rb, n, dtype, op, lo, hi, up, shared=shared))
            return self._landed(target, output)

        return self._collective(kind, meta, rb, body)

    def _start_broadcast(self, kind: str, meta: dict, tensor: Tensor, src: int,
                         target: Tensor | None) -> Completion:
        pieces = [(src, 0, tensor.nbytes)]
        if target is None:  # the source
            rb = self._readback(tensor)

            def body(_):
                self._gather(kind, pieces, tensor.nbytes, rb, None)
                return tensor

            return self._collective(kind, meta, rb, body)

        def receive(_):
            up = self._upload(target, kind, np.dtype(np.uint8))
            self._run_upload(up, lambda: self._gather(kind, pieces, tensor.nbytes, None, up))
            return self._landed(target, tensor)

        return self._collective(kind, meta, None, receive)

    def _start_all_gather(self, kind: str, meta: dict, tensor: Tensor) -> Completion:
        rb = self._readback(tensor)
        dtype = tensor.dtype

        def body(shapes):
            outs = [Tensor.empty(s, dtype, self.device) for s in shapes]
            offs = np.cumsum([0] + [round4(o.nbytes) for o in outs]).tolist()  # 4-aligned: one GPU copy each
            pieces = [(r, offs[r], o.nbytes) for r, o in enumerate(outs)]

            def copies(j: int, start: int, end: int):
                out = []
                for o, off in zip(outs, offs):
                    s, e = max(off, start), min(off + o.nbytes, end)
                    if s < e:
                        out.append((s - start, o._storage.buffer, s - off, round4(e - s)))
                return out

            up = ChunkedUpload(self._pool, offs[-1], self.chunk, np.dtype(np.uint8), copies, self._timeout, kind)
            self._run_upload(up, lambda: self._gather(kind, pieces, offs[-1], rb, up))
            for o in outs:
                o._storage.bump_version()
            self._count(h2d=sum(o.nbytes for o in outs))
            return outs

        return self._collective(kind, meta, rb, body, info=tensor.shape)

    def _start_all_gather_into(self, kind: str, meta: dict, output: Tensor, target: Tensor,
                               tensor: Tensor) -> Completion:
        rb = self._readback(tensor)
        nb = tensor.nbytes
        pieces = [(r, r * nb, nb) for r in range(self.world_size)]

        def body(_):
            up = self._upload(target, kind, np.dtype(np.uint8))
            self._run_upload(up, lambda: self._gather(kind, pieces, output.nbytes, rb, up))
            return self._landed(target, output)

        return self._collective(kind, meta, rb, body)

    def _start_barrier(self, kind: str) -> Completion:
        return self._collective(kind, {}, None, lambda _: None)

    def host_all_reduce(self, array: np.ndarray, op: str = "sum") -> np.ndarray:
        """All-reduce a contiguous float32, float16 or int32 NumPy array in place, through the path a
        tensor's all-reduce takes once its bytes are on the host (shared memory inside a host, MPI
        between hosts), with the same bits; returns ``array``. What bench_allreduce times against a
        host memcpy."""
        kind = "host_all_reduce"
        self._launch(kind)
        if not (isinstance(array, np.ndarray) and array.flags.c_contiguous
                and array.dtype in (np.float32, np.float16, np.int32)):
            raise TypeError(f"{kind}: needs a contiguous float32, float16 or int32 NumPy array")
        op = check_reduce_op(op, kind)
        dtype = _dt.as_dtype(array.dtype.name)
        check_reducible(dtype, op, f"{kind} on rank {self.rank}")
        meta = {"shape": array.shape, "dtype": dtype.name, "op": op}
        n = array.size

        def body(_):
            self._reduce(kind, _HostSource(array), n, dtype, op, 0, n, _HostTarget(array), shared=True)
            return array

        return self._submit(kind, self._collective(kind, meta, None, body)).wait()

    def gather_objects(self, obj: Any, label: str | None = None) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank (run_spmd's results)."""
        kind = kind_name("gather_objects", label)
        self._launch(kind)
        try:
            body = pickle.dumps(obj)
        except Exception as exc:
            raise TypeError(f"{kind} on rank {self.rank}: cannot send a {type(obj).__name__} to the other "
                            f"processes ({exc}); return NumPy arrays or numbers (tensor.numpy(), .item())") from exc

        def exchange(sizes):
            others = [r for r in range(self.world_size) if r != self.rank]
            bufs = {r: bytearray(sizes[r]) for r in others}
            reqs = [self._hdr.Irecv(bufs[r], r, _OBJ_TAG) for r in others]
            reqs += [self._hdr.Isend(body, r, _OBJ_TAG) for r in others]
            self._wait(reqs, kind, lambda: f"{kind}: a rank did not send its object within {self._timeout:g} s")
            return [obj if r == self.rank else pickle.loads(bufs[r]) for r in range(self.world_size)]

        return self._submit(kind, self._collective(kind, {}, None, exchange, info=len(body))).wait()

    # -- point to point -------------------------------------------------------------------
    def _check_tag(self, tag: int, what: str) -> None:
        if not 0 <= tag <= self.tag_ub:
            raise ValueError(f"{what} on rank {self.rank}: MPI tags run from 0 to {self.tag_ub}, got {tag}")

    def _start_send(self, kind: str, tensor: Tensor, dst: int, tag: int) -> Completion:
        rb = self._readback(tensor)
        header = (tensor.shape, tensor.dtype.name, rb.nbytes, self.chunk)

        def complete():
            if self._mail is not None and dst in self._host_members and rb.nbytes <= self._mail.slot_bytes:
                slot = self._mail.claim()
                if slot is not None:
                    return self._send_through_mailbox(kind, rb, header, dst, tag, slot)
            reqs = [self._p2p.Isend(_pack((*header, -1), kind), dst, tag)]
            self._sent[dst] += 1
            try:
                for a in range(0, rb.nbytes, self.chunk):
                    ((_, mem),) = self._mapping(lambda a=a: rb.span(a, min(self.chunk, rb.nbytes - a), self._timeout,
                                                                   kind), kind)
                    reqs.append(self._p2p_data.Isend(mem, dst, tag))  # the mapped memory itself, no copy
            finally:
                self._sends.add(reqs, rb.release)
            return None

        return complete

    def _send_through_mailbox(self, kind: str, rb: ChunkedReadback, header: tuple, dst: int, tag: int,
                              slot: int) -> None:
        """Copy the message into a free mailbox slot of this rank's, mark it full, then send ``dst`` (on this
        host) the header naming the slot: nothing of the message depends on MPI's progress but its small header."""
        try:
            box = self._mail.slot(self.local_rank, slot, rb.nbytes)
            for a in range(0, rb.nbytes, self.chunk):
                ((_, mem),) = self._mapping(lambda a=a: rb.span(a, min(self.chunk, rb.nbytes - a), self._timeout,
                                                               kind), kind)
                copy_into(box[a:a + len(mem)], np.frombuffer(mem, dtype=np.uint8))
            self._mail.post(slot)
        finally:
            rb.release()
        self._sends.add([self._p2p.Isend(_pack((*header, slot), kind), dst, tag)], _nothing)
        self._sent[dst] += 1

    def _start_recv(self, kind: str, tensor: Tensor | None, src: int, tag: int) -> Completion:
        # The header's receive is posted now, in call order (messages with one source and tag match in
        # posting order): a message sent before this recv's turn comes on the communication thread is
        # matched on arrival, and its header waits there.
        hdr = bytearray(_HDR)
        req = self._p2p.Irecv(hdr, src, tag)

        def complete():
            self._await_message(req, hdr, src, tag, kind)
            self._received[src] += 1
            shape, dtype_name, nbytes, chunk, slot = _unpack(hdr)
            try:
                out, target = self._receiving(tensor, src, tag, shape, _dt.as_dtype(dtype_name))
            except CollectiveError:
                if slot >= 0:
                    self._mail.free(self._host_members.index(src), slot)
                else:
                    self._drain(src, tag, nbytes, chunk, kind)
                raise
            buf, base = target._storage.buffer, byte_offset(target)
            up = ChunkedUpload(self._pool, nbytes, chunk, np.dtype(np.uint8),
                               lambda j, s, e: [(0, buf, base + s, round4(e - s))], self._timeout, kind)
            if slot >= 0:
                self._run_upload(up, lambda: self._take_from_mailbox(up, src, slot, nbytes, chunk))
            else:
                self._run_upload(up, lambda: self._receive_into(up, src, tag, nbytes, chunk, kind))
            return self._landed(target, out)

        return complete

    def _await_message(self, req, hdr: bytearray, src: int, tag: int, kind: str) -> None:
        """Wait for ``req``, the receive (posted at launch) of the header of the next message from ``src``
        with ``tag``. A sender that entered a collective of this group instead will never send it: its
        messages on this group leave in call order, and it waits in the collective for this rank, which
        gets there only after this recv. So once its collective header has waited ``_MOVED_ON_GRACE`` s,
        fail naming the recv (not the collective, such as run_spmd's end-of-program gather, that the
        sender met)."""
        seen: list[float] = []  # when the sender's collective header was first seen
        moved_on = "moved on"

        def broken() -> str | None:
            if self._broken:
                return self._broken
            if not seen:
                if self._hdr.Iprobe(src, _HDR_TAG):
                    seen.append(time.monotonic())
            elif time.monotonic() - seen[0] > _MOVED_ON_GRACE:
                return moved_on
            return None

        try:
            done = self.world.wait([req], self._timeout, broken, self._spin, _MAX_FLAG_PAUSE)
        except Interrupted as exc:
            if str(exc) != moved_on:
                raise CollectiveError(f"{kind} on rank {self.rank}: aborted, {exc}") from None
            req.Cancel()
            theirs = bytearray(_HDR)
            self._hdr.Recv(theirs, src, _HDR_TAG)
            other, _, _, sent = _unpack(theirs)
            reason = (f"recv on rank {self.rank} from rank {src} (tag {tag}) is never matched: rank {src} called "
                      f"{other} on this group instead of sending it (messages from rank {src} to rank {self.rank} on "
                      f"this group: {sent} sent, {self._received[src]} received)")
            self._fail(reason)
            raise CollectiveError(reason) from None
        if not done:
            reason = f"recv on rank {self.rank}: no message from rank {src} (tag {tag}) within {self._timeout:g} s"
            self._fail(reason, [src])
            raise CollectiveTimeoutError(reason)

    def _receive_into(self, up: ChunkedUpload, src: int, tag: int, nbytes: int, chunk: int, kind: str) -> None:
        """Receive a message's chunks straight into mapped upload memory, a few ahead, committing in order."""
        starts = list(range(0, nbytes, chunk))
        posted: deque = deque()
        for i, a in enumerate(starts):
            ((_, mem),) = up.span(a, min(chunk, nbytes - a))
            posted.append((self._p2p_data.Irecv(mem, src, tag), min(a + chunk, nbytes)))
            if len(posted) > _RECV_AHEAD or i == len(starts) - 1:
                while posted and (len(posted) > _RECV_AHEAD or i == len(starts) - 1):
                    req, end = posted.popleft()
                    # The sender is sending: look often (a fragment may move per look on either side).
                    self._wait([req], kind, lambda: f"recv on rank {self.rank}: the message from rank {src} "
                                                    f"(tag {tag}) stopped arriving for {self._timeout:g} s",
                               max_pause=PAUSE_IN_FLIGHT)
                    up.advance(end)

    def _take_from_mailbox(self, up: ChunkedUpload, src: int, slot: int, nbytes: int, chunk: int) -> None:
        """Copy a message out of ``src``'s mailbox slot into mapped upload memory, committing chunk by chunk,
        then free the slot."""
        frm = self._host_members.index(src)
        try:
            self._mail.opened()
            box = self._mail.slot(frm, slot, nbytes)
            for a in range(0, nbytes, chunk):
                n = min(chunk, nbytes - a)
                for rel, piece in up.span(a, n):
                    copy_into(piece, box[a + rel:a + rel + len(piece)])
                up.advance(a + n)
        finally:
            self._mail.free(frm, slot)

    def _drain(self, src: int, tag: int, nbytes: int, chunk: int, kind: str) -> None:
        """Take a message's payload without keeping it (it did not fit the receiver's tensor)."""
        scratch = np.empty(min(chunk, max(nbytes, 1)), np.uint8)
        for a in range(0, nbytes, chunk):
            self._wait([self._p2p_data.Irecv(scratch[:min(chunk, nbytes - a)], src, tag)], kind,
                       lambda: f"recv on rank {self.rank}: the message from rank {src} stopped arriving")

    # -- sub-groups -----------------------------------------------------------------------
    def _start_split(self, kind: str, meta: dict, ranks: tuple[int, ...]) -> Completion:
        MPI = self.MPI

        def body(_):
            member = self.rank in ranks
            sub = self.comm.Split(0 if member else MPI.UNDEFINED, ranks.index(self.rank) if member else 0)
            if not member:
                return None
            g = MPIGroup(self.world, sub, self.device, self._timeout, ranks=[self.ranks[r] for r in ranks],
                         name=f"{self.name}/{'.'.join(map(str, ranks))}")
            self._children.append(g)
            return g

        return self._collective(kind, meta, None, body)


def _nothing() -> None:
    pass


# -- the process's world group, and run_spmd under mpiexec ------------------------------------
_root: MPIGroup | None = None
_root_lock = threading.Lock()


def init_world_group(timeout: float | None = None, device: Device | int | str | None = None) -> MPIGroup:
    """This process's group over every process of the job (made once; later calls return it).

    Arguments:
        timeout: seconds every collective wait may take (default 300; a later call may change it).
        device: this process's device (default: device ``local_rank``, opened; see the module docstring).
    """
    global _root
    with _root_lock:
        if _root is not None:
            if timeout is not None:
                _root.timeout = timeout
            if device is not None and _adapters.resolve(device) is not _root.device:
                raise ValueError(f"init_process_group: this process already uses {_root.device}, not {device}")
            return _root
        t = check_timeout(timeout if timeout is not None else DEFAULT_TIMEOUT)
        w = world()
        # Every process must be here before the blocking set-up calls: a missing one times out, not hangs.
        if not w.wait([w.comm.Ibarrier()], t, lambda: None):
            reason = f"init_process_group: not every one of the {w.size} processes arrived within {t:g} s"
            w.notify(reason)
            raise CollectiveTimeoutError(reason)
        dev = _adapters.resolve(device) if device is not None else _adapters.open_device(w.local_rank)
        _root = MPIGroup(w, w.comm.Dup(), dev, t)
        return _root


def _report(group: MPIGroup, exc: BaseException) -> int:
    """This rank's program failed: print why, tell (or answer) the others, and return the rank at fault."""
    w = group.world
    w.poll()
    if w.failure is None or w.culprit == w.rank:
        w.notify(f"{type(exc).__name__}: {exc}")
    print(f"wgpar: rank {w.rank} of {w.size} failed:", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    w.settle()
    return w.culprit if w.culprit is not None else w.rank


def run_spmd(fn: Callable[..., Any], world_size: int | None, timeout: float | None, args: Sequence) -> list[Any]:
    """``fn(group, *args)`` in this process (one rank of the job); every rank's result, in rank order."""
    group = init_world_group(timeout)
    if world_size is not None and world_size != group.world_size:
        raise ValueError(f"run_spmd: world_size={world_size}, but mpiexec started {group.world_size} processes")
    try:
        result = fn(group, *args)
        return group.gather_objects(result, "run_spmd")
    except BaseException as exc:
        raise RankError(_report(group, exc), exc) from exc
