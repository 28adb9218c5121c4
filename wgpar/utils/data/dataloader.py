"""DataLoader: batches from a dataset, shuffled with a seed, loaded (and uploaded) ahead on a background thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...autograd.grad_mode import no_grad
from ...runtime import Device, resolve
from .collate import default_collate, to_device
from .dataset import Dataset
from .prefetch import Prefetcher
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, _check_int


def _preview(indices: Sequence[int], n: int = 8) -> str:
    shown = ", ".join(str(i) for i in list(indices)[:n])
    return f"[{shown}{', ...' if len(indices) > n else ''}]"


class DataLoader:
    """Iterate over a dataset in batches, as ``torch.utils.data.DataLoader`` (threads, not processes).

    Each ``for batch in loader`` is one epoch. Batches are made by ``collate_fn`` (default:
    ``default_collate``, NumPy arrays on the host) or by the dataset's ``get_batch`` when it has one
    (``TensorDataset``). With ``device=``, every array of a batch is uploaded to that device, so the
    loop gets wgpar tensors. With ``prefetch > 0`` (the default) one background thread loads and
    uploads the next ``prefetch`` batches while the loop works on the current one, so that reading,
    collating and the upload's host work overlap the training step; at most ``prefetch`` batches exist
    besides the one the loop holds. Leaving the loop early (``break``, an exception) stops and joins
    the thread; an exception raised while loading is raised in the loop, with a note naming the
    batch and its sample indices.

    Host batches (no ``device``) feed ``DataParallel.train_step`` directly (it splits them and uploads
    each rank's share from that rank's thread); for ``DistributedDataParallel`` give each rank a
    ``DistributedSampler`` and its own device.

    Arguments:
        dataset: a Dataset (``__getitem__`` and ``__len__``).
        batch_size: samples per batch.
        shuffle: visit the samples in a new random order every epoch (a ``RandomSampler``).
        sampler: the order of the indices (a Sampler, e.g. ``DistributedSampler``); excludes ``shuffle``.
        batch_sampler: yields whole lists of indices; excludes batch_size, shuffle, sampler and drop_last.
        collate_fn: turns a list of samples into a batch (default ``default_collate``).
        drop_last: leave out a last batch smaller than ``batch_size``.
        generator: the shuffle's seed or ``numpy.random.Generator`` (see ``RandomSampler``); an int
            makes runs repeat; None draws each epoch's seed from wgpar's generator (``wgpar.manual_seed``).
        device: upload batches to this device (a Device, an index, ``"wgpu:1"``); None keeps NumPy batches.
        prefetch: batches prepared ahead on the background thread; 0 loads each batch in the loop's thread.
        timeout: seconds to wait for one batch before raising TimeoutError.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, sampler: Sampler | None = None,
                 batch_sampler: Sampler | None = None, collate_fn: Callable[[list], Any] | None = None,
                 drop_last: bool = False, generator: int | np.random.Generator | None = None, *,
                 device: Device | int | str | None = None, prefetch: int = 2, timeout: float = 300.0) -> None:
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
                get_batch = getattr(self.dataset, "get_batch", None)
                if self.collate_fn is None and get_batch is not None:
                    batch = get_batch(indices)
                else:
                    batch = (self.collate_fn or default_collate)([self.dataset[i] for i in indices])
                return batch if self.device is None else to_device(batch, self.device)
        except Exception as exc:
            exc.add_note(f"wgpar DataLoader: while loading batch {k} (dataset indices {_preview(indices)})"
                         + (f" for {self.device}" if self.device is not None else ""))
            raise

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.batch_sampler)  # the epoch's shuffle is drawn here, on the loop's thread
        if self.prefetch == 0:
            for k, indices in enumerate(batches):
                yield self._load(k, indices)
            return
        with Prefetcher(self._load, batches, self.prefetch, self.timeout, name="wgpar-DataLoader") as ahead:
            yield from ahead


__all__ = ["DataLoader"]
