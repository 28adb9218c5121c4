"""wgpar.linalg: PyTorch's torch.linalg names that wgpar has (vector norms so far)."""

from __future__ import annotations

from .autograd.composites import vector_norm

__all__ = ["vector_norm"]
