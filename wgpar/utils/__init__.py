"""Utilities beside the core: ``wgpar.utils.data`` (datasets, samplers, DataLoader) and
``wgpar.utils.checkpoint`` (activation checkpointing)."""

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
