"""AllReduceSync: bucketed gradient all-reduce across replicas, overlapped with backward.

rumus's four phases (copy to staging on every device, map_async all, wait,
reduce on the host and upload), per bucket rather than per parameter:
parameters are grouped, last layer first (the order backward produces them),
into flat buckets of up to ``bucket_cap_mb``. When backward has finished every
gradient of a bucket, a hook records the bucket's copy to its staging buffer
(the GPU performs it in stream order between the remaining backward kernels)
and requests its map, so ``finish`` can reduce early buckets on the host while
the GPU still computes the rest of backward. ``finish`` waits
for each bucket, exchanges it with the other ranks, uploads the reduced
values once, and leaves every ``param.grad`` as a view into its bucket.
Buckets and staging buffers are allocated once and reused every step.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import ops
from ..autograd.grad_mode import no_grad
from ..runtime.transfer import StagingBuffer, UploadBuffer
from ..tensor import Tensor
from .context import MultiAdapterContext


class _Bucket:
    __slots__ = ("index", "params", "offsets", "flat", "staging", "upload", "ready", "launched")

    def __init__(self, index: int, params: list, flat: Tensor, staging: StagingBuffer,
                 upload: UploadBuffer) -> None:
        self.index = index
        self.params = params
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.flat = flat
        self.staging = staging
        self.upload = upload
        self.ready = 0
        self.launched = False

    def view(self, i: int) -> Tensor:
        p, off = self.params[i], self.offsets[i]
        return ops.reshape(ops.getitem(self.flat, slice(off, off + p.numel())), p.shape)


class AllReduceSync:
    """Average (``op="mean"``) or sum the gradients of replicas living on the context's ranks.

    Arguments:
        context: the MultiAdapterContext whose ranks hold the replicas.
        bucket_cap_mb: largest bucket, in MiB (a parameter larger than that gets a bucket of its own).
        op: "mean" (default) or "sum" (DataParallel seeds each rank's backward with its batch share and sums).
    """

    def __init__(self, context: MultiAdapterContext, bucket_cap_mb: float = 25, op: str = "mean") -> None:
        if op not in ("mean", "sum"):
            raise ValueError(f"AllReduceSync: op must be 'mean' or 'sum', got {op!r}")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.context = context
        self.cap_bytes = int(bucket_cap_mb * 2**20)
        self.op = op
        self._buckets: list[list[_Bucket]] = [[] for _ in range(context.world_size)]
        self._where: list[dict[int, tuple[_Bucket, int]]] = [{} for _ in range(context.world_size)]
        self.launched_in_backward = [0] * context.world_size  # buckets whose transfer overlapped backward
        self.overlap = True  # False: every bucket waits for finish() (to measure what overlap buys)

    # -- set-up ---------------------------------------------------------------------------
    def register(self, rank: int, params: Sequence[Tensor]) -> None:
        """Give rank ``rank``'s replica parameters (same order and shapes on every rank)."""
        if self._buckets[rank]:
            raise RuntimeError(f"AllReduceSync: rank {rank} already registered its parameters")
        dev = self.context.device_of(rank)
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.device is not dev:
                raise ValueError(f"AllReduceSync: rank {rank} owns {dev} but a parameter of shape {p.shape} "
                                 f"is on {p.device}")
            if not p.is_leaf:
                raise ValueError("AllReduceSync: parameters must be leaf tensors")
        groups: list[list[Tensor]] = []
        size = 0
        for p in reversed(params):  # backward produces the last layers' gradients first
            nbytes = p.nbytes
            if not groups or size + nbytes > self.cap_bytes or groups[-1][0].dtype is not p.dtype:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        for i, group in enumerate(groups):
            dt = group[0].dtype
            numel = sum(p.numel() for p in group)
            numel += -(numel * dt.itemsize) % 4 // dt.itemsize  # copies move whole 4-byte words
            flat = Tensor.empty((numel,), dt, dev)
            b = _Bucket(i, group, flat, StagingBuffer(dev, flat.nbytes, f"bucket{i}"),
                        UploadBuffer(dev, flat.nbytes, f"bucket{i}"))
            self._buckets[rank].append(b)
            for j, p in enumerate(group):
                self._where[rank][id(p)] = (b, j)
                p.register_post_accumulate_grad_hook(self._make_hook(rank))

    def _make_hook(self, rank: int):
        def hook(param: Tensor) -> None:
            b, _ = self._where[rank][id(param)]
            b.ready += 1
            if self.overlap and b.ready == len(b.params) and not b.launched:
                self._launch(b)
                self.launched_in_backward[rank] += 1

        return hook

    def bucket_sizes(self, rank: int = 0) -> list[int]:
        """Bytes per bucket of rank ``rank`` (buckets are identical on every rank)."""
        return [b.flat.nbytes for b in self._buckets[rank]]

    # -- per step -------------------------------------------------------------------------
    def prepare(self, rank: int) -> None:
        """Call before each backward on rank ``rank``."""
        for b in self._buckets[rank]:
            b.ready = 0
            b.launched = False
        self.launched_in_backward[rank] = 0

    def _launch(self, b: _Bucket) -> None:
        with no_grad():
            for i, p in enumerate(b.params):
                view = b.view(i)
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():
                    ops.copy_(view, p.grad)
        # The copy runs in stream order right after these gradients; the map (completed by our
        # non-blocking polls, so later submits never wait for it) lets finish() reduce this
        # bucket on the host while the GPU still runs the rest of backward.
        b.staging.start(b.flat._storage.buffer, 0, b.flat.nbytes)
        b.launched = True

    def finish(self, rank: int) -> None:
        """After backward on rank ``rank``: reduce every bucket across ranks into ``param.grad``."""
        comm = self.context.comm(rank)
        buckets = self._buckets[rank]
        for b in buckets:  # parameters that got no gradient this step: their bucket goes now
            if not b.launched:
                self._launch(b)
        for b in buckets:
            comm.reduce_in_place(b.flat, self.op, b.staging, b.upload, started=True)
            for i, p in enumerate(b.params):
                p.grad = b.view(i)

    def __repr__(self) -> str:
        sizes = self.bucket_sizes(0) if self._buckets[0] else []
        return (f"AllReduceSync(world_size={self.context.world_size}, op={self.op!r}, "
                f"buckets={len(sizes)}, bytes={sum(sizes)}, cap={self.cap_bytes})")
