"""Named tuples that ops with two results return, as ``torch.return_types``: ``t.max(dim=0)`` gives
``max(values=..., indices=...)``, unpackable as ``values, indices = t.max(dim=0)``.

Each is a ``typing.NamedTuple``: fields by name (``.values``, ``.indices``) or position, tuple
equality, and a repr naming the op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .tensor import Tensor


class max(NamedTuple):  # torch.return_types.max; shadows the builtin only in this module
    """``Tensor.max(dim)``: the largest values along ``dim`` and their indices (int32)."""

    values: Tensor
    indices: Tensor


class min(NamedTuple):
    """``Tensor.min(dim)``: the smallest values along ``dim`` and their indices (int32)."""

    values: Tensor
    indices: Tensor


class sort(NamedTuple):
    """``Tensor.sort(dim)``: the sorted values and where each came from (int32)."""

    values: Tensor
    indices: Tensor


class topk(NamedTuple):
    """``Tensor.topk(k, dim)``: the k largest (or smallest) values and their indices (int32)."""

    values: Tensor
    indices: Tensor


class median(NamedTuple):
    """``Tensor.median(dim)``: the median along ``dim`` (the lower middle value) and its index (int32)."""

    values: Tensor
    indices: Tensor


__all__ = ["max", "min", "sort", "topk", "median"]
