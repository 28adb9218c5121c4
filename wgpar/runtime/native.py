"""The three commands every dispatch records, called straight into wgpu-native.

wgpu-py wraps each native call in an error capture (a thread-local stack, an ErrorSlot per call):
``set_pipeline`` + ``set_bind_group`` + ``dispatch_workgroups`` cost 3.5 us through it against
1.05 us called directly (lavapipe, docs/design.md "Command stream"). Errors in a compute pass are
not reported by these calls anyway: wgpu validates the pass when it ends and the encoder at
``finish()``, where ``Device`` turns them into a WgparError.

``PASS_CALLS`` is None when this wgpu-py lacks the internals (another backend or version); the
device then records through the public API. ``WGPAR_NATIVE_CALLS=0`` forces that too.
"""

from __future__ import annotations

from typing import Any

from .config import CONFIG


def _load() -> tuple[Any, Any, Any, Any] | None:
    if not CONFIG.native_calls:
        return None
    try:
        from wgpu.backends.wgpu_native._api import ffi, lib

        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi)
    except (ImportError, AttributeError):
        return None


# (set_pipeline(pass, pipeline), set_bind_group(pass, index, group, count, offsets), dispatch(pass, x, y, z), ffi)
PASS_CALLS = _load()


def handle(obj: Any) -> Any:
    """The native handle of a wgpu-py object (its pass, pipeline or bind group)."""
    return obj._internal
