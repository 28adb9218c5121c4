"""Load triton's LLVM before Mesa's, so a CUDA build of PyTorch can share the process with lavapipe.

PyPI's Linux PyTorch wheels bring triton, whose ``libtriton.so`` links its own LLVM statically and
exports its symbols. Mesa's Vulkan drivers (lavapipe among them) link the system's ``libLLVM-N.so``,
which the Vulkan loader brings in when wgpu first enumerates adapters. If ``libtriton.so`` is loaded
after that, the dynamic linker binds its LLVM references to the system LLVM already in the process
(an older version with other object layouts): its static initialisers register command-line options
through ``llvm::cl::Option::addArgument`` in the wrong library and the process dies with SIGSEGV
(reproduced with triton 3.9 and Mesa's LLVM 15; loading triton first works). wgpar opens the first
adapter before a user's code touches ``torch.compile`` or triton, so it loads triton's library first
when triton is installed; a triton that is not installed costs nothing (0.2 s when it is).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

_log = logging.getLogger("wgpar")


def load_triton_first() -> bool:
    """Load triton's compiled library now if triton is installed and not yet loaded; True if it was loaded.

    Linux only (the clash is between ELF shared libraries). A triton that fails to load is left alone:
    it would have failed the same way later, in the code that imports it.
    """
    if not sys.platform.startswith("linux") or "triton._C.libtriton" in sys.modules:
        return False
    try:
        if importlib.util.find_spec("triton") is None:
            return False
        importlib.import_module("triton._C.libtriton")
    except Exception as exc:  # noqa: BLE001 - triton's own problem, reported when its user imports it
        _log.debug("triton is installed but its library did not load: %s", exc)
        return False
    return True
