"""Map-style datasets: ``Dataset`` (subclass it) and ``TensorDataset`` (arrays or tensors indexed along dim 0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...autograd.grad_mode import no_grad
from ...tensor import Tensor


class Dataset:
    """A collection of samples indexed by ``0 .. len(dataset) - 1``, as ``torch.utils.data.Dataset``.

    Subclass it and define ``__getitem__(index)`` (one sample: an array, a number, a tensor, or a
    tuple / list / dict of them) and ``__len__``. A dataset may also define ``get_batch(indices)``
    returning a whole batch at once (what ``default_collate`` would make of those samples);
    DataLoader then calls it instead of ``__getitem__`` once per sample, when it has no ``collate_fn``.
    A DataLoader reads its dataset from one background thread at a time.
    """

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class TensorDataset(Dataset):
    """Samples from NumPy arrays and/or wgpar tensors of equal length along dim 0.

    ``ds[i]`` is the tuple of row ``i`` of each; ``get_batch(indices)`` takes the rows of a whole batch
    in one step per array (NumPy fancy indexing on the host, one gather kernel on the device for a tensor).

    Arguments:
        *tensors: NumPy arrays or wgpar Tensors, each with at least one dimension, all of one length.
    """

    def __init__(self, *tensors: np.ndarray | Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one array or tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, (np.ndarray, Tensor)):
                raise TypeError(f"TensorDataset: argument {i} is a {type(t).__name__}; pass NumPy arrays or "
                                "wgpar Tensors (np.asarray(...) first)")
            if t.ndim == 0:
                raise ValueError(f"TensorDataset: argument {i} is 0-dimensional; samples are taken along dim 0")
        lengths = [t.shape[0] for t in tensors]
        if len(set(lengths)) > 1:
            raise ValueError("TensorDataset: every array needs the same length along dim 0, got shapes "
                             + ", ".join(str(tuple(t.shape)) for t in tensors))
        self.tensors = tensors

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def __getitem__(self, index: int) -> tuple:
        n = len(self)
        if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)):
            raise TypeError(f"TensorDataset index must be an int, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"TensorDataset index {index} is out of range for {n} samples")
        with no_grad():
            return tuple(t[int(index)] for t in self.tensors)

    def get_batch(self, indices: Sequence[int]) -> tuple:
        """The rows ``indices`` of every array, as one batch (a tuple: arrays stay arrays, tensors tensors)."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"TensorDataset: indices in [{idx.min()}, {idx.max()}] are out of range for {n} samples")
        with no_grad():
            return tuple(t[idx] for t in self.tensors)


__all__ = ["Dataset", "TensorDataset"]
