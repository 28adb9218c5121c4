"""Thread-local switch for recording the autograd graph (no_grad / enable_grad)."""

from __future__ import annotations

import functools
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    """Whether ops record the autograd graph on this thread (``torch.is_grad_enabled``); False inside ``no_grad``."""
    return getattr(_state, "enabled", True)


def set_grad_enabled(mode: bool) -> None:
    """Turn recording of the autograd graph on or off for this thread.

    Unlike ``torch.set_grad_enabled`` this is a plain function, not a context manager: use ``no_grad()``
    or ``enable_grad()`` for a block.

    Arguments:
        mode: True to record, False not to.
    """
    _state.enabled = bool(mode)


class _Mode:
    _value: bool

    def __enter__(self):
        self._prev = is_grad_enabled()
        set_grad_enabled(self._value)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_Mode):
    """Context manager / decorator: ops inside record no graph (this thread only)."""

    _value = False


class enable_grad(_Mode):
    """Context manager / decorator: re-enable recording inside a no_grad block."""

    _value = True
