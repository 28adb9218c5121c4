"""Automatic mixed precision: ``autocast`` regions and ``GradScaler`` (as ``torch.amp``).

See docs/design.md ("AMP") for the op rules and why the scale lives on the host.
"""

from ..autograd.autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled
from .grad_scaler import GradScaler, OptState

__all__ = ["autocast", "GradScaler", "OptState", "is_autocast_enabled", "get_autocast_dtype"]
