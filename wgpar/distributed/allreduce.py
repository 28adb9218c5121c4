"""AllReduceSync: one rank's bucketed gradient all-reduce, overlapped with backward.

rumus's four phases (copy to staging on every device, map_async all, wait,
reduce on the host and upload), per bucket rather than per parameter, on the
ProcessGroup interface only: parameters are grouped, last layer first (the
order backward produces them), into flat buckets of up to ``bucket_cap_mb``.
When backward has finished every gradient of a bucket, a hook copies them
into the bucket and starts ``group.all_reduce(bucket, async_op=True)``: the
transfer and the host reduction run on the rank's communication thread while
the GPU still computes the rest of backward. ``finish`` waits for every
bucket and leaves each ``param.grad`` as a view into its bucket; the first
hook of a backward queues it to run when that backward ends (autograd's
``queue_callback``), so after ``loss.backward()`` the gradients are reduced.

Gradient accumulation: a second backward without ``zero_grad`` adds its
gradient to the reduced one (each step's local gradients are reduced once;
what was already reduced is set aside in ``prepare`` and added back after the
reduction). Inside ``no_sync()`` nothing is communicated: local gradients
accumulate and are reduced, in full, by the next synchronised backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from .. import ops
from ..autograd.engine import queue_callback
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor
from .group import ProcessGroup, Work


class _Bucket:
    __slots__ = ("index", "params", "offsets", "flat", "ready", "work")

    def __init__(self, index: int, params: list[Tensor], flat: Tensor) -> None:
        self.index = index
        self.params = params
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.flat = flat
        self.ready = 0
        self.work: Work | None = None

    def view(self, i: int) -> Tensor:
        p, off = self.params[i], self.offsets[i]
        return ops.reshape(ops.getitem(self.flat, slice(off, off + p.numel())), p.shape)

    def holds(self, i: int) -> bool:
        """Whether parameter i's gradient is (still) its view into this bucket."""
        g = self.params[i].grad
        return g is not None and g._storage is self.flat._storage


class AllReduceSync:
    """Sum (``op="sum"``) or average (``op="mean"``) one rank's gradients with the other ranks'.

    Every rank builds one over the same parameters (same order and shapes).

    Arguments:
        group: this rank's ProcessGroup.
        params: the replica's parameters (those that require grad are synchronised).
        bucket_cap_mb: largest bucket, in MiB (a parameter larger than that gets a bucket of its own).
        op: "mean" (default) or "sum" (DataParallel seeds each rank's backward with its batch share and sums).
    """

    def __init__(self, group: ProcessGroup, params: Iterable[Tensor], bucket_cap_mb: float = 25,
                 op: str = "mean") -> None:
        if op not in ("mean", "sum"):
            raise ValueError(f"AllReduceSync: op must be 'mean' or 'sum', got {op!r}")
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.group = group
        self.cap_bytes = int(bucket_cap_mb * 2**20)
        self.op = op
        self.overlap = True  # False: every bucket waits for finish() (to measure what overlap buys)
        self.launched_in_backward = 0  # buckets of the last backward whose transfer overlapped it
        self._sync = True
        self._step_open = False  # prepare() ran and finish() has not yet
        self._finish_queued = False
        self._set_aside: dict[int, Tensor] = {}  # id(param) -> already-reduced gradient (accumulation)
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.device is not group.device:
                raise ValueError(f"AllReduceSync: rank {group.rank} owns {group.device} but a parameter of shape "
                                 f"{p.shape} is on {p.device}")
            if not p.is_leaf:
                raise ValueError("AllReduceSync: parameters must be leaf tensors")
        self._buckets: list[_Bucket] = []
        self._where: dict[int, tuple[_Bucket, int]] = {}
        groups: list[list[Tensor]] = []
        size = 0
        for p in reversed(params):  # backward produces the last layers' gradients first
            if not groups or size + p.nbytes > self.cap_bytes or groups[-1][0].dtype is not p.dtype:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += p.nbytes
        for i, members in enumerate(groups):
            dt = members[0].dtype
            numel = sum(p.numel() for p in members)
            numel += -(numel * dt.itemsize) % 4 // dt.itemsize  # whole 4-byte words: no padding copy
            b = _Bucket(i, members, Tensor.empty((numel,), dt, group.device))
            self._buckets.append(b)
            for j, p in enumerate(members):
                self._where[id(p)] = (b, j)
                p.register_post_accumulate_grad_hook(self._hook)

    def bucket_sizes(self) -> list[int]:
        """Bytes per bucket (identical on every rank)."""
        return [b.flat.nbytes for b in self._buckets]

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate local gradients without communicating."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    # -- per step -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Call before each backward: resets the buckets and sets already-reduced gradients aside."""
        for b in self._buckets:
            if b.work is not None:
                if not b.work.is_completed():
                    raise RuntimeError(f"AllReduceSync on rank {self.group.rank}: bucket {b.index} of the previous "
                                       "backward is still in flight; call finish() first")
                b.work = None  # a step that failed before finish(): its gradients are dropped
            b.ready = 0
            for i, p in enumerate(b.params):
                if b.holds(i):  # reduced by an earlier finish and not zeroed: accumulate on top of it
                    self._set_aside[id(p)] = ops.clone(p.grad)
                    p.grad = None
        self.launched_in_backward = 0
        self._step_open = True
        self._finish_queued = False

    def _hook(self, param: Tensor) -> None:
        b, _ = self._where[id(param)]
        b.ready += 1
        if self._step_open and not self._finish_queued:
            self._finish_queued = True
            queue_callback(self.finish)
        if self._sync and self.overlap and b.ready == len(b.params) and b.work is None:
            self._launch(b)
            self.launched_in_backward += 1

    def _launch(self, b: _Bucket) -> None:
        with no_grad():
            for i, p in enumerate(b.params):
                view = b.view(i)
                if p.grad is None:
                    view.zero_()
                else:
                    ops.copy_(view, p.grad)
        b.work = self.group.all_reduce(b.flat, self.op, async_op=True, label=f"bucket{b.index}")

    def finish(self) -> None:
        """After backward: wait for every bucket's all-reduce and point each ``param.grad`` into it.

        Inside ``no_sync()`` this does nothing: the gradients stay local. Called again after the step's
        gradients were reduced (backward queues it), it does nothing either.
        """
        if not self._sync or not self._step_open:
            return
        self._step_open = False
        for b in self._buckets:  # parameters that got no gradient this step: their bucket goes now
            if b.work is None:
                self._launch(b)
        try:
            for b in self._buckets:
                b.work.wait()
        finally:
            for b in self._buckets:
                b.work = None
        with no_grad():
            for b in self._buckets:
                for i, p in enumerate(b.params):
                    view = b.view(i)
                    earlier = self._set_aside.pop(id(p), None)
                    if earlier is not None:
                        ops.inplace("add", view, earlier)
                    p.grad = view

    def __repr__(self) -> str:
        sizes = self.bucket_sizes()
        return (f"AllReduceSync(rank={self.group.rank}, world_size={self.group.world_size}, op={self.op!r}, "
                f"buckets={len(sizes)}, bytes={sum(sizes)}, cap={self.cap_bytes})")
