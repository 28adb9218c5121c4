"""The collective protocol every staged backend shares, stated once (MLX's GroupImpl shape).

A collective of a staged backend runs in two halves: the *launch* on the calling thread (it records
the input's copy to the host in the device's stream order and leases buffers, without waiting) and
the *completion* on the rank's communication thread, in call order (it waits for the maps, meets
the other ranks, moves the data and commits the result). :class:`StagedGroup` owns what is the same
on every backend: the collective's kind, the metadata the ranks must agree on, the reducibility and
receive checks, reduce-scatter's geometry, the stand-in for an output that cannot be written in
place, the completion's error handling and timeout, and what happens once a result has landed.

A backend implements the ``_start_*`` methods: each is the launch, and returns the completion (a
function of no arguments giving the collective's result). They move data and nothing else.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any

from ... import dtypes as _dt
from ... import ops
from ...runtime import profiling
from ...runtime.transfer import TransferTimeout
from ...tensor import Tensor
from ..errors import CollectiveError, CollectiveTimeoutError
from ..group import ProcessGroup, Work, split_sizes
from .common import Progress, kind_name, writable
from .hostreduce import check_reducible

Completion = Callable[[], Any]


class StagedGroup(ProcessGroup):
    """A ProcessGroup whose collectives are launched on the caller's thread and completed on a
    communication thread (``_progress``). Subclasses set ``name`` and ``_progress`` and implement
    the ``_start_*`` transport methods."""

    name: str
    _progress: Progress
    _broken_advice: str = "reset it first"  # what the user can do about a broken group

    # -- what a backend implements: transport ---------------------------------------------
    @abc.abstractmethod
    def _start_all_reduce(self, kind: str, meta: dict, tensor: Tensor, op: str) -> Completion: ...

    @abc.abstractmethod
    def _start_broadcast(self, kind: str, meta: dict, tensor: Tensor, src: int,
                         target: Tensor | None) -> Completion:
        """``target``: where a receiving rank's upload lands (None on ``src``)."""

    @abc.abstractmethod
    def _start_all_gather(self, kind: str, meta: dict, tensor: Tensor) -> Completion: ...

    @abc.abstractmethod
    def _start_all_gather_into(self, kind: str, meta: dict, output: Tensor, target: Tensor,
                               tensor: Tensor) -> Completion: ...

    @abc.abstractmethod
    def _start_scatter_reduced(self, kind: str, meta: dict, tensor: Tensor, output: Tensor, target: Tensor,
                               op: str, lo: int, hi: int) -> Completion:
        """Reduce elements ``[lo, hi)`` of the flattened ``tensor`` over ranks into ``target``."""

    @abc.abstractmethod
    def _start_barrier(self, kind: str) -> Completion: ...

    @abc.abstractmethod
    def _start_send(self, kind: str, tensor: Tensor, dst: int, tag: int) -> Completion: ...

    @abc.abstractmethod
    def _start_recv(self, kind: str, tensor: Tensor | None, src: int, tag: int) -> Completion: ...

    @abc.abstractmethod
    def _start_split(self, kind: str, meta: dict, ranks: tuple[int, ...]) -> Completion:
        """The completion gives this rank's view of the sub-group, or None when it is not a member."""

    def _check_tag(self, tag: int, what: str) -> None:
        """Backends with a bounded tag space reject tags outside it here (before anything starts)."""

    # -- the protocol ---------------------------------------------------------------------
    def _launch(self, kind: str) -> None:
        why = self.broken
        if why:
            raise CollectiveError(f"{kind} on rank {self.rank}: the group is broken ({why}); {self._broken_advice}")

    def _submit(self, kind: str, complete: Completion) -> Work:
        def run():
            try:
                with profiling.span(kind, "collective", rank=self.ranks[self.rank], group=self.name):
                    return complete()
            except CollectiveError:
                raise
            except BaseException as exc:  # a local failure: the other ranks must not wait for us
                self.abort(f"{kind}: {type(exc).__name__}: {exc}")
                raise
        # The completion's own waits fail after ``timeout``; this limit only guards against a lost one.
        work = Work(f"{kind} on rank {self.rank}", self.timeout * 2 + 60)
        self._count(calls=1)
        self._progress.submit(work, run)
        return work

    def _stand_in(self, t: Tensor) -> Tensor:
        """``t`` itself when an upload can land in it in place, else a fresh tensor copied into it after."""
        return t if writable(t) else Tensor.empty(t.shape, t.dtype, self.device)

    def _landed(self, target: Tensor, result: Tensor) -> Tensor:
        """The upload into ``target`` is committed: bump its version, copy into ``result`` if it was a stand-in."""
        self._count(h2d=target.nbytes)
        target._storage.bump_version()
        if target is not result:
            ops.copy_(result, target)
        return result

    def _mapping(self, fn: Callable[[], Any], kind: str) -> Any:
        """Run a step that waits for mapped memory; a map that times out aborts the group."""
        try:
            return fn()
        except TransferTimeout as exc:
            self.abort(str(exc))
            raise CollectiveTimeoutError(f"{kind} on rank {self.rank}: {exc}") from None

    def _receiving(self, tensor: Tensor | None, src: int, tag: int, shape: tuple[int, ...],
                   dtype: _dt.DType) -> tuple[Tensor, Tensor]:
        """(result, upload target) of a message of ``shape`` and ``dtype`` from ``src``; CollectiveError
        when the receiver's tensor does not match it."""
        if tensor is not None and (tensor.shape != shape or tensor.dtype is not dtype):
            raise CollectiveError(
                f"recv on rank {self.rank} from rank {src} (tag {tag}): rank {src} sent {dtype.name} "
                f"{shape} but rank {self.rank} receives into {tensor.dtype.name} {tensor.shape}")
        out = tensor if tensor is not None else Tensor.empty(shape, dtype, self.device)
        return out, self._stand_in(out)

    # -- the collectives: kinds, what the ranks agree on, then the backend's transport ----
    def _all_reduce(self, tensor: Tensor, op: str, label: str | None) -> Work:
        kind = kind_name("all_reduce", label)
        self._launch(kind)
        check_reducible(tensor.dtype, op, f"{kind} on rank {self.rank}")
        meta = {"shape": tensor.shape, "dtype": tensor.dtype.name, "op": op}
        return self._submit(kind, self._start_all_reduce(kind, meta, tensor, op))

    def _broadcast(self, tensor: Tensor, src: int, label: str | None) -> Work:
        kind = kind_name("broadcast", label)
        self._launch(kind)
        meta = {"shape": tensor.shape, "dtype": tensor.dtype.name, "src": src}
        target = None if self.rank == src else self._stand_in(tensor)
        return self._submit(kind, self._start_broadcast(kind, meta, tensor, src, target))

    def _all_gather(self, tensor: Tensor, label: str | None) -> Work:
        kind = kind_name("all_gather", label)
        self._launch(kind)
        return self._submit(kind, self._start_all_gather(kind, {"dtype": tensor.dtype.name}, tensor))

    def _all_gather_into(self, output: Tensor, tensor: Tensor, label: str | None) -> Work:
        kind = kind_name("all_gather_into", label)
        self._launch(kind)
        meta = {"numel": tensor.numel(), "dtype": tensor.dtype.name}
        target = self._stand_in(output)
        return self._submit(kind, self._start_all_gather_into(kind, meta, output, target, tensor))

    def _reduce_scatter(self, tensor: Tensor, op: str, label: str | None) -> Work:
        kind = kind_name("reduce_scatter", label)
        self._launch(kind)
        check_reducible(tensor.dtype, op, f"{kind} on rank {self.rank}")
        rows = split_sizes(tensor.shape[0], self.world_size)
        row = math.prod(tensor.shape[1:])
        start = sum(rows[:self.rank])
        out = Tensor.empty((rows[self.rank], *tensor.shape[1:]), tensor.dtype, self.device)
        meta = {"shape": tensor.shape, "dtype": tensor.dtype.name, "op": op}
        return self._submit(kind, self._start_scatter_reduced(kind, meta, tensor, out, self._stand_in(out), op,
                                                              start * row, (start + rows[self.rank]) * row))

    def _reduce_scatter_into(self, output: Tensor, tensor: Tensor, op: str, label: str | None) -> Work:
        kind = kind_name("reduce_scatter_into", label)
        self._launch(kind)
        check_reducible(tensor.dtype, op, f"{kind} on rank {self.rank}")
        n = output.numel()
        meta = {"numel": tensor.numel(), "dtype": tensor.dtype.name, "op": op}
        return self._submit(kind, self._start_scatter_reduced(kind, meta, tensor, output, self._stand_in(output), op,
                                                              self.rank * n, (self.rank + 1) * n))

    def _barrier(self, label: str | None) -> Work:
        kind = kind_name("barrier", label)
        self._launch(kind)
        return self._submit(kind, self._start_barrier(kind))

    def _send(self, tensor: Tensor, dst: int, tag: int) -> Work:
        kind = f"send to rank {dst} (tag {tag})"
        self._check_tag(tag, kind)
        self._launch(kind)
        return self._submit(kind, self._start_send(kind, tensor, dst, tag))

    def _recv(self, tensor: Tensor | None, src: int, tag: int) -> Work:
        kind = f"recv from rank {src} (tag {tag})"
        self._check_tag(tag, kind)
        self._launch(kind)
        return self._submit(kind, self._start_recv(kind, tensor, src, tag))

    def _split(self, ranks: tuple[int, ...]) -> ProcessGroup | None:
        kind = "split"
        self._launch(kind)
        return self._submit(kind, self._start_split(kind, {"ranks": ranks}, ranks)).wait()
