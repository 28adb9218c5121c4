"""Deprecated path of ``wgpar.autograd.autocast_mode`` (the differentiable ops consult it); kept for one release."""

import warnings

from .autograd.autocast_mode import *  # noqa: F403
from .autograd.autocast_mode import __all__  # noqa: F401

warnings.warn("wgpar.autocast_mode is now wgpar.autograd.autocast_mode (wgpar.autocast is unchanged); the old path "
              "goes away in the next release", DeprecationWarning, stacklevel=2)
