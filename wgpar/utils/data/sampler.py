"""Samplers: the order in which a DataLoader visits a dataset, and how ranks share it.

Shuffles are NumPy permutations. With an int seed, iteration (epoch) ``e`` of a ``RandomSampler``
and ``DistributedSampler.set_epoch(e)`` draw the same permutation, ``default_rng([seed, e])``, so a
data-parallel run over N ranks with per-rank batches of B sees, step by step, the samples a
single-device run with batches of N * B sees (with ``drop_last``, or when the data divides).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from ...creation import generator as _global_generator


def _check_int(value: Any, name: str, low: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class Sampler:
    """Yields dataset indices; ``len(sampler)`` says how many. Subclass it and define both."""

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class SequentialSampler(Sampler):
    """``0, 1, ..., len(data_source) - 1``.

    Arguments:
        data_source: anything with a length (a dataset).
    """

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh permutation of the dataset's indices on every iteration (epoch), as ``torch.utils.data.RandomSampler``.
    Differs from torch: no ``replacement=`` or ``num_samples=`` (TypeError).

    The permutation is drawn when the iteration starts, on the thread that starts it (so a
    DataLoader's background thread never draws from a generator the training thread uses).

    Arguments:
        data_source: anything with a length (a dataset).
        generator: an int seed (epoch ``e``, the e-th iteration, draws from ``default_rng([seed, e])``:
            runs repeat, and ``DistributedSampler`` with that seed draws the same permutations), a
            ``numpy.random.Generator`` (each epoch draws from it), or None: each epoch's seed comes
            from wgpar's generator, which ``wgpar.manual_seed`` seeds (torch's rule).
    """

    def __init__(self, data_source: Sized, generator: int | np.random.Generator | None = None) -> None:
        if not (generator is None or isinstance(generator, np.random.Generator)):
            generator = _check_int(generator, "RandomSampler: generator (a seed)", 0)
        self.data_source = data_source
        self.generator = generator
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        g = self.generator
        if g is None:
            g = np.random.default_rng(int(_global_generator().integers(2**63)))
        elif not isinstance(g, np.random.Generator):
            g = np.random.default_rng([g, self.epoch])
        self.epoch += 1
        return iter(g.permutation(n).tolist())

    def __len__(self) -> int:
        return len(self.data_source)


class BatchSampler(Sampler):
    """Groups a sampler's indices into lists of ``batch_size`` (the last one shorter unless ``drop_last``).

    Arguments:
        sampler: yields indices (a Sampler or any iterable with a length).
        batch_size: indices per batch (>= 1).
        drop_last: leave out a last batch shorter than ``batch_size``.
    """

    def __init__(self, sampler: Sampler, batch_size: int, drop_last: bool = False) -> None:
        self.sampler = sampler
        self.batch_size = _check_int(batch_size, "batch_size", 1)
        self.drop_last = bool(drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        # The sampler's iterator (its shuffle) is made now, on the caller's thread; batches are cut lazily.
        return self._batches(iter(self.sampler))

    def _batches(self, indices: Iterator[int]) -> Iterator[list[int]]:
        while batch := list(itertools.islice(indices, self.batch_size)):
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DistributedSampler(Sampler):
    """This rank's share of the dataset in data-parallel training, with torch's rules.

    Every rank gets ``num_samples`` indices, the same number on every rank, so every rank runs the
    same number of batches of the same sizes (collectives line up; the mean of the ranks' mean losses
    is the mean over all their samples). Without ``drop_last`` the (shuffled) index list is padded
    by repeating its first indices up to a multiple of the ranks, so up to ``num_replicas - 1``
    samples appear twice per epoch; with ``drop_last`` its tail is left out instead, up to
    ``num_replicas - 1`` samples that a later epoch's shuffle brings back. Rank r takes every
    ``num_replicas``-th index from position r. Call ``set_epoch(epoch)`` before each epoch so that
    the shuffle changes (the same on every rank).

    Arguments:
        dataset: anything with a length.
        num_replicas: the number of ranks (default: ``group.world_size``).
        rank: this rank (default: ``group.rank``).
        shuffle: permute the indices each epoch (``default_rng([seed, epoch])``: the same on every rank).
        seed: the shuffle's seed; every rank must pass the same.
        drop_last: leave out the tail instead of padding (see above).
        group: a ProcessGroup to take ``num_replicas`` and ``rank`` from.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *, group: Any = None) -> None:
        if group is not None:
            num_replicas = group.world_size if num_replicas is None else num_replicas
            rank = group.rank if rank is None else rank
        if num_replicas is None or rank is None:
            raise ValueError("DistributedSampler needs num_replicas and rank, or group= (a ProcessGroup)")
        self.num_replicas = _check_int(num_replicas, "DistributedSampler: num_replicas", 1)
        self.rank = _check_int(rank, "DistributedSampler: rank", 0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"DistributedSampler: rank {self.rank} is out of range for {self.num_replicas} ranks "
                             f"(0 .. {self.num_replicas - 1})")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = _check_int(seed, "DistributedSampler: seed", 0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._length = n = len(dataset)
        self.num_samples = n // self.num_replicas if drop_last else -(-n // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for ``epoch`` next (call it on every rank, with the same epoch, before each epoch)."""
        self.epoch = _check_int(epoch, "DistributedSampler: epoch", 0)

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if n != self._length:  # num_samples was computed from the old length: ranks would disagree
            raise RuntimeError(f"DistributedSampler: the dataset's length changed from {self._length} to {n} "
                               "since the sampler was made; make a new sampler")
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle
                 else np.arange(n))
        if self.drop_last:
            order = order[:self.total_size]
        elif self.total_size > n:  # pad by repeating the start (several times over if n < num_replicas)
            order = np.concatenate([order, np.resize(order, self.total_size - n)])
        return iter(order[self.rank:self.total_size:self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "BatchSampler", "DistributedSampler"]
