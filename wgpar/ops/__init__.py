"""Kernel-backed tensor operations (no autograd here; see wgpar.autograd)."""

from .arith import binary, inplace
from .elementwise import cast, clamp, clone, contiguous, copy_, fill, fill_, run_map, unary, where
from .index import getitem, index_add_rows, index_select, setitem
from .matmul import matmul, matmul_bias
from .reduce import reduce, softmax
from .scan import scan
from .shape import (
    cat,
    expand,
    flatten,
    permute,
    reshape,
    reshape_view,
    squeeze,
    stack,
    to_device,
    transpose,
    unsqueeze,
)
from .sort import argsort, scatter_along, take_along

__all__ = [
    "binary", "cast", "clamp", "clone", "contiguous", "copy_", "fill", "fill_", "inplace", "run_map", "unary",
    "where", "getitem", "index_add_rows", "index_select", "setitem", "matmul", "matmul_bias", "reduce", "softmax",
    "argsort", "scan",
    "take_along", "scatter_along", "cat", "expand", "flatten", "permute", "reshape", "reshape_view", "squeeze",
    "stack", "to_device", "transpose", "unsqueeze",
]
