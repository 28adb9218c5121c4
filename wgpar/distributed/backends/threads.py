"""The threaded backend: ranks are threads of one process, each owning one device.

``ThreadGroup`` is the state the ranks share: a rendezvous keyed by each
collective's sequence number, a mailbox for point-to-point messages, and the
failure flag. ``ThreadRank`` is one rank's ``ProcessGroup``.

A collective runs in two halves. The *launch* runs on the calling thread: it
records the copy of the input into a leased staging buffer (so it reads the
input in the device's stream order), submits it and requests the map, without
waiting. The *completion* runs on the rank's communication thread, in call
order: it waits for the map, meets the other ranks, reduces or copies on the
host straight between the mapped buffers (every rank reads the others'
readbacks in place and works on its own slice), meets them again so nobody
unmaps memory another rank still reads, and commits the upload with a GPU
copy. ``async_op=True`` returns the Work of that completion, so transfers and
host reductions overlap the rank's compute. What the ranks agree on and how a
collective fails is ``staged.py``'s; this file moves the data.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import dtypes as _dt
from ... import ops
from ...creation import own_generator_for_thread
from ...runtime import profiling
from ...runtime.device import Device
from ...runtime.transfer import StagingBuffer, UploadBuffer
from ...tensor import Tensor
from ..errors import CollectiveError, CollectiveTimeoutError, RankError
from ..group import DEFAULT_TIMEOUT, check_agreement, split_sizes
from .common import Progress, byte_offset, check_timeout, readable, round4, writable
from .hostreduce import copy_into, host_dtype, reduce_into
from .staged import Completion, StagedGroup
from .staging import TransferPool


class _Slot:
    __slots__ = ("kind", "first", "data", "result", "error", "taken")

    def __init__(self, kind: str, first: int) -> None:
        self.kind = kind
        self.first = first
        self.data: dict[int, object] = {}
        self.result: object = None
        self.error: str | None = None
        self.taken = 0


class ThreadGroup:
    """The shared state of a group of thread ranks, rank r owning ``devices[r]``.

    Arguments:
        devices: one distinct Device per rank.
        timeout: seconds any wait inside a collective may take.
        ranks: the members' ranks in the parent group (sub-groups made by ``split``).
    """

    def __init__(self, devices: Sequence[Device], timeout: float = DEFAULT_TIMEOUT, *,
                 ranks: Sequence[int] | None = None, name: str = "group") -> None:
        if len(devices) < 1:
            raise ValueError("a process group needs at least one device")
        if len({id(d) for d in devices}) != len(devices):
            raise ValueError(f"each rank needs its own device, got {[str(d) for d in devices]}")
        self.devices = list(devices)
        self.world_size = len(devices)
        self._timeout = check_timeout(timeout)
        self.ranks = tuple(ranks) if ranks is not None else tuple(range(self.world_size))
        self.name = name
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._seq = [0] * self.world_size
        self._broken: str | None = None
        self._mail: dict[tuple[int, int, int], deque] = {}
        self._children: list[ThreadGroup] = []
        self._members = [ThreadRank(self, r) for r in range(self.world_size)]

    @property
    def timeout(self) -> float:
        """The collective timeout, in seconds."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = check_timeout(seconds)
        for child in self._children:
            child.timeout = seconds

    def rank(self, r: int) -> ThreadRank:
        """Rank ``r``'s ProcessGroup (use it from that rank's thread)."""
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.world_size:
            raise ValueError(f"rank {r!r} out of range for a group of {self.world_size}")
        return self._members[r]

    # -- failure handling -----------------------------------------------------------------
    def abort(self, rank: int, reason: str) -> None:
        """Mark the group (and its sub-groups) broken: every rank waiting in a collective raises."""
        self._break(f"rank {rank} failed: {reason}")

    def _break(self, why: str) -> None:
        with self._cond:
            if self._broken is None:
                self._broken = why
            self._cond.notify_all()
        for child in self._children:
            child._break(f"its parent group broke ({why})")

    @property
    def broken(self) -> str | None:
        """Why the group is broken (a failed or timed-out collective), None while it works."""
        return self._broken

    def reset(self) -> None:
        """Forget a failure and everything pending, so the group can be used again.

        Collectives still in flight fail first (the group is aborted while they drain); then every
        rank's abandoned staging buffers are settled and returned to its pool.
        """
        busy = [m for m in self._members if m._progress.pending]
        if busy:
            self.abort(busy[0].rank, "reset() while collectives were in flight")
        for m in self._members:
            if not m._progress.drain(self._timeout + 10):
                raise CollectiveTimeoutError(f"reset: rank {m.rank}'s collectives did not finish within "
                                             f"{self._timeout + 10:g} s")
        with self._cond:
            mail, self._mail = self._mail, {}
            self._broken = None
            self._slots.clear()
            self._seq = [0] * self.world_size
        for box in mail.values():
            for msg in box:
                msg[-1]()  # give the sender's staging buffer back
        for m in self._members:
            m._pool.reset()
        for child in self._children:
            child.reset()

    def close(self) -> None:
        """Stop the ranks' communication threads (and the sub-groups')."""
        for child in self._children:
            child.close()
        for m in self._members:
            m._progress.close()

    # -- the rendezvous -------------------------------------------------------------------
    def exchange(self, rank: int, kind: str, payload, combine: Callable[[dict[int, object]], object] | None):
        """Deposit ``payload``; once all ranks have, ``combine`` (run once) gives everyone the result."""
        with self._cond:
            if self._broken:
                raise CollectiveError(f"{kind}: the group is broken ({self._broken}); reset it first")
            seq = self._seq[rank]
            self._seq[rank] += 1
            slot = self._slots.get(seq)
            if slot is None:
                slot = self._slots[seq] = _Slot(kind, rank)
            if slot.kind != kind:
                self._broken = (f"rank {rank} called {kind} as collective #{seq} while rank {slot.first} "
                                f"called {slot.kind}")
                self._cond.notify_all()
                raise CollectiveError(self._broken)
            slot.data[rank] = payload
            if len(slot.data) == self.world_size:
                try:
                    slot.result = combine(slot.data) if combine is not None else True
                except Exception as exc:  # e.g. ranks disagree on shapes: everyone learns why
                    slot.error = f"{kind} #{seq}: {exc}"
                slot.data = {}
                self._cond.notify_all()
            deadline = time.monotonic() + self._timeout
            while slot.result is None and slot.error is None:
                if self._broken:
                    raise CollectiveError(f"{kind} #{seq} on rank {rank}: aborted, {self._broken}")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in range(self.world_size) if r not in slot.data]
                    self._broken = f"{kind} #{seq}: rank(s) {missing} did not arrive within {self._timeout:g} s"
                    self._cond.notify_all()
                    raise CollectiveTimeoutError(self._broken)
                self._cond.wait(left)
            slot.taken += 1
            if slot.taken == self.world_size:
                del self._slots[seq]
            if slot.error is not None:
                raise CollectiveError(slot.error)
            return slot.result

    # -- point to point -------------------------------------------------------------------
    def post(self, src: int, dst: int, tag: int, message: tuple) -> None:
        """Put ``message`` in the mailbox from ``src`` to ``dst`` under ``tag`` (point-to-point send);
        CollectiveError if the group is broken.

        Arguments:
            src: the sending rank.
            dst: the receiving rank.
            tag: the message tag.
            message: the payload.
        """
        with self._cond:
            if self._broken:
                raise CollectiveError(f"send from rank {src} to rank {dst}: the group is broken ({self._broken})")
            self._mail.setdefault((src, dst, tag), deque()).append(message)
            self._cond.notify_all()

    def take(self, src: int, dst: int, tag: int) -> tuple:
        """Wait for and remove the oldest message from ``src`` to ``dst`` under ``tag`` (point-to-point receive).

        Raises CollectiveError if the group breaks, CollectiveTimeoutError (and breaks the group) after the timeout.

        Arguments:
            src: the sending rank.
            dst: the receiving rank.
            tag: the message tag.
        """
        deadline = time.monotonic() + self._timeout
        key = (src, dst, tag)
        with self._cond:
            while True:
                if self._broken:
                    raise CollectiveError(f"recv on rank {dst} from rank {src} (tag {tag}): aborted, {self._broken}")
                box = self._mail.get(key)
                if box:
                    return box.popleft()
                left = deadline - time.monotonic()
                if left <= 0:
                    self._broken = (f"recv on rank {dst}: no message from rank {src} (tag {tag}) within "
                                    f"{self._timeout:g} s")
                    self._cond.notify_all()
                    raise CollectiveTimeoutError(self._broken)
                self._cond.wait(left)

    # -- sub-groups -----------------------------------------------------------------------
    def child(self, ranks: tuple[int, ...]) -> ThreadGroup:
        """A sub-group over ``ranks`` of this group, with the same timeout; aborting this group breaks it too.

        Arguments:
            ranks: the member ranks, as indices into this group.
        """
        sub = ThreadGroup([self.devices[r] for r in ranks], self._timeout,
                          ranks=[self.ranks[r] for r in ranks], name=f"{self.name}/{'.'.join(map(str, ranks))}")
        self._children.append(sub)
        return sub

    def __repr__(self) -> str:
        return f"ThreadGroup(world_size={self.world_size}, devices={[str(d) for d in self.devices]})"


class ThreadRank(StagedGroup):
    """Rank ``rank`` of a ThreadGroup; call its methods from that rank's thread."""

    backend = "threads"

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.device = group.devices[rank]
        self.ranks = group.ranks
        self.name = group.name
        self._pool = TransferPool(self.device, f"{group.name}:{rank}")
        self._progress = Progress(f"wgpar-comm{group.ranks[rank]}")

    @property
    def timeout(self) -> float:
        """The group's collective timeout, in seconds."""
        return self.group.timeout

    def abort(self, reason: str) -> None:
        """Mark the group (and its sub-groups) broken: every rank waiting in a collective raises.

        Arguments:
            reason: why, shown in their errors.
        """
        self.group.abort(self.rank, reason)

    def reset(self) -> None:
        """Forget a failure and everything pending so the group can be used again (``ThreadGroup.reset``)."""
        self.group.reset()

    @property
    def broken(self) -> str | None:
        """Why the group is broken, None while it works."""
        return self.group.broken

    # -- plumbing -------------------------------------------------------------------------
    def _exchange(self, kind: str, payload, combine=None):
        with profiling.span("rendezvous", "collective", rank=self.group.ranks[self.rank], kind=kind):
            return self.group.exchange(self.rank, kind, payload, combine)

    def _download(self, t: Tensor) -> StagingBuffer:
        """Start copying ``t`` into a leased staging buffer."""
        src = t if readable(t) else ops.clone(t)
        down = self._pool.down(round4(src.nbytes))
        try:
            down.start(src._storage.buffer, byte_offset(src), round4(src.nbytes))
        except BaseException:
            self._pool.give_back(down)
            raise
        self._count(d2h=src.nbytes)
        return down

    def _mapped_bytes(self, down: StagingBuffer, kind: str) -> memoryview:
        """The staging buffer's bytes, read in place once its map completes (with the group's timeout)."""
        return self._mapping(lambda: down.view(self.group.timeout, kind), kind)

    def _mapped(self, down: StagingBuffer, kind: str, dtype: _dt.DType, count: int) -> np.ndarray:
        return np.frombuffer(self._mapped_bytes(down, kind), dtype=host_dtype(dtype), count=count)

    def _upload_view(self, up: UploadBuffer, kind: str, dtype: _dt.DType, count: int) -> np.ndarray:
        mem = self._mapping(lambda: up.view(self.group.timeout, kind), kind)
        return np.frombuffer(mem, dtype=host_dtype(dtype), count=count)

    def _commit(self, up: UploadBuffer, target: Tensor, result: Tensor) -> Tensor:
        """Copy the upload into ``target`` (then into ``result`` when target is a stand-in)."""
        try:
            up.commit(target._storage.buffer, byte_offset(target), round4(target.nbytes))
        finally:
            self._pool.give_back(up)
        return self._landed(target, result)

    def _abandon(self, *bufs) -> None:
        for b in bufs:
            if b is not None:
                self._pool.abandon(b)

    def _give_back(self, *bufs) -> None:
        for b in bufs:
            if b is not None:
                self._pool.give_back(b)

    def _shared_phase(self, kind: str, bufs: tuple, what: str, work: Callable[..., None], *args) -> None:
        """Run ``work(*args)`` (which reads or writes other ranks' mappings; ``what`` names it in a profile),
        then meet every rank again so that no rank releases memory another one still uses; on failure the
        buffers are abandoned."""
        try:
            with profiling.span(what, "collective", rank=self.group.ranks[self.rank], kind=kind):
                work(*args)
            self._exchange(kind + ".done", None)
        except BaseException:
            self._abandon(*bufs)
            raise

    def _through_host(self, kind: str, meta: dict, src: Tensor, target_t: Tensor, result: Tensor, what: str,
                      work: Callable[[list[np.ndarray], list[np.ndarray], np.ndarray], None]) -> Completion:
        """The elementwise shape (all-reduce, all-gather into, reduce-scatter): download ``src``, share
        every rank's readback and upload view, run ``work(readbacks, upload views, own upload view)``,
        commit into ``target_t``. ``result`` is what the collective returns."""
        down = self._download(src)
        up = self._pool.up(round4(target_t.nbytes))
        n, dtype, m = src.numel(), src.dtype, target_t.numel()  # src was copied at launch: do not keep it alive

        def complete():
            try:
                mine = self._mapped(down, kind, dtype, n)
                target = self._upload_view(up, kind, dtype, m)
                parts, targets = self._exchange(kind, (meta, mine, target), _share_all(kind))
            except BaseException:
                self._give_back(down, up)
                raise
            self._shared_phase(kind, (down, up), what, work, parts, targets, target)
            del mine, target, parts, targets
            self._give_back(down)
            return self._commit(up, target_t, result)

        return complete

    # -- collectives ----------------------------------------------------------------------
    def _start_all_reduce(self, kind: str, meta: dict, tensor: Tensor, op: str) -> Completion:
        work_t = tensor if writable(tensor) else ops.clone(tensor)  # a clone owns its padding
        n = tensor.numel()
        bounds = np.cumsum([0, *split_sizes(n, self.world_size)])
        lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
        is_bool = tensor.dtype is _dt.bool_

        def work(parts, targets, _):  # this rank reduces its slice into every rank's upload
            reduce_into([p[lo:hi] for p in parts], [t[lo:hi] for t in targets], op, is_bool)

        return self._through_host(kind, meta, work_t, work_t, tensor, "host reduce", work)

    def _start_all_gather_into(self, kind: str, meta: dict, output: Tensor, target: Tensor,
                               tensor: Tensor) -> Completion:
        n = tensor.numel()

        def work(parts, _, mine):
            _copy_pieces([(mine[r * n:(r + 1) * n], part) for r, part in enumerate(parts)])

        return self._through_host(kind, meta, tensor, target, output, "host copy", work)

    def _start_scatter_reduced(self, kind: str, meta: dict, tensor: Tensor, output: Tensor, target: Tensor,
                               op: str, lo: int, hi: int) -> Completion:
        is_bool = tensor.dtype is _dt.bool_

        def work(parts, _, mine):
            reduce_into([p[lo:hi] for p in parts], [mine], op, is_bool)

        return self._through_host(kind, meta, tensor, target, output, "host reduce", work)

    def _start_broadcast(self, kind: str, meta: dict, tensor: Tensor, src: int,
                         target_t: Tensor | None) -> Completion:
        n = tensor.numel()
        if target_t is None:  # the source
            down = self._download(tensor)

            def complete():
                try:
                    mine = self._mapped(down, kind, tensor.dtype, n)
                    self._exchange(kind, (meta, mine), _share_src(kind, src))
                except BaseException:
                    self._give_back(down)
                    raise
                self._shared_phase(kind, (down,), "host copy", _nothing)
                del mine
                self._give_back(down)
                return tensor

            return complete

        up = self._pool.up(round4(tensor.nbytes))

        def receive():
            try:
                target = self._upload_view(up, kind, tensor.dtype, n)
                value = self._exchange(kind, (meta, None), _share_src(kind, src))
            except BaseException:
                self._give_back(up)
                raise
            self._shared_phase(kind, (up,), "host copy", copy_into, target, value)
            del target, value
            return self._commit(up, target_t, tensor)

        return receive

    def _start_all_gather(self, kind: str, meta: dict, tensor: Tensor) -> Completion:
        down = self._download(tensor)
        dtype, n, shape = tensor.dtype, tensor.numel(), tensor.shape

        def complete():
            up = None
            try:
                mine = self._mapped(down, kind, dtype, n)
                parts = self._exchange(kind, (meta, (shape, mine)), _share_all_payloads(kind))
                outs = [Tensor.empty(s, dtype, self.device) for s, _ in parts]
                offsets = np.cumsum([0] + [round4(o.nbytes) for o in outs]).tolist()
                up = self._pool.up(max(4, offsets[-1]))
                mem = self._mapping(lambda: up.view(self.group.timeout, kind), kind)
            except BaseException:
                self._give_back(down, up)
                raise
            flat = np.frombuffer(mem, dtype=np.uint8)
            pieces = [(flat[off:off + o.nbytes], part.view(np.uint8))
                      for (_, part), o, off in zip(parts, outs, offsets)]
            self._shared_phase(kind, (down, up), "host copy", _copy_pieces, pieces)
            del flat, pieces
            del mine, parts, mem
            self._give_back(down)
            try:
                up.commit_many([(off, o._storage.buffer, 0, round4(o.nbytes))
                                for o, off in zip(outs, offsets) if o.numel()])
            finally:
                self._give_back(up)
            self._count(h2d=sum(o.nbytes for o in outs))
            return outs

        return complete

    def _start_barrier(self, kind: str) -> Completion:
        def complete():
            self._exchange(kind, None)

        return complete

    # -- point to point -------------------------------------------------------------------
    def _start_send(self, kind: str, tensor: Tensor, dst: int, tag: int) -> Completion:
        down = self._download(tensor)
        meta = (tensor.shape, tensor.dtype)

        def complete():
            # The receiver copies straight out of our mapping, then gives the buffer back to our pool.
            try:
                view = self._mapped_bytes(down, kind)
                self.group.post(self.rank, dst, tag, (meta, view, lambda: self._pool.give_back(down)))
            except BaseException:
                self._give_back(down)
                raise
            return None

        return complete

    def _start_recv(self, kind: str, tensor: Tensor | None, src: int, tag: int) -> Completion:
        def complete():
            (shape, dtype), view, release = self.group.take(src, self.rank, tag)
            up = None
            try:
                out, target_t = self._receiving(tensor, src, tag, shape, dtype)
                up = self._pool.up(round4(out.nbytes))
                mem = np.frombuffer(self._mapping(lambda: up.view(self.group.timeout, kind), kind), dtype=np.uint8)
                copy_into(mem, np.frombuffer(view, dtype=np.uint8))
                del mem
            except BaseException:
                self._give_back(up)
                raise
            finally:
                del view
                release()
            return self._commit(up, target_t, out)

        return complete

    # -- sub-groups -----------------------------------------------------------------------
    def _start_split(self, kind: str, meta: dict, ranks: tuple[int, ...]) -> Completion:
        def combine(d):
            check_agreement(kind, d)
            return self.group.child(ranks)

        def complete():
            sub = self._exchange(kind, meta, combine)
            return sub.rank(ranks.index(self.rank)) if self.rank in ranks else None

        return complete


def _nothing() -> None:
    pass


def _copy_pieces(pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in pieces:
        copy_into(dst, src)


def _share_all(kind: str):
    """Combine for (meta, readback, target): check the metas agree, share readbacks and targets."""
    def combine(d):
        check_agreement(kind, {r: v[0] for r, v in d.items()})
        world = len(d)
        return [d[r][1] for r in range(world)], [d[r][2] for r in range(world)]
    return combine


def _share_all_payloads(kind: str):
    """Combine for (meta, payload): check the metas agree, share every rank's payload in rank order."""
    def combine(d):
        check_agreement(kind, {r: v[0] for r, v in d.items()})
        return [d[r][1] for r in range(len(d))]
    return combine


def _share_src(kind: str, src: int):
    def combine(d):
        check_agreement(kind, {r: v[0] for r, v in d.items()})
        return d[src][1]
    return combine


class RankWorkers:
    """One worker thread per rank of a ThreadGroup: ``run`` hands each rank a function and collects the
    results in rank order (MultiAdapterContext and run_spmd drive their ranks through it)."""

    def __init__(self, group: ThreadGroup, name: str = "wgpar-rank") -> None:
        self.group = group
        self._inboxes: list[queue.Queue] = []
        self._threads: list[threading.Thread] = []
        for r in range(group.world_size):
            inbox: queue.Queue = queue.Queue()
            t = threading.Thread(target=self._loop, args=(inbox,), name=f"{name}{r}", daemon=True)
            t.start()
            self._inboxes.append(inbox)
            self._threads.append(t)

    @staticmethod
    def _loop(inbox: queue.Queue) -> None:
        own_generator_for_thread()  # ranks seed and draw apart, as processes do
        while True:
            item = inbox.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller of run()
                box["error"] = exc
            done.set()
            # Idle until the next call without the last one's result or error (whose traceback holds
            # that call's frames, and with them its tensors).
            del item, fn, box, done

    def run(self, fns: Sequence[Callable[[], Any]], timeout: float | None = None) -> list[Any]:
        """Run ``fns[r]`` on rank r's thread; return their results in rank order."""
        n = self.group.world_size
        if len(fns) != n:
            raise ValueError(f"run needs {n} functions (one per rank), got {len(fns)}")
        boxes = [{} for _ in range(n)]
        dones = [threading.Event() for _ in range(n)]
        for r in range(n):
            self._inboxes[r].put((fns[r], boxes[r], dones[r]))
        # A rank stuck in GPU work past every collective timeout is reported, not waited on forever.
        limit = timeout if timeout is not None else self.group.timeout * 2 + 60
        first_error: tuple[int, BaseException] | None = None
        pending = set(range(n))
        while pending:
            for r in sorted(pending):
                if dones[r].wait(0.01):
                    pending.discard(r)
                    err = boxes[r].get("error")
                    if err is not None:
                        if first_error is None or (isinstance(first_error[1], CollectiveError)
                                                   and not isinstance(err, CollectiveError)):
                            first_error = (r, err)
                        self.group.abort(r, f"{type(err).__name__}: {err}")
            limit -= 0.01 * max(1, len(pending))
            if limit <= 0 and pending:
                self.group.abort(min(pending), "did not finish its work")
                raise RankError(min(pending), TimeoutError(f"rank(s) {sorted(pending)} did not finish"))
        if first_error is not None:
            r, err = first_error
            raise RankError(r, err) from err
        return [b.get("value") for b in boxes]

    def close(self) -> None:
        """Stop the worker threads (waits up to 5 s for each)."""
        for inbox in self._inboxes:
            inbox.put(None)
        for t in self._threads:
            t.join(5)
