"""Kernel-backed tensor operations (no autograd here; see wgpar.autograd)."""

from .. import tensor as _tensor  # noqa: F401  (load Tensor before the ops that import it)

from .elementwise import binary, cast, clamp, clone, contiguous, copy_, fill, fill_, inplace, run_map, unary, where
from .index import getitem, index_add_rows, index_select, setitem
from .matmul import matmul
from .reduce import reduce, softmax
from .shape import cat, expand, flatten, permute, reshape, squeeze, stack, to_device, transpose, unsqueeze

__all__ = [
    "binary", "cast", "clamp", "clone", "contiguous", "copy_", "fill", "fill_", "inplace", "run_map", "unary", "where",
    "getitem", "index_add_rows", "index_select", "setitem", "matmul", "reduce", "softmax", "cat", "expand", "flatten",
    "permute", "reshape", "squeeze", "stack", "to_device", "transpose", "unsqueeze",
]
