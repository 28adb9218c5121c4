"""wgpar: PyTorch-familiar deep learning on any WebGPU adapter.

Tensors live in wgpu buffers and every op is a WGSL compute shader. See the
README for the two commands, adapter selection and examples.
"""

from __future__ import annotations

from . import amp, autograd, distributed, functional, models, nn, optim, profiler, return_types, utils
from .autograd import backward_with_grad, enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .autograd.autocast_mode import autocast
from .creation import (
    arange,
    empty,
    eye,
    from_numpy,
    full,
    linspace,
    manual_seed,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    rng_stream,
    tensor,
    zeros,
    zeros_like,
)
from .dtypes import DType, DTypeWarning, bool_, float16, float32, int32
from .errors import (
    AdapterNotFoundError,
    BindingLimitError,
    DeviceMismatchError,
    HostDeviceError,
    OutOfMemoryError,
    StorageFreedError,
    WgparError,
)
from .functional import *  # noqa: F403  (with the functions generated from the op registry)
from .memory import (
    empty_cache,
    max_memory_allocated,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
    set_memory_limit,
    synchronize,
)
from .runtime import Device, adapter_names, device, devices
from .serialization import load, save
from .storage import Storage
from .tensor import Tensor

bool = bool_  # noqa: A001  (torch.bool)
float = float32  # noqa: A001
half = float16

__version__ = "0.1.0"

__all__ = [
    "Tensor", "Storage", "Device", "DType", "DTypeWarning", "float32", "float16", "int32", "bool_", "half",
    "tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn", "randint",
    "zeros_like", "ones_like", "manual_seed", "rng_stream",
    "devices", "device", "adapter_names", "synchronize", "memory_stats", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats", "empty_cache", "set_memory_limit",
    *functional.__all__,
    "autograd", "nn", "optim", "distributed", "amp", "autocast", "models", "return_types", "utils", "profiler",
    "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled",
    "backward_with_grad",
    "save", "load",
    "OutOfMemoryError", "DeviceMismatchError", "BindingLimitError", "AdapterNotFoundError", "WgparError",
    "StorageFreedError", "HostDeviceError",
]


_MISSING_DTYPES = {"float64": "float32", "double": "float32", "bfloat16": "float32", "int64": "int32",
                   "long": "int32", "int16": "int32", "short": "int32", "int8": "int32", "uint8": "int32"}


def __getattr__(name: str):
    if name == "parallel":  # the deprecated alias of wgpar.distributed, imported (and warned about) on use
        import importlib

        return importlib.import_module(".parallel", __name__)
    if name in _MISSING_DTYPES:
        raise AttributeError(f"module 'wgpar' has no attribute {name!r}: wgpar's dtypes are float32, float16, int32 "
                             f"and bool (README 'Types'); dtype={name!r} gives {_MISSING_DTYPES[name]} with a "
                             "one-time DTypeWarning")
    raise AttributeError(f"module 'wgpar' has no attribute {name!r}")
