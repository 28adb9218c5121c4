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

Gradient accumulation follows PyTorch's rules whatever the loop order: a
backward adds its gradient to whatever ``.grad`` holds when it reaches the
parameter, so ``zero_grad`` (to None or to zeros, before or after the
forward) resets it, and nothing but backward touches ``.grad`` (a forward
between backward and ``step`` leaves it alone). Each local gradient is reduced
once: when a backward finds ``.grad`` still holding a reduced gradient (a view
into a bucket that finish left there), it sets that reduced part aside, keeps
its own local sum apart, shows ``.grad`` as their sum, and adds the reduced
part back after reducing only the local one (summing already reduced values
again would count them N times with ``op="sum"``). Inside ``no_sync()``
nothing is communicated: local gradients accumulate and are reduced, in full,
by the next synchronised backward.
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
        self._in_pass = False  # a backward reached a parameter and its end-of-pass callback has not run
        self._pending = False  # a synchronised backward ran and finish() has not yet
        # Accumulation onto reduced gradients, per id(param): what finish left in .grad (the bucket view),
        # the reduced part set aside, the local sum apart from it, and the sum shown as .grad (with its
        # storage version, so an in-place change by the user is noticed).
        self._reduced: dict[int, Tensor] = {}
        self._aside: dict[int, Tensor] = {}
        self._local: dict[int, Tensor] = {}
        self._shown: dict[int, tuple[Tensor, int]] = {}
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
                p.register_hook(lambda g, p=p: self._before_accumulate(p))
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

    # -- per backward ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Reset the per-backward bookkeeping; gradients are left alone. Each backward does it when it first
        reaches a parameter; DistributedDataParallel's forward calls it too, because a backward that raised
        never ended its pass: its buckets (dropped here once complete) and its flags stay behind."""
        for b in self._buckets:
            if b.work is not None:
                if not b.work.is_completed():
                    raise RuntimeError(f"AllReduceSync on rank {self.group.rank}: bucket {b.index} of the previous "
                                       "backward is still in flight; call finish() first")
                b.work = None
            b.ready = 0
        self.launched_in_backward = 0
        self._in_pass = False

    def _forget(self, key: int) -> None:
        self._aside.pop(key, None)
        self._local.pop(key, None)
        self._shown.pop(key, None)

    def _local_part(self, p: Tensor) -> Tensor | None:
        """The part of ``p.grad`` no reduction has counted yet (None: nothing); sets a reduced part aside."""
        key, g = id(p), p.grad
        if g is None:  # zero_grad(): everything before is gone
            self._forget(key)
            return None
        if g is self._reduced.get(key):  # the reduced gradient (in-place changes by the user included)
            self._forget(key)
            self._aside[key] = ops.clone(g)  # the bucket is about to be overwritten
            return None
        shown = self._shown.get(key)
        if shown is not None and shown[0] is g and g._storage.version == shown[1]:
            return self._local[key]
        # Accumulated locally, or the user's own (or a shown sum they changed in place): all of it is local.
        self._forget(key)
        return g

    def _before_accumulate(self, p: Tensor) -> None:
        # Backward adds this pass's gradient to .grad next: make .grad the local part alone.
        with no_grad():
            p.grad = self._local_part(p)

    def _hook(self, param: Tensor) -> None:
        key = id(param)
        aside = self._aside.get(key)
        if aside is not None:  # .grad holds the local sum: show reduced + local, as PyTorch's .grad would
            with no_grad():
                self._local[key] = param.grad
                shown = ops.binary("add", aside, param.grad)
            self._shown[key] = (shown, shown._storage.version)
            param.grad = shown
        if not self._in_pass:  # the first parameter this backward reached
            self.prepare()
            self._in_pass = True
            queue_callback(self._end_pass)
        if self._sync:
            self._pending = True
        b, _ = self._where[key]
        b.ready += 1
        if self._sync and self.overlap and b.ready == len(b.params) and b.work is None:
            self._launch(b)
            self.launched_in_backward += 1

    def _end_pass(self) -> None:
        self._in_pass = False
        self.finish()

    def _launch(self, b: _Bucket) -> None:
        with no_grad():
            for i, p in enumerate(b.params):
                view = b.view(i)
                local = self._local_part(p)
                if local is None:
                    view.zero_()
                else:
                    ops.copy_(view, local)
        b.work = self.group.all_reduce(b.flat, self.op, async_op=True, label=f"bucket{b.index}")

    def finish(self) -> None:
        """After backward: wait for every bucket's all-reduce and point each ``param.grad`` into it.

        Inside ``no_sync()`` this does nothing: the gradients stay local. Called again after the step's
        gradients were reduced (backward queues it), it does nothing either.
        """
        if not self._sync or not self._pending:
            return
        self._pending = False
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
                    earlier = self._aside.get(id(p))
                    if earlier is not None:
                        ops.inplace("add", view, earlier)
                    self._forget(id(p))
                    self._reduced[id(p)] = view
                    p.grad = view

    def __repr__(self) -> str:
        sizes = self.bucket_sizes()
        return (f"AllReduceSync(rank={self.group.rank}, world_size={self.group.world_size}, op={self.op!r}, "
                f"buckets={len(sizes)}, bytes={sum(sizes)}, cap={self.cap_bytes})")
