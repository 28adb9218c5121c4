"""DataLoader: batches from a dataset, shuffled with a seed, loaded (and uploaded) ahead on a background thread
or loaded by worker processes (``num_workers``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...autograd.grad_mode import no_grad
from ...creation import generator as _global_generator
from ...runtime import Device, resolve
from ...tensor import Tensor
from .collate import to_device
from .dataset import Dataset, TensorDataset
from .pool import WorkerPool, _preview, resolve_context
from .prefetch import Prefetcher
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, _check_int
from .worker import fetch


class DataLoader:
    """Iterate over a dataset in batches, as ``torch.utils.data.DataLoader``. Differs from torch: ``timeout``
    defaults to 300 s (torch: 0, wait forever); no ``pin_memory_device=`` or ``in_order=``; workers spawn.

    Each ``for batch in loader`` is one epoch. Batches are made by ``collate_fn`` (default:
    ``default_collate``, NumPy arrays on the host) or by the dataset's ``get_batch`` when it has one
    (``TensorDataset``). With ``device=``, every array of a batch is uploaded to that device, so the
    loop gets wgpar tensors. With ``prefetch > 0`` (the default) one background thread loads and
    uploads the next ``prefetch`` batches while the loop works on the current one, so that reading,
    collating and the upload's host work overlap the training step; at most ``prefetch`` batches exist
    besides the one the loop holds. Leaving the loop early (``break``, an exception) stops and joins
    the thread; an exception raised while loading is raised in the loop, with a note naming the
    batch and its sample indices.

    With ``num_workers > 0``, that many worker processes fetch and collate batches on the host (for
    datasets whose ``__getitem__`` decodes or augments in Python, which a thread would serialise on
    the GIL), with torch's semantics: batch k goes to worker ``k % num_workers``, batches come out in
    the sampler's order, at most ``prefetch_factor * num_workers`` are in flight; worker i seeds
    ``random``, NumPy's global generator and ``wgpar.manual_seed`` from ``base_seed + i``
    (``base_seed`` drawn from ``generator`` each epoch, or once with ``persistent_workers``) and
    then calls ``worker_init_fn(i)``; ``get_worker_info()`` tells a dataset which worker it runs in.
    An exception in a worker is raised in the loop (the original type when it pickles) with a note
    naming the worker, the batch and its indices, and the worker's traceback; a worker that dies
    raises RuntimeError, one stuck longer than ``timeout`` TimeoutError. Workers are stopped and
    joined when the epoch ends or the loop is left (``break``, an exception), or with
    ``persistent_workers`` when the loader is collected. Workers start with ``"spawn"`` by default
    (no forking of a process that holds a GPU device), so the dataset, ``collate_fn`` and
    ``worker_init_fn`` must pickle: module-level classes and functions, not lambdas. Workers never
    touch a device: they return NumPy batches, and the upload (``device=``) happens in the loop's
    process, in the loop's thread.

    Host batches (no ``device``) feed ``DataParallel.train_step`` directly (it splits them and uploads
    each rank's share from that rank's thread); for ``DistributedDataParallel`` give each rank a
    ``DistributedSampler`` and its own device.

    Arguments:
        dataset: a Dataset (``__getitem__`` and ``__len__``).
        batch_size: samples per batch.
        shuffle: visit the samples in a new random order every epoch (a ``RandomSampler``).
        sampler: the order of the indices (a Sampler, e.g. ``DistributedSampler``); excludes ``shuffle``.
        batch_sampler: yields whole lists of indices; excludes batch_size, shuffle, sampler and drop_last.
        num_workers: worker processes loading batches (0: none, the background thread of ``prefetch``).
        collate_fn: turns a list of samples into a batch (default ``default_collate``).
        pin_memory: accepted for torch compatibility and ignored: WebGPU has no page-locked host memory
            to ask for (uploads go through the device's own mapped staging buffers).
        drop_last: leave out a last batch smaller than ``batch_size``.
        timeout: seconds to wait for one batch before raising TimeoutError.
        worker_init_fn: called in each worker with its id, after seeding, before its first batch.
        multiprocessing_context: how workers start: ``"spawn"`` (None), ``"forkserver"``, ``"fork"``
            or a ``multiprocessing`` context.
        generator: the shuffle's seed or ``numpy.random.Generator`` (see ``RandomSampler``); an int
            makes runs repeat; None draws each epoch's seed from wgpar's generator (``wgpar.manual_seed``).
            Workers' base seeds are drawn from it too.
        prefetch_factor: batches in flight per worker (default 2; only with ``num_workers > 0``).
        persistent_workers: keep the workers between epochs (only with ``num_workers > 0``).
        device: upload batches to this device (a Device, an index, ``"wgpu:1"``); None keeps NumPy batches.
        prefetch: batches prepared ahead on the background thread; 0 loads each batch in the loop's thread
            (without workers).
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, sampler: Sampler | None = None,
                 batch_sampler: Sampler | None = None, num_workers: int = 0,
                 collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 300.0, worker_init_fn: Callable[[int], Any] | None = None,
                 multiprocessing_context: Any = None, generator: int | np.random.Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 device: Device | int | str | None = None, prefetch: int = 2) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"DataLoader needs a dataset with __getitem__ and __len__, got {type(dataset).__name__}")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("DataLoader: batch_sampler excludes batch_size, shuffle, sampler and drop_last")
        else:
            if sampler is not None and shuffle:
                raise ValueError("DataLoader: sampler excludes shuffle (the sampler decides the order)")
            if sampler is None:
                sampler = RandomSampler(dataset, generator) if shuffle else SequentialSampler(dataset)
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.prefetch = _check_int(prefetch, "DataLoader: prefetch", 0)
        self.num_workers = _check_int(num_workers, "DataLoader: num_workers", 0)
        if self.num_workers == 0 and (prefetch_factor is not None or persistent_workers):
            raise ValueError("DataLoader: prefetch_factor and persistent_workers need num_workers > 0 (without "
                             "workers, prefetch= sets the background thread's look-ahead)")
        self.prefetch_factor = 2 if prefetch_factor is None else _check_int(prefetch_factor,
                                                                            "DataLoader: prefetch_factor", 1)
        self.persistent_workers = bool(persistent_workers)
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"DataLoader: worker_init_fn must be callable, got {type(worker_init_fn).__name__}")
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = resolve_context(multiprocessing_context) if self.num_workers else None
        if self.num_workers and isinstance(dataset, TensorDataset) and any(isinstance(t, Tensor)
                                                                            for t in dataset.tensors):
            raise ValueError("DataLoader: worker processes load on the host and cannot reach a device; this "
                             "TensorDataset holds wgpar tensors: give it NumPy arrays, or use num_workers=0")
        self.pin_memory = bool(pin_memory)
        self.generator = generator
        self._pool: WorkerPool | None = None
        self._pools_started = 0
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"DataLoader: timeout must be a positive number of seconds, got {timeout!r}")
        self.dataset = dataset
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.collate_fn = collate_fn
        self.device = None if device is None else resolve(device)
        self.timeout = float(timeout)

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.batch_sampler)

    def _load(self, k: int, indices: Sequence[int]) -> Any:
        """Batch ``k`` of the epoch: fetch, collate, upload (on the background thread, or the loop's)."""
        try:
            with no_grad():
                batch = fetch(self.dataset, self.collate_fn, indices)
                return batch if self.device is None else to_device(batch, self.device)
        except Exception as exc:
            exc.add_note(f"wgpar DataLoader: while loading batch {k} (dataset indices {_preview(indices)})"
                         + (f" for {self.device}" if self.device is not None else ""))
            raise

    def _base_seed(self) -> int:
        g = self.generator
        if g is None:
            g = _global_generator()
        elif not isinstance(g, np.random.Generator):  # an int seed: the n-th pool's seed repeats across runs
            g = np.random.default_rng([g, self._pools_started, 2**31])
        self._pools_started += 1
        return int(g.integers(2**31 - self.num_workers))  # every worker's seed fits an int32 tensor

    def _start_pool(self) -> WorkerPool:
        return WorkerPool(self.dataset, self.collate_fn, self.worker_init_fn, self.num_workers, self._base_seed(),
                          self.multiprocessing_context, self.timeout)

    def _from_workers(self, batches: Iterator[Sequence[int]]) -> Iterator[Any]:
        pool = self._pool
        if pool is None:
            pool = self._start_pool()
            if self.persistent_workers:
                self._pool = pool
        try:
            for k, batch in enumerate(pool.epoch(batches, self.prefetch_factor)):
                if self.device is not None:
                    try:
                        with no_grad():
                            batch = to_device(batch, self.device)
                    except Exception as exc:
                        exc.add_note(f"wgpar DataLoader: while uploading batch {k} to {self.device}")
                        raise
                yield batch
        finally:
            if not self.persistent_workers:
                pool.close()

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.batch_sampler)  # the epoch's shuffle is drawn here, on the loop's thread
        if self.num_workers:
            yield from self._from_workers(batches)
            return
        if self.prefetch == 0:
            for k, indices in enumerate(batches):
                yield self._load(k, indices)
            return
        with Prefetcher(self._load, batches, self.prefetch, self.timeout, name="wgpar-DataLoader") as ahead:
            yield from ahead

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()


__all__ = ["DataLoader"]
