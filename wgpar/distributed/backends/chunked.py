"""Transfers in chunks through leased mapped buffers, so the host can work on one chunk while the
GPU copies the next (device -> host) or the previous one (host -> device).

``ChunkedReadback`` records the GPU copies of a whole tensor at once (so it reads the tensor in the
device's stream order) into staging buffers of at most ``chunk`` bytes, each submitted and mapped on
its own: the first chunk can be read while later ones are still being copied. ``ChunkedUpload``
covers a target of ``total`` bytes with upload buffers of ``chunk`` bytes leased from the pool: the
host writes a chunk into mapped memory in place, the chunk is committed (a GPU copy) once the writer
moves past it, and its buffer goes back to the pool at once, to be leased again once that copy has
run (the pool's rule, TransferPool.up).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import ops
from ...runtime.transfer import StagingBuffer, UploadBuffer
from ...tensor import Tensor
from .common import byte_offset, readable, round4
from .hostreduce import BLOCK, copy_into
from .staging import TransferPool

Copies = list[tuple[int, object, int, int]]  # (offset in the upload buffer, target GPUBuffer, target offset, bytes)


class ChunkedReadback:
    """The bytes of ``t`` on their way to the host, in staging buffers of at most ``chunk`` bytes."""

    def __init__(self, pool: TransferPool, t: Tensor, chunk: int) -> None:
        src = t if readable(t) else ops.clone(t)
        self.pool = pool
        self.nbytes = src.nbytes
        self.chunk = chunk
        self._bufs: list[StagingBuffer] = []
        self._views: list[memoryview | None] = []
        buf, off = src._storage.buffer, byte_offset(src)
        try:
            for a in range(0, self.nbytes, chunk):
                down = pool.down(round4(min(chunk, self.nbytes - a)))
                self._bufs.append(down)
                self._views.append(None)
                # One submit per chunk: a map completes only once its whole submission has, so chunk 0
                # can be read while the GPU still copies the rest. Bytes read past the end, up to a
                # multiple of 4, lie in the source's own buffer.
                down.start(buf, off + a, round4(min(chunk, self.nbytes - a)))
        except BaseException:
            self.abandon()
            raise

    def _mapped(self, j: int, timeout: float, what: str) -> memoryview:
        if self._views[j] is None:
            self._views[j] = self._bufs[j].view(timeout, what)
        return self._views[j]

    def span(self, off: int, nbytes: int, timeout: float, what: str) -> list[tuple[int, memoryview]]:
        """Bytes ``[off, off + nbytes)`` as (offset within the span, mapped memory) pieces, read in place
        (waiting, at most ``timeout`` seconds per chunk, for the copies to arrive)."""
        pieces = []
        end = off + nbytes
        for j in range(off // self.chunk, -(-end // self.chunk)):
            a = max(off, j * self.chunk)
            b = min(end, (j + 1) * self.chunk)
            if a < b:
                pieces.append((a - off, self._mapped(j, timeout, what)[a - j * self.chunk:b - j * self.chunk]))
        return pieces

    def array(self, off: int, count: int, dtype: np.dtype, timeout: float, what: str) -> np.ndarray:
        """``count`` items of ``dtype`` from byte ``off`` (in place when they lie in one chunk)."""
        pieces = self.span(off, count * dtype.itemsize, timeout, what)
        if len(pieces) == 1:
            return np.frombuffer(pieces[0][1], dtype=dtype, count=count)
        if not pieces:
            return np.empty(0, dtype)
        return np.frombuffer(b"".join(bytes(p) for _, p in pieces), dtype=dtype, count=count)

    def release(self, timeout: float = 60.0) -> None:
        """Unmap every chunk and give the buffers back (nobody reads them any more). A chunk never read
        (the collective stopped early: ranks disagreed) first waits for its map to settle."""
        self._views = [None] * len(self._views)
        for down in self._bufs:
            down.settle(timeout)
            self.pool.give_back(down)
        self._bufs = []

    def abandon(self) -> None:
        """After a failure: keep the buffers out of use (MPI may still read one) until the pool's reset."""
        self._views = [None] * len(self._views)
        for down in self._bufs:
            self.pool.abandon(down)
        self._bufs = []


class ChunkedUpload:
    """Host -> device for ``total`` bytes through upload buffers of ``chunk`` bytes, one leased per chunk.

    ``copies(j, start, end)`` lists the GPU copies that commit bytes ``[start, end)`` (chunk ``j``).
    """

    def __init__(self, pool: TransferPool, total: int, chunk: int, item: np.dtype,
                 copies: Callable[[int, int, int], Copies], timeout: float, what: str) -> None:
        self.pool = pool
        self.total = total
        self.chunk = chunk
        self.item = np.dtype(item)
        self._copies = copies
        self._timeout = timeout
        self._what = what
        self._cap = round4(min(chunk, max(total, 4)))
        self._open: dict[int, tuple[UploadBuffer, np.ndarray]] = {}
        self._next = 0  # the first chunk not yet committed

    def _buffer(self, j: int) -> np.ndarray:
        got = self._open.get(j)
        if got is None:
            if j < self._next:
                raise RuntimeError(f"chunk {j} of an upload was written after it was committed")
            up = self.pool.up(self._cap)
            got = self._open[j] = (up, np.frombuffer(up.view(self._timeout, self._what), dtype=np.uint8))
        return got[1]

    def span(self, off: int, nbytes: int) -> list[tuple[int, np.ndarray]]:
        """Writable bytes ``[off, off + nbytes)`` of the target, as (offset within the span, mapped bytes)
        pieces (write only: mapped upload memory may be slow to read)."""
        pieces = []
        end = off + nbytes
        for j in range(off // self.chunk, -(-end // self.chunk)):
            a = max(off, j * self.chunk)
            b = min(end, (j + 1) * self.chunk)
            if a < b:
                pieces.append((a - off, self._buffer(j)[a - j * self.chunk:b - j * self.chunk]))
        return pieces

    def targets(self, off: int, count: int) -> list[tuple[int, np.ndarray]]:
        """``count`` items from byte ``off`` as (first item, writable items of ``item``) pieces."""
        size = self.item.itemsize
        return [(rel // size, piece.view(self.item)) for rel, piece in self.span(off, count * size)]

    def write(self, off: int, values: np.ndarray, divide: float | None = None, block: int = BLOCK) -> None:
        """Write ``values`` at byte ``off`` as items of ``item`` (a same-kind cast, e.g. float32 sums into
        float16), divided by ``divide`` if given, ``block`` elements per task on the host pool."""
        for start, dst in self.targets(off, len(values)):
            copy_into(dst, values[start:start + len(dst)], divide, block)

    def advance(self, upto: int) -> None:
        """Commit every chunk that ends at or before byte ``upto`` (the writer has moved past it)."""
        while self._next * self.chunk < self.total and min(self.total, (self._next + 1) * self.chunk) <= upto:
            self._commit(self._next)

    def finish(self) -> None:
        """Commit what is left (every buffer is back in the pool after)."""
        while self._next * self.chunk < self.total:
            self._commit(self._next)

    def _commit(self, j: int) -> None:
        got = self._open.pop(j, None)
        self._next = j + 1
        if got is None:  # nothing was written there (a gap): nothing to copy
            return
        up = got[0]
        del got
        start = j * self.chunk
        try:
            up.commit_many(self._copies(j, start, min(self.total, start + self.chunk)))
        finally:  # its view is gone either way; a failed flush left its re-map pending, which view() waits for
            self.pool.give_back(up)

    def abandon(self) -> None:
        """After a failure: keep the buffers still open out of use (MPI may still write into one)."""
        for up, _ in self._open.values():
            self.pool.abandon(up)
        self._open.clear()
