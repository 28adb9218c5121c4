"""Moved to ``wgpar.distributed.single_controller.fsdp``."""

from .._moved import moved

__getattr__ = moved(__name__, "wgpar.distributed.single_controller", ("FSDP",))
