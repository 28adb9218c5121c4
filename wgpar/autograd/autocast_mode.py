"""autocast: a thread-local mixed-precision region, as ``torch.autocast`` (rules in docs/design.md, "AMP").

Inside ``with wgpar.autocast(dtype=wgpar.float16):`` matmuls and attention run in float16 (f16 storage, f32
accumulation in the kernels) and linear and convolution layers give float16 outputs, while softmax,
log_softmax, layer_norm, the losses, sum and exp / log / rsqrt / pow run in float32 (torch's CUDA autocast
lists); other ops take their inputs' types, so float16 meeting float32 gives float32. Parameters stay float32
(the "master weights"): a matmul's or attention's cast node casts each use down and its backward casts the
gradient back up; convolution kernels read float32 operands as they are and write each gradient in its
operand's dtype, and so does linear, but for its weight, rounded to float16 once a call (as torch's). The
ops themselves (``wgpar.autograd.differentiable``, ``wgpar.nn.functional``) ask this module what to do; it
holds only the state, one per thread, like torch's.
"""

from __future__ import annotations

import functools
import threading

from .. import dtypes as _dt

_state = threading.local()


def is_autocast_enabled() -> bool:
    """Whether this thread is inside an enabled autocast region."""
    return getattr(_state, "enabled", False)


def get_autocast_dtype() -> _dt.DType:
    """The lower-precision dtype of this thread's autocast region (float16)."""
    return getattr(_state, "dtype", _dt.float16)


class autocast:
    """Context manager / decorator: run the ops inside in mixed precision (this thread only).

    Arguments:
        device_type: ``"wgpu"`` (the only device type; accepted for torch-style calls).
        dtype: the lower precision, ``wgpar.float16`` (wgpar has no bfloat16).
        enabled: False makes the region a no-op (and disables an enclosing one inside it).
        cache_enabled: accepted for torch compatibility; wgpar casts each use of a weight (a GPT
            uses each weight once per forward).

    Adapters without the shader-f16 feature raise TypeError at the first op that would cast.
    """

    def __init__(self, device_type: str = "wgpu", dtype=_dt.float16, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if device_type != "wgpu":
            raise ValueError(f"autocast: device_type must be 'wgpu' (wgpar's only device type), got {device_type!r}")
        if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
            raise TypeError("autocast: wgpar has no bfloat16 (WGSL has no such type); use dtype=wgpar.float16")
        dt = _dt.as_dtype(dtype)
        if dt is not _dt.float16:
            raise TypeError(f"autocast: dtype must be wgpar.float16, got {dt.name}")
        self.dtype = dt
        self.enabled = bool(enabled)
        self._prev: list[tuple[bool, _dt.DType]] = []

    def __enter__(self) -> autocast:
        self._prev.append((is_autocast_enabled(), get_autocast_dtype()))
        _state.enabled = self.enabled
        _state.dtype = self.dtype
        return self

    def __exit__(self, *exc) -> bool:
        _state.enabled, _state.dtype = self._prev.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(dtype=self.dtype, enabled=self.enabled):
                return fn(*args, **kwargs)

        return wrapper


__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype"]
