"""Collectives: the one interface every parallel piece talks through, and its threaded backend.

``Collectives`` is what one rank holds: all_reduce, broadcast, all_gather,
reduce_scatter and barrier on that rank's tensors. ``ThreadGroup`` implements
it for ranks that are threads of one process, each owning one device: every
rank copies its tensor into a persistent staging buffer and maps it
(starting the transfer before waiting on anyone), the ranks meet in a
rendezvous keyed by the collective's sequence number, the last to arrive
reduces on the host with NumPy, and each rank uploads the result once. A
multi-process backend (MPI, one process per adapter) implements the same
``Collectives`` methods.

Every wait has a timeout. A rank that fails calls ``abort``; a rank that
never arrives is found by the others' timeouts. Either way every waiting rank
raises a CollectiveError naming the missing or failing rank and the sequence
number, and the group refuses further collectives until ``reset``.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from .. import ops
from ..runtime.device import Device
from ..runtime.transfer import StagingBuffer, TransferTimeout, UploadBuffer, host_pool
from ..tensor import Tensor
from .errors import CollectiveError, CollectiveTimeoutError

DEFAULT_TIMEOUT = 300.0
_OPS = ("sum", "mean", "max", "min")


def split_sizes(n: int, parts: int) -> list[int]:
    """Split n as evenly as possible: the first n % parts get one more (never drops anything)."""
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


class Collectives(abc.ABC):
    """One rank's view of a process group."""

    rank: int
    world_size: int
    device: Device

    @abc.abstractmethod
    def all_reduce(self, tensor: Tensor, op: str = "sum") -> Tensor:
        """Reduce ``tensor`` over ranks (sum, mean, max, min) and write the result into it, in place."""

    @abc.abstractmethod
    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        """Overwrite ``tensor`` on every rank with rank ``src``'s values."""

    @abc.abstractmethod
    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's tensor (shapes may differ), as new tensors on this rank's device."""

    @abc.abstractmethod
    def reduce_scatter(self, tensor: Tensor, op: str = "sum") -> Tensor:
        """Reduce over ranks, then return this rank's part of dim 0 (split as evenly as possible)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has arrived."""


class _Slot:
    __slots__ = ("kind", "data", "result", "error", "taken")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.data: dict[int, object] = {}
        self.result = None
        self.error: str | None = None
        self.taken = 0


class ThreadGroup:
    """A process group whose ranks are threads, rank r owning ``devices[r]``."""

    def __init__(self, devices: Sequence[Device], timeout: float = DEFAULT_TIMEOUT) -> None:
        if len(devices) < 1:
            raise ValueError("a process group needs at least one device")
        if len({id(d) for d in devices}) != len(devices):
            raise ValueError(f"each rank needs its own device, got {[str(d) for d in devices]}")
        self.devices = list(devices)
        self.world_size = len(devices)
        self.timeout = float(timeout)
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._seq = [0] * self.world_size
        self._broken: str | None = None
        self._ranks = [ThreadRank(self, r) for r in range(self.world_size)]

    def rank(self, r: int) -> ThreadRank:
        if not 0 <= r < self.world_size:
            raise ValueError(f"rank {r} out of range for a group of {self.world_size}")
        return self._ranks[r]

    # -- failure handling -----------------------------------------------------------------
    def abort(self, rank: int, reason: str) -> None:
        """Mark the group broken (rank failed): every rank waiting in a collective raises."""
        with self._cond:
            if self._broken is None:
                self._broken = f"rank {rank} failed: {reason}"
            self._cond.notify_all()

    @property
    def broken(self) -> str | None:
        return self._broken

    def reset(self) -> None:
        """Forget a failure and all pending collectives (call when no rank is inside one)."""
        with self._cond:
            self._broken = None
            self._slots.clear()
            self._seq = [0] * self.world_size

    # -- the rendezvous -------------------------------------------------------------------
    def exchange(self, rank: int, kind: str, payload, combine: Callable[[dict[int, object]], object]):
        """Deposit ``payload``; once all ranks have, ``combine`` (run once) gives everyone the result."""
        with self._cond:
            if self._broken:
                raise CollectiveError(f"{kind}: the group is broken ({self._broken}); reset it first")
            seq = self._seq[rank]
            self._seq[rank] += 1
            slot = self._slots.setdefault(seq, _Slot(kind))
            if slot.kind != kind:
                self._broken = (f"rank {rank} called {kind} as collective #{seq} while other ranks "
                                f"called {slot.kind}")
                self._cond.notify_all()
                raise CollectiveError(self._broken)
            slot.data[rank] = payload
            if len(slot.data) == self.world_size:
                try:
                    slot.result = combine(slot.data)
                except Exception as exc:  # e.g. ranks disagree on shapes: everyone learns why
                    slot.error = f"{kind} #{seq}: {exc}"
                slot.data = {}
                self._cond.notify_all()
            deadline = time.monotonic() + self.timeout
            while slot.result is None and slot.error is None:
                if self._broken:
                    raise CollectiveError(f"{kind} #{seq} on rank {rank}: aborted, {self._broken}")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in range(self.world_size) if r not in slot.data]
                    self._broken = (f"{kind} #{seq}: rank(s) {missing} did not arrive within "
                                    f"{self.timeout:g} s")
                    self._cond.notify_all()
                    raise CollectiveTimeoutError(self._broken)
                self._cond.wait(left)
            slot.taken += 1
            if slot.taken == self.world_size:
                del self._slots[seq]
            if slot.error is not None:
                raise CollectiveError(slot.error)
            return slot.result


class ThreadRank(Collectives):
    """Rank ``rank`` of a ThreadGroup; call its methods from that rank's thread."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size
        self.device = group.devices[rank]
        self._staging: StagingBuffer | None = None
        self._upload: UploadBuffer | None = None
        self._abandoned: list = []  # buffers other ranks may still read after a failure: never unmapped

    # -- transfers ------------------------------------------------------------------------
    def staging(self, nbytes: int) -> StagingBuffer:
        """This rank's download staging buffer, grown (never per call) to hold ``nbytes``."""
        if self._staging is None or self._staging.capacity < nbytes:
            cap = max(nbytes, 2 * self._staging.capacity if self._staging else 1 << 16)
            self._staging = StagingBuffer(self.device, cap, f"collective{self.rank}")
        return self._staging

    def uploader(self, nbytes: int) -> UploadBuffer:
        """This rank's mapped upload buffer, grown (never per call) to hold ``nbytes``."""
        if self._upload is None or self._upload.capacity < nbytes:
            cap = max(nbytes, 2 * self._upload.capacity if self._upload else 1 << 16)
            self._upload = UploadBuffer(self.device, cap, f"collective{self.rank}")
        return self._upload

    _BLOCK = 1 << 20  # elements per block: a worker's scratch block stays in its cache

    def _reduce_slice(self, parts: list[np.ndarray], targets: list[np.ndarray], lo: int, hi: int, op: str) -> None:
        """Reduce ``parts[:][lo:hi]`` and write the result into every rank's upload mapping.

        Upload mappings may be write-combined or device memory (resizable BAR), where reads are
        orders of magnitude slower than writes: each block of the result is built in a cached
        scratch block and only ever written to them. Blocks run on a shared thread pool (NumPy
        releases the GIL), since one core cannot keep up with the PCIe copies.
        """
        if hi <= lo:
            return
        fn = np.add if op in ("sum", "mean") else (np.maximum if op == "max" else np.minimum)
        world = len(parts)

        def run_block(a: int, b: int) -> None:
            if world == 1:  # a plain copy (the transfer floor): nothing to build first
                for t in targets:
                    np.copyto(t[a:b], parts[0][a:b])
                return
            scratch = getattr(_scratch, "block", None)
            if scratch is None or scratch.dtype != parts[0].dtype or scratch.size < b - a:
                scratch = _scratch.block = np.empty(self._BLOCK, dtype=parts[0].dtype)
            acc = scratch[: b - a]
            fn(parts[0][a:b], parts[1][a:b], out=acc)
            for p in parts[2:]:
                fn(acc, p[a:b], out=acc)
            if op == "mean":
                (np.divide if acc.dtype.kind == "f" else np.floor_divide)(acc, world, out=acc)
            for t in targets:
                np.copyto(t[a:b], acc)

        blocks = [(a, min(a + self._BLOCK, hi)) for a in range(lo, hi, self._BLOCK)]
        if len(blocks) == 1:
            run_block(*blocks[0])
            return
        for f in [host_pool().submit(run_block, a, b) for a, b in blocks]:
            f.result()

    @staticmethod
    def start_reduce(tensor: Tensor, down: StagingBuffer) -> None:
        """First half of ``reduce_in_place``: start the readback (copy + map) without waiting."""
        down.start(tensor._storage.buffer, tensor._offset * tensor.dtype.itemsize, tensor.nbytes)

    def reduce_in_place(self, tensor: Tensor, op: str, down: StagingBuffer, up: UploadBuffer,
                        kind: str = "all_reduce", reduce: bool = True, started: bool = False) -> None:
        """All-reduce a contiguous, 4-byte-aligned tensor through persistent mapped buffers.

        Rank r's readback is mapped and read in place by every rank; each rank reduces its slice
        straight into every rank's mapped upload buffer; after a second rendezvous each rank
        commits its upload buffer into the tensor. With ``reduce=False`` a rank copies its own
        data back (the transfer floor the benchmark compares against). ``started``: the readback
        was already begun with ``start_reduce`` (AllReduceSync does that during backward).
        """
        start = tensor._offset * tensor.dtype.itemsize
        nbytes = tensor.nbytes
        host_dtype = np.int32 if tensor.dtype.storage == "i32" else tensor.dtype.np
        timeout = self.group.timeout
        if not started:
            self.start_reduce(tensor, down)
        try:
            mine = np.frombuffer(down.view(timeout, kind), dtype=host_dtype)
            target = np.frombuffer(up.view(timeout, kind), dtype=host_dtype, count=tensor.numel())
        except TransferTimeout as exc:
            self.group.abort(self.rank, str(exc))
            raise CollectiveTimeoutError(f"{kind} on rank {self.rank}: {exc}") from None
        if not reduce:
            self._reduce_slice([mine], [target], 0, target.size, "sum")
        else:
            world = self.world_size

            def share(d):
                _same_shapes({r: v[0] for r, v in d.items()}, kind)
                return [d[r][0] for r in range(world)], [d[r][1] for r in range(world)]

            try:
                parts, targets = self.group.exchange(self.rank, kind, (mine, target), share)
            except CollectiveError:
                down.release()  # no other rank reads our mapping once the first rendezvous failed
                raise
            # From here other ranks read our mapped memory: on failure, never unmap (it would crash them).
            bounds = np.cumsum([0, *split_sizes(target.size, world)])
            lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
            self._reduce_slice(parts, targets, lo, hi, op)
            del parts, targets
            try:
                self.group.exchange(self.rank, kind + ".reduced", None, lambda d: True)
            except CollectiveError:
                self._abandoned.append((down.buffer, up.buffer))
                self._staging = self._upload = None
                raise
        del mine, target
        down.release()
        up.commit(tensor._storage.buffer, start, nbytes)
        tensor._storage.version += 1

    def _check(self, tensor: Tensor, what: str) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{what}: expected a wgpar.Tensor, got {type(tensor).__name__}")
        if tensor.device is not self.device:
            raise ValueError(f"{what} on rank {self.rank}: tensor is on {tensor.device}, "
                             f"but this rank owns {self.device}")

    def read(self, tensor: Tensor, what: str) -> np.ndarray:
        """Copy a tensor to the host through the staging buffer, with the group's timeout."""
        src = tensor.contiguous()
        nbytes = src.nbytes
        start = src._offset * src.dtype.itemsize
        st = self.staging(nbytes + 4)
        lo = start - start % 4
        st.start(src._storage.buffer, lo, -(-(start + nbytes - lo) // 4) * 4)
        try:
            raw = st.wait(self.group.timeout, what)
        except TransferTimeout as exc:
            self.group.abort(self.rank, str(exc))
            raise CollectiveTimeoutError(f"{what} on rank {self.rank}: {exc}") from None
        host_dtype = np.int32 if src.dtype.storage == "i32" else src.dtype.np
        return np.frombuffer(raw, dtype=host_dtype, count=src.numel(), offset=start - lo).reshape(src.shape)

    def write(self, tensor: Tensor, values: np.ndarray) -> None:
        """Upload host values into ``tensor`` (any layout) on this rank's device."""
        host_dtype = np.int32 if tensor.dtype.storage == "i32" else tensor.dtype.np
        values = np.ascontiguousarray(values, dtype=host_dtype).reshape(tensor.shape)
        if tensor.is_contiguous() and tensor.nbytes % 4 == 0 and tensor._offset * tensor.dtype.itemsize % 4 == 0:
            if tensor.nbytes:  # write_buffer takes the array's memory directly: no extra host copy
                self.device.upload(tensor._storage.buffer, tensor._offset * tensor.dtype.itemsize,
                                   memoryview(values).cast("B"))
            tensor._storage.version += 1
        else:
            ops.copy_(tensor, Tensor.from_numpy(values, device=self.device, dtype=tensor.dtype))

    # -- collectives ----------------------------------------------------------------------
    def reduce_host(self, host: np.ndarray, op: str, kind: str = "all_reduce") -> np.ndarray:
        """Reduce every rank's host array; each rank reduces its own slice, in parallel.

        Two rendezvous: the first shares the arrays (and one result array), then every rank
        fills its slice of the result (NumPy releases the GIL, so slices run at once), and
        the second waits for all slices. Returns the full result (shared, read-only).
        """
        world = self.world_size

        def share(parts):
            _same_shapes(parts, kind)
            return [parts[r] for r in range(world)], np.empty_like(parts[0])

        parts, result = self.group.exchange(self.rank, kind, host, share)
        out = result.reshape(-1)
        bounds = np.cumsum([0, *split_sizes(out.size, world)])
        self._reduce_slice([p.reshape(-1) for p in parts], [out], int(bounds[self.rank]),
                           int(bounds[self.rank + 1]), op)
        self.group.exchange(self.rank, kind + ".reduced", None, lambda d: True)
        return result

    def all_reduce(self, tensor: Tensor, op: str = "sum") -> Tensor:
        self._check(tensor, "all_reduce")
        if op not in _OPS:
            raise ValueError(f"all_reduce: op must be sum, mean, max or min, got {op!r}")
        if tensor.numel() == 0:
            self.barrier()
            return tensor
        aligned = (tensor.is_contiguous() and tensor.nbytes % 4 == 0
                   and tensor._offset * tensor.dtype.itemsize % 4 == 0)
        src = tensor if aligned else ops.clone(tensor)  # clone: offset 0, its own padded buffer
        nbytes = max(4, -(-src.nbytes // 4) * 4)
        self.reduce_in_place(src, op, self.staging(nbytes), self.uploader(nbytes))
        if src is not tensor:
            ops.copy_(tensor, src)
        return tensor

    def broadcast(self, tensor: Tensor, src: int = 0) -> Tensor:
        self._check(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast: src rank {src} out of range for {self.world_size} ranks")
        payload = self.read(tensor, "broadcast") if self.rank == src else tensor.shape

        def combine(parts):
            value = parts[src]
            for r, p in parts.items():
                if r != src and tuple(p) != value.shape:
                    raise ValueError(f"rank {r} has shape {tuple(p)} but src rank {src} sends {value.shape}")
            return value

        result = self.group.exchange(self.rank, "broadcast", payload, combine)
        if self.rank != src:
            self.write(tensor, result)
        return tensor

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        self._check(tensor, "all_gather")
        host = self.read(tensor, "all_gather")
        parts = self.group.exchange(self.rank, "all_gather", host,
                                    lambda d: [d[r] for r in range(self.world_size)])
        return [Tensor.from_numpy(p, device=self.device, dtype=tensor.dtype) for p in parts]

    def reduce_scatter(self, tensor: Tensor, op: str = "sum") -> Tensor:
        self._check(tensor, "reduce_scatter")
        if tensor.ndim == 0:
            raise ValueError("reduce_scatter needs a tensor with at least one dimension")
        if op not in _OPS:
            raise ValueError(f"reduce_scatter: op must be sum, mean, max or min, got {op!r}")
        full = self.reduce_host(self.read(tensor, "reduce_scatter"), op, "reduce_scatter")
        bounds = np.cumsum([0] + split_sizes(full.shape[0], self.world_size))
        mine = full[bounds[self.rank]:bounds[self.rank + 1]]
        return Tensor.from_numpy(mine, device=self.device, dtype=tensor.dtype)

    def barrier(self) -> None:
        self.group.exchange(self.rank, "barrier", None, lambda d: True)


_scratch = threading.local()


def _same_shapes(parts: dict[int, np.ndarray], what: str) -> None:
    shapes = {r: p.shape for r, p in parts.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{what}: ranks hold different shapes {dict(sorted(shapes.items()))}")
