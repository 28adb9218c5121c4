"""Turning a list of samples into a batch (``default_collate``), and a batch's arrays into device tensors."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...autograd.grad_mode import no_grad
from ...functional import stack
from ...runtime import Device
from ...tensor import Tensor


def default_collate(samples: Sequence[Any]) -> Any:
    """Stack a list of samples into one batch, keeping the samples' structure (torch's rules, on NumPy).

    NumPy arrays stack into one array with a new leading dim, numbers into a 1-d array, wgpar
    tensors into one tensor (``wgpar.stack``, on their device); tuples, lists, named tuples and dicts
    are collated field by field; strings stay a list. Batches stay on the host until a DataLoader
    with ``device=`` uploads them.

    Arguments:
        samples: a non-empty list of samples of one structure.
    """
    if not samples:
        raise ValueError("default_collate: no samples")
    first = samples[0]
    if isinstance(first, Tensor):
        return stack(list(samples))
    if isinstance(first, np.ndarray):
        shapes = {np.shape(s) for s in samples}
        if len(shapes) > 1:
            raise ValueError(f"default_collate: samples of different shapes cannot be stacked: {sorted(shapes)}")
        return np.stack(samples)
    if isinstance(first, (numbers.Number, np.bool_, np.number)) and not isinstance(first, complex):
        return np.asarray(samples)
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, Mapping):
        return {key: default_collate([s[key] for s in samples]) for key in first}
    if isinstance(first, Sequence):
        if len({len(s) for s in samples}) > 1:
            raise ValueError("default_collate: samples of one batch have different lengths "
                             f"({sorted({len(s) for s in samples})})")
        fields = [default_collate(list(field)) for field in zip(*samples)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # a named tuple
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    raise TypeError(f"default_collate: cannot batch samples of type {type(first).__name__}; pass a collate_fn")


def to_device(batch: Any, device: Device) -> Any:
    """``batch`` with every NumPy array of numbers uploaded to ``device`` and every tensor moved there.

    Containers (tuples, lists, named tuples, dicts) keep their structure; anything else (strings,
    arrays of strings) stays as it is.

    Arguments:
        batch: a batch, as ``default_collate`` makes them.
        device: the target Device.
    """
    if isinstance(batch, Tensor):
        if batch.device is device:
            return batch
        with no_grad():
            return batch.to(device)
    if isinstance(batch, np.ndarray):
        return Tensor.from_numpy(batch, device=device) if batch.dtype.kind in "fiub" else batch
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


__all__ = ["default_collate", "to_device"]
