"""Reverse-mode autograd: thread-local graphs, explicit tapes, custom Functions.

See docs/design.md "Autograd": every thread records its own graph; ``install_tape`` / ``take_tape`` hand one thread's
recorded nodes to whoever runs their backward (``backward_with_grad``);
``backward_input`` splits a backward into input gradients now and weight
gradients later (``DeferredGrad.run``), for zero-bubble pipeline schedules.
"""

from .engine import DeferredGrad, backward, backward_input, backward_with_grad, queue_callback
from .function import Context, Function
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .graph import Node, Tape, current_tape, install_tape, take_tape
from .methods import install as _install_methods
from .versions import preserve_version

_install_methods()

__all__ = [
    "backward", "backward_with_grad", "Function", "Context", "no_grad", "enable_grad", "is_grad_enabled",
    "set_grad_enabled", "Tape", "Node", "install_tape", "take_tape", "current_tape", "queue_callback",
    "preserve_version", "backward_input", "DeferredGrad",
]
