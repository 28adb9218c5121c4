"""preserve_version: write into a tensor the autograd graph saved, without tripping its version check.

Every in-place write bumps its storage's version, and backward refuses a node whose saved tensors'
versions changed. FSDP frees a parameter's storage after forward and, before backward reaches the
nodes that saved that parameter, re-materialises it and writes the same values back (re-gathered
from the shards): that write must not count as a change. PyTorch has the same tool,
``torch.autograd.graph._unsafe_preserve_version_counter``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..tensor import Tensor


@contextmanager
def preserve_version(tensor: Tensor) -> Iterator[Tensor]:
    """Inside the block, writes to ``tensor``'s storage leave its version counter unchanged.

    Only for restoring values identical to the ones the graph saved (re-gathered parameters, a
    re-materialised storage): anything else silently gives backward wrong gradients. The version is
    restored when the block ends normally; if it raises, the writes count (a half-restored tensor
    must not pass the version check).

    Arguments:
        tensor: the tensor (any view of the storage) about to be written.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"preserve_version: expected a wgpar.Tensor, got {type(tensor).__name__}")
    storage = tensor._storage
    version = storage.version
    yield tensor
    storage.version = version
