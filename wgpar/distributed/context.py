"""Moved to ``wgpar.distributed.single_controller.context``."""

from ._moved import moved

__getattr__ = moved(__name__, "wgpar.distributed.single_controller", ("MultiAdapterContext",))
