"""Deprecated path of ``wgpar.serialization`` (``wgpar.save`` / ``wgpar.load``); kept for one release, after which
"checkpoint" means activation recomputation (``wgpar.utils.checkpoint``), as in torch."""

import warnings

from .serialization import *  # noqa: F403
from .serialization import __all__  # noqa: F401

warnings.warn("wgpar.checkpoint is now wgpar.serialization (wgpar.save / wgpar.load are unchanged); the old path "
              "goes away in the next release", DeprecationWarning, stacklevel=2)
