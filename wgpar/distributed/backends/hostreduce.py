"""Reductions of host arrays, in blocks on the shared host thread pool.

Each rank reduces its slice of a collective's result from every rank's mapped
readback straight into the mapped upload buffers. Upload mappings may be
write-combined or device memory (resizable BAR), where reads are orders of
magnitude slower than writes, so each block of the result is built in a
cached scratch block and only ever written to them. Blocks run on a thread
pool (NumPy releases the GIL): one core cannot keep up with PCIe.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ...dtypes import DType
from ...runtime.transfer import host_pool

BLOCK = 1 << 20  # elements per block: a worker's scratch block stays in its cache
_scratch = threading.local()


def host_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype of a tensor's bytes on the host (bool is stored as one int32 per element)."""
    return np.dtype(np.int32) if dtype.storage == "i32" else dtype.np


def check_reducible(dtype: DType, op: str, what: str) -> None:
    if op == "mean" and not dtype.is_float:
        raise TypeError(f"{what}: op 'mean' needs a float tensor, got {dtype.name}: reduce with op 'sum' and "
                        "divide by world_size yourself (an integer mean must choose its rounding), or reduce a float "
                        "copy (tensor.float())")


def _ufunc(op: str, is_bool: bool):
    if is_bool:  # 0/1 values: sum and max are "any", prod and min are "all"
        return np.maximum if op in ("sum", "max") else np.minimum
    return {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]


def reduce_into(parts: Sequence[np.ndarray], targets: Sequence[np.ndarray], op: str, is_bool: bool = False,
                block: int = BLOCK, acc: np.ndarray | None = None) -> None:
    """Reduce equal-length ``parts`` elementwise and write the result into every array of ``targets``.

    float16 accumulates in float32; NaN propagates (np.maximum / np.minimum / np.add do). ``block``
    (at most BLOCK) elements per task on the host pool. ``acc``: cached memory of the accumulation
    dtype (float32 for float16 parts) that receives the result too: the reduction accumulates in it
    instead of a scratch block (the same operations, so the same bits).
    """
    n = len(parts[0]) if parts else 0
    if n == 0:
        return
    fn = _ufunc(op, is_bool)
    world = len(parts)
    acc_dtype = np.dtype(np.float32) if parts[0].dtype == np.float16 else parts[0].dtype

    out = acc

    def run_block(a: int, b: int) -> None:
        if world == 1:
            for t in targets if out is None else (out, *targets):
                np.copyto(t[a:b], parts[0][a:b], casting="unsafe")
            return
        if out is not None:
            acc = out[a:b]
        else:
            scratch = getattr(_scratch, "block", None)
            if scratch is None or scratch.dtype != acc_dtype:
                scratch = _scratch.block = np.empty(BLOCK, dtype=acc_dtype)
            acc = scratch[: b - a]
        # dtype: float16 parts are added as float32 from the first pair on (not rounded to float16 first)
        fn(parts[0][a:b], parts[1][a:b], out=acc, dtype=acc_dtype, casting="unsafe")
        for p in parts[2:]:
            fn(acc, p[a:b], out=acc, casting="unsafe")
        if op == "mean":
            np.divide(acc, world, out=acc)
        for t in targets:
            np.copyto(t[a:b], acc, casting="unsafe")

    block = min(block, BLOCK)
    blocks = [(a, min(a + block, n)) for a in range(0, n, block)]
    if len(blocks) == 1:
        run_block(*blocks[0])
        return
    for f in [host_pool().submit(run_block, a, b) for a, b in blocks]:
        f.result()


def copy_into(dst: np.ndarray, src: np.ndarray, divide: float | None = None, block: int = BLOCK) -> None:
    """``dst[:] = src`` (or ``src / divide``, cast to dst's dtype) in blocks on the host pool (large copies
    between mappings)."""
    n = len(src)

    def run_block(a: int, b: int) -> None:
        if divide is None:
            np.copyto(dst[a:b], src[a:b])
        else:
            np.divide(src[a:b], divide, out=dst[a:b], casting="unsafe")

    blocks = [(a, min(a + block, n)) for a in range(0, n, block)]
    if len(blocks) <= 1:
        run_block(0, n)
        return
    for f in [host_pool().submit(run_block, a, b) for a, b in blocks]:
        f.result()
