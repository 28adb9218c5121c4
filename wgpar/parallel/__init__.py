"""Deprecated alias of ``wgpar.distributed`` (renamed so the name says what it is); kept for one release."""

import warnings

from ..distributed import *  # noqa: F403
from ..distributed import __all__  # noqa: F401

warnings.warn("wgpar.parallel is now wgpar.distributed; the old name goes away in the next release",
              DeprecationWarning, stacklevel=2)
